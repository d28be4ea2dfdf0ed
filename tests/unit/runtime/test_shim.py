"""The shim: real processes. It records exit status, keeps the workload in its own process group,
rotates logs, stops on request, and outlives the process that launched it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpufrac.runtime.cgroups import HostLimits, detect
from gpufrac.runtime.shim import LOG, ShimStatus, cgroup_of, launch, read_status, stop

PY = sys.executable


def wait_done(run_dir: Path, timeout: float = 20.0) -> ShimStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = read_status(run_dir)
        if status.done:
            return status
        time.sleep(0.02)
    raise AssertionError(f"not done: {read_status(run_dir)}")


def test_exit_code_and_output_are_recorded(tmp_path: Path) -> None:
    run = tmp_path / "run"
    launch(
        run,
        [
            PY,
            "-c",
            "import os; print('hello', os.environ['GREETING'], os.getcwd()); raise SystemExit(3)",
        ],
        env={**os.environ, "GREETING": "gpu"},
        workdir=str(tmp_path),
    )
    status = wait_done(run)
    assert (status.exit_code, status.signal) == (3, None)
    assert f"hello gpu {tmp_path}" in (run / LOG).read_text()


def test_the_workload_has_its_own_process_group_without_the_shim(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shim_pid = launch(run, [PY, "-c", "import time; time.sleep(30)"])
    try:
        status = read_status(run)
        assert status.shim_alive and status.child_pid
        assert os.getpgid(status.child_pid) == status.child_pid
        assert os.getpgid(shim_pid) != status.child_pid
    finally:
        stop(run, grace=2)
    done = wait_done(run)
    assert done.signal == 15 and done.exit_code is None
    time.sleep(0.2)
    assert not read_status(run).shim_alive


def test_a_command_that_cannot_start_is_reported(tmp_path: Path) -> None:
    run = tmp_path / "run"
    launch(run, ["/nonexistent/program"])
    assert wait_done(run).exit_code == 127
    assert "cannot start" in (run / LOG).read_text()


def test_logs_rotate_by_size(tmp_path: Path) -> None:
    run = tmp_path / "run"
    launch(
        run,
        [PY, "-c", "import sys\nfor i in range(4000): print('x' * 60, flush=True)"],
        log_max_bytes=20_000,
        log_backups=2,
    )
    wait_done(run)
    files = sorted(p.name for p in run.glob("output.log*"))
    assert files == ["output.log", "output.log.1", "output.log.2"]
    assert all(p.stat().st_size <= 20_000 + 65536 for p in run.glob("output.log*"))


def test_the_shim_outlives_a_killed_launcher(tmp_path: Path) -> None:
    run = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from pathlib import Path
        from gpufrac.runtime.shim import launch
        launch(Path({str(run)!r}), [sys.executable, "-c", \
"import time; time.sleep(1); raise SystemExit(5)"])
        os.kill(os.getpid(), signal.SIGKILL)  # the agent dies with kill -9
        """
    )
    proc = subprocess.run([PY, "-c", script], timeout=60)
    assert proc.returncode == -9
    status = wait_done(run)
    assert status.exit_code == 5


def test_a_run_stopped_before_its_shim_reports_never_starts_its_workload(tmp_path: Path) -> None:
    from gpufrac.runtime.shim import live

    run = tmp_path / "run"
    marker = tmp_path / "started"
    assert launch(run, [PY, "-c", f"open({str(marker)!r}, 'w').close()"], wait=False) is None
    assert live(run)  # on its way: not a dead run, and not one to start again
    stop(run, grace=1)
    status = wait_done(run)
    time.sleep(0.3)
    assert not marker.exists() and status.child_pid is None and not live(run)


def test_a_run_launched_without_waiting_reports_by_itself(tmp_path: Path) -> None:
    run = tmp_path / "run"
    launch(run, [PY, "-c", "raise SystemExit(3)"], wait=False)
    assert wait_done(run).exit_code == 3


def test_stopping_a_workload_that_ignores_sigterm_returns_at_once_and_it_is_killed_after_the_grace(
    tmp_path: Path,
) -> None:
    code = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\ntime.sleep(60)\n"
    )
    run = tmp_path / "run"
    launch(run, [sys.executable, "-c", code])
    deadline = time.monotonic() + 10
    while "up" not in (run / LOG).read_text():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    started = time.monotonic()
    assert stop(run, grace=1.5, wait=0.2) is False  # still in its grace: not waited for
    assert time.monotonic() - started < 1.0
    deadline = time.monotonic() + 10
    while not read_status(run).done:
        assert time.monotonic() < deadline, "never killed after its grace"
        time.sleep(0.05)
    took = time.monotonic() - started
    assert 1.4 <= took < 6, took
    assert read_status(run).signal == 9  # SIGKILL, by its shim


def test_a_process_that_leaves_the_workloads_group_ends_with_it(tmp_path: Path) -> None:
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()  # out of the workload's process group (and session)\n"
        "    print('escaped', os.getpid(), flush=True)\n"
        "    time.sleep(300)\n"
        "    os._exit(0)\n"
        "time.sleep(300)\n"
    )
    run = tmp_path / "run"
    launch(run, [sys.executable, "-c", code])
    deadline = time.monotonic() + 10
    while "escaped" not in (run / LOG).read_text():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    escaped = int((run / LOG).read_text().split("escaped")[1].split()[0])
    assert os.getpgid(escaped) != read_status(run).child_pid
    stop(run, grace=1.0)
    wait_done(run)
    deadline = time.monotonic() + 10
    while True:
        try:
            state = Path(f"/proc/{escaped}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break  # gone
        if state == "Z":
            break  # killed, not reaped yet
        assert time.monotonic() < deadline, "the escaped process lives on"
        time.sleep(0.05)


def test_the_owner_of_a_listening_port_is_found_through_proc() -> None:
    import socket

    from gpufrac.runtime.runs import port_owners

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert port_owners(port) == {os.getpid()}
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        free = unused.getsockname()[1]
    assert port_owners(free) == set()  # nobody listens there


def test_a_shim_whose_node_data_is_removed_still_stops_at_the_lease_it_read(tmp_path: Path) -> None:
    """The node's data directory removed under it (run directory and lease file): the shim stops
    its workload once the last lease it read has run out, and does not outlive it."""
    import shutil

    from gpufrac.runtime.shim import write_lease

    node = tmp_path / "node"
    run = node / "runs" / "w"
    lease = node / "lease.json"
    node.mkdir()
    write_lease(lease, time.time() + 1.5, 0.5)
    shim_pid = launch(run, [PY, "-c", "import time; time.sleep(60)"], lease=lease)
    child = read_status(run).child_pid
    assert shim_pid and child
    time.sleep(0.6)  # the shim has read the lease
    shutil.rmtree(node)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_alive(child) or _alive(shim_pid)):
        time.sleep(0.1)
    assert not _alive(child) and not _alive(shim_pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


CGROUPS = detect()
needs_cgroups = pytest.mark.skipif(not CGROUPS.usable, reason="no writable cgroup hierarchy here")
ESCAPING = textwrap.dedent(
    """
    import os, sys, time
    if os.fork() == 0:
        os.setsid()  # leaves the workload's process group
    print(os.getpid(), flush=True)
    time.sleep(60)
    """
)


@needs_cgroups
def test_a_workload_runs_in_its_cgroup_and_stop_kills_and_removes_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    launch(run, [PY, "-c", ESCAPING], cgroups=CGROUPS, limits=HostLimits(pids=50))
    cgroup = cgroup_of(run)
    assert cgroup is not None and cgroup.exists()
    deadline = time.monotonic() + 30  # two Pythons started, with the CPUs busy
    while len((run / LOG).read_text().split()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    pids = {int(p) for p in (run / LOG).read_text().split()}
    assert cgroup.pids() == pids  # both, the one that left its group too; the shim is outside
    assert read_status(run).shim_pid not in cgroup.pids()
    if "pids" in cgroup.dirs:
        assert (cgroup.dirs["pids"] / "pids.max").read_text().strip() == "50"
    assert stop(run, grace=5.0, wait=10.0)
    assert not cgroup.exists()  # removed before exit.json was written
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


@needs_cgroups
@pytest.mark.skipif("memory" not in CGROUPS.places, reason="no writable memory controller")
def test_a_workload_over_its_host_memory_is_stopped_and_says_why(tmp_path: Path) -> None:
    run = tmp_path / "run"
    hog = textwrap.dedent(
        """
        import os, time
        if os.fork() == 0:  # the child is the one over the limit; its parent would run on
            b = []
            while True:
                b.append(bytearray(8 * 2**20))
        time.sleep(60)
        """
    )
    launch(run, [PY, "-c", hog], cgroups=CGROUPS, limits=HostLimits(memory_bytes=64 * 2**20))
    status = wait_done(run)
    assert status.signal == 9  # the whole workload, not only the process the kernel chose
    limit = json.loads((run / "limit.json").read_text())
    assert limit["limit"] == "host_memory" and "64 MiB host_memory limit" in limit["why"]
    assert "host_memory limit" in (run / LOG).read_text()
    cgroup = cgroup_of(run)
    assert cgroup is not None and not cgroup.exists()
