"""The process runner behind the runner seam: real processes in their group and cgroup."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpufrac.runtime.cgroups import Layout, detect
from gpufrac.runtime.process_runner import ProcessRunner
from gpufrac.runtime.runner import Launch, RunHandle, Runner

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
    runner.start(handle, Launch([sys.executable, "-c", LISTENER], dict(os.environ)))
    child, port = _started(handle.run_dir)
    main = runner.status(handle).child_pid
    assert main is not None and runner.owns(handle, pid=main)
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
    finally:
        other.close()
        with contextlib.suppress(ProcessLookupError):  # the shim ends it anyway (its subreaper)
            os.kill(child, signal.SIGKILL)
