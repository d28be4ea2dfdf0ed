"""Safe defaults through a real agent (real processes, simulated GPUs): nothing starves beside idle
services (a job paused beside a busy one, and its share: test_qos_priority.py), evictions are
shown, a workload that says `preemption: never` evicts no one, and a deployment whose replicas
cannot start answers within its timeout with their error on show."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import httpx

from tests.integration.conftest import RunningAgent
from tests.integration.test_agent_api import wait_for
from tests.integration.test_cli_contract import cli

PY = sys.executable
IDLE = "import time; time.sleep(120)"
# a second of CPU time: time paused (SIGSTOP) does not count, so paused 90% it takes about ten
JOB = "import time\nwhile time.process_time() < 1.0: pass\nprint('done')"
BUSY = (  # a service whose processes keep the (simulated) GPU's SMs busy, as NVML would show
    "import time\nfrom gpufrac.sdk import report_gpu_use\nreport_gpu_use(1024, 100)\n"
    "while True: pass\n"
)


def doc(name: str, kind: str, code: str, priority: str, **extra: str) -> str:
    more = "".join(f"  {k}: {v}\n" for k, v in extra.items())
    restart = "  restart: always\n" if kind == "service" else ""
    return (
        "apiVersion: gpufrac/v1\nkind: Workload\n"
        f"metadata: {{name: {name}}}\n"
        f"spec:\n  type: {kind}\n  command: {json.dumps([PY, '-c', code])}\n"
        "  resources: {gpu: {fraction: 0.3}}\n  sharing: timeslice\n"
        f"  priority: {priority}\n{restart}{more}"
    )


def post(agent: RunningAgent, text: str) -> dict[str, Any]:
    r = httpx.post(agent.url + "/api/v1/workloads", content=text, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def phase(ws: list[dict[str, Any]], name: str) -> str | None:
    return next((w["phase"] for w in ws if w["name"] == name), None)


def test_a_plain_job_beside_idle_services_is_never_paused(agent: RunningAgent) -> None:
    post(
        agent,
        doc("web-a", "service", IDLE, "high") + "---\n" + doc("web-b", "service", IDLE, "high"),
    )
    wait_for(agent, lambda ws: phase(ws, "web-a") == phase(ws, "web-b") == "running")
    post(agent, doc("batch", "job", JOB, "normal"))
    seen: set[str] = set()

    def done(ws: list[dict[str, Any]]) -> bool:
        seen.add(str(phase(ws, "batch")))
        return phase(ws, "batch") == "succeeded"

    wait_for(agent, done, timeout=60)
    assert "paused" not in seen, seen  # an idle service holds nothing
    events = httpx.get(agent.url + "/api/v1/workloads/default/batch", timeout=10).json()["events"]
    assert not [e for e in events if e["kind"] == "paused"]


def test_preemption_never_waits_instead_of_evicting(agent: RunningAgent) -> None:
    low = [
        doc(f"low-{i}", "service", IDLE, "low").replace("fraction: 0.3", "count: 1") for i in (0, 1)
    ]
    post(agent, "---\n".join(low))
    wait_for(agent, lambda ws: all(phase(ws, f"low-{i}") == "running" for i in (0, 1)))
    polite = doc("polite", "job", JOB, "high", preemption="never").replace(
        "fraction: 0.3", "count: 1"
    )
    result = post(agent, polite)["results"][0]
    assert result["decision"]["outcome"] == "pending" and not result["decision"]["evicted"]
    assert "preemption: never" in result["decision"]["reason"]
    time.sleep(1.0)
    ws = httpx.get(agent.url + "/api/v1/workloads", timeout=10).json()["workloads"]
    assert phase(ws, "low-0") == phase(ws, "low-1") == "running"
    rude = doc("rude", "job", JOB, "high").replace("fraction: 0.3", "count: 1")
    decided = post(agent, rude)["results"][0]["decision"]
    assert decided["outcome"] == "placed" and decided["evicted"]
    evict = [a for a in decided["actions"] if a["kind"] == "evict"]
    assert evict and "preempted by default/rude" in evict[0]["reason"]


def test_a_deployment_whose_replicas_cannot_start_answers_within_its_timeout(
    agent: RunningAgent,
) -> None:
    manifest = (
        "apiVersion: gpufrac/v1\nkind: Deployment\nmetadata: {name: broken}\nspec:\n"
        "  replicas: 1\n  timeout_seconds: 3\n  template:\n    model: no_such_module:nothing\n"
        "    resources: {gpu: {fraction: 0.2}}\n    sharing: timeslice\n"
    )
    r = httpx.post(agent.url + "/api/v1/deployments", content=manifest, timeout=30)
    assert r.status_code == 200, r.text
    url = r.json()["results"][0]["url"]
    deadline = time.monotonic() + 30
    while True:  # the gateway starts with the next reconcile pass
        started = time.monotonic()
        try:
            answer = httpx.post(url + "/predict", json={"inputs": [1]}, timeout=30)
            break
        except httpx.ConnectError:
            assert time.monotonic() < deadline, "the gateway never came up"
            time.sleep(0.2)
    took = time.monotonic() - started
    assert answer.status_code in (503, 504) and took < 3 + 2, (answer.status_code, took)

    def explained() -> dict[str, Any] | None:
        d = httpx.get(agent.url + "/api/v1/deployments/default/broken", timeout=10).json()
        return d if any(x.get("last_error") for x in d["replicas"]) else None

    deadline = time.monotonic() + 30
    while (found := explained()) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert found is not None
    assert any("no_such_module" in (x["last_error"] or "") for x in found["replicas"])
    # `gpufrac logs DEPLOYMENT` shows its replicas' output, each line named by its replica
    shown = cli(agent, "logs", "broken")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines and all(line.startswith("[broken-") for line in lines)
    assert "no_such_module" in shown.stdout
