"""``/metrics``, the Grafana dashboard built on it, and the decision log, against one real agent
(simulated GPUs) with a MIG workload, a time-sliced one and a deployment that served requests.

The agent is shared by this module's tests (module scope): starting it and its replica costs a few
seconds, and the tests only read it."""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import kill_leftover_runs
from tests.integration.conftest import RunningAgent, free_port
from tests.prom import exported_names, samples, value

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "examples" / "monitoring" / "gpufrac.json"
REPORT = "from gpufrac import sdk; import time; sdk.report_gpu_memory(1500); time.sleep(120)"
REQUESTS = 5
MANIFESTS = f"""
apiVersion: gpufrac/v1
kind: Workload
metadata: {{name: mg}}
spec:
  type: service
  command: ["{sys.executable}", "-c", "{REPORT}"]
  resources: {{gpu: {{mig: 1g.18gb}}}}
---
apiVersion: gpufrac/v1
kind: Workload
metadata: {{name: ts}}
spec:
  type: service
  command: ["{sys.executable}", "-c", "{REPORT}"]
  resources: {{gpu: {{memory: 4GiB}}}}
  sharing: timeslice
---
apiVersion: gpufrac/v1
kind: Deployment
metadata: {{name: adder}}
spec:
  template:
    model: examples.serving.models:echo_sum
    workdir: {ROOT}
    resources: {{gpu: {{fraction: 0.2}}}}
    sharing: timeslice
  replicas: 1
"""


def wait_for(check: Callable[[], object], timeout: float = 60.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningAgent, str]]:
    """The agent (JSON decision log on stderr) once its workloads run and the deployment answered
    ``REQUESTS`` requests, and the text of a scrape taken after the agent read the gateway."""
    tmp = tmp_path_factory.mktemp("metrics")
    data_dir = tmp / "data"
    data_dir.mkdir()
    port = free_port()
    running = RunningAgent(f"http://127.0.0.1:{port}", data_dir, port, None, "h200:1:mig,h200:1")  # type: ignore[arg-type]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUFRAC_LOG_FORMAT", "json")
        running.start()
    try:
        r = httpx.post(running.url + "/api/v1/workloads", content=MANIFESTS, timeout=30)
        assert r.status_code == 200, r.text

        def all_running() -> bool:
            ws = httpx.get(running.url + "/api/v1/workloads", timeout=10).json()["workloads"]
            return len(ws) == 3 and all(w["phase"] == "running" for w in ws)

        wait_for(all_running, what="the workloads and the replica running")
        ready = f"{running.url}/api/v1/deployments/default/adder"
        wait_for(lambda: httpx.get(ready, timeout=10).json()["replicas_ready"] == 1, what="ready")
        # refused by the gateway: counted apart from every deployment (no such name)
        missing = httpx.post(f"{running.gateway}/serve/nothing/predict", content=b"{}", timeout=30)
        assert missing.status_code == 404, missing.text
        for _ in range(REQUESTS):
            answer = httpx.post(
                f"{running.gateway}/serve/adder/predict", content=b'{"inputs": [1, 2]}', timeout=30
            )
            assert answer.status_code == 200, answer.text

        def scraped() -> str | None:
            text = httpx.get(running.url + "/metrics", timeout=10).text
            used = samples(text, "gpufrac_workload_gpu_memory_used_bytes", workload="mg")
            answered = value(
                text, "gpufrac_gateway_request_duration_seconds_count", deployment="adder"
            )
            return text if used and answered == REQUESTS else None

        yield running, wait_for(scraped, timeout=20, what="the gateway's counts in /metrics")
    finally:
        running.proc.kill()
        running.proc.wait(timeout=10)
        kill_leftover_runs(data_dir)


def test_workload_series_carry_dcgm_gpu_and_mig_instance_labels(
    served: tuple[RunningAgent, str],
) -> None:
    agent, text = served
    gpus = httpx.get(agent.url + "/api/v1/gpus", timeout=10).json()["gpus"]
    by_uuid = {g["uuid"]: g for g in gpus}
    mg = httpx.get(agent.url + "/api/v1/workloads/default/mg", timeout=10).json()["placement"]
    gpu = by_uuid[mg["gpus"][0]]
    gi_id = next(
        i["gi_id"]
        for i in gpu["instances"]
        if (i["profile"], i["start"]) == (mg["mig"]["profile"], mg["mig"]["start"])
    )
    ((labels, used),) = samples(text, "gpufrac_workload_gpu_memory_used_bytes", workload="mg")
    assert used == 1500 * 2**20
    assert labels == {
        "tenant": "default",
        "workload": "mg",
        "gpu": str(gpu["index"]),
        "UUID": gpu["uuid"],
        "GPU_I_ID": str(gi_id),
        "GPU_I_PROFILE": "1g.18gb",
        "Hostname": socket.gethostname(),
        "source": "simulated",
    }
    # the same labels as the DCGM series of that MIG instance: the two join
    assert value(text, "DCGM_FI_DEV_FB_USED", UUID=gpu["uuid"], GPU_I_ID=str(gi_id)) is not None
    ts = httpx.get(agent.url + "/api/v1/workloads/default/ts", timeout=10).json()["placement"]
    ((labels, limit),) = samples(text, "gpufrac_workload_gpu_memory_limit_bytes", workload="ts")
    assert limit == 4 * 2**30
    assert labels["UUID"] == ts["gpus"][0] and labels["gpu"] == str(by_uuid[ts["gpus"][0]]["index"])
    assert "GPU_I_ID" not in labels  # not on MIG: absent, as with DCGM
    info = {s[0]["workload"]: s[0]["mode"] for s in samples(text, "gpufrac_workload_gpu_info")}
    assert info["mg"] == "mig" and info["ts"] == "timeslice"
    assert value(text, "gpufrac_workload_state", workload="ts", phase="running") == 1


def test_dcgm_fields_with_the_dcgm_exporters_labels_and_nothing_made_up(
    served: tuple[RunningAgent, str],
) -> None:
    """Per GPU DCGM's labels (gpu, UUID, pci_bus_id, device, modelName, Hostname, driver);
    utilization, which NVML does not give in MIG mode, has no series for the MIG GPU (not a 0),
    while GPM's engine and tensor pipe activity are there per GPU and per MIG instance (an H200:
    Hopper)."""
    agent, text = served
    gpus = httpx.get(agent.url + "/api/v1/gpus", timeout=10).json()["gpus"]
    mig = next(g for g in gpus if g["mig_mode"]["current"] == "enabled")
    whole = next(g for g in gpus if g["mig_mode"]["current"] != "enabled")
    ((labels, _),) = samples(text, "DCGM_FI_DEV_POWER_USAGE", UUID=mig["uuid"])
    assert labels == {
        "gpu": str(mig["index"]),
        "UUID": mig["uuid"],
        "pci_bus_id": mig["readings"]["pci_bus_id"],
        "device": f"nvidia{mig['index']}",
        "modelName": mig["name"],
        "Hostname": socket.gethostname(),
        "DCGM_FI_DRIVER_VERSION": "simulated",
    }
    assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.0", labels["pci_bus_id"])
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"):
        assert samples(text, name, UUID=mig["uuid"]) == []  # not supported in MIG mode
        assert value(text, name, UUID=whole["uuid"]) is not None
    for name in ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"):
        assert value(text, name, UUID=whole["uuid"]) is not None
    assert 0 <= (value(text, "DCGM_FI_DEV_POWER_USAGE", UUID=whole["uuid"]) or -1) <= 1000
    # GPM: per GPU, and per MIG instance (GPU_I_ID) with nvmlGpmMigSampleGet
    for name in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"):
        active = samples(text, name, UUID=mig["uuid"])
        per_instance = {labels.get("GPU_I_ID") for labels, _ in active}
        assert per_instance == {None, *(str(i["gi_id"]) for i in mig["instances"])}, name
        assert all(0 <= v <= 1 for _, v in active)
        assert value(text, name, UUID=whole["uuid"]) is not None


def test_gateway_series_per_deployment_and_replica(served: tuple[RunningAgent, str]) -> None:
    agent, text = served
    replicas = httpx.get(f"{agent.url}/api/v1/deployments/default/adder", timeout=10).json()
    (replica,) = [r["name"] for r in replicas["replicas"]]
    at = {"tenant": "default", "deployment": "adder", "replica": replica}
    assert value(text, "gpufrac_gateway_requests_total", **at, code="200") == REQUESTS
    buckets = samples(text, "gpufrac_gateway_request_duration_seconds_bucket", **at)
    assert [v for labels, v in buckets if labels["le"] == "+Inf"] == [REQUESTS]
    counts = [v for _, v in buckets]
    assert counts == sorted(counts)  # cumulative
    assert value(text, "gpufrac_gateway_requests_in_flight", **at) == 0
    lab = {"tenant": "default", "deployment": "adder"}
    assert value(text, "gpufrac_gateway_queue_depth", **lab) == 0
    for name in ("rejected", "retries", "errors", "cold_starts"):
        assert value(text, f"gpufrac_gateway_{name}_total", **lab) == 0
    assert value(text, "gpufrac_deployment_replicas", **lab, state="ready") == 1
    assert value(text, "gpufrac_deployment_replicas", **lab, state="wanted") == 1
    # the gateway's refusal of a name it has no deployment of: no deployment, no tenant
    ((labels, n),) = [
        (la, v)
        for la, v in samples(text, "gpufrac_gateway_requests_total")
        if "deployment" not in la
    ]
    assert (labels, n) == ({"code": "404"}, 1)


def _names_in(expr: str) -> set[str]:
    """The series names a PromQL expression uses: what is left once strings, label matchers,
    ranges and grouping clauses are taken out, and function and keyword names are skipped."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    keywords = {"bool", "and", "or", "unless", "offset", "inf", "nan"}
    return {
        m.group(1)
        for m in re.finditer(r"(?<![\w$.])([A-Za-z_:][\w:]*)\b(?!\s*\()", expr)
        if m.group(1) not in keywords
    }


def _queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            exprs.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", query["query"]))
    return exprs


def test_names_in_expressions() -> None:
    rate = 'sum by (deployment, le) (rate(x_bucket{a="b{c}"}[$__rate_interval])) / on(d) y > 0'
    assert _names_in(rate) == {"x_bucket", "y"}
    assert _names_in("histogram_quantile(0.99, z)") == {"z"}


def test_the_grafana_dashboard_uses_only_series_the_agent_exports(
    served: tuple[RunningAgent, str],
) -> None:
    _, text = served
    exported = exported_names(text)
    queries = _queries(json.loads(DASHBOARD.read_text()))
    assert len(queries) >= 20
    for expr in queries:
        names = _names_in(expr)
        assert names, f"no series in {expr!r}"
        assert names <= exported, f"{expr!r} names {sorted(names - exported)}, not exported"


def test_every_exported_series_is_documented(served: tuple[RunningAgent, str]) -> None:
    _, text = served
    docs = (ROOT / "docs" / "agent.md").read_text() + (ROOT / "docs" / "serving.md").read_text()
    families = {n.removesuffix("_total") for n in exported_names(text)}
    families = {re.sub(r"_(bucket|count|sum)$", "", n) for n in families}
    assert not [n for n in sorted(families) if n not in docs]


def test_the_decision_log_has_a_json_line_per_placement(served: tuple[RunningAgent, str]) -> None:
    agent, _ = served
    lines = (agent.data_dir.parent / "agent.log").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    placed = {r["workload"]: r for r in records if r["event"] == "placed"}
    mg = httpx.get(agent.url + "/api/v1/workloads/default/mg", timeout=10).json()["placement"]
    gpus = httpx.get(agent.url + "/api/v1/gpus", timeout=10).json()["gpus"]
    index = next(g["index"] for g in gpus if g["uuid"] == mg["gpus"][0])
    assert placed["default/mg"]["gpu"] == str(index)
    assert placed["default/mg"]["UUID"] == mg["gpus"][0]
    assert placed["default/mg"]["mode"] == "mig" and placed["default/mg"]["mig"].startswith("1g.")
    assert placed["default/ts"]["mode"] == "timeslice"
    assert {r["level"] for r in records} <= {"info", "warning"}
    started = [r for r in records if r["event"] == "started"]
    assert {r["workload"] for r in started} >= {"default/mg", "default/ts"}
