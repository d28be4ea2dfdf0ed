"""Deployments end to end: a real agent (simulated GPUs), real replica processes, real HTTP through
the gateway. Traffic comes from the project's own load generator (``gpufrac load``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufrac.cli.serve_cmds import run_load
from tests.integration.conftest import RunningAgent

ROOT = Path(__file__).resolve().parents[2]
BODY = b'{"inputs": [1, 2, 3]}'


def deployment(name: str, model: str, extra: str, *, env: str = "") -> str:
    return f"""
apiVersion: gpufrac/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  template:
    model: examples.serving.models:{model}
    workdir: {ROOT}
    resources: {{gpu: {{fraction: 0.2}}}}
    sharing: timeslice
    env: {{MARK: "{env}"}}
{extra}
"""


def apply(agent: RunningAgent, text: str) -> dict[str, Any]:
    r = httpx.post(agent.url + "/api/v1/deployments", content=text, timeout=30)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["results"][0]
    return result


def view(agent: RunningAgent, name: str) -> dict[str, Any]:
    r = httpx.get(f"{agent.url}/api/v1/deployments/default/{name}", timeout=10)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def wait_for(check: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def ready(agent: RunningAgent, name: str) -> int:
    return int(view(agent, name)["replicas_ready"])


def load(url: str, steps: list[int], seconds: float) -> list[dict[str, Any]]:
    return asyncio.run(run_load(url, BODY, steps, seconds, lambda n, got: None))


def test_requests_are_spread_and_a_dying_replica_costs_no_request(agent: RunningAgent) -> None:
    apply(agent, deployment("spread", "echo_sum", "  replicas: 3"))
    wait_for(lambda: ready(agent, "spread") == 3, what="3 ready replicas")
    url = f"{agent.gateway}/serve/spread/predict"
    r = httpx.post(url, content=BODY, timeout=10)
    assert r.status_code == 200 and r.json() == {"outputs": 6}
    rows = load(url, [6], 2.0)
    assert rows[0]["non_2xx"] == 0 and rows[0]["requests"] > 100
    served = [r["served"] for r in view(agent, "spread")["replicas"]]
    assert len(served) == 3 and min(served) > 0.15 * sum(served), (
        served
    )  # every replica took a share
    # kill one replica's process group while 6 clients keep sending: the gateway retries elsewhere
    victim = view(agent, "spread")["replicas"][0]["name"]
    runs = sorted((agent.data_dir / "runs" / "default" / victim).glob("g*-*"))
    pid = int((runs[-1] / "child.json").read_text().split('"pid": ')[1].split(",")[0])
    result: list[list[dict[str, Any]]] = []
    t = threading.Thread(target=lambda: result.append(load(url, [6], 3.0)))
    t.start()
    time.sleep(1.0)
    os.killpg(pid, signal.SIGKILL)
    t.join(timeout=30)
    assert result and result[0][0]["non_2xx"] == 0 and result[0][0]["requests"] > 100
    assert view(agent, "spread")["traffic"]["errors"] == 0


def test_429_comes_only_when_the_queue_is_full(agent: RunningAgent) -> None:
    extra = "  replicas: 1\n  max_concurrency: 1\n  queue_limit: 4"
    apply(agent, deployment("narrow", "slow_sum", extra))
    wait_for(lambda: ready(agent, "narrow") == 1, what="a ready replica")
    url = f"{agent.gateway}/serve/narrow/predict"
    within = load(url, [5], 1.5)[0]  # 1 in the replica + 4 waiting: the queue holds them all
    assert within["non_2xx"] == 0 and within["requests"] > 20
    over = load(url, [12], 1.5)[0]
    assert over["non_2xx"] > 0
    r = httpx.post(url, content=BODY, timeout=10)  # and after the burst, all is well again
    assert r.status_code == 200
    with httpx.Client(timeout=10) as c:
        burst: list[httpx.Response] = []
        threads = [
            threading.Thread(target=lambda: burst.append(c.post(url, content=BODY)))
            for _ in range(12)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    rejected = [r for r in burst if r.status_code == 429]
    assert rejected and all(r.headers.get("retry-after") == "1" for r in rejected)
    assert all(r.status_code in (200, 429) for r in burst)


def test_autoscaling_up_down_and_to_zero_with_a_cold_start(agent: RunningAgent) -> None:
    extra = (
        "  autoscale: {min_replicas: 0, max_replicas: 3, target_in_flight: 1,"
        " scale_up_delay_seconds: 0.5, scale_down_delay_seconds: 1,"
        " scale_to_zero_delay_seconds: 2, traffic_history_seconds: 1}\n"
        "  max_concurrency: 2"
    )
    apply(agent, deployment("elastic", "slow_sum", extra))
    time.sleep(1.5)
    assert view(agent, "elastic")["replicas"] == []  # min 0: nothing runs before traffic
    url = f"{agent.gateway}/serve/elastic/predict"
    started = time.monotonic()
    r = httpx.post(url, content=BODY, timeout=60)  # held by the gateway while a replica starts
    assert r.status_code == 200 and r.json() == {"outputs": 6}
    cold = time.monotonic() - started
    rows = load(url, [4, 4, 4], 2.0)
    assert all(row["non_2xx"] == 0 for row in rows)
    assert max(int(r["replicas_wanted"] or 0) for r in [view(agent, "elastic")]) >= 2
    wait_for(lambda: ready(agent, "elastic") >= 2, timeout=30, what="a second replica")
    wait_for(lambda: not view(agent, "elastic")["replicas"], timeout=60, what="scale to zero")
    kinds = [e["message"] for e in view(agent, "elastic")["events"] if e["kind"] == "scaled"]
    assert any("cold start" in k for k in kinds) and kinds[-1].startswith("0 replica")
    notes = [e["message"] for e in view(agent, "elastic")["events"] if e["kind"] == "autoscaler"]
    assert not any("QoS weight" in m for m in notes)  # alone on its GPUs: straight to more replicas
    assert cold < 30
    # a manual count on an autoscaled deployment is only where the autoscaler goes on from: said so
    r = httpx.post(
        f"{agent.url}/api/v1/deployments/default/elastic/scale", json={"replicas": 1}, timeout=10
    )
    assert r.status_code == 200 and "autoscaler goes on from this count" in r.json()["warnings"][0]


def test_a_rolling_update_drops_no_request(agent: RunningAgent) -> None:
    apply(agent, deployment("rolling", "echo_sum", "  replicas: 2", env="one"))
    wait_for(lambda: ready(agent, "rolling") == 2, what="2 ready replicas")
    old = view(agent, "rolling")["template"]
    url = f"{agent.gateway}/serve/rolling/predict"
    result: list[list[dict[str, Any]]] = []
    t = threading.Thread(target=lambda: result.append(load(url, [4, 4, 4, 4, 4], 2.0)))
    t.start()
    time.sleep(1.0)
    assert (
        apply(agent, deployment("rolling", "echo_sum", "  replicas: 2", env="two"))["result"]
        == "updated"
    )

    def rolled() -> bool:
        v = view(agent, "rolling")
        return v["template"] != old and all(r["template"] == v["template"] for r in v["replicas"])

    wait_for(rolled, timeout=60, what="only new replicas left")
    t.join(timeout=60)
    assert result and all(row["non_2xx"] == 0 and row["requests"] > 0 for row in result[0])
    assert ready(agent, "rolling") == 2


@pytest.fixture(autouse=True)
def _kill_gateway_children(agent: RunningAgent) -> Any:
    yield
    agent.proc.kill()  # the gateway and the arbiter follow their agent out


def test_a_model_replica_batches_concurrent_requests(agent: RunningAgent) -> None:
    text = (
        deployment("batched", "echo_sum", "  replicas: 1")
        .replace(
            "examples.serving.models:echo_sum", "tests.integration.serving_fixtures:batch_sizes"
        )
        .replace("    workdir:", "    max_batch_size: 4\n    max_wait_ms: 50\n    workdir:")
    )
    apply(agent, text)
    wait_for(lambda: ready(agent, "batched") == 1, what="a ready replica")
    url = f"{agent.gateway}/serve/batched/predict"
    sizes: list[int] = []
    with httpx.Client(timeout=30) as c:
        threads = [
            threading.Thread(
                target=lambda: sizes.append(c.post(url, content=BODY).json()["outputs"])
            )
            for _ in range(8)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert len(sizes) == 8 and max(sizes) > 1 and max(sizes) <= 4, sizes


def test_a_command_server_on_port_streams_through_the_gateway(agent: RunningAgent) -> None:
    text = f"""
apiVersion: gpufrac/v1
kind: Deployment
metadata: {{name: streamer}}
spec:
  template:
    command: [python, -m, tests.integration.serving_fixtures, chunked]
    workdir: {ROOT}
    resources: {{gpu: {{fraction: 0.2}}}}
    sharing: timeslice
  replicas: 1
"""
    apply(agent, text.replace("[python,", f"[{sys.executable},"))
    wait_for(lambda: ready(agent, "streamer") == 1, what="the server listening on $PORT")
    arrived: list[float] = []
    chunks: list[bytes] = []
    with httpx.stream("GET", f"{agent.gateway}/serve/streamer/stream", timeout=30) as r:
        assert r.status_code == 200 and r.headers.get("transfer-encoding") == "chunked"
        for chunk in r.iter_raw():
            arrived.append(time.monotonic())
            chunks.append(chunk)
    body = b"".join(chunks).decode()
    assert [line.split(" at ")[0] for line in body.splitlines()] == ["part 0", "part 1", "part 2"]
    assert arrived[-1] - arrived[0] > 0.4  # passed on as they came, not all at the end


def test_the_cli_verbs_for_deployments(agent: RunningAgent, tmp_path: Path) -> None:
    env = {**os.environ, "GPUFRAC_SERVER": agent.url, "COLUMNS": "200"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpufrac.cli", *args],
            capture_output=True, text=True, env=env, timeout=60, cwd=ROOT,
        )  # fmt: skip

    f = tmp_path / "d.yaml"
    f.write_text(deployment("verbs", "echo_sum", "  replicas: 1"))
    assert "deployment default/verbs created" in cli("apply", "-f", str(f)).stdout
    wait_for(lambda: ready(agent, "verbs") == 1, what="a ready replica")
    assert "verbs" in cli("get", "deployments").stdout
    assert cli("scale", "verbs", "--replicas", "2").returncode == 0
    wait_for(lambda: ready(agent, "verbs") == 2, what="2 ready replicas")
    shown = cli("describe", "deployment", "verbs").stdout
    assert "2 ready of 2 wanted" in shown and "set by gpufrac scale" in shown
    url = f"{agent.gateway}/serve/verbs/predict"
    loaded = cli("load", url, "--clients", "2,2", "--step", "1", "--json")
    steps = json.loads(loaded.stdout)["steps"]
    assert [s["clients"] for s in steps] == [2, 2] and all(s["non_2xx"] == 0 for s in steps)
    assert cli("delete", "verbs", "--deployment").returncode == 0
    wait_for(
        lambda: not httpx.get(agent.url + "/api/v1/workloads").json()["workloads"],
        what="no replica",
    )
    assert cli("describe", "deployment", "verbs").returncode == 1


def test_an_agent_restart_keeps_a_deployment_serving(agent: RunningAgent) -> None:
    apply(agent, deployment("durable", "echo_sum", "  replicas: 2"))
    wait_for(lambda: ready(agent, "durable") == 2, what="2 ready replicas")
    before = {r["name"] for r in view(agent, "durable")["replicas"]}
    agent.kill9()  # the gateway follows it out; the replicas run on under their shims
    agent.start()
    wait_for(lambda: ready(agent, "durable") == 2, what="the replicas taken back")
    assert {r["name"] for r in view(agent, "durable")["replicas"]} == before  # not started again
    url = f"{agent.gateway}/serve/durable/predict"

    def serving() -> bool:
        try:
            return httpx.post(url, content=BODY, timeout=10).status_code == 200
        except httpx.HTTPError:
            return False  # the new gateway is not listening yet

    wait_for(serving, what="the new gateway serving")
    assert load(url, [4], 1.0)[0]["non_2xx"] == 0


def test_the_weight_is_raised_first_only_where_a_replica_shares_its_gpu(
    agent: RunningAgent,
) -> None:
    neighbour = f"""
apiVersion: gpufrac/v1
kind: Workload
metadata: {{name: neighbour}}
spec:
  type: service
  command: [{sys.executable}, -c, "import time; time.sleep(600)"]
  resources: {{gpu: {{fraction: 0.5}}}}
  sharing: timeslice
"""
    r = httpx.post(agent.url + "/api/v1/workloads", content=neighbour, timeout=30)
    assert r.status_code == 200, r.text
    extra = (
        "  autoscale: {min_replicas: 1, max_replicas: 2, target_in_flight: 1,"
        " scale_up_delay_seconds: 0.5, scale_down_delay_seconds: 30}\n  max_concurrency: 2"
    )
    apply(agent, deployment("shared", "slow_sum", extra))
    wait_for(lambda: ready(agent, "shared") == 1, what="a ready replica")
    replica = view(agent, "shared")["replicas"][0]
    placed = httpx.get(agent.url + "/api/v1/workloads/default/neighbour", timeout=10).json()
    assert replica["gpus"] == placed["placement"]["gpus"]  # packed beside the neighbour
    load(f"{agent.gateway}/serve/shared/predict", [4, 4, 4], 2.0)
    events = [e["message"] for e in view(agent, "shared")["events"] if e["kind"] == "autoscaler"]
    assert any("QoS weight x2 first" in m for m in events), events
    replicas = httpx.get(agent.url + "/api/v1/workloads", timeout=10).json()["workloads"]
    weights = [w["spec"]["weight"] for w in replicas if w["name"].startswith("shared-")]
    assert 2 in weights or len(weights) == 2  # boosted live (or already a second replica)
