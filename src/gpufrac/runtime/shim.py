"""The shim: a small process that runs one workload, outlives the agent, and records how it ended.

``launch`` starts ``python -m gpufrac.runtime.shim RUN_DIR`` detached (double fork, new session), so
the agent can be killed, even with ``kill -9``, without taking workloads with it. The shim:

* writes ``shim.json`` (its pid, start time) then starts the workload in its own process group (the
  shim stays outside it, so signalling the group never hits the shim), and writes ``child.json``;
* where the agent found cgroups it may use (``runtime/cgroups.py``), makes the workload's cgroup
  with its host limits (``cgroup.json`` says where), and the workload's process enters it before it
  runs the workload: a stop signals every process of the cgroup, the kill after the grace kills the
  cgroup, a process the kernel kills for the host memory limit stops the whole workload
  (``limit.json``), and the cgroup is removed before ``exit.json`` is written;
* copies the workload's output into ``output.log``, rotated by size (``output.log.1``, ...);
* passes SIGTERM/SIGINT on to the workload's process group;
* when the workload ends, writes ``exit.json`` (exit code or signal) atomically, then exits; where
  it cannot (a full disk), it keeps the outcome in memory and tries again with backoff until the
  write goes through, and does not exit before (``record_outcome``): meanwhile the agent reads the
  run's outcome as ``unknown`` (its shim lives, its workload does not: ``outcome_pending``);
* with a ``view`` (a workload run as a tenant's user, where the agent's Python is closed to it),
  starts the workload in its own mount namespace that shows it the agent's Python
  (``runtime/python_view.py``), made as root before the change of user;
* on a node of a cluster (``lease`` given), stops the workload (``fenced.json``) once the node's
  lease file says the lease has run out: a node agent that cannot renew it (frozen, cut off from
  the control plane) stops its work by the shims' hand before the control plane places it again.

Every file is written to a temporary name and renamed, so a reader sees all of it or nothing. A
restarted agent re-attaches by reading the run directory (``read_status``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpufrac.runtime.cgroups import HostLimits, Layout, OomWatch, WorkloadCgroup
from gpufrac.runtime.lease import LEASE_CHECK_S, lease_ended, read_lease
from gpufrac.runtime.lease import write_lease as write_lease
from gpufrac.runtime.python_view import PythonView, enter
from gpufrac.runtime.runner import RunStatus

LOG = "output.log"


ShimStatus = RunStatus  # how a run under its shim goes: the runner seam's status


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def launch(
    run_dir: Path,
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    user: str | int | None = None,
    group: int | None = None,
    view: PythonView | None = None,
    log_max_bytes: int = 10 * 2**20,
    log_backups: int = 3,
    lease: Path | None = None,
    cgroups: Layout | None = None,
    limits: HostLimits | None = None,
    enters: bool = True,
    timeout: float = 10.0,
    wait: bool = True,
) -> int | None:
    """Start a shim for ``command``. With ``wait``, returns the shim's pid once it has started the
    workload; without, returns at once (None) and the shim reports in the run directory itself (the
    agent does not wait under its lock: ``launched_at`` says since when a run is on its way).

    Without ``enters``, ``command`` stays out of the workload's memory cgroup (and so out of every
    directory of it that holds its memory: all of it on a v2-only machine): it is a container
    engine's client, which puts the container below that cgroup itself, so the memory limit
    bounds the container and not the client."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("shim.json", "child.json", "exit.json", "stop.json", "cgroup.json", "limit.json"):
        (run_dir / stale).unlink(missing_ok=True)
    _write_json(
        run_dir / "spec.json",
        {
            "command": list(command),
            "env": dict(env) if env is not None else None,
            "workdir": workdir,
            "user": user,
            "group": group,
            "view": view.to_json() if view is not None and view.covers else None,
            "log_max_bytes": log_max_bytes,
            "log_backups": log_backups,
            "lease": None if lease is None else str(lease),
            "cgroups": cgroups.to_json() if cgroups is not None and cgroups.usable else None,
            "limits": (limits or HostLimits()).to_json(),
            "enters": enters,
        },
    )
    with open(run_dir / "shim.log", "ab") as shim_log:
        first = subprocess.run(
            # a small first process forks the shim off (its own session) and returns at once
            [sys.executable, "-S", "-c", _DETACH, str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=shim_log,
            timeout=timeout,
            check=False,
        )
    if first.returncode != 0:
        raise RuntimeError(
            f"the shim did not start (exit {first.returncode}); see {run_dir / 'shim.log'}"
        )
    if not wait:
        return None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shim, child, done = (
            _read_json(run_dir / n) for n in ("shim.json", "child.json", "exit.json")
        )
        if shim is not None and (child is not None or done is not None):
            return int(shim["pid"])
        time.sleep(0.01)
    raise RuntimeError(f"the shim did not report within {timeout}s; see {run_dir / 'shim.log'}")


_DETACH = (
    "import os, sys\n"
    "if os.fork() > 0:\n"
    "    os._exit(0)\n"
    "os.setsid()\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'gpufrac.runtime.shim', sys.argv[1]])\n"
)


def launched_at(run_dir: Path) -> float | None:
    """When the run was launched (its spec written), or None if it never was."""
    try:
        return (run_dir / "spec.json").stat().st_mtime
    except OSError:
        return None


DEFAULT_GRACE_S = 10.0  # SIGTERM, then SIGKILL this long after
LAUNCH_TIMEOUT_S = 10.0  # how long a launched shim may take to report before its run counts as dead


def launching(run_dir: Path, status: ShimStatus) -> bool:
    """Launched, and its shim has not reported yet (but may still)."""
    if status.shim_pid is not None or status.done:
        return False
    since = launched_at(run_dir)
    return since is not None and time.time() < since + LAUNCH_TIMEOUT_S


def live(run_dir: Path, status: ShimStatus | None = None) -> bool:
    """Whether the run's workload runs, or is about to: its shim is alive or still on its way."""
    status = status or read_status(run_dir)
    return not status.done and (status.shim_alive or launching(run_dir, status))


def read_status(run_dir: Path) -> ShimStatus:
    shim = _read_json(run_dir / "shim.json") or {}
    child = _read_json(run_dir / "child.json") or {}
    done = _read_json(run_dir / "exit.json") or {}
    pid = shim.get("pid")
    return ShimStatus(
        shim_pid=pid,
        child_pid=child.get("pid"),
        started=shim.get("started"),
        exit_code=done.get("exit_code"),
        signal=done.get("signal"),
        finished=done.get("finished"),
        error=done.get("error") if isinstance(done.get("error"), str) else None,
        unknown=done.get("unknown") is True,
        shim_alive=isinstance(pid, int) and _is_our_shim(pid, run_dir),
    )


def _is_our_shim(pid: int, run_dir: Path) -> bool:
    """Alive, and really this run directory's shim (not a process that got the pid later)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"gpufrac.runtime.shim" in cmdline and str(run_dir).encode() in cmdline


def cgroup_name(run_dir: Path) -> str:
    """The name of a run's cgroup in each hierarchy (unique to its run directory)."""
    return "gpufrac-" + hashlib.sha1(str(run_dir.absolute()).encode()).hexdigest()[:16]


def cgroup_of(run_dir: Path) -> WorkloadCgroup | None:
    """The run's cgroup, as its shim recorded it (None: it runs in its process group only)."""
    raw = _read_json(run_dir / "cgroup.json")
    return None if raw is None else WorkloadCgroup.from_json(raw)


def abandon(run_dir: Path, why: str, *, unknown: bool = False) -> ShimStatus:
    """A run whose shim is gone without a record (killed, or the machine rebooted): its workload's
    cgroup or process group, if still there, is killed (no shim is left to watch it) and its
    cgroup removed, and the run is recorded as ended now with ``why``, once, so later passes read
    an ordinary failed attempt; with ``unknown``, as ended with an outcome nobody knows (it may
    have exited 0), which the agent does not restart on until an admin clears it
    (``clear_unknown``)."""
    child = _read_json(run_dir / "child.json")
    cgroup = cgroup_of(run_dir)
    if cgroup is not None:
        cgroup.remove()
    if child is not None and _group_is_this_runs(int(child["pgid"]), run_dir):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(child["pgid"]), signal.SIGKILL)
    record: dict[str, Any] = {"exit_code": None, "signal": None, "finished": time.time()}
    record.update(error=why, unknown=unknown)
    _write_json(run_dir / "exit.json", record)
    return read_status(run_dir)


def clear_unknown(run_dir: Path, by: str) -> bool:
    """An admin's word that a run whose outcome is unknown may count as failed (and be restarted
    as its policy says). False if the run's outcome is not unknown."""
    done = _read_json(run_dir / "exit.json")
    if done is None or done.get("unknown") is not True:
        return False
    done.update(unknown=False, error=f"{done.get('error') or 'its outcome was unknown'}; {by}")
    _write_json(run_dir / "exit.json", done)
    return True


def outcome_pending(run_dir: Path, status: ShimStatus) -> bool:
    """Its shim lives but its workload has ended: the shim holds the outcome and has not written
    it yet (it cannot: a full disk), so how the run ended is not known yet."""
    if status.done or not status.shim_alive or status.child_pid is None:
        return False
    child = _read_json(run_dir / "child.json")
    return child is not None and not _group_is_this_runs(int(child["pgid"]), run_dir)


def limit_hit(run_dir: Path) -> str | None:
    """Why the shim stopped the workload for a host limit (``limit.json``), or None."""
    why = (_read_json(run_dir / "limit.json") or {}).get("why")
    return why if isinstance(why, str) else None


def launched_env(run_dir: Path) -> dict[str, str]:
    """The environment the run was launched with (its ``spec.json``), or {} where unreadable."""
    env = (_read_json(run_dir / "spec.json") or {}).get("env")
    if not isinstance(env, dict):
        return {}
    return {str(k): str(v) for k, v in env.items()}


def record_outcome(
    run_dir: Path, outcome: dict[str, Any], *, first: float = 0.05, most: float = 2.0
) -> int:
    """Write ``exit.json``, trying again with backoff (``first`` doubling up to ``most`` seconds)
    for as long as the write fails (a full disk): the outcome is held in memory meanwhile and the
    shim does not exit before it is written, unless its run directory is gone (removed with its
    workload, or its node's data: nobody is left to read it). Returns the failed tries."""
    delay, failed = first, 0
    while True:
        try:
            _write_json(run_dir / "exit.json", outcome)
            return failed
        except OSError:
            failed += 1
            if not run_dir.is_dir():
                return failed
            for tmp in run_dir.glob(".exit.json.*.tmp"):  # a half-written one holds space
                tmp.unlink(missing_ok=True)
            time.sleep(delay)
            delay = min(most, delay * 2)


def _group_is_this_runs(pgid: int, run_dir: Path) -> bool:
    """The process group ``pgid`` is still the one this run's shim started: its leader was started
    after the run was launched (a pid reused later by another program is older than nothing, but
    a process that got the pid after the leader died started later than the shim wrote
    child.json)."""
    try:
        stat = Path(f"/proc/{pgid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    if int(stat[2]) != pgid:  # field 5 (pgrp): no longer a group leader of that id
        return False
    started = _boot_time() + int(stat[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time
    written = (run_dir / "child.json").stat().st_mtime
    return abs(started - written) < 5.0


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def stop(run_dir: Path, *, grace: float = DEFAULT_GRACE_S, wait: float = 0.5) -> bool:
    """Stop the run: its shim passes SIGTERM to the workload's process group and SIGKILLs the group
    ``grace`` seconds later if it is still there. Waits at most ``wait`` seconds for it to end (the
    agent calls this under its lock: a workload that ignores SIGTERM never holds the agent up for
    its grace). True if the run has ended by the time this returns.

    A run not started yet never starts (``stop.json``, which its shim reads before and after
    starting the workload). A run whose shim is gone has its group killed at once."""
    if (run_dir / "exit.json").exists():
        return True
    _write_json(run_dir / "stop.json", {"at": time.time(), "grace": grace})
    status = read_status(run_dir)
    child = _read_json(run_dir / "child.json")
    if status.shim_alive and status.shim_pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(status.shim_pid, signal.SIGTERM)
    else:  # no shim to pass it on: at once
        cgroup = cgroup_of(run_dir)
        if cgroup is not None:
            cgroup.remove()
        if child is not None and _group_is_this_runs(int(child["pgid"]), run_dir):
            _kill_group(int(child["pgid"]))
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if (run_dir / "exit.json").exists():
            return True
        time.sleep(0.01)
    return (run_dir / "exit.json").exists()


def wait_ended(run_dir: Path, timeout: float) -> bool:
    """Wait until the run has ended (its ``exit.json``), or its shim is gone; True if it ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = read_status(run_dir)
        if status.done or not (status.shim_alive or launching(run_dir, status)):
            return status.done
        time.sleep(0.02)
    return False


def _become_subreaper() -> None:
    """Orphans among the workload's processes become this process's children, not init's
    (``PR_SET_CHILD_SUBREAPER``), so none escapes by leaving its process group."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _kill_descendants(*, reap: bool = True) -> None:
    """SIGKILL every process below this one (and with ``reap``, collect their exit status)."""
    me = os.getpid()
    parent: dict[int, int] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    for pid in parent:
        p, hops = pid, 0
        while p in parent and p != me and hops < 64:
            p, hops = parent[p], hops + 1
        if p == me and pid != me:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if not reap:
        return
    deadline = time.monotonic() + 2.0
    with contextlib.suppress(ChildProcessError):
        while time.monotonic() < deadline:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.01)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


class _RotatingLog:
    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self.file = open(path, "ab")  # noqa: SIM115 - held for the shim's life
        self.size = self.file.tell()
        self.lost = 0  # bytes of output that could not be written

    def write(self, data: bytes) -> None:
        if self.size + len(data) > self.max_bytes and self.size:
            self.file.close()
            for i in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{i}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
            if self.backups:
                os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
            else:
                self.path.unlink(missing_ok=True)
            self.file = open(self.path, "ab")  # noqa: SIM115
            self.size = 0
        try:
            self.file.write(data)
            self.file.flush()
        except OSError:  # a full disk: this output is lost, not the workload (its pipe drains)
            self.lost += len(data)
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = open(self.path, "ab")  # noqa: SIM115 - a clean buffer
            return
        self.size += len(data)


def _run(run_dir: Path) -> int:
    spec = _read_json(run_dir / "spec.json")
    if spec is None:
        print(f"no spec.json in {run_dir}", file=sys.stderr)
        return 2
    stopping = threading.Event()
    started: list[subprocess.Popen[bytes]] = []
    killer: list[threading.Timer] = []
    cgroups: list[WorkloadCgroup] = []  # the workload's cgroup, where it has one
    # an engine's client passes a signal on to its container (whose process 1 passes it on to
    # the command); sent to the whole cgroup it would also reach the client's own helpers and the
    # engine's monitor, and end the client before the container
    client = spec.get("enters", True) is False

    def forward(signum: int, _frame: object, grace_s: float | None = None) -> None:
        """Pass the signal to the workload's group; after a SIGTERM, SIGKILL it once the grace
        the agent asked for (``stop.json``, or ``grace_s``) has passed, so nobody waits on a
        workload that ignores SIGTERM."""
        stopping.set()
        if not started:
            return  # not started yet: it never will be
        pgid = started[0].pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signum)
            os.killpg(pgid, signal.SIGCONT)  # one the QoS arbiter paused must run to handle it
        for cgroup in cgroups:  # its processes outside the group too; thawed to handle it
            if not client:
                cgroup.signal(signum)
            cgroup.thaw()
        if signum == signal.SIGTERM and not killer:
            asked = _read_json(run_dir / "stop.json") or {}
            grace = asked.get("grace", DEFAULT_GRACE_S) if grace_s is None else grace_s

            def kill() -> None:
                _kill_group(pgid)
                for cgroup in cgroups:
                    cgroup.kill()
                _kill_descendants(reap=False)  # the main thread waits for its child itself

            timer = threading.Timer(
                float(grace) if isinstance(grace, int | float) else DEFAULT_GRACE_S, kill
            )
            timer.daemon = True
            killer.append(timer)
            timer.start()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    _become_subreaper()
    _write_json(run_dir / "shim.json", {"pid": os.getpid(), "started": time.time()})
    if stopping.is_set() or (run_dir / "stop.json").exists():  # stopped before it started
        record_outcome(
            run_dir, {"exit_code": None, "signal": signal.SIGTERM, "finished": time.time()}
        )
        return 0
    log = _RotatingLog(run_dir / LOG, int(spec["log_max_bytes"]), int(spec["log_backups"]))
    workdir = spec.get("workdir")
    # a workload run as another user enters its working directory as that user, not as the shim
    # (whose rights would let it start inside a directory it could never open itself)
    as_other = spec.get("user") is not None
    view = PythonView.from_json(spec.get("view")) if as_other else PythonView()
    cgroup = _make_cgroup(run_dir, spec, log)
    oom = None
    if cgroup is not None:
        cgroups.append(cgroup)
        oom = cgroup.watch_oom()  # before the workload starts: v1 signals only from then on
    # an engine's client enters all of it but its memory's: its monitor, which it starts, is then
    # a member, and the memory limit bounds the container (and monitor) only
    enters = cgroup if cgroup is None or not client else cgroup.apart_from("memory")
    if enters is not None and not enters.dirs:
        enters = None
    report_r, report_w = os.pipe()  # why the view could not be made, from the child
    try:
        if view.covers or enters is not None:
            # the cgroup entered and the view made as root: the user changes after them (by the
            # child itself)
            user, group = spec.get("user"), spec.get("group")
            uid = (
                None
                if user is None
                else user
                if isinstance(user, int)
                else pwd.getpwnam(str(user)).pw_uid
            )
            start = _prepare(enters, view, uid, group, workdir if as_other else None, report_w)
            who: dict[str, Any] = {"preexec_fn": start}
        else:
            who = {
                "preexec_fn": (lambda: os.chdir(workdir)) if as_other and workdir else None,
                "user": spec.get("user"),
                "group": spec.get("group"),
                "extra_groups": [] if spec.get("group") is not None else None,
            }
        child = subprocess.Popen(
            spec["command"],
            cwd=None if as_other else workdir,
            env=spec.get("env"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group; the shim stays outside it
            **who,
        )
    except Exception as e:  # no such program, user or directory, a NUL byte: a failed attempt
        os.close(report_w)
        with os.fdopen(report_r, "rb") as report:
            why = report.read().decode(errors="replace")
        error = f"cannot start {spec['command'][0]!r}: {why}" if why else _start_error(spec, e)
        log.write(f"gpufrac shim: {error}\n".encode())
        if cgroup is not None:
            cgroup.remove()
        record_outcome(
            run_dir, {"exit_code": 127, "signal": None, "finished": time.time(), "error": error}
        )
        return 0
    os.close(report_w)
    os.close(report_r)
    _write_json(run_dir / "child.json", {"pid": child.pid, "pgid": child.pid})
    started.append(child)
    if stopping.is_set() or (run_dir / "stop.json").exists():  # asked to stop while starting
        forward(signal.SIGTERM, None)
    out = child.stdout
    assert isinstance(out, io.BufferedReader)

    def copy() -> None:
        for chunk in iter(lambda: out.read1(65536), b""):
            with contextlib.suppress(OSError):  # never stop draining the workload's output
                log.write(chunk)

    reader = threading.Thread(target=copy, daemon=True)
    reader.start()
    lease = spec.get("lease")
    if isinstance(lease, str):

        def watch_lease() -> None:
            last = None
            while not stopping.is_set() and child.poll() is None:
                last = read_lease(Path(lease)) or last
                ended = lease_ended(Path(lease), last)
                if ended is not None:
                    until, grace = ended
                    forward(signal.SIGTERM, None, grace)  # first: nothing below may keep it
                    with contextlib.suppress(OSError, ValueError):  # its directory removed, say
                        log.write(
                            b"gpufrac shim: this node's lease ran out (its agent did not renew "
                            b"it): stopping the workload\n"
                        )
                        _write_json(
                            run_dir / "fenced.json", {"lease_until": until, "at": time.time()}
                        )
                    return
                time.sleep(LEASE_CHECK_S)

        threading.Thread(target=watch_lease, daemon=True).start()
    if oom is not None and "memory" in oom.cgroup.dirs:
        threading.Thread(
            target=_watch_host_memory, args=(oom, run_dir, spec, log, child), daemon=True
        ).start()
    code = child.wait()
    # what the workload left behind, in its group or not (a process that left it with setsid is
    # still this shim's descendant: the shim is their subreaper), ends with it
    _kill_group(child.pid)
    if oom is not None:
        _host_memory_hit(oom, run_dir, spec, log)
        oom.close()
    if cgroup is not None:
        cgroup.kill()
    _kill_descendants()
    reader.join(timeout=5.0)
    if cgroup is not None and not cgroup.remove():
        log.write(b"gpufrac shim: its cgroup could not be removed (a process would not end)\n")
    outcome = {
        "exit_code": code if code >= 0 else None,
        "signal": -code if code < 0 else None,
        "finished": time.time(),
    }
    if record_outcome(run_dir, outcome):
        with contextlib.suppress(OSError, ValueError):
            log.write(b"gpufrac shim: exit.json could be written only after retries (disk full?)\n")
    return 0


def _make_cgroup(run_dir: Path, spec: dict[str, Any], log: _RotatingLog) -> WorkloadCgroup | None:
    """The workload's cgroup with its host limits, where the agent found cgroups to use; None
    (and a line in the log) where it cannot be made: the workload then runs in its process group
    only. ``cgroup.json`` is written first, so whoever cleans up after a crash finds it."""
    raw = spec.get("cgroups")
    if not isinstance(raw, dict):
        return None
    cgroup = WorkloadCgroup.for_run(Layout.from_json(raw), cgroup_name(run_dir))
    _write_json(run_dir / "cgroup.json", cgroup.to_json())
    try:
        missing = cgroup.create(HostLimits.from_json(spec.get("limits")))
    except OSError as e:
        log.write(
            f"gpufrac shim: cannot make the workload's cgroup ({e}): it runs in its process "
            "group only (a process that leaves it is not paused, counted or bounded)\n".encode()
        )
        cgroup.remove()
        (run_dir / "cgroup.json").unlink(missing_ok=True)
        return None
    for limit in missing:
        log.write(f"gpufrac shim: host limit not applied: {limit}\n".encode())
    return cgroup


def _host_memory_hit(oom: OomWatch, run_dir: Path, spec: dict[str, Any], log: _RotatingLog) -> bool:
    """Whether the kernel killed a process of the workload for its host memory limit; the first
    time, says so in the run (``limit.json``) and the log."""
    if not oom.hits():
        return False
    if not (run_dir / "limit.json").exists():
        limit = HostLimits.from_json(spec.get("limits")).memory_bytes
        mib = None if limit is None else limit // 2**20
        why = (
            f"stopped: it used more host memory than its {mib} MiB host_memory limit "
            "(the kernel killed a process of it)"
            if mib is not None
            else "stopped: the kernel killed a process of it for want of host memory (a limit "
            "above its own: its agent's cgroup, or the machine's)"
        )
        _write_json(run_dir / "limit.json", {"limit": "host_memory", "limit_mib": mib, "why": why})
        with contextlib.suppress(OSError, ValueError):
            log.write(f"gpufrac shim: {why}\n".encode())
    return True


def _watch_host_memory(
    oom: OomWatch,
    run_dir: Path,
    spec: dict[str, Any],
    log: _RotatingLog,
    child: subprocess.Popen[bytes],
) -> None:
    """Stop the whole workload once the kernel has killed one of its processes for its host
    memory limit (what is left of it would run on crippled)."""
    while child.poll() is None:
        if _host_memory_hit(oom, run_dir, spec, log):
            oom.cgroup.kill()
            return
        time.sleep(LEASE_CHECK_S)


def _prepare(
    cgroup: WorkloadCgroup | None,
    view: PythonView,
    uid: int | None,
    group: int | None,
    workdir: str | None,
    report: int,
) -> Callable[[], None]:
    """What the workload's process does before it runs the workload, as root: enters its
    cgroup, enters its own mount namespace with ``view`` in it (where the view covers anything),
    then becomes the workload's user (as Popen's ``user``, ``group`` and ``extra_groups`` would),
    then enters its working directory as that user."""

    def start() -> None:
        if cgroup is not None:
            try:
                cgroup.enter(os.getpid())
            except OSError as e:
                os.write(report, f"cannot enter its cgroup: {e.strerror}".encode())
                raise
        if view.covers:
            try:
                enter(view)
            except OSError as e:
                os.write(report, f"cannot show it the agent's Python: {e.strerror}".encode())
                raise
        if uid is not None:
            if group is not None:
                os.setgroups([])
                os.setgid(group)
            os.setuid(uid)
        if workdir:
            os.chdir(workdir)

    return start


def _start_error(spec: dict[str, Any], e: Exception) -> str:
    """Why the workload could not start, as a person reads it."""
    program = spec["command"][0] if spec.get("command") else "?"
    if isinstance(e, KeyError) and spec.get("user"):  # getpwnam: the user does not exist
        return f"cannot start {program!r}: no user {spec['user']!r} on this machine"
    if isinstance(e, FileNotFoundError) and e.filename == spec.get("workdir"):
        return f"cannot start {program!r}: no directory {spec['workdir']!r}"
    if isinstance(e, subprocess.SubprocessError) and spec.get("workdir"):  # preexec_fn's chdir
        return (
            f"cannot start {program!r}: its user cannot enter {spec['workdir']!r}"
            " (missing, or not open to it)"
        )
    return f"cannot start {program!r}: {e}"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    detach = args[:1] == ["--detach"]
    if detach:
        args = args[1:]
    if len(args) != 1:
        print("usage: python -m gpufrac.runtime.shim [--detach] RUN_DIR", file=sys.stderr)
        return 2
    if detach and os.fork() > 0:
        return 0  # the launcher's child returns at once; the shim lives on, re-parented
    if detach:
        os.setsid()
    return _run(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
