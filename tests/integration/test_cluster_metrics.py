"""Every node's series through the control plane's ``/metrics``, read by a real Prometheus server:
``gpufrac control --local 3`` (a MIG node, an MPS node, a time-sliced node: simulated H200s),
scraped every 2 s by Debian's ``prometheus`` on loopback; every query of gpufrac's Grafana
dashboard and of the one written from the DCGM exporter's documented names
(``examples/monitoring/``) is run through Prometheus's HTTP API with each node picked in turn.
``promtool check metrics`` reads the same page.

On each node a workload failed its first attempt, was restarted and holds memory. On every node
the QoS arbiter acts (on the MIG node between two small workloads sharing one MIG instance
inside): a workload takes SDK turns back to back (on
simulated GPUs, which run no CUDA, it hands the arbiter each turn's GPU time itself, as the SDK does
with CUDA events' timing) and a low-priority one beside it is held paused. One workload waits: the
time-sliced node's two GPUs are taken, and it asks for both.

Prometheus and promtool come from ``make`` (a stamp, as Chromium does); without them the tests that
need them are skipped."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import kill_leftover_runs
from tests.integration.conftest import free_port
from tests.prom import samples, value

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "examples" / "monitoring"
NODES = ("local-0", "local-1", "local-2")
HOLD = "from gpufrac import sdk; import time; sdk.report_gpu_memory(700); time.sleep(600)"
# fails its first attempt (restart: always, a service's default), then holds memory
RESTARTED = (
    "import sys, time; from gpufrac import sdk; sdk.attempt() > 1 or sys.exit(3);"
    " sdk.report_gpu_memory(700); time.sleep(600)"
)
# turns back to back, each 0.2 s of (simulated) GPU work, told to the arbiter as CUDA events would
TURNS = (
    "import time; from gpufrac import sdk; sdk.report_gpu_use(500, 90)\n"
    "turns = sdk.TurnClient.from_env()\n"
    "while True:\n    turns.acquire(); time.sleep(0.2); turns.release(0.2)"
)


def workload(
    name: str, kind: str, gpu: dict[str, Any], sharing: str, code: str, priority: str = "normal"
) -> str:
    spec = {
        "type": "service",
        "command": [PY, "-c", code],
        "resources": {"gpu": gpu},
        "sharing": sharing,
        "priority": priority,
        "node_selector": {"gpufrac.io/kind": kind},
    }
    meta = {"name": name, "tenant": "obs"}
    return json.dumps(
        {"apiVersion": "gpufrac/v1", "kind": "Workload", "metadata": meta, "spec": spec}
    )


MIG, SHARE, SMALL = {"mig": "1g.18gb"}, {"memory": "10GiB"}, {"memory": "4GiB"}
MANIFESTS = "\n---\n".join(
    (
        workload("on-mig", "mig", MIG, "mig", RESTARTED),
        workload("on-mps", "mps", {"memory": "10GiB", "compute": "30%"}, "mps", RESTARTED),
        workload("on-ts", "timeslice", SHARE, "timeslice", RESTARTED),
        workload("turns-mps", "mps", SHARE, "mps", TURNS),
        workload("turns-ts", "timeslice", SHARE, "timeslice", TURNS),
        workload("background-mps", "mps", SHARE, "mps", HOLD, "low"),
        workload("background-ts", "timeslice", SHARE, "timeslice", HOLD, "low"),
        # two small ones on the MIG node, applied together: they share one instance inside
        # (docs/mig.md, the nesting rule), where the arbiter acts as on a time-sliced GPU
        workload("turns-mig", "mig", SMALL, "timeslice", TURNS),
        workload("background-mig", "mig", SMALL, "timeslice", HOLD, "low"),
        # both of the time-sliced node's GPUs, which are taken: it waits (low: it evicts no one)
        workload("waits", "timeslice", {"count": 2}, "exclusive", HOLD, "low"),
    )
)


def settled(w: dict[str, Any]) -> bool:
    """As the scenario means it to be: waiting, paused by the arbiter, restarted and running."""
    name, phase = w["name"], w["phase"]
    if name == "waits":
        return bool(phase == "pending")
    if name.startswith("background-"):
        return bool(phase == "paused")
    if name.startswith("on-") and not w["restarts"]:
        return False
    return bool(phase == "running")


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except httpx.HTTPError:
            got = None
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Cluster:
    url: str
    data: Path

    def metrics(self) -> str:
        r = httpx.get(self.url + "/metrics", timeout=20)
        assert r.status_code == 200, r.text
        return r.text


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("cluster-metrics")
    data = tmp / "control"
    port = free_port()
    args = [PY, "-m", "gpufrac.cli", "control", "--local", "3", "--port", str(port)]
    args += ["--node-port", str(free_port()), "--gateway-port", str(free_port())]
    args += ["--data-dir", str(data)]
    with open(tmp / "control.log", "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=log)
    c = Cluster(f"http://127.0.0.1:{port}", data)
    try:

        def nodes_alive() -> bool:
            ns = httpx.get(c.url + "/api/v1/nodes", timeout=10).json()["nodes"]
            return sorted(n["name"] for n in ns if n["state"] == "alive") == list(NODES)

        wait_for(nodes_alive, 60, "three nodes alive")
        r = httpx.post(c.url + "/api/v1/workloads", content=MANIFESTS, timeout=30)
        assert r.status_code == 200, r.text

        def all_settled() -> bool:
            ws = httpx.get(c.url + "/api/v1/workloads", timeout=10).json()["workloads"]
            return len(ws) == 10 and all(settled(w) for w in ws)

        wait_for(all_settled, 60, "the workloads running, restarted, paused and waiting")
        yield c
    finally:
        proc.terminate()  # the control plane stops its local nodes with it
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        for node in NODES:
            kill_leftover_runs(data / "nodes" / node)


def test_the_control_plane_relays_every_nodes_gpu_mig_and_workload_series(
    cluster: Cluster,
) -> None:
    def relayed() -> str | None:
        text = cluster.metrics()
        used = samples(text, "gpufrac_workload_gpu_memory_used_bytes")
        return text if {la["workload"] for la, _ in used} >= {"on-mig", "on-mps", "on-ts"} else None

    text = wait_for(relayed, 20, "each workload's memory on /metrics")
    for node in NODES:
        assert value(text, "gpufrac_cluster_node_metrics_up", node=node) == 1
        gpus = samples(text, "DCGM_FI_DEV_FB_USED", node=node)
        gpus = [(labels, v) for labels, v in gpus if "GPU_I_ID" not in labels]
        assert gpus, node
        # the node label is the control plane's; Hostname the node's own name (as DCGM's)
        assert {labels["Hostname"] for labels, _ in gpus} == {node}
    ((labels, used),) = samples(text, "gpufrac_workload_gpu_memory_used_bytes", workload="on-mig")
    assert used == 700 * 2**20
    assert labels["node"] == labels["Hostname"] == "local-0" and "GPU_I_ID" in labels
    # the MIG instance's own series, on its node, joins the workload's
    mig = samples(text, "DCGM_FI_DEV_FB_USED", node="local-0", GPU_I_ID=labels["GPU_I_ID"])
    assert [v for _, v in mig] == [700]
    by_node = {la["workload"]: la["node"] for la, _ in samples(text, "gpufrac_workload_gpu_info")}
    assert {w: n for w, n in by_node.items() if w.startswith("on-")} == {
        "on-mig": "local-0",
        "on-mps": "local-1",
        "on-ts": "local-2",
    }
    # the MIG node's two small ones share one instance inside, applied together
    placed = [
        httpx.get(f"{cluster.url}/api/v1/workloads/obs/{n}", timeout=10).json()["placement"]
        for n in ("turns-mig", "background-mig")
    ]
    assert placed[0]["mig"] is not None and placed[0]["mig"] == placed[1]["mig"], placed
    assert placed[0]["mode"] == placed[1]["mode"] == "timeslice"
    # what waits in a cluster waits at the control plane, on no node
    ((labels, waited),) = samples(text, "gpufrac_workload_pending_seconds")
    assert labels == {"tenant": "obs", "workload": "waits"} and 0 < waited < 120
    # one family each: no name declared twice on the page
    declared = re.findall(r"^# TYPE (\S+)", text, flags=re.M)
    assert len(declared) == len(set(declared))


PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="Debian's prometheus is not installed (make test installs it)",
)


@needs_prometheus
def test_promtool_finds_only_dcgms_own_camel_case_label(cluster: Cluster) -> None:
    """The control plane's page, and each node's own (what the control plane relays, read with the
    node's credential as the control plane reads it)."""
    pages = {"control plane": cluster.metrics()}
    for n in httpx.get(cluster.url + "/api/v1/nodes", timeout=10).json()["nodes"]:
        credential = (cluster.data / "nodes" / n["name"] / "node-credential").read_text().strip()
        r = httpx.get(
            n["address"] + "/cluster/v1/metrics",
            headers={"authorization": f"Bearer {credential}"},
            timeout=20,
        )
        assert r.status_code == 200, r.text
        pages[n["name"]] = r.text
    assert sorted(pages) == ["control plane", *NODES]
    assert PROMTOOL is not None
    for page, text in pages.items():
        run = subprocess.run(
            [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
        )
        complaints = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
        assert complaints, f"{page}: promtool found nothing: modelName should be its one complaint"
        assert all("modelName" in line or "camelCase" in line for line in complaints), complaints
        assert all(line.startswith("DCGM_FI_") for line in complaints), complaints


# (query, node) pairs with no series, and why: what the node's device cannot read is left out
# (never a 0), and what the node cannot have
NO_SERIES = {
    "gpufrac_workload_sm_utilization_percent": (
        {"local-1"},
        "under MPS NVML's per-process SM samples name the MPS server alone, its clients' use "
        "summed (read on an H200: ../shared/reference/h200/nvml-notes.md; the simulated NVML "
        "answers so too): no client's own use to report",
    ),
}


def queries(dashboard: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            out.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", query["query"]))
    return out


def expected_empty(expr: str, node: str) -> bool:
    return any(key in expr and node in nodes for key, (nodes, _) in NO_SERIES.items())


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert PROMETHEUS is not None
    tmp = tmp_path_factory.mktemp("prometheus")
    target = cluster.url.removeprefix("http://")
    config = tmp / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 2s, scrape_timeout: 2s, evaluation_interval: 2s}\n"
        "scrape_configs:\n"
        f"  - job_name: gpufrac\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = free_port()
    args = [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}"]
    args += [f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with open(tmp / "prometheus.log", "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(url + "/-/ready", timeout=5).status_code == 200, 30, "ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.post(prometheus + "/api/v1/query", data={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]  # type: ignore[no-any-return]


@needs_prometheus
@pytest.mark.parametrize(
    ("dashboard", "node_variable"), [("gpufrac.json", "node"), ("dcgm.json", "Hostname")]
)
def test_every_dashboard_query_returns_series_for_each_node(
    prometheus: str, dashboard: str, node_variable: str
) -> None:
    """Each query with each node picked (the dashboard's node variable), the others at All."""
    exprs = queries(json.loads((MONITORING / dashboard).read_text()))
    assert len(exprs) >= 10
    up = wait_for(lambda: query(prometheus, "up") or None, 20, "a first scrape")
    assert [s["value"][1] for s in up] == ["1"]

    def substituted(expr: str, node: str) -> str:
        for name, chosen in (
            ("__rate_interval", "5s"),
            (node_variable, node),  # a plain name: nothing to escape
            ("instance", ".*"),
            ("tenant", ".*"),
            ("deployment", ".*"),
            ("gpu", ".*"),
        ):
            expr = expr.replace("${" + name + "}", chosen).replace("$" + name, chosen)
        return expr

    per_node = [e for e in exprs if f"${node_variable}" in e]
    assert per_node, "the dashboard has no node variable"
    # each (query, node) must return series once: a scrape that runs past Prometheus's timeout
    # on this busy machine marks the page's series stale until the next one
    pairs = [(node, expr) for expr in per_node for node in NODES]
    empty = [(n, e) for n, e in pairs if expected_empty(e, n)]
    missing = set(pairs) - set(empty)
    deadline = time.monotonic() + 20
    with ThreadPoolExecutor(max_workers=8) as pool:

        def found(pair: tuple[str, str]) -> bool:
            return bool(query(prometheus, substituted(pair[1], pair[0])))

        while True:
            asked = sorted(missing)
            missing -= {
                pair for pair, got in zip(asked, pool.map(found, asked), strict=True) if got
            }
            if not missing:
                break
            if time.monotonic() > deadline:
                health = [
                    (e, [(r["metric"], r["value"][1]) for r in query(prometheus, e)])
                    for e in ("scrape_duration_seconds", "gpufrac_cluster_node_metrics_up")
                ]
                raise AssertionError(f"no series: {sorted(missing)}; {health}")
            time.sleep(0.5)
        # now that every node's series are there, what a node cannot have is not there
        for (node, expr), got in zip(empty, pool.map(found, empty), strict=True):
            assert not got, f"{expr!r} on {node}: expected none"
    for expr in exprs:  # the rest (the gateway's, the control plane's): valid PromQL
        query(prometheus, substituted(expr, NODES[0]))
    waiting = [e for e in per_node if "gpufrac_workload_pending_seconds" in e]
    assert waiting or dashboard == "dcgm.json"  # DCGM's names have no workloads
    for expr in waiting:  # what waits at the control plane, on no node: whichever node is picked
        for node in (".*", *NODES):
            got = query(prometheus, substituted(expr, node))
            assert [s["metric"]["workload"] for s in got] == ["waits"], (node, got)
            assert "Hostname" not in got[0]["metric"]
    # its phase is the control plane's to give, in the nodes' family (no node, no Hostname)
    got = query(prometheus, 'gpufrac_workload_state{phase="pending"}')
    assert [(s["metric"]["workload"], "node" in s["metric"]) for s in got] == [("waits", False)]
