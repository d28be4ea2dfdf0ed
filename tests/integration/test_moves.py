"""Moves that make room, through a real agent on two simulated H100s in MIG mode: a replica in the
way of a 7g.80gb is replaced elsewhere under traffic through the gateway with no failed request,
then the 7g.80gb is placed by a re-cut; a job in the way is never moved; the CLI's describe and the
events say why (docs/scheduler.md, "Moves")."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import RunningAgent, running_agent
from tests.integration.test_serving import ROOT, load, wait_for


@pytest.fixture
def mig_agent(tmp_path: Path) -> Iterator[RunningAgent]:
    yield from running_agent(tmp_path, "h100:2:mig")


def apply(agent: RunningAgent, text: str) -> None:
    r = httpx.post(agent.url + "/api/v1/workloads", content=text, timeout=30)
    assert r.status_code == 200, r.text


def job(name: str, profile: str) -> str:
    return f"""
apiVersion: gpufrac/v1
kind: Workload
metadata: {{name: {name}}}
spec:
  command: [sleep, "600"]
  resources: {{gpu: {{mig: {profile}}}}}
"""


DEPLOYMENT = f"""
apiVersion: gpufrac/v1
kind: Deployment
metadata: {{name: web}}
spec:
  replicas: 1
  template:
    model: examples.serving.models:echo_sum
    workdir: {ROOT}
    resources: {{gpu: {{mig: 1g.10gb}}}}
"""


def get(agent: RunningAgent, path: str) -> Any:
    r = httpx.get(agent.url + path, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def workload(agent: RunningAgent, name: str) -> dict[str, Any]:
    data: dict[str, Any] = get(agent, f"/api/v1/workloads/default/{name}")
    return data


def replicas(agent: RunningAgent) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = get(agent, "/api/v1/deployments/default/web")["replicas"]
    return found


def gpu_of(agent: RunningAgent, name: str) -> str:
    return str(workload(agent, name)["placement"]["gpus"][0])


def test_a_replica_is_moved_under_traffic_and_the_large_request_placed(
    mig_agent: RunningAgent,
) -> None:
    agent = mig_agent
    apply(agent, DEPLOYMENT)
    wait_for(lambda: any(r["ready"] for r in replicas(agent)), 60, "a ready replica")
    apply(agent, job("fill", "4g.40gb"))  # GPU 0 full beside the replica ...
    apply(agent, job("fill2", "2g.20gb"))
    apply(agent, job("train", "1g.10gb"))  # ... so a job goes to GPU 1
    web0 = replicas(agent)[0]["name"]
    assert gpu_of(agent, "fill2") == gpu_of(agent, web0) != gpu_of(agent, "train")
    for name in ("fill", "fill2"):  # idle instances stay on GPU 0; its replica is in the way
        assert httpx.delete(f"{agent.url}/api/v1/workloads/default/{name}", timeout=30).is_success
    wait_for(lambda: workload(agent, "train")["phase"] == "running", 30, "the job running")
    train = workload(agent, "train")
    url = f"{agent.gateway}/serve/web/predict"
    result: list[list[dict[str, Any]]] = []
    traffic = threading.Thread(target=lambda: result.append(load(url, [4] * 6, 2.0)))
    traffic.start()
    time.sleep(1.0)

    apply(agent, job("big", "7g.80gb"))
    big = workload(agent, "big")
    assert big["phase"] == "pending", big
    why = big["placement"]["reason"]
    assert "waiting for 1 move(s)" in why and "1 replica(s) replaced first" in why, why
    moves = big["placement"]["moves"]
    assert [(m["workload"], m["how"]) for m in moves] == [(f"default/{web0}", "replace")]
    out = subprocess.run(
        [sys.executable, "-m", "gpufrac.cli", "describe", "workload", "big", "--server", agent.url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    line = next((x for x in out.stdout.splitlines() if x.strip().startswith("Move:")), "")
    assert f"default/{web0} off its 1g.10gb" in line, out.stdout + out.stderr

    wait_for(lambda: workload(agent, "big")["phase"] == "running", 90, "the 7g.80gb running")
    traffic.join(timeout=60)
    assert result and all(row["non_2xx"] == 0 and row["requests"] > 0 for row in result[0]), result
    assert gpu_of(agent, "big") != gpu_of(agent, "train")
    now = replicas(agent)
    assert [r["name"] for r in now] != [web0] and len(now) == 1
    assert gpu_of(agent, now[0]["name"]) == gpu_of(agent, "train")  # moved beside the job
    # the job was never moved: the same attempt, in the same place, never evicted
    after = workload(agent, "train")
    assert (after["attempts"], after["evictions"], after["placement"]) == (
        train["attempts"],
        0,
        train["placement"],
    )
    events = get(agent, "/api/v1/events?limit=200")["events"]
    said = {(e["kind"], e["subject"]) for e in events if e.get("cause") == "default/big"}
    assert ("moving", f"default/{web0}") in said and ("moved", f"default/{web0}") in said
    metrics = httpx.get(agent.url + "/metrics", timeout=10).text
    assert 'gpufrac_deployment_replica_moves_total{deployment="web",tenant="default"} 1.0' in (
        metrics
    )
