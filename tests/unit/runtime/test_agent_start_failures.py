"""A workload that cannot start, or whose shim is killed, is a clear failed attempt at once: the
reason says why, the restart policy applies, nothing waits under the agent's lock, and no process is
left behind. In-process agent, real shims and processes, simulated GPUs."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.model.settings import OperatorSettings, TenantQuota
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.shim import read_status
from tests.conftest import kill_leftover_runs
from tests.unit.runtime.test_agent_decisions import settle

PY = sys.executable


@pytest.fixture
def agent(data_dir: Path) -> Iterator[Agent]:
    dev: NvmlDevices = open_simulated("h200:1", data_dir)
    # the operator allows a user this machine does not have: a failed attempt, not a refusal
    allowed = OperatorSettings(tenants={"default": TenantQuota(users=("no-such-user-here",))})
    a = Agent(data_dir, dev, allowed)
    yield a
    a.close()
    kill_leftover_runs(data_dir)


def job(name: str, **kw: object) -> WorkloadSpec:
    fields: dict[str, object] = {
        "command": (PY, "-c", "import time; time.sleep(60)"),
        "gpu": GpuRequest(fraction_milli=250),
        "sharing": "timeslice",
    }
    fields.update(kw)
    return WorkloadSpec(name=name, **fields)  # type: ignore[arg-type]


def gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"user": "no-such-user-here"}, "no user 'no-such-user-here' on this machine"),
        ({"command": ("/no/such/program",)}, "cannot start '/no/such/program'"),
        ({"workdir": "/no/such/dir"}, "no directory '/no/such/dir'"),
    ],
)
def test_a_workload_that_cannot_start_fails_with_the_reason(
    agent: Agent, changes: dict[str, object], said: str
) -> None:
    agent.apply_workload(job("bad", restart="never", **changes))
    started = time.monotonic()
    state = settle(agent, "default/bad", {"failed"})
    assert said in state.reason and state.attempts == 1
    assert time.monotonic() - started < 8  # at once, not after a launch timeout
    again = job("again", restart="on-failure", backoff_limit=3, **changes)
    agent.apply_workload(again)
    retrying = settle(agent, "default/again", {"backoff"})
    assert said in retrying.reason and "restart 1 in" in retrying.reason


def test_a_killed_shim_stops_its_workload_and_counts_as_a_failed_attempt(agent: Agent) -> None:
    agent.apply_workload(job("svc", type="service", restart="always"))
    settle(agent, "default/svc", {"running"})
    run = agent.runs.attempts("default", "svc", 1)[-1]
    status = read_status(run)
    assert status.shim_pid is not None and status.child_pid is not None
    os.kill(status.shim_pid, signal.SIGKILL)
    state = settle(agent, "default/svc", {"backoff", "starting", "running"})
    deadline = time.monotonic() + 10
    while state.attempts < 2 or state.phase != "running":
        assert time.monotonic() < deadline, state
        state = settle(agent, "default/svc", {"backoff", "starting", "running"})
    # the old workload's process group is gone; the new attempt runs
    assert gone(status.child_pid), Path(f"/proc/{status.child_pid}/stat").read_text()
    assert "its shim died" in (read_status(run).error or "")
    # its restart says what happened, not "after signal None"
    said = [e.message for e in agent.store.events("default/svc") if e.kind == "restarted"]
    assert said and "after killed (its shim died" in said[-1] and "None" not in said[-1], said


def test_how_a_run_ended_names_the_signal() -> None:
    from gpufrac.runtime.shim import ShimStatus

    def ended(code: int | None, sig: int | None, error: str | None = None) -> str:
        return ShimStatus(1, 2, 0.0, code, sig, 1.0, False, error).ended_by()

    assert ended(3, None) == "exit 3"
    assert ended(None, 9) == "signal SIGKILL (9)"
    assert ended(None, 200) == "signal 200"
    assert ended(None, None) == "killed"
