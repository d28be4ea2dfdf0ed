"""Tenant isolation on every endpoint, with API tokens."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import kill_leftover_runs
from tests.integration.conftest import TOKENS, RunningAgent, free_port
from tests.integration.test_agent_api import manifest

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]


def h(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[who]}"}


def test_tenants_see_and_change_only_their_own(tenant_agent: RunningAgent) -> None:
    url = tenant_agent.url + "/api/v1"
    sleepy = [PY, "-c", "import time; time.sleep(60)"]
    assert httpx.get(url + "/workloads").status_code == 401
    assert (
        httpx.get(url + "/workloads", headers={"authorization": "Bearer nope"}).status_code == 401
    )
    # a manifest naming another tenant is refused, and nothing is stored
    r = httpx.post(
        url + "/workloads", content=manifest("x", sleepy, tenant="research"), headers=h("search")
    )
    assert r.status_code == 403
    assert httpx.get(url + "/workloads", headers=h("admin")).json()["workloads"] == []
    assert (
        httpx.post(
            url + "/workloads",
            content=manifest("web", sleepy, tenant="search"),
            headers=h("search"),
        ).status_code
        == 200
    )
    # research cannot see, read, log or delete search's workload; search can
    assert httpx.get(url + "/workloads", headers=h("research")).json()["workloads"] == []
    for method, path in [
        ("GET", "/workloads/search/web"),
        ("GET", "/workloads/search/web/logs"),
        ("DELETE", "/workloads/search/web"),
    ]:
        assert httpx.request(method, url + path, headers=h("research")).status_code == 404
    assert [
        w["name"] for w in httpx.get(url + "/workloads", headers=h("search")).json()["workloads"]
    ] == ["web"]
    assert httpx.get(url + "/workloads/search/web", headers=h("search")).status_code == 200
    assert all(
        e["subject"].startswith("search/")
        for e in httpx.get(url + "/events", headers=h("search")).json()["events"]
    )
    assert httpx.get(url + "/events", headers=h("research")).json()["events"] == []
    # GPUs: tenants read them, only the admin changes them or reads the metrics
    gpus = httpx.get(url + "/gpus", headers=h("research")).json()["gpus"]
    assert (
        httpx.post(url + f"/gpus/{gpus[0]['index']}/cordon", headers=h("search")).status_code == 403
    )
    assert (
        httpx.post(url + f"/gpus/{gpus[0]['index']}/cordon", headers=h("admin")).status_code == 200
    )
    assert httpx.get(tenant_agent.url + "/metrics", headers=h("search")).status_code == 403
    assert httpx.get(tenant_agent.url + "/metrics", headers=h("admin")).status_code == 200
    assert httpx.delete(url + "/workloads/search/web", headers=h("search")).status_code == 200


def test_the_gateway_answers_only_the_deployments_tenant(tenant_agent: RunningAgent) -> None:
    url = tenant_agent.url + "/api/v1"
    serve = (
        "import os, uvicorn; uvicorn.run('tests.integration.echo_asgi:app', "
        "port=int(os.environ['PORT']), log_level='warning')"
    )

    def deployment(name: str, public: bool) -> str:
        return (
            f"apiVersion: gpufrac/v1\nkind: Deployment\nmetadata: {{name: {name}, tenant: "
            "search}\n"
            f"spec:\n  public: {str(public).lower()}\n  replicas: 1\n  template:\n"
            f"    command: [{PY}, -c, {json.dumps(serve)}]\n    workdir: {ROOT}\n"
            "    resources: {gpu: {fraction: 0.2}}\n    sharing: timeslice\n"
        )

    for name, public in (("private", False), ("open", True)):
        r = httpx.post(url + "/deployments", content=deployment(name, public), headers=h("search"))
        assert r.status_code == 200, r.text

    def ready(name: str) -> bool:
        d = httpx.get(url + f"/deployments/search/{name}", headers=h("search")).json()
        return int(d["replicas_ready"]) == 1

    deadline = time.monotonic() + 60
    while not (ready("private") and ready("open")):
        assert time.monotonic() < deadline, "the replicas never became ready"
        time.sleep(0.2)
    gw = tenant_agent.gateway + "/serve/search."
    assert httpx.get(gw + "private/x", timeout=10).status_code == 401
    assert httpx.get(gw + "no-such-one/x", timeout=10).status_code == 401  # the same: no hint
    bad = {"authorization": "Bearer garbage-garbage-garbage"}
    assert httpx.get(gw + "private/x", headers=bad, timeout=10).status_code == 401
    assert httpx.get(gw + "private/x", headers=h("research"), timeout=10).status_code == 404
    for who in ("search", "admin"):
        r = httpx.get(gw + "private/x", headers=h(who), timeout=10)
        assert r.status_code == 200 and TOKENS[who] not in r.text  # the token is not passed on
    assert httpx.get(gw + "open/x", timeout=10).status_code == 200
    lower = {"authorization": f"bearer {TOKENS['search']}"}  # the scheme is case-insensitive
    assert httpx.get(gw + "private/x", headers=lower, timeout=10).status_code == 200
    assert httpx.get(url + "/workloads", headers=lower).status_code == 200


def test_a_workload_gets_nothing_of_the_agents_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFRAC_TOKEN", TOKENS["admin"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "agent-only-secret")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    port = free_port()
    agent = RunningAgent(f"http://127.0.0.1:{port}", data_dir, port, None)  # type: ignore[arg-type]
    agent.start()
    try:
        show = "import json, os; print(json.dumps(dict(os.environ)))"
        text = manifest("env", [PY, "-c", show], kind="job").replace(
            "resources:", "env: {MINE: mine}\n  resources:"
        )
        assert httpx.post(agent.url + "/api/v1/workloads", content=text).status_code == 200
        deadline = time.monotonic() + 30
        while (w := httpx.get(agent.url + "/api/v1/workloads/default/env").json())[
            "phase"
        ] != "succeeded":
            assert time.monotonic() < deadline, w
            time.sleep(0.1)
        logs = httpx.get(agent.url + "/api/v1/workloads/default/env/logs").json()["lines"]
        seen = json.loads(logs[-1])
        assert seen["MINE"] == "mine" and seen["PATH"]
        assert "GPUFRAC_TOKEN" not in seen and "AWS_SECRET_ACCESS_KEY" not in seen
        assert "GPUFRAC_DATA_DIR" not in seen and str(data_dir) not in json.dumps(seen)
        assert "GPUFRAC_TOKEN" not in w["env"] and TOKENS["admin"] not in json.dumps(w)
    finally:
        agent.proc.kill()
        agent.proc.wait(timeout=10)
        kill_leftover_runs(data_dir)


def test_a_preemption_does_not_name_another_tenants_workloads(tenant_agent: RunningAgent) -> None:
    url = tenant_agent.url + "/api/v1"
    sleepy = [PY, "-c", "import time; time.sleep(60)"]
    for i in range(2):  # research fills both time-sliced GPUs at priority 50
        m = manifest(f"secret-train-{i}", sleepy, gpu="{memory: 140GiB}", tenant="research")
        assert httpx.post(url + "/workloads", content=m, headers=h("research")).status_code == 200
    bully = manifest("bully", sleepy, gpu="{memory: 140GiB}", tenant="search").replace(
        "  type: service\n", "  type: service\n  priority: 100\n"
    )
    r = httpx.post(url + "/workloads", content=bully, headers=h("search"))
    assert r.status_code == 200, r.text
    decision = r.json()["results"][0]["decision"]
    assert decision["outcome"] == "placed" and decision["evicted"] == ["another tenant's workload"]
    assert "secret-train" not in r.text and "research/" not in r.text
    # nor does the stored placement, read back as the workload or the list
    mine = httpx.get(url + "/workloads/search/bully", headers=h("search"))
    listed = httpx.get(url + "/workloads", headers=h("search"))
    for text in (mine.text, listed.text):
        assert "secret-train" not in text and "research/" not in text
    assert mine.json()["placement"]["evicted"] == ["another tenant's workload"]
    # and the evicted one's own tenant is not told the other's name
    time.sleep(1)
    seen = httpx.get(url + "/workloads", headers=h("research")).json()["workloads"]
    moved = [w for w in seen if "preempted" in w["reason"]]
    assert moved and all("search/" not in w["reason"] for w in moved), seen
    assert "another tenant's workload" in moved[0]["reason"]
    events = httpx.get(url + "/events", headers=h("research")).text
    assert "search/bully" not in events and "bully" not in events


def test_a_tenants_token_makes_its_tenant_the_default(tenant_agent: RunningAgent) -> None:
    import os
    import subprocess

    url = tenant_agent.url + "/api/v1"
    text = manifest("mine", [PY, "-c", "import time; time.sleep(60)"]).replace(
        "metadata: {name: mine, tenant: default}", "metadata: {name: mine}"
    )
    assert "tenant" not in text.split("spec:")[0]
    r = httpx.post(url + "/workloads", content=text, headers=h("search"))
    assert r.status_code == 200 and r.json()["results"][0]["workload"] == "search/mine", r.text
    assert httpx.get(url + "/whoami", headers=h("search")).json() == {
        "tenant": "search",
        "admin": False,
    }
    assert httpx.get(url + "/whoami", headers=h("admin")).json()["admin"] is True
    env = {**os.environ, "GPUFRAC_TOKEN": TOKENS["search"]}
    out = subprocess.run(
        [PY, "-m", "gpufrac.cli", "describe", "workload", "mine", "--server", tenant_agent.url],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0 and "search/mine" in out.stdout, out.stdout + out.stderr


def test_a_tenant_cannot_hold_more_workloads_than_its_bound(tmp_path: Path) -> None:
    from tests.integration.conftest import tokens_yaml

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "gpufrac.yaml").write_text(
        "workload_users: agent\ntenants: {search: {max_workloads: 2}}\n"
    )
    (data_dir / "tokens.yaml").write_text(tokens_yaml())
    (data_dir / "tokens.yaml").chmod(0o600)  # tokens are the owner's alone
    port = free_port()
    agent = RunningAgent(f"http://127.0.0.1:{port}", data_dir, port, None)  # type: ignore[arg-type]
    agent.start()
    try:
        url = agent.url + "/api/v1"
        sleepy = ["sleep", "60"]

        def many(*names: str, tenant: str = "search") -> str:
            return "---\n".join(manifest(n, sleepy, tenant=tenant) for n in names)

        r = httpx.post(url + "/workloads", content=many("a", "b", "c"), headers=h("search"))
        assert r.status_code == 409 and "tenants.search.max_workloads" in r.text, r.text
        assert httpx.get(url + "/workloads", headers=h("admin")).json()["workloads"] == []
        ok = httpx.post(url + "/workloads", content=many("a", "b"), headers=h("search"))
        assert ok.status_code == 200
        assert (
            httpx.post(url + "/workloads", content=many("c"), headers=h("search")).status_code
            == 409
        )
        # changing one it has is no new workload; another tenant has its own bound
        assert (
            httpx.post(url + "/workloads", content=many("a"), headers=h("search")).status_code
            == 200
        )
        other = many("x", "y", "z", tenant="research")
        assert (
            httpx.post(url + "/workloads", content=other, headers=h("research")).status_code == 200
        )
    finally:
        agent.proc.kill()
        agent.proc.wait(timeout=10)
        kill_leftover_runs(data_dir)
