"""MPS daemons per MPS domain (runtime/mps.py): one GPU's daemon as ever, one daemon serving
several GPUs for a share of each (HAMi's ``nvidia.com/gpu: 2`` with ``gpucores``), through the
simulation's stand-in ``nvidia-cuda-mps-control`` (which refuses a device ordinal its daemon does
not serve, as a daemon does)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.devices.sim_tools import MPS_LOG, mps_server_pid, write_sim_tools
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.executor import ActionRefused
from gpufrac.runtime.mps import MpsDaemons, MpsDomain
from tests.conftest import kill_leftover_runs, settle

PY = sys.executable
SLEEP = "import time; time.sleep(60)"


def log_of(tools: Path) -> list[dict[str, str]]:
    path = tools / MPS_LOG
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def daemons(tmp_path: Path) -> MpsDaemons:
    return MpsDaemons(
        tmp_path / "shared/mps",
        log_root=tmp_path / "data/mps",
        enabled=True,
        tool_path=str(write_sim_tools(tmp_path / "bin")),
    )


def test_a_domain_of_one_device_keeps_its_uuid_and_one_of_several_a_stable_digest() -> None:
    assert MpsDomain(("GPU-a",)).key == "GPU-a"  # one GPU's pipe: ROOT/UUID/pipe, as ever
    pair = MpsDomain(("GPU-a", "GPU-b"))
    assert pair.key.startswith("domain-") and len(pair.key) == len("domain-") + 16
    assert pair.key == MpsDomain(("GPU-b", "GPU-a")).key  # the same GPUs, the same daemon
    assert pair.key != MpsDomain(("GPU-a", "GPU-c")).key
    assert pair.visible == "GPU-a,GPU-b"
    for bad in ((), ("GPU-a", "GPU-a"), ("../x",), ("GPU-a,GPU-b",)):
        with pytest.raises(ValueError):
            MpsDomain(bad)


def test_one_daemon_serves_a_domain_of_two_gpus(tmp_path: Path, daemons: MpsDaemons) -> None:
    pair = MpsDomain(("GPU-a", "GPU-b"))
    assert daemons.ensure(pair) == "started"
    pipe = daemons.pipe_dir(pair)
    assert pipe == tmp_path / "shared/mps" / pair.key / "pipe"
    assert daemons.ensure(pair) == "running"  # a second client: no second start
    (started,) = log_of(tmp_path / "bin")
    assert (started["command"], started["visible"], started["pipe"]) == (
        "-d",
        "GPU-a,GPU-b",  # both GPUs, as the daemon's CUDA_VISIBLE_DEVICES
        str(pipe),
    )
    # a client: the pipe, its limit on each of its two devices, its thread percentage
    assert daemons.client_env(pair, 4096, 30) == {
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M,1=4096M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }
    # server side: the default memory limit of each of the daemon's devices, and the limits of
    # the server it runs (the stand-in lists one) on each
    server = mps_server_pid(str(pipe))
    assert daemons.server_pids(pair) == {server}
    bounds = [
        "set_default_active_thread_percentage 40",
        "set_default_device_pinned_mem_limit 0 8192M",
        "set_default_device_pinned_mem_limit 1 8192M",
        f"set_active_thread_percentage {server} 40",
        f"set_device_pinned_mem_limit {server} 0 8192M",
        f"set_device_pinned_mem_limit {server} 1 8192M",
    ]
    assert daemons.bound(pair, 8192, 40) == bounds
    sent = log_of(tmp_path / "bin")
    assert [e["command"] for e in sent[1:]] == ["get_server_list", "get_server_list", *bounds]
    assert not any("error" in e for e in sent)  # the stand-in took device 1: it serves two
    # found again from its devices file (after an agent restart too), and as serving each GPU
    again = MpsDaemons(
        tmp_path / "shared/mps", log_root=tmp_path / "data/mps", enabled=True,
        tool_path=str(tmp_path / "bin"),
    )  # fmt: skip
    assert again.domains() == [pair]
    assert again.serving(MpsDomain(("GPU-b",))) == [pair]
    assert again.serving(MpsDomain(("GPU-c",))) == []
    again.stop(pair)
    assert not again.running(pair) and again.domains() == []
    assert log_of(tmp_path / "bin")[-1]["command"] == "quit"


def test_the_stand_in_refuses_a_device_its_daemon_does_not_serve(
    tmp_path: Path, daemons: MpsDaemons
) -> None:
    """As a daemon does: device 1 of a one-GPU daemon is no device (so the agent's per-device
    commands are checked against the devices each daemon serves)."""
    one = MpsDomain(("GPU-a",))
    daemons.ensure(one)
    assert daemons.bound(one, 1024, None)[1] == "set_default_device_pinned_mem_limit 0 1024M"
    done = subprocess.run(
        [str(tmp_path / "bin/nvidia-cuda-mps-control")],
        input=b"set_default_device_pinned_mem_limit 1 1024M\nset_device_pinned_mem_limit 7 0 2G\n",
        env={"CUDA_MPS_PIPE_DIRECTORY": str(daemons.pipe_dir(one))},
        capture_output=True,
        check=True,
    )
    assert done.stdout.decode().splitlines() == ["error: no device 1: the daemon serves 1"]
    assert [e.get("error") for e in log_of(tmp_path / "bin")[-2:]] == [
        "no device 1: the daemon serves 1",
        None,
    ]


# -- through the agent, on two simulated GPUs ------------------------------------------------------


@pytest.fixture
def two(data_dir: Path) -> Iterator[NvmlDevices]:
    dev = open_simulated("h200:2", data_dir)
    yield dev
    kill_leftover_runs(data_dir)  # whatever a failing test left running is stopped
    dev.close()


def job(name: str, devices: int) -> WorkloadSpec:
    gpu = GpuRequest(memory_mib=4096, compute_pct=30, devices=devices)
    return WorkloadSpec(name=name, gpu=gpu, command=(PY, "-c", SLEEP))


def test_a_pairs_daemon_starts_only_once_its_gpus_own_daemon_has_stopped(
    data_dir: Path, two: NvmlDevices
) -> None:
    """A one-GPU MPS workload ends; a share of both GPUs under MPS starts: the GPU's own daemon
    is stopped first (a GPU is served by one daemon), the pair's daemon started with both GPUs,
    its servers bounded on each device; its last workload gone, it is stopped."""
    agent = Agent(data_dir, two)
    tools = Path(two.tool_path or "")
    pair = MpsDomain(tuple(g.uuid for g in two.gpus()))
    try:
        agent.apply_workload(job("single", 1))
        settle(agent, "default/single", {"running"})
        (alone,) = agent.scheduler.allocations("default/single")
        single = str(agent.mps.pipe_dir(MpsDomain((two.gpus()[alone.gpu].uuid,))))
        assert agent.delete("default", "single")
        agent.apply_workload(job("pair", 2))
        settle(agent, "default/pair", {"running"})
        sent = log_of(tools)
        stopped = [i for i, e in enumerate(sent) if (e["command"], e["pipe"]) == ("quit", single)]
        starts = [(i, e["visible"]) for i, e in enumerate(sent) if e["command"] == "-d"]
        assert [v for _, v in starts] == [two.gpus()[alone.gpu].uuid, pair.visible]
        assert stopped and stopped[0] < starts[1][0]  # before the pair's daemon started
        assert not any("error" in e for e in sent)
        commands = [e["command"] for e in sent if e["pipe"] == str(agent.mps.pipe_dir(pair))]
        assert "set_default_device_pinned_mem_limit 1 4096M" in commands
    finally:
        agent.delete("default", "pair")
        agent.reconcile()
        agent.close()
    assert not agent.mps.running(pair)
    assert log_of(tools)[-1] == {**log_of(tools)[-1], "command": "quit"}


def test_a_domains_start_stops_idle_daemons_of_its_gpus_never_busy_ones(
    data_dir: Path, two: NvmlDevices
) -> None:
    """Before a domain's daemon starts, the executor stops the daemons of ours that serve one of
    its GPUs where no workload uses them (the idle pass may not have come yet), and refuses,
    naming the workload, where one does (a conflict the scheduler's rule rules out)."""
    agent = Agent(data_dir, two)
    pair = MpsDomain(tuple(g.uuid for g in two.gpus()))
    try:
        agent.apply_workload(job("single", 1))
        settle(agent, "default/single", {"running"})
        (alone,) = agent.scheduler.allocations("default/single")
        own = MpsDomain((two.gpus()[alone.gpu].uuid,))
        with pytest.raises(ActionRefused, match="in use by default/single"):
            agent.executor._clear_mps(pair)
        assert agent.mps.running(own)
        assert agent.delete("default", "single")  # no pass since: its daemon still runs
        assert agent.mps.running(own)
        agent.executor._clear_mps(pair)
        assert not agent.mps.running(own)
        (told,) = [e for e in agent.store.events() if e.kind == "mps_stopped"]
        assert told.message.endswith(f"its devices go to the daemon of {pair.describe()}")
    finally:
        agent.delete("default", "single")
        agent.close()
