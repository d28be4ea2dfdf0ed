"""Nothing lost on a full disk: an agent whose data directory is a small tmpfs that fills up while a
job ends. The shim keeps the outcome and writes it once space returns (the agent shows the run
``unknown`` meanwhile, never a dead shim's failure); a store commit the disk refused is never
logged; /health is ok again within one pass. In-process agent, real shims and processes, simulated
GPUs; skipped where ``mount -t tmpfs`` is not permitted."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufrac.devices import open_simulated
from gpufrac.model.event import Event
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.runtime.agent import Agent, WorkloadState
from gpufrac.runtime.service import AgentService
from gpufrac.runtime.store import Store
from tests.conftest import kill_leftover_runs

PY = sys.executable


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs, unmounted after the test."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(
            f"mount -t tmpfs is not permitted here: {done.stderr.strip() or done.returncode}"
        )
    try:
        yield where
    finally:
        kill_leftover_runs(where / "data")
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Fill the disk to the last byte; the file that does it (remove it to give the space back)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)
    return filler


def job(name: str, go: Path, code: int, restart: str) -> WorkloadSpec:
    waits = (
        f"import os,sys,time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
        f"sys.exit({code})"
    )
    return WorkloadSpec(
        name=name,
        command=(PY, "-c", waits),
        gpu=GpuRequest(fraction_milli=250),
        sharing="timeslice",
        restart=restart,  # type: ignore[arg-type]
    )


def until(agent: Agent, key: str, phases: set[str], timeout: float = 20.0) -> WorkloadState:
    deadline = time.monotonic() + timeout
    states: dict[str, WorkloadState] = {}
    while time.monotonic() < deadline:
        states = {s.key: s for s in agent.reconcile()}
        if key in states and states[key].phase in phases:
            return states[key]
        time.sleep(0.05)
    raise AssertionError(f"{key} never reached {phases}: {states.get(key)}")


@pytest.mark.parametrize(
    ("code", "restart", "ends"), [(3, "never", "failed"), (0, "on-failure", "succeeded")]
)
def test_an_outcome_the_disk_cannot_take_is_kept_and_reported_once_space_returns(
    disk: Path, tmp_path: Path, code: int, restart: str, ends: str
) -> None:
    data = disk / "data"
    agent = Agent(data, open_simulated("h200:1", data))
    service = AgentService(agent)
    try:
        go = tmp_path / "go"
        agent.apply_workload(job("j", go, code, restart))
        until(agent, "default/j", {"running"})
        filler = fill(disk)
        go.touch()  # the job ends while the disk is full: its shim cannot write exit.json
        held = until(agent, "default/j", {"unknown", "failed", "succeeded"})
        assert held.phase == "unknown", held
        assert "has not been able to record" in held.reason
        for _ in range(
            5
        ):  # it stays unknown (no restart, no "its shim died") while the disk is full
            time.sleep(0.1)
            again = {s.key: s for s in agent.reconcile()}["default/j"]
            assert again.phase == "unknown" and again.attempts == 1, again
        assert service.health().status == "degraded"  # the store cannot be written
        filler.unlink()
        service.reconcile()  # one pass after space returns
        assert service.health().status == "ok", service.health().problems
        ended = until(agent, "default/j", {ends})
        assert ended.exit_code == code and ended.attempts == 1, ended
        assert "shim died" not in ended.reason
        time.sleep(0.2)
        agent.reconcile()
        assert len(agent.runs.attempts("default", "j", 1)) == 1  # never run a second time
    finally:
        agent.close()


def test_a_commit_the_disk_refused_is_not_logged(disk: Path) -> None:
    store = Store(disk / "control.db")
    told: list[Event] = []
    store.listeners.append(lambda event, _details: told.append(event))
    try:
        store.put_workload("default", "kept", {"n": 0})
        filler = fill(disk)
        refused = 0
        for i in range(4):  # each apply is refused (its commit cannot be written)
            try:
                store.put_workload("default", f"lost{i}", {"n": "x" * 200_000})
            except Exception:
                refused += 1
        assert refused == 4
        filler.unlink()
        store.put_workload("default", "after", {"n": 1})
        assert [e.subject for e in told if e.kind == "applied"] == ["default/kept", "default/after"]
        assert sorted(w.name for w in store.workloads()) == ["after", "kept"]
    finally:
        store.close()


def test_a_lease_is_renewed_in_place_on_a_full_disk(disk: Path) -> None:
    """A node's lease file is written whole once, then renewed over itself: a full disk refuses a
    new file, never the renewal, so the shims read each new lease and stop nothing early."""
    from gpufrac.runtime.lease import LEASE_BYTES, read_lease, write_lease

    lease = disk / "lease.json"
    write_lease(lease, 1000.0, 2.0)
    assert lease.stat().st_size == LEASE_BYTES and read_lease(lease) == (1000.0, 2.0)
    fill(disk)
    with pytest.raises(OSError):
        (disk / "new.json").write_text("{}")  # the disk is full indeed
    write_lease(lease, 2000.5, 3.0)
    assert read_lease(lease) == (2000.5, 3.0)
