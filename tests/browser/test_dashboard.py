"""The dashboard at /ui in a real browser (Debian's Chromium through Playwright) against a real
agent on simulated GPUs: it loads without console errors, shows the numbers the API gives, follows
changes without a reload, asks for a token when the agent has tokens, and shows a tenant only its
own workloads by name. Screenshots are saved (see conftest.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gpufrac.cli.serve_cmds import run_load
from tests.browser.conftest import Page
from tests.integration.conftest import TOKENS, RunningAgent, free_port, kill_leftover_runs

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def workload(
    tenant: str, name: str, gpu: dict[str, Any], sharing: str, use_mib: int, sm: int = 0
) -> dict[str, Any]:
    """A service that reports its GPU use (simulated GPUs) and keeps running."""
    code = (
        f"from gpufrac import sdk; import time; sdk.report_gpu_use({use_mib}, {sm}); "
        "time.sleep(600)"
    )
    return {
        "apiVersion": "gpufrac/v1",
        "kind": "Workload",
        "metadata": {"name": name, "tenant": tenant},
        "spec": {
            "type": "service",
            "command": [PY, "-c", code],
            "resources": {"gpu": gpu},
            "sharing": sharing,
        },
    }


DEPLOYMENT = {
    "apiVersion": "gpufrac/v1",
    "kind": "Deployment",
    "metadata": {"name": "summer"},
    "spec": {
        "template": {
            "model": "examples.serving.models:slow_sum",
            "workdir": str(ROOT),
            "resources": {"gpu": {"fraction": 0.25}},
            "sharing": "timeslice",
        },
        "replicas": 2,
        "max_concurrency": 4,
    },
}

# as after `make demo`: a MIG GPU with instances, a GPU shared under MPS, a deployment
DEMO = [
    workload("search", "encoder", {"memory": "12GiB"}, "mig", 9000),
    workload("search", "ranker", {"mig": "1g.18gb"}, "mig", 6000),
    workload("search", "vision", {"mig": "3g.71gb"}, "mig", 41000),
    workload("research", "trainer", {"memory": "24GiB", "compute": "50%"}, "mps", 17000),
    workload("research", "batch-a", {"memory": "8GiB", "compute": "20%"}, "mps", 5000),
    workload("research", "batch-b", {"memory": "8GiB", "compute": "10%"}, "mps", 7500),
    DEPLOYMENT,
]


def get(agent: RunningAgent, path: str, token: str | None = None) -> Any:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(agent.url + path, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def apply(agent: RunningAgent, docs: list[dict[str, Any]], token: str | None = None) -> None:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    text = "\n---\n".join(json.dumps(d) for d in docs)
    r = httpx.post(agent.url + "/api/v1/workloads", content=text, headers=headers, timeout=30)
    assert r.status_code == 200, r.text


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def all_running(agent: RunningAgent, token: str | None = None) -> bool:
    found = get(agent, "/api/v1/workloads", token)["workloads"]
    deps = get(agent, "/api/v1/deployments", token)["deployments"]
    return all(w["phase"] == "running" for w in found) and all(
        d["replicas_ready"] == d["replicas_wanted"] for d in deps
    )


def gib(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB"


SHOWN = """() => ({
  gpus: [...document.querySelectorAll('#fleet article')].map(a => ({
    uuid: a.dataset.gpu,
    reserved: a.querySelector('[data-field=reserved]').textContent,
    used: a.querySelector('[data-field=used]').textContent,
    cordoned: a.classList.contains('cordoned'),
    shares: [...a.querySelectorAll('.shares li')].map(li => ({
      who: li.querySelector('.who').textContent,
      reserved: li.querySelector('.mem').dataset.reserved,
      phase: li.querySelector('.phase').textContent,
    })),
  })),
  workloads: Object.fromEntries([...document.querySelectorAll('#workloads tr[data-key]')].map(
    tr => [tr.dataset.key, \
{phase: tr.children[1].textContent, restarts: tr.children[3].textContent}])),
  deployments: Object.fromEntries([...document.querySelectorAll('#deployments tr[data-key]')].map(
    tr => [tr.dataset.key, tr.querySelector('.replicas').textContent])),
})"""


def expected(agent: RunningAgent, token: str | None = None) -> dict[str, Any]:
    """What the page must show, from the API."""
    gpus = get(agent, "/api/v1/gpus", token)["gpus"]
    found = get(agent, "/api/v1/workloads", token)["workloads"]
    deps = get(agent, "/api/v1/deployments", token)["deployments"]
    return {
        "gpus": [
            {
                "uuid": g["uuid"],
                "reserved": f"{gib(g['reserved_memory_mib'])} reserved",
                "used": f"{gib(g['memory_used_mib'])} used",
                "cordoned": bool(g["cordoned"]),
                "shares": [
                    {
                        "who": f"{a['tenant']}/{a['name']}"
                        if a["name"] is not None
                        else "another tenant's share",
                        "reserved": str(a["memory_mib"]),
                        "phase": a["phase"],
                    }
                    for a in g["allocations"]
                ],
            }
            for g in gpus
        ],
        "workloads": {
            f"{w['tenant']}/{w['name']}": {"phase": w["phase"], "restarts": str(w["restarts"])}
            for w in found
        },
        "deployments": {
            f"{d['tenant']}/{d['name']}": f"{d['replicas_ready']} / {d['replicas_wanted']}"
            for d in deps
        },
    }


def page_matches_api(tab: Page, agent: RunningAgent, token: str | None = None) -> dict[str, Any]:
    """Wait (a few of the page's polls) until it shows what the API says; fail with the
    difference."""
    want: dict[str, Any] = {}
    shown: dict[str, Any] = {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        want = expected(agent, token)
        shown = tab.page.evaluate(SHOWN)
        if shown == want:
            return want
        time.sleep(0.5)
    assert shown == want
    return want


def load(url: str, clients: int, seconds: float) -> threading.Thread:
    body = b'{"inputs": [1, 2, 3]}'

    def run() -> None:
        asyncio.run(run_load(url, body, [clients], seconds, lambda n, got: None))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_dashboard_shows_what_the_api_says_and_follows_changes(
    agent: RunningAgent, tab: Page, artifacts: Path
) -> None:
    apply(agent, DEMO)
    wait_for(lambda: all_running(agent), "the demo fleet to run")
    idle = [g for g in get(agent, "/api/v1/gpus")["gpus"] if not g["allocations"]]
    assert idle, "the fleet has a GPU left for the cordon"
    r = httpx.post(f"{agent.url}/api/v1/gpus/{idle[0]['index']}/cordon", timeout=10)
    assert r.status_code == 200, r.text

    page = tab.page
    page.goto(agent.url + "/ui")
    page.wait_for_selector("#fleet article")
    assert page.locator("#login").is_hidden()  # no tokens: no question
    want = page_matches_api(tab, agent)
    assert len(want["gpus"]) == 4 and len(want["workloads"]) == 8
    # MIG instances drawn on their slots, each with its workload
    drawn = page.eval_on_selector_all(
        "#fleet g.instance", "gs => gs.map(g => g.dataset.profile + '@' + g.dataset.start)"
    )
    placed = [
        f"{a['mig']['profile']}@{a['mig']['start']}"
        for g in get(agent, "/api/v1/gpus")["gpus"]
        for a in g["allocations"]
        if a["mig"]
    ]
    assert sorted(drawn) == sorted(placed) and len(placed) == 3

    # a workload applied now appears without a reload, and traffic reaches the plots
    traffic = load(f"{agent.gateway}/serve/summer/predict", 6, 14)
    apply(agent, [workload("research", "late", {"memory": "2GiB"}, "timeslice", 1000)])
    page.wait_for_selector('#workloads tr[data-key="research/late"]')
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-plot^="Deployments: requests/s"] .last')]
                  .some(e => parseFloat(e.textContent) > 0)""",
        timeout=30_000,
    )
    page.wait_for_timeout(300)
    page.screenshot(path=str(artifacts / "dashboard-admin.png"), full_page=True)
    page.locator("#fleet").screenshot(path=str(artifacts / "dashboard-fleet.png"))
    page.locator("#plots").screenshot(path=str(artifacts / "dashboard-plots.png"))

    # the logs of a workload, from its link
    page.click('#workloads tr[data-key="search/encoder"] a')
    page.wait_for_function("() => document.getElementById('logs').open")
    page.click("#logs-close")
    traffic.join(timeout=30)
    history = get(agent, "/api/v1/history")
    assert {w["key"] for w in history["workloads"]} >= {"search/encoder", "research/trainer"}
    assert any(v for d in history["deployments"] for v in d["series"]["rate"])
    assert tab.errors == []


def test_with_tokens_the_page_asks_for_one_and_a_tenant_sees_others_anonymised(
    tenant_agent: RunningAgent, tab: Page, artifacts: Path
) -> None:
    admin, research = TOKENS["admin"], TOKENS["research"]
    apply(
        tenant_agent,
        [
            workload("search", "secret", {"memory": "20GiB"}, "timeslice", 8000),
            workload("research", "mine", {"memory": "10GiB"}, "timeslice", 3000),
        ],
        admin,
    )
    wait_for(lambda: all_running(tenant_agent, admin), "both workloads to run")
    gpus = get(tenant_agent, "/api/v1/gpus", admin)["gpus"]
    assert any(len(g["allocations"]) == 2 for g in gpus), "both on one GPU (binpack)"
    r = httpx.get(tenant_agent.url + "/api/v1/history", timeout=10)
    assert r.status_code == 401  # the page is open, the data is not

    page = tab.page
    page.goto(tenant_agent.url + "/ui")
    page.wait_for_selector("#token")
    assert page.locator("#main").is_hidden()
    page.fill("#token", "not-a-token-of-this-agent")
    page.click("#token-form button")
    page.wait_for_function("() => document.getElementById('login-error').textContent !== ''")
    assert tab.errors and all("401" in e for e in tab.errors)  # the refused request, only
    tab.errors.clear()

    page.fill("#token", research)
    page.click("#token-form button")
    page.wait_for_selector("#fleet article")
    want = page_matches_api(tab, tenant_agent, research)
    assert list(want["workloads"]) == ["research/mine"]
    shares = [s["who"] for g in want["gpus"] for s in g["shares"]]
    assert sorted(shares) == ["another tenant's share", "research/mine"]
    assert "secret" not in page.content()
    assert page.evaluate("() => document.cookie") == ""
    assert page.evaluate("() => sessionStorage.getItem('gpufrac-token')") == research
    page.wait_for_function("() => document.querySelectorAll('#plots .plot').length > 0")
    wait_for(  # the next sample (every 5 s) holds the workloads
        lambda: bool(get(tenant_agent, "/api/v1/history", admin)["workloads"]), "a sample", 15
    )
    history = get(tenant_agent, "/api/v1/history", research)
    assert [w["key"] for w in history["workloads"]] == ["research/mine"]
    assert len(get(tenant_agent, "/api/v1/history", admin)["workloads"]) == 2
    page.screenshot(path=str(artifacts / "dashboard-tenant.png"), full_page=True)
    assert tab.errors == []


def test_a_cluster_control_planes_dashboard_shows_every_nodes_gpus_and_its_deployment(
    tab: Page, artifacts: Path, tmp_path: Path
) -> None:
    """``gpufrac control --local 3`` with the cluster examples applied: the page shows each node's
    GPUs (with the node) and the deployment served across two of them, and plots each GPU by
    node."""
    port, gateway = free_port(), free_port()
    data = tmp_path / "control"
    proc = subprocess.Popen(
        [
            *(PY, "-m", "gpufrac.cli", "control", "--local", "3", "--port", str(port)),
            *("--gateway-port", str(gateway), "--node-port", str(free_port())),
            *("--data-dir", str(data)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    control = RunningAgent(f"http://127.0.0.1:{port}", data, port, proc)
    try:
        wait_for(
            lambda: (
                _ok(control, "/api/v1/nodes")
                and [n["state"] for n in get(control, "/api/v1/nodes")["nodes"]] == ["alive"] * 3
            ),
            "three nodes",
        )
        for example in ("placement.yaml", "serving.yaml"):
            text = (ROOT / "examples" / "cluster" / example).read_text()
            r = httpx.post(f"{control.url}/api/v1/workloads", content=text, timeout=30)
            assert r.status_code == 200, r.text
        wait_for(lambda: all_running(control), "the examples to run")
        page = tab.page
        page.goto(control.url + "/ui")
        page.wait_for_selector("#fleet article")
        want = page_matches_api(tab, control)
        assert len(want["gpus"]) == 4 and want["deployments"] == {"search/summer": "2 / 2"}
        subs = page.eval_on_selector_all("#fleet article .sub", "ss => ss.map(s => s.textContent)")
        assert sorted(s.rsplit(" · ", 1)[-1] for s in subs) == [
            "local-0",
            "local-1",
            "local-2",
            "local-2",
        ]
        page.wait_for_function(  # a sample (every 5 s): each GPU's line, named by its node
            """() => [...document.querySelectorAll('[data-plot="GPU memory used"] .legend li')]
                      .map(li => li.children[1].textContent).join(',')
                      .includes('local-1 GPU 0')""",
            timeout=30_000,
        )
        page.screenshot(path=str(artifacts / "dashboard-cluster.png"), full_page=True)
        assert tab.errors == []
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        for node in ("local-0", "local-1", "local-2"):
            kill_leftover_runs(data / "nodes" / node)


def _ok(agent: RunningAgent, path: str) -> bool:
    try:
        return httpx.get(agent.url + path, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
