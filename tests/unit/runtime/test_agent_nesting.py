"""Workloads sharing one MIG instance inside, with real processes on simulated GPUs: each is
handed the MIG device, MPS workloads that instance's own daemon and pipe, and the QoS domain is
the instance."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpufrac.cli.tables import gpu_rows, table_text
from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.errors import InputError
from gpufrac.model.caller import ADMIN
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.fleet_view import read_fleet
from gpufrac.runtime.metrics import AgentCollector
from tests.conftest import kill_leftover_runs, settle
from tests.prom import samples

SLEEP = (sys.executable, "-c", "import time; time.sleep(60)")


@pytest.fixture
def dev(data_dir: Path) -> Iterator[NvmlDevices]:
    yield open_simulated("h100:1:mig", data_dir)
    kill_leftover_runs(data_dir)


def small(name: str, sharing: str, **gpu: int) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        gpu=GpuRequest(**gpu),  # type: ignore[arg-type]
        command=SLEEP,
        sharing=sharing,  # type: ignore[arg-type]
    )


def env_of(agent: Agent, key: str) -> dict[str, str]:
    return next(s.env for s in agent.reconcile() if s.key == key)


def test_mps_workloads_share_one_instance_through_its_own_daemon(
    data_dir: Path, dev: NvmlDevices
) -> None:
    agent = Agent(data_dir, dev)
    for name in ("a", "b"):
        agent.apply_workload(small(name, "mps", memory_mib=2048, compute_pct=5))
    for name in ("a", "b"):
        settle(agent, f"default/{name}", {"running"})
    (inst,) = dev.gpus()[0].instances  # one 1g.10gb, shared
    assert inst.placement.profile == "1g.10gb"
    a, b = env_of(agent, "default/a"), env_of(agent, "default/b")
    for env in (a, b):
        assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == inst.uuid
        assert env["GPUFRAC_QOS_DOMAIN"] == inst.uuid  # QoS between them: the instance
        assert env["CUDA_MPS_PIPE_DIRECTORY"].endswith(f"/{inst.uuid}/pipe")
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "35"  # 5 % of the GPU: 35 % of a 1g
        assert env["GPUFRAC_SHARING"] == "mps"
    assert a["CUDA_MPS_PIPE_DIRECTORY"] == b["CUDA_MPS_PIPE_DIRECTORY"]
    log = Path(dev.tool_path or "") / "mps-control.log"
    started = [json.loads(x) for x in log.read_text().splitlines()]
    daemons = [e for e in started if e["command"] == "-d"]
    assert [(e["visible"], e["pipe"]) for e in daemons] == [
        (inst.uuid, a["CUDA_MPS_PIPE_DIRECTORY"])
    ]  # one daemon, for the MIG device, with that instance's pipe
    assert "set_default_active_thread_percentage 35" in [e["command"] for e in started]
    nest = agent.scheduler.state.gpus[0].nests[inst.placement]
    assert (nest.mode, nest.mem_used, nest.compute_used) == ("mps", 4096, 70)
    agent.delete("default", "a")
    agent.delete("default", "b")
    agent.reconcile()
    assert "quit" in [json.loads(x)["command"] for x in log.read_text().splitlines()]
    agent.close()


def test_time_sliced_workloads_share_one_instance(data_dir: Path, dev: NvmlDevices) -> None:
    agent = Agent(data_dir, dev)
    for name in ("a", "b"):
        agent.apply_workload(small(name, "timeslice", memory_mib=3072))
    for name in ("a", "b"):
        settle(agent, f"default/{name}", {"running"})
    (inst,) = dev.gpus()[0].instances
    for name in ("a", "b"):
        env = env_of(agent, f"default/{name}")
        assert env["CUDA_VISIBLE_DEVICES"] == inst.uuid
        assert env["GPUFRAC_GPU_MEMORY_LIMIT_MIB"] == "3072"
        assert env["GPUFRAC_SHARING"] == "timeslice"
        assert not any(k.startswith("CUDA_MPS_") for k in env)
    # the QoS arbiter starts only once a domain holds two workloads: here, the shared instance
    agent.reconcile()
    assert agent.arbiter.running
    assert {"default/a", "default/b"} <= set(agent.arbiter.stats())
    agent.delete("default", "a")
    agent.delete("default", "b")
    agent.close()


def test_the_gpu_view_and_metrics_show_the_instance_and_its_shares(
    data_dir: Path, dev: NvmlDevices
) -> None:
    agent = Agent(data_dir, dev)
    for name in ("a", "b"):
        agent.apply_workload(small(name, "timeslice", memory_mib=2048))
    for name in ("a", "b"):
        settle(agent, f"default/{name}", {"running"})
    (inst,) = dev.gpus()[0].instances
    states = {s.key: s for s in agent.reconcile()}
    (gpu,) = read_fleet(agent, states, ADMIN)
    shares = [(a["name"], a["mode"], a["mig"]["profile"]) for a in gpu["allocations"]]
    assert shares == [("a", "timeslice", "1g.10gb"), ("b", "timeslice", "1g.10gb")]
    lines = table_text(*gpu_rows([gpu], wide=False)).splitlines()
    assert lines[2].split()[:5] == ["0", f"{inst.placement}", "2", "sharing", "(timeslice)"]
    assert [line.split()[:5] for line in lines[3:]] == [
        ["0", "->", "timeslice", "default/a", "running"],
        ["0", "->", "timeslice", "default/b", "running"],
    ]
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent, lambda: states))
    text = generate_latest(registry).decode()
    (found,) = samples(text, "gpufrac_mig_instance_workloads")
    assert found[1] == 2
    assert (found[0]["GPU_I_PROFILE"], found[0]["mode"]) == ("1g.10gb", "timeslice")
    info = samples(text, "gpufrac_workload_gpu_info", GPU_I_PROFILE="1g.10gb", mode="timeslice")
    assert sorted(labels["workload"] for labels, _ in info) == ["a", "b"]
    agent.delete("default", "a")
    agent.delete("default", "b")
    agent.close()


def test_replicas_applied_together_share_a_new_instance(data_dir: Path, dev: NvmlDevices) -> None:
    agent = Agent(data_dir, dev)
    got = agent.apply_new_workloads([small(f"r{i}", "auto", memory_mib=2048) for i in range(2)])
    assert [(d.outcome, d.mode) for d in got] == [("placed", "timeslice")] * 2
    for i in range(2):
        settle(agent, f"default/r{i}", {"running"})
    (inst,) = dev.gpus()[0].instances
    assert {env_of(agent, f"default/r{i}")["CUDA_VISIBLE_DEVICES"] for i in range(2)} == {inst.uuid}
    with pytest.raises(InputError, match="stored already"):
        agent.apply_new_workloads([small("r0", "auto", memory_mib=2048)])
    agent.delete("default", "r0")
    agent.delete("default", "r1")
    agent.close()


def test_a_share_over_its_memory_is_stopped_and_its_neighbour_runs_on(
    data_dir: Path, dev: NvmlDevices
) -> None:
    """The instance bounds the shares together, not each: the watchdog bounds each, as on a
    time-sliced GPU."""
    agent = Agent(data_dir, dev, stop_grace=2)
    hog = (
        "import time\nfrom gpufrac import sdk\n"
        "sdk.report_gpu_memory(sdk.memory_limit_mib() * 2)\ntime.sleep(60)\n"
    )
    specs = [
        WorkloadSpec(
            name="hog",
            gpu=GpuRequest(memory_mib=2048),
            command=(sys.executable, "-c", hog),
            sharing="timeslice",
            restart="never",
        ),
        small("calm", "timeslice", memory_mib=2048),
    ]
    got = agent.apply_new_workloads(specs)
    assert got[0].mig == got[1].mig and got[0].mode == "timeslice"
    state = settle(agent, "default/hog", {"failed"}, timeout=30)
    assert "over its 2048 MiB limit" in state.reason and "4096 MiB" in state.reason
    assert settle(agent, "default/calm", {"running"}).phase == "running"
    agent.delete("default", "calm")
    agent.close()


def test_an_operator_layout_that_takes_a_shared_instance_names_and_moves_its_shares(
    data_dir: Path, dev: NvmlDevices
) -> None:
    from gpufrac.model.mig import MigPlacement
    from gpufrac.runtime.mig_apply import ApplyRefused

    agent = Agent(data_dir, dev)
    got = agent.apply_new_workloads([small(f"r{i}", "timeslice", memory_mib=2048) for i in (0, 1)])
    for i in (0, 1):
        settle(agent, f"default/r{i}", {"running"})
    uuid = dev.gpus()[0].uuid
    elsewhere = [MigPlacement(0, "3g.40gb")]  # the shared instance is not in it
    with pytest.raises(ApplyRefused, match="default/r0, default/r1"):
        agent.set_mig_layout(uuid, True, elsewhere)
    agent.set_mig_layout(uuid, True, elsewhere, drain=True)
    assert got[0].mig not in {i.placement for i in dev.gpus()[0].instances}
    for i in (0, 1):  # placed again elsewhere, or waiting: not on the instance that went
        assert all(a.mig != got[0].mig for a in agent.scheduler.allocations(f"default/r{i}"))
    assert agent.scheduler.state.violations(False, {}) == []
    agent.close()
