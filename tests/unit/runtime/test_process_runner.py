"""The process runner behind the runner seam: real processes in their group and cgroup."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpufrac.runtime.cgroups import Layout, detect
from gpufrac.runtime.process_runner import ProcessRunner
from gpufrac.runtime.runner import Launch, RunHandle, Runner, RunStatus
from gpufrac.runtime.shim import LAUNCH_TIMEOUT_S

# a workload whose child leaves its group (setsid) and listens on a port it prints
LISTENER = textwrap.dedent(
    """
    import os, socket, time
    if os.fork() == 0:
        os.setsid()
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        print(os.getpid(), s.getsockname()[1], flush=True)
    time.sleep(60)
    """
)


def _started(run: Path) -> tuple[int, int]:
    deadline = time.monotonic() + 10
    while True:
        words = (run / "output.log").read_text().split() if (run / "output.log").exists() else []
        if len(words) == 2:
            return int(words[0]), int(words[1])
        assert time.monotonic() < deadline, "the workload never started"
        time.sleep(0.02)


@pytest.mark.parametrize("layout", [detect(), Layout({})], ids=["cgroup", "process-group"])
def test_the_process_runner_recognises_pauses_and_stops_its_workload(
    tmp_path: Path, layout: Layout
) -> None:
    runner: Runner = ProcessRunner(layout)
    handle = RunHandle(tmp_path / "run")
    env = {**os.environ, "GPUFRAC_TEST": "handed"}
    runner.start(handle, Launch([sys.executable, "-c", LISTENER], env))
    child, port = _started(handle.run_dir)
    main = runner.status(handle).child_pid
    assert main is not None and runner.owns(handle, pid=main)
    assert runner.env(handle) == env
    assert runner.log(handle).read_text().split() == [str(child), str(port)]
    # of some processes, its own: its first, and the one that left its group where a cgroup has it
    mine = {main, child} if layout.usable else {main}
    assert runner.members(handle, [main, child, os.getpid(), 1]) == mine
    pausable = runner.pausable(handle)
    assert pausable is not None and pausable.group == main
    assert (pausable.cgroup is not None) == layout.usable
    assert pausable.cgroup is None or pausable.cgroup.owns(child)
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    try:
        assert not runner.owns(handle, pid=os.getpid())
        assert not runner.owns(handle, port=other.getsockname()[1])
        # the child left its process group: only a cgroup still knows it as the workload's
        assert runner.owns(handle, pid=child) == layout.usable
        assert runner.owns(handle, port=port) == layout.usable
        assert runner.pause(handle) and runner.resume(handle)
        assert runner.signal(handle, 0) >= 1
        assert runner.stop(handle, grace=5, wait=10)
        assert runner.status(handle).signal == signal.SIGTERM
        assert runner.pausable(handle) is None  # nothing of it runs
        assert runner.members(handle, [main, child]) == frozenset()
        assert runner.limit_hit(handle) is None
    finally:
        other.close()
        with contextlib.suppress(ProcessLookupError):  # the shim ends it anyway (its subreaper)
            os.kill(child, signal.SIGKILL)


def _run_dir(tmp_path: Path, **files: dict[str, object]) -> RunHandle:
    """A run directory as a shim leaves it (its files written by hand): ``spec`` first."""
    run = tmp_path / "run"
    run.mkdir()
    for name, value in {"spec": {"command": ["true"]}, **files}.items():
        (run / f"{name}.json").write_text(json.dumps(value))
    return RunHandle(run)


def test_a_run_whose_shim_has_not_reported_is_launching_until_its_timeout(tmp_path: Path) -> None:
    runner = ProcessRunner(Layout({}))
    handle = _run_dir(tmp_path)
    status = runner.status(handle)
    assert status.shim_pid is None and not status.done
    assert runner.launching(handle, status)
    old = time.time() - LAUNCH_TIMEOUT_S - 1
    os.utime(handle.run_dir / "spec.json", (old, old))
    assert not runner.launching(handle, status)


@pytest.mark.parametrize(
    ("shim", "said", "unknown"),
    [
        (None, "its shim did not start within 10s", False),
        ({"pid": 2**22 + 7, "started": 1.0}, "its shim died without a record", True),
    ],
)
def test_an_abandoned_run_is_recorded_as_ended_once_with_why(
    tmp_path: Path, shim: dict[str, object] | None, said: str, unknown: bool
) -> None:
    runner = ProcessRunner(Layout({}))
    handle = _run_dir(tmp_path, **({"shim": shim} if shim else {}))
    status = runner.status(handle)
    assert not status.shim_alive and not status.done
    ended = runner.abandon(handle, status)
    assert ended.done and said in (ended.error or "") and ended.unknown == unknown
    assert runner.status(handle) == ended  # kept: a later pass reads the same
    # an admin's word turns an unknown outcome into a failure, once
    assert runner.clear_unknown(handle, "cleared by ann") == unknown
    assert not runner.status(handle).unknown
    assert not runner.clear_unknown(handle, "again")
    if unknown:
        assert "cleared by ann" in (runner.status(handle).error or "")


def test_an_outcome_not_recorded_yet_is_pending_with_why(tmp_path: Path) -> None:
    runner = ProcessRunner(Layout({}))
    # its shim lives (this process stands in for it) but its workload's group is gone
    handle = _run_dir(tmp_path, child={"pid": 2**22 + 9, "pgid": 2**22 + 9})
    alive = RunStatus(os.getpid(), 2**22 + 9, 1.0, None, None, None, True)
    said = runner.pending_outcome(handle, alive)
    assert said is not None and str(handle.run_dir / "exit.json") in said
    assert runner.pending_outcome(handle, replace(alive, finished=2.0)) is None  # recorded
    assert runner.pending_outcome(handle, replace(alive, shim_alive=False)) is None


def test_a_host_limit_stop_is_told_by_the_runner(tmp_path: Path) -> None:
    runner = ProcessRunner(Layout({}))
    handle = _run_dir(tmp_path, limit={"limit": "host_memory", "why": "stopped: too much"})
    assert runner.limit_hit(handle) == "stopped: too much"
    assert runner.env(handle) == {}  # none recorded
