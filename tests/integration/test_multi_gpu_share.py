"""A share of each of several GPUs (HAMi's ``nvidia.com/gpu: 2`` with ``gpumem``; issue 31)
through a real agent on simulated GPUs: the job sees both its GPUs, in its decision's order, with
its limit on each, and the fleet view shows its share on each GPU; over its limit on its second
GPU alone, it is stopped; with a compute cap (``gpucores``) it runs under MPS, one daemon serving
both GPUs; on a cluster it goes to the node that has two GPUs."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import gpufrac
from gpufrac.cluster.core import ClusterCore
from gpufrac.cluster.node import InProcessLink, NodeAgent
from gpufrac.devices import open_simulated
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.runtime.agent import Agent
from tests.integration.conftest import RunningAgent, close_nodes, running_agent

PY = sys.executable
SRC = Path(gpufrac.__file__).parents[1]  # the gpufrac under test, its SDK too (spec.env)
CODE = (
    "import os,time; print(os.environ['CUDA_VISIBLE_DEVICES'], "
    "os.environ['GPUFRAC_GPU_MEMORY_LIMIT_MIB'], flush=True); time.sleep(60)"
)
# within its limit on its first GPU, over it on its second (the sum apart)
HOG = (
    "from gpufrac import sdk; import time; sdk.report_gpu_use(1000); "
    "sdk.report_gpu_use(11000, device=1); time.sleep(60)"
)


def job(name: str, code: str) -> str:
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}}}\n"
        f'spec:\n  command: ["{PY}", "-c", "{code}"]\n  restart: never\n'
        f"  env: {{PYTHONPATH: {SRC}}}\n"
        "  resources: {gpu: {count: 2, memory: 10GiB}}\n"
    )


@pytest.fixture
def two_gpus(tmp_path: Path) -> Iterator[RunningAgent]:
    yield from running_agent(tmp_path, "h200:2")


def test_a_job_with_a_share_of_two_gpus_sees_both_and_holds_a_share_of_each(
    two_gpus: RunningAgent,
) -> None:
    url = two_gpus.url + "/api/v1"
    r = httpx.post(url + "/workloads", content=job("pair", CODE), timeout=10)
    assert r.status_code == 200, r.text
    lines: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not lines:
        lines = httpx.get(url + "/workloads/default/pair/logs", timeout=5).json()["lines"]
        time.sleep(0.1)
    w = httpx.get(url + "/workloads/default/pair", timeout=5).json()
    gpus = httpx.get(url + "/gpus", timeout=5).json()["gpus"]
    uuids = [g["uuid"] for g in sorted(gpus, key=lambda g: g["index"])]
    assert w["placement"]["gpus"] == uuids and w["placement"]["mode"] == "timeslice"
    assert lines == [f"{','.join(uuids)} 10240"]  # both GPUs, and its limit on each
    assert w["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    for g in gpus:  # its share on each GPU
        (share,) = g["allocations"]
        assert (share["name"], share["mode"], share["memory_mib"]) == ("pair", "timeslice", 10240)
        assert g["reserved_memory_mib"] == 10240
    assert httpx.delete(url + "/workloads/default/pair", timeout=10).status_code == 200
    # over its limit on its second GPU only: stopped, naming that GPU
    assert httpx.post(url + "/workloads", content=job("hog", HOG), timeout=10).status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        hog = httpx.get(url + "/workloads/default/hog", timeout=5).json()
        if hog["phase"] == "failed":
            break
        time.sleep(0.2)
    assert f"11000 MiB of GPU memory on {uuids[1]}, over its 10240 MiB limit" in hog["reason"]


# writes the MPS part of its environment to a file, then waits to be deleted
MPS_ENV = (
    "import json,os,sys,time; json.dump({k: v for k, v in os.environ.items() if "
    "k.startswith(('CUDA_', 'GPUFRAC_QOS_DOMAIN'))}, open(sys.argv[1] + '.tmp', 'w')); "
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(60)"
)


def test_a_compute_cap_on_two_gpus_runs_under_one_mps_daemon_serving_both(
    two_gpus: RunningAgent, tmp_path: Path
) -> None:
    """HAMi's README example (two vGPUs, 10 GiB and 30% of the SMs of each): under MPS on both
    GPUs, its environment names the one daemon's pipe directory, both GPUs, its limit on each of
    its two devices and its thread percentage; the stand-in daemon was started once, with both
    GPUs; when the workload ends, the daemon is stopped."""
    url = two_gpus.url + "/api/v1"
    out = tmp_path / "env.json"
    manifest = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: capped}\n"
        f'spec:\n  command: ["{PY}", "-c", "{MPS_ENV}", "{out}"]\n  restart: never\n'
        "  resources: {gpu: {nvidia.com/gpu: 2, nvidia.com/gpumem: 10240, "
        "nvidia.com/gpucores: 30}}\n"
    )
    r = httpx.post(url + "/workloads", content=manifest, timeout=10)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not out.exists():
        time.sleep(0.05)
    env = json.loads(out.read_text())
    w = httpx.get(url + "/workloads/default/capped", timeout=5).json()
    uuids = w["placement"]["gpus"]
    assert w["placement"]["mode"] == "mps" and len(set(uuids)) == 2
    pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
    assert pipe.endswith("/pipe") and Path(pipe).parent.name.startswith("domain-")
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M,1=10240M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["GPUFRAC_QOS_DOMAIN"] == uuids[0]  # arbitrated in its first GPU's domain
    log = two_gpus.data_dir / "simulated" / "bin" / "mps-control.log"
    sent = [json.loads(x) for x in log.read_text().splitlines()]
    daemons = [(e["visible"], e["pipe"]) for e in sent if e["command"] == "-d"]
    assert daemons == [(",".join(uuids), pipe)]  # one daemon, serving both GPUs
    ours = [e["command"] for e in sent if e["pipe"] == pipe]
    assert {
        "set_default_device_pinned_mem_limit 1 10240M",
        "set_default_active_thread_percentage 30",
    } <= set(ours)
    assert not any("error" in e for e in sent)
    for g in httpx.get(url + "/gpus", timeout=5).json()["gpus"]:  # its share on each GPU
        (share,) = g["allocations"]
        assert (share["name"], share["mode"], share["memory_mib"]) == ("capped", "mps", 10240)
    assert httpx.delete(url + "/workloads/default/capped", timeout=10).status_code == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (Path(pipe) / "control").exists():
        time.sleep(0.05)
    assert not (Path(pipe) / "control").exists()  # the daemon was told to quit
    assert [json.loads(x)["command"] for x in log.read_text().splitlines()][-1] == "quit"


def test_a_cluster_places_a_share_of_two_gpus_on_the_node_that_has_two(tmp_path: Path) -> None:
    """On a cluster (one control-plane core, two real node agents: one GPU and two GPUs), a
    share of each of two GPUs goes to the node with two, and runs there on both."""
    core = ClusterCore(lease_s=2.0)
    link = InProcessLink(core)
    nodes: dict[str, NodeAgent] = {}
    for name, fleet in (("n1", "h200:1"), ("n2", "h200:2")):
        data = tmp_path / name
        data.mkdir()
        settings = OperatorSettings(node_name=name, workload_users="agent")
        agent = Agent(data, open_simulated(fleet, data), settings, stop_grace=0.5)
        nodes[name] = NodeAgent(agent, link, fence_s=1.0)
        nodes[name].join()
    try:
        spec = WorkloadSpec(
            name="pair",
            tenant="a",
            gpu=GpuRequest(memory_mib=10240, devices=2),
            command=(PY, "-c", "import time; time.sleep(60)"),
        )
        with link.lock:
            d = core.decide(spec)
        assert d.outcome == "placed" and core.assigned["a/pair"].node == "n2"
        two = [f"n2/{g.uuid}" for g in nodes["n2"].agent.dev.gpus()]  # the core names NODE/UUID
        assert sorted(d.gpus) == sorted(two)
        phase = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and phase != "running":
            for n in nodes.values():
                phase = {s.key: s.phase for s in n.step()}.get("a/pair", phase)
            with link.lock:
                core.tick(link.clock())
            time.sleep(0.05)
        assert phase == "running"
        agent = nodes["n2"].agent
        assert [a.gpu for a in agent.scheduler.allocations("a/pair")] == [0, 1]
    finally:
        close_nodes(nodes.values())
