"""The agent core with real processes on simulated GPUs: env handed over, restarts with backoff,
re-attachment after a restart, never running a workload twice."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufrac.config import shared_path
from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.devices.sim_tools import mps_server_pid
from gpufrac.errors import InputError
from gpufrac.model.settings import OperatorSettings, TenantQuota
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.cgroups import detect
from gpufrac.runtime.shim import LOG, cgroup_of, read_status
from tests.conftest import kill_leftover_runs, settle

PY = sys.executable


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def job(name: str, code: str, **kw: object) -> WorkloadSpec:
    gpu = kw.pop("gpu", GpuRequest(memory_mib=4096))
    return WorkloadSpec(name=name, gpu=gpu, command=(PY, "-c", code), **kw)  # type: ignore[arg-type]


def state_env(agent: Agent, key: str) -> dict[str, str]:
    return next(s.env for s in agent.reconcile() if s.key == key)


@pytest.fixture
def dev(data_dir: Path) -> Iterator[NvmlDevices]:
    yield open_simulated("h200:1:mig,h200:1", data_dir)
    kill_leftover_runs(data_dir)  # whatever a failing test left running is stopped


def test_a_job_runs_with_its_gpu_in_the_environment(data_dir: Path, dev: NvmlDevices) -> None:
    agent = Agent(data_dir, dev)
    code = (
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], "
        "os.environ['GPUFRAC_GPU_MEMORY_LIMIT_MIB'])"
    )
    what, decision = agent.apply_workload(job("env", code, sharing="timeslice"))
    assert what == "created" and decision is not None and decision.mode == "timeslice"
    state = settle(agent, "default/env", {"succeeded"})
    assert state.exit_code == 0
    log = next((data_dir / "runs" / "default" / "env").glob("g1-1")) / LOG
    assert log.read_text().split() == [dev.gpus()[1].uuid, "4096"]
    assert agent.apply_workload(job("env", code, sharing="timeslice"))[0] == "unchanged"


def test_a_mig_workload_gets_its_instance_created_and_its_mig_uuid(
    data_dir: Path, dev: NvmlDevices
) -> None:
    agent = Agent(data_dir, dev)
    agent.apply_workload(
        job(
            "mig",
            "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])",
            gpu=GpuRequest(mig_profile="1g.18gb"),
        )
    )
    settle(agent, "default/mig", {"succeeded"})
    inst = dev.gpus()[0].instances
    assert [str(i.placement) for i in inst] == ["1g.18gb@6"]
    assert (data_dir / "runs/default/mig/g1-1" / LOG).read_text().strip() == inst[0].uuid


def test_on_failure_restarts_with_backoff_until_success(
    data_dir: Path, dev: NvmlDevices, tmp_path: Path
) -> None:
    clock = Clock()
    agent = Agent(data_dir, dev, clock=clock)
    counter = tmp_path / "count"
    code = (
        f"import pathlib,sys; p=pathlib.Path({str(counter)!r}); n=int(p.read_text()) if "
        "p.exists() else 0; p.write_text(str(n+1)); sys.exit(0 if n >= 2 else 1)"
    )
    agent.apply_workload(job("flaky", code))
    state = settle(agent, "default/flaky", {"backoff"})
    assert state.attempts == 1 and state.exit_code == 1
    clock.offset += 1.5  # first backoff: 1 s
    state = settle(agent, "default/flaky", {"backoff"})
    assert state.attempts == 2 and "in 2s" in state.reason  # doubled
    clock.offset += 2.5
    state = settle(agent, "default/flaky", {"succeeded"})
    assert state.attempts == 3
    assert [e.kind for e in agent.store.events("default/flaky")].count("restarted") == 2


def test_backoff_limit_fails_the_job_and_frees_its_gpu(data_dir: Path, dev: NvmlDevices) -> None:
    clock = Clock()
    agent = Agent(data_dir, dev, clock=clock)
    agent.apply_workload(job("bad", "raise SystemExit(7)", backoff_limit=1))
    settle(agent, "default/bad", {"backoff"})
    clock.offset += 2
    state = settle(agent, "default/bad", {"failed"})
    assert state.attempts == 2 and "exited with 7" in state.reason
    assert agent.scheduler.allocations("default/bad") == []


def test_a_restarted_agent_reattaches_and_never_runs_a_workload_twice(
    data_dir: Path, dev: NvmlDevices
) -> None:
    first = Agent(data_dir, dev)
    first.apply_workload(
        job("svc", "import time; time.sleep(60)", type="service", restart="always")
    )
    settle(first, "default/svc", {"running"})
    pid = read_status(data_dir / "runs/default/svc/g1-1").child_pid
    cgroup = cgroup_of(data_dir / "runs/default/svc/g1-1")
    assert (cgroup is not None and cgroup.pids() == {pid}) or not first.runs.cgroups.usable
    first.close()  # the agent goes away; the shim does not
    second = Agent(data_dir, open_simulated("h200:1:mig,h200:1", data_dir))
    state = settle(second, "default/svc", {"running"})
    assert state.attempts == 1 and read_status(data_dir / "runs/default/svc/g1-1").child_pid == pid
    assert cgroup is None or cgroup.pids() == {pid}  # its cgroup too, as it was
    assert second.scheduler.allocations("default/svc")  # its placement was taken back, not re-made
    assert second.delete("default", "svc")
    assert not (data_dir / "runs/default/svc").exists()
    assert second.runs.wait_stopped(10)
    assert cgroup is None or not cgroup.exists()  # delete leaves no cgroup behind


@pytest.mark.skipif(
    "memory" not in detect().places, reason="no writable memory cgroup controller here"
)
def test_a_workload_over_its_host_memory_is_stopped_and_reported(
    data_dir: Path, dev: NvmlDevices
) -> None:
    agent = Agent(data_dir, dev)
    hog = "b = []\nwhile True:\n    b.append(bytearray(8 * 2**20))\n"
    agent.apply_workload(job("hog", hog, restart="never", host_memory_mib=64))
    state = settle(agent, "default/hog", {"failed"})
    assert "more host memory than its 64 MiB host_memory limit" in state.reason
    for _ in range(3):
        agent.reconcile()
    assert [e.kind for e in agent.store.events("default/hog")].count("memory_limit") == 1


def test_on_failure_still_applies_to_a_job_that_failed_while_the_agent_was_down(
    data_dir: Path, dev: NvmlDevices
) -> None:
    clock = Clock()
    first = Agent(data_dir, dev, clock=clock)
    first.apply_workload(job("crash", "import time; time.sleep(0.8); raise SystemExit(2)"))
    settle(first, "default/crash", {"running"})  # its MIG instance made, its process started
    first.close()
    time.sleep(1.5)  # it fails while no agent runs
    second = Agent(data_dir, open_simulated("h200:1:mig,h200:1", data_dir), clock=clock)
    clock.offset += 5
    state = settle(second, "default/crash", {"starting", "running", "backoff"})
    assert state.attempts == 2


def test_changing_a_spec_replaces_it_and_a_refused_one_stores_nothing(
    data_dir: Path, dev: NvmlDevices
) -> None:
    agent = Agent(data_dir, dev)
    agent.apply_workload(
        job("svc", "import time; time.sleep(60)", type="service", restart="always")
    )
    settle(agent, "default/svc", {"running"})
    old = read_status(data_dir / "runs/default/svc/g1-1")
    what, _ = agent.apply_workload(
        job("svc", "import time; time.sleep(61)", type="service", restart="always")
    )
    assert what == "replaced"
    state = settle(agent, "default/svc", {"running"})
    assert state.generation == 2 and not read_status(data_dir / "runs/default/svc/g2-1").done
    assert old.child_pid != read_status(data_dir / "runs/default/svc/g2-1").child_pid
    what, decision = agent.apply_workload(job("huge", "pass", gpu=GpuRequest(memory_mib=10**7)))
    assert what == "refused" and decision is not None and "could ever hold" in decision.reason
    assert agent.store.workload("default", "huge") is None
    agent.delete("default", "svc")


def test_a_workload_over_its_memory_is_stopped_by_the_watchdog(
    data_dir: Path, dev: NvmlDevices
) -> None:
    """On simulated GPUs a workload reports its memory through gpufrac.sdk; the agent reads it back
    through the device adapter, as NVML's per-process memory on a real GPU, and stops it when
    over."""
    agent = Agent(data_dir, dev, stop_grace=2)
    code = (
        "import time\nfrom gpufrac import sdk\n"
        "assert sdk.report_gpu_memory(sdk.memory_limit_mib() // 2)\ntime.sleep(1)\n"
        "sdk.report_gpu_memory(sdk.memory_limit_mib() * 3)\ntime.sleep(60)\n"
    )
    agent.apply_workload(job("hog", code, sharing="timeslice", restart="never"))
    state = settle(agent, "default/hog", {"failed"}, timeout=30)
    assert "over its 4096 MiB limit" in state.reason and "12288 MiB" in state.reason
    assert [e.kind for e in agent.store.events("default/hog")].count("memory_limit") == 1
    calm = job(
        "calm",
        "from gpufrac import sdk\nimport time\nsdk.report_gpu_memory(1000)\ntime.sleep(1)\n",
        sharing="timeslice",
    )
    agent.apply_workload(calm)
    assert settle(agent, "default/calm", {"succeeded"}).exit_code == 0


@pytest.mark.skipif(not detect().usable, reason="no writable cgroup hierarchy here")
def test_the_watchdog_counts_a_process_that_left_the_workloads_group(
    data_dir: Path, dev: NvmlDevices
) -> None:
    """The whole cgroup is counted: a child that called setsid is still the workload's."""
    agent = Agent(data_dir, dev, stop_grace=2)
    code = (
        "import os, time\nfrom gpufrac import sdk\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    sdk.report_gpu_memory(sdk.memory_limit_mib() * 2)\n"
        "time.sleep(60)\n"
    )
    agent.apply_workload(job("escapee", code, sharing="timeslice", restart="never"))
    state = settle(agent, "default/escapee", {"failed"}, timeout=30)
    assert "over its 4096 MiB limit" in state.reason and "8192 MiB" in state.reason


@pytest.mark.skipif(not detect().usable, reason="no writable cgroup hierarchy here")
def test_the_views_count_a_process_that_left_the_workloads_group(
    data_dir: Path, dev: NvmlDevices
) -> None:
    """The fleet view and the memory reading ask the workload's runner which processes are its,
    as the watchdog does: its setsid child's GPU memory is the workload's too."""
    from gpufrac.model.caller import ADMIN
    from gpufrac.runtime.fleet_view import read_fleet

    agent = Agent(data_dir, dev, stop_grace=2)
    code = (
        "import os, time\nfrom gpufrac import sdk\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    sdk.report_gpu_memory(1000)\n"
        "    time.sleep(60)\n"
        "sdk.report_gpu_memory(500)\n"
        "time.sleep(60)\n"
    )
    agent.apply_workload(job("svc", code, type="service", sharing="timeslice"))
    deadline = time.monotonic() + 20
    while True:
        states = {s.key: s for s in agent.reconcile()}
        use = agent.memory_use("default", "svc", state=states["default/svc"])
        if use is not None and use.mib == 1500:
            break
        assert time.monotonic() < deadline, (use, states["default/svc"])
        time.sleep(0.05)
    assert len(use.pids) == 2
    fleet = read_fleet(agent, states, ADMIN)
    (entry,) = [a for g in fleet for a in g["allocations"] if a["name"] == "svc"]
    assert entry["used_memory_mib"] == 1500
    assert agent.delete("default", "svc")


def test_the_attempt_number_is_handed_over(data_dir: Path, dev: NvmlDevices) -> None:
    clock = Clock()
    agent = Agent(data_dir, dev, clock=clock)
    agent.apply_workload(
        job("once", "from gpufrac import sdk\nraise SystemExit(1 if sdk.attempt() == 1 else 0)")
    )
    settle(agent, "default/once", {"backoff"})
    clock.offset += 2
    assert settle(agent, "default/once", {"succeeded"}).attempts == 2


def test_cordon_drain_and_an_xid_move_workloads_off_a_gpu(data_dir: Path, dev: NvmlDevices) -> None:
    from gpufrac.devices.simfleet import SimulatedFleet

    dev2 = open_simulated("h200:3", data_dir / "three")
    agent = Agent(data_dir / "three", dev2)
    svc = job(
        "svc", "import time; time.sleep(60)", type="service", restart="always", sharing="timeslice"
    )
    agent.apply_workload(svc)
    first = settle(agent, "default/svc", {"running"}).decision
    assert first is not None
    gpu_a = first.gpus[0]
    moved = agent.drain(gpu_a)
    assert moved[0].outcome == "placed" and moved[0].gpus[0] != gpu_a
    second = settle(agent, "default/svc", {"running"})
    assert second.decision is not None and second.decision.gpus[0] != gpu_a
    assert gpu_a in agent.store.cordons()
    with pytest.raises(InputError, match="another gpufrac agent"):
        Agent(data_dir / "three", dev2)  # one agent per data directory
    gpu_b = second.decision.gpus[0]
    SimulatedFleet.open("h200:3", data_dir / "three").inject_xid(gpu_b, 79)
    third = settle(agent, "default/svc", {"running"})
    assert third.decision is not None and third.decision.gpus[0] not in (gpu_a, gpu_b)
    assert "xid 79" in agent.store.cordons()[gpu_b]
    agent.delete("default", "svc")
    agent.close()
    again = Agent(
        data_dir / "three", open_simulated("h200:3", data_dir / "three")
    )  # cordons persist
    assert not again.scheduler.state.by_uuid[gpu_a].schedulable
    again.uncordon(gpu_a)
    assert again.scheduler.state.by_uuid[gpu_a].schedulable
    again.close()


def test_a_qos_change_applies_live_without_a_restart(data_dir: Path, dev: NvmlDevices) -> None:
    agent = Agent(data_dir, dev)
    agent.apply_workload(
        job("svc", "import time; time.sleep(60)", type="service", restart="always")
    )
    first = settle(agent, "default/svc", {"running"})
    pid = read_status(data_dir / "runs/default/svc/g1-1").child_pid
    changed = job(
        "svc", "import time; time.sleep(60)", type="service", restart="always",
        priority=100, qos="latency", weight=3, min_share_milli=100,
    )  # fmt: skip
    assert agent.apply_workload(changed) == ("updated", None)
    state = settle(agent, "default/svc", {"running"})
    assert state.generation == first.generation
    assert read_status(data_dir / "runs/default/svc/g1-1").child_pid == pid
    assert agent.scheduler.requests["default/svc"].priority == 100
    assert any(
        e.kind == "qos_changed" and "weight: 1 -> 3" in e.message for e in agent.store.events()
    )
    assert state.env["GPUFRAC_ARBITER"].endswith("arbiter.sock")
    agent.delete("default", "svc")
    agent.close()


def test_mps_workloads_get_the_mps_environment(data_dir: Path, dev: NvmlDevices) -> None:
    agent = Agent(data_dir, dev)
    code = (
        "import os; print(os.environ['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'], "
        "os.environ['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'], "
        "os.environ['CUDA_MPS_PIPE_DIRECTORY'])"
    )
    agent.apply_workload(
        job("m", code, gpu=GpuRequest(memory_mib=4096, compute_pct=25), sharing="mps")
    )
    settle(agent, "default/m", {"succeeded"})
    limit, pct, pipe = (data_dir / "runs/default/m/g1-1" / LOG).read_text().split()
    assert (limit, pct) == ("0=4096M", "25")
    assert state_env(agent, "default/m")["CUDA_MPS_CLIENT_PRIORITY"] == "1"  # a job: throughput
    # the pipe lies where a workload running as a tenant's uid can reach it: not in the data
    # directory
    assert not Path(pipe).is_relative_to(data_dir) and pipe.endswith("/pipe")
    assert Path(pipe).is_relative_to(shared_path(data_dir))
    # the daemon's log directory stays the agent's: it is not handed to workloads
    assert "CUDA_MPS_LOG_DIRECTORY" not in state_env(agent, "default/m")
    # simulated GPUs: the stand-in control daemon on the simulation's PATH was started
    assert agent.mps.enabled and "mps_started" in [e.kind for e in agent.store.events()]
    # two more on the daemon's GPU at once: it is started once for them, not once each
    before = [e.kind for e in agent.store.events()].count("mps_started")
    for name in ("m2", "m3"):
        agent.apply_workload(
            job(
                name,
                "import time; time.sleep(30)",
                gpu=GpuRequest(memory_mib=4096, compute_pct=25),
                sharing="mps",
            )
        )
    placed = [settle(agent, f"default/{n}", {"running"}).decision for n in ("m2", "m3")]
    assert len({tuple(d.gpus) for d in placed if d is not None}) == 1  # one GPU, one daemon
    assert [e.kind for e in agent.store.events()].count("mps_started") == before + 1
    for name in ("m2", "m3"):
        agent.delete("default", name)
    agent.close()


def test_mps_servers_are_bounded_to_the_largest_limits_of_their_gpu(
    data_dir: Path, dev: NvmlDevices
) -> None:
    """The env's limits only lower the server's (NVIDIA's MPS docs): the daemon is told the
    largest among the GPU's MPS workloads before each starts; the stand-in records it."""
    agent = Agent(data_dir, dev)
    sleep = "import time; time.sleep(60)"
    for name, mib, pct in (("a", 4096, 20), ("b", 8192, 40)):
        spec = job(name, sleep, gpu=GpuRequest(memory_mib=mib, compute_pct=pct), sharing="mps")
        agent.apply_workload(spec)
        settle(agent, f"default/{name}", {"running"})
    log = Path(dev.tool_path or "") / "mps-control.log"
    sent = [json.loads(line)["command"] for line in log.read_text().splitlines()]
    assert sent[0] == "-d"
    # the stand-in lists one server (as a daemon with clients does): it is bounded too
    pid = str(mps_server_pid(json.loads(log.read_text().splitlines()[0])["pipe"]))
    assert sent[-5:] == [
        "get_server_list",
        "set_default_active_thread_percentage 40",
        "set_default_device_pinned_mem_limit 0 8192M",
        f"set_active_thread_percentage {pid} 40",
        f"set_device_pinned_mem_limit {pid} 0 8192M",
    ]
    assert "set_default_device_pinned_mem_limit 0 4096M" in sent  # when only a ran
    assert state_env(agent, "default/a")["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    # the larger one gone, the daemon's bounds come down to a's at the next upkeep: a client a
    # server starts for it later could otherwise raise its own limits to b's
    assert agent.delete("default", "b")
    agent.gpu_care.stop_idle_mps()
    sent = [json.loads(line)["command"] for line in log.read_text().splitlines()]
    assert sent[-5:] == [
        "get_server_list",
        "set_default_active_thread_percentage 20",
        "set_default_device_pinned_mem_limit 0 4096M",
        f"set_active_thread_percentage {pid} 20",
        f"set_device_pinned_mem_limit {pid} 0 4096M",
    ]
    agent.gpu_care.stop_idle_mps()  # nothing changed: nothing sent
    assert len(log.read_text().splitlines()) == len(sent)
    assert agent.delete("default", "a")


def test_mps_pipe_directories_are_reachable_by_every_uid_and_logs_by_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufrac.devices.sim_tools import write_sim_tools
    from gpufrac.runtime import mps

    daemons = mps.MpsDaemons(
        tmp_path / "shared/mps",
        log_root=tmp_path / "data/mps",
        enabled=True,
        tool_path=str(write_sim_tools(tmp_path / "bin")),
    )
    started: list[dict[str, str]] = []  # the daemon's start recorded instead of run
    monkeypatch.setattr(mps.subprocess, "run", lambda *a, **k: started.append(k["env"]))
    gpu = mps.MpsDomain(("GPU-x",))
    assert daemons.ensure(gpu) == "started"
    pipe = daemons.pipe_dir(gpu)
    for d in (pipe, pipe.parent, daemons.root):
        assert d.stat().st_mode & 0o777 == 0o755, d
    assert daemons.log_dir(gpu).stat().st_mode & 0o777 == 0o700
    assert started[0]["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert started[0]["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "data/mps/GPU-x/log")


def test_a_service_is_running_only_once_its_health_check_passes(
    data_dir: Path, dev: NvmlDevices
) -> None:
    import socket

    from gpufrac.model.workload import HealthCheck

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = (
        "import http.server, socketserver, time\n"
        "time.sleep(1.5)\n"
        f"socketserver.TCPServer(('127.0.0.1', {port}), "
        "http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    )
    spec = job(
        "web",
        server,
        type="service",
        restart="always",
        sharing="timeslice",
        health=HealthCheck("http", port, "/", period_seconds=1),
    )
    agent = Agent(data_dir, dev)
    agent.apply_workload(spec)
    early = settle(agent, "default/web", {"starting"})
    assert early.reason in ("", "waiting for its health check")
    state = settle(agent, "default/web", {"running"}, timeout=30)
    assert state.phase == "running"
    assert "ready" in [e.kind for e in agent.store.events("default/web")]
    agent.delete("default", "web")


def test_a_service_whose_port_another_process_holds_is_never_ready(
    data_dir: Path, dev: NvmlDevices
) -> None:
    """Another process (another tenant's, say) took the port first and answers the health check:
    the workload, which could not bind it, gets no traffic."""
    import http.server
    import threading
    import time

    from gpufrac.model.workload import HealthCheck

    squatter = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    port = squatter.server_address[1]
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    try:
        spec = job(
            "web",
            "import time; time.sleep(60)",  # it would listen on the port, if it could
            type="service",
            restart="always",
            sharing="timeslice",
            health=HealthCheck("http", port, "/", period_seconds=1),
        )
        agent = Agent(data_dir, dev)
        agent.apply_workload(spec)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            states = {s.key: s for s in agent.reconcile()}
            assert states["default/web"].phase != "running", "ready on another process's port"
            if any(e.kind == "not_ready" for e in agent.store.events("default/web")):
                break
            time.sleep(0.3)
        said = [e.message for e in agent.store.events("default/web") if e.kind == "not_ready"]
        assert said and f"port {port} is held by another process" in said[0], said
        agent.delete("default", "web")
    finally:
        squatter.shutdown()


def test_mig_changes_through_the_agent_keep_its_scheduler_true(
    data_dir: Path, dev: NvmlDevices
) -> None:
    from gpufrac.model.mig import parse_layout
    from gpufrac.runtime.mig_apply import ApplyRefused

    agent = Agent(data_dir, dev)
    mig_gpu = dev.gpus()[0].uuid
    agent.apply_workload(
        job(
            "small",
            "import time; time.sleep(60)",
            gpu=GpuRequest(mig_profile="1g.18gb"),
            type="service",
            restart="always",
        )
    )
    first = settle(agent, "default/small", {"running"})
    assert first.decision is not None and first.decision.mig is not None
    # re-cut the GPU to one 7g: the running workload's instance would go, so without drain: refused
    with pytest.raises(ApplyRefused, match="default/small"):
        agent.set_mig_layout(mig_gpu, True, list(parse_layout("7g.141gb@0")))
    assert [str(i.placement) for i in dev.gpu(mig_gpu).instances] == [str(first.decision.mig)]
    done = agent.set_mig_layout(mig_gpu, True, list(parse_layout("7g.141gb@0")), drain=True)
    assert [a.kind for a in done][-2:] == ["create_gi", "create_ci"]
    assert [str(p) for p in dev.gpu(mig_gpu).layout] == ["7g.141gb@0"]
    # the scheduler sees the new layout: the 1g workload waits, a 7g workload fits
    assert agent.scheduler.state.by_uuid[mig_gpu].instances == {parse_layout("7g.141gb@0")[0]: None}
    state = settle(agent, "default/small", {"pending"})
    assert state.phase == "pending"
    agent.apply_workload(
        job(
            "big",
            "import time; time.sleep(60)",
            gpu=GpuRequest(mig_profile="7g.141gb"),
            type="service",
            restart="always",
        )
    )
    assert settle(agent, "default/big", {"running"}).decision is not None
    assert agent.scheduler.state.violations(False, {}) == []
    agent.delete("default", "big")
    agent.delete("default", "small")


@pytest.mark.skipif(os.geteuid() != 0, reason="running as another user needs root")
def test_a_workload_runs_as_its_user(data_dir: Path, dev: NvmlDevices) -> None:
    import pwd

    nobody = pwd.getpwnam("nobody")
    allowed = OperatorSettings(tenants={"default": TenantQuota(users=("nobody",))})
    agent = Agent(data_dir, dev, allowed)
    who = WorkloadSpec(
        name="who",
        gpu=GpuRequest(memory_mib=1024),
        command=("id", "-u"),
        user="nobody",
        workdir="/",
        sharing="timeslice",
    )
    agent.apply_workload(who)  # a system program: nobody cannot read this venv under /root
    settle(agent, "default/who", {"succeeded"})
    assert (data_dir / "runs/default/who/g1-1" / LOG).read_text().strip() == str(nobody.pw_uid)


@pytest.mark.parametrize(
    ("evicted", "attempts", "counts"),
    [
        ((), 0, (0, 0)),
        ((False,), 1, (0, 0)),
        ((False,), 2, (1, 0)),  # it exited and its next attempt starts: a restart
        ((True,), 1, (0, 1)),  # stopped to make room, waiting
        ((True,), 2, (0, 1)),  # ... and started again: no restart
        ((False, True), 2, (1, 1)),
        ((True, False, False), 3, (1, 1)),
    ],
)
def test_restarts_count_failures_and_evictions_count_apart(
    evicted: tuple[bool, ...], attempts: int, counts: tuple[int, int]
) -> None:
    from gpufrac.runtime.agent import attempt_counts

    assert attempt_counts(evicted, attempts) == counts
