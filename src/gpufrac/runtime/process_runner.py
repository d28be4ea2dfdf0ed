"""The process runner: a workload as a host command under its shim (``runtime/shim.py``), in its
own process group and, where the machine offers one, its own cgroup (``runtime/cgroups.py``).

The shim is the run's supervisor: ``RunStatus.shim_pid`` and ``shim_alive`` are its. Everything
this runner knows of a run is in its run directory (the shim's files), so a restarted agent asks
again and gets the same answers."""

from __future__ import annotations

import os
import signal as signals
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from gpufrac.runtime.cgroups import Layout, detect, enable_controllers
from gpufrac.runtime.runner import Launch, Pausable, RunHandle, RunnerKind, RunStatus
from gpufrac.runtime.shim import (
    LAUNCH_TIMEOUT_S,
    LOG,
    abandon,
    cgroup_of,
    clear_unknown,
    launch,
    launched_env,
    launching,
    limit_hit,
    outcome_pending,
    read_status,
    stop,
)


class ProcessRunner:
    kind: RunnerKind = "process"

    def __init__(self, cgroups: Layout | None = None) -> None:
        """``cgroups``: where workloads' cgroups live (default: what this machine offers); a
        layout that is not ``usable`` runs them in their process groups only. The cgroup v2
        controllers the layout uses are enabled for the workloads' cgroups here, once
        (``cgroups.enable_controllers``); what could not be is said on stderr."""
        self.cgroups = detect() if cgroups is None else cgroups
        self.problems = enable_controllers(self.cgroups) if self.cgroups.usable else []
        for problem in self.problems:
            print(f"gpufrac: warning: {problem}", file=sys.stderr)

    def start(self, handle: RunHandle, what: Launch) -> None:
        # a host process sees every device and file: it is held to its GPU by its environment
        # (``what.grant.env``, in ``what.env``), so the grant's devices and mounts need nothing
        launch(
            handle.run_dir,
            what.command,
            env=what.env,
            workdir=what.workdir,
            user=what.user,
            group=what.group,
            view=what.view,
            lease=what.lease,
            cgroups=self.cgroups,
            limits=what.limits,
            enters=not what.engine_client,
            wait=False,
        )

    def stop(self, handle: RunHandle, *, grace: float, wait: float = 0.5) -> bool:
        return stop(handle.run_dir, grace=grace, wait=wait)

    def signal(self, handle: RunHandle, sig: int) -> int:
        cgroup = cgroup_of(handle.run_dir)
        if cgroup is not None and cgroup.exists():
            return cgroup.signal(sig)
        pgid = self._group(handle)
        if pgid is None:
            return 0
        try:
            os.killpg(pgid, sig)
        except OSError:
            return 0
        return 1

    def pause(self, handle: RunHandle) -> bool:
        cgroup = cgroup_of(handle.run_dir)
        if cgroup is not None and cgroup.exists():
            return cgroup.freeze()
        return self.signal(handle, signals.SIGSTOP) > 0

    def resume(self, handle: RunHandle) -> bool:
        cgroup = cgroup_of(handle.run_dir)
        resumed = cgroup is not None and cgroup.exists() and cgroup.thaw()
        return self.signal(handle, signals.SIGCONT) > 0 or resumed

    def owns(self, handle: RunHandle, *, pid: int | None = None, port: int | None = None) -> bool:
        if port is not None:
            owners = port_owners(port)
            if not owners:
                return True  # cannot be told
            return bool(self.members(handle, owners))
        if pid is None:
            return False
        return bool(self.members(handle, (pid,)))

    def members(self, handle: RunHandle, pids: Iterable[int]) -> frozenset[int]:
        """Its process group's (while its first process runs) and its cgroup's."""
        wanted = set(pids)
        if not wanted:
            return frozenset()
        group = self._group(handle)
        cgroup = cgroup_of(handle.run_dir)
        in_cgroup = cgroup.pids() if cgroup is not None else set()
        return frozenset(
            p for p in wanted if p in in_cgroup or (group is not None and process_group(p) == group)
        )

    def status(self, handle: RunHandle) -> RunStatus:
        return read_status(handle.run_dir)

    def launching(self, handle: RunHandle, status: RunStatus) -> bool:
        return launching(handle.run_dir, status)

    def pending_outcome(self, handle: RunHandle, status: RunStatus) -> str | None:
        if not outcome_pending(handle.run_dir, status):
            return None
        return (
            f"its process ended; its shim has not been able to record how yet "
            f"(cannot write {handle.run_dir / 'exit.json'}: disk full?); it keeps trying"
        )

    def abandon(self, handle: RunHandle, status: RunStatus) -> RunStatus:
        if status.shim_pid is None:  # it never reported
            why = (
                f"its shim did not start within {LAUNCH_TIMEOUT_S:.0f}s (see "
                f"{handle.run_dir / 'shim.log'})"
            )
            return abandon(handle.run_dir, why)
        # killed, or the machine rebooted: its workload is stopped; how it ended, unknown
        return abandon(
            handle.run_dir, "its shim died without a record; the workload was stopped", unknown=True
        )

    def clear_unknown(self, handle: RunHandle, by: str) -> bool:
        return clear_unknown(handle.run_dir, by)

    def limit_hit(self, handle: RunHandle) -> str | None:
        return limit_hit(handle.run_dir)

    def pausable(self, handle: RunHandle) -> Pausable | None:
        status = read_status(handle.run_dir)
        if status.done or not status.shim_alive or status.child_pid is None:
            return None
        return Pausable(status.child_pid, cgroup_of(handle.run_dir))

    def env(self, handle: RunHandle) -> Mapping[str, str]:
        return launched_env(handle.run_dir)

    def log(self, handle: RunHandle) -> Path:
        return handle.run_dir / LOG

    def _group(self, handle: RunHandle) -> int | None:
        status = read_status(handle.run_dir)
        return None if status.done else status.child_pid


def port_owners(port: int) -> set[int] | None:
    """The processes holding a listening TCP socket on ``port`` (any address), from ``/proc``;
    None where that cannot be told (no ``/proc``, or sockets of processes it may not read)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if (
                        len(cols) > 9
                        and cols[3] == "0A"
                        and int(cols[1].rsplit(":", 1)[1], 16) == port
                    ):
                        inodes.add(cols[9])
        except (OSError, ValueError, IndexError):
            return None
    if not inodes:
        return set()
    wanted = {f"socket:[{i}]" for i in inodes}
    owners: set[int] = set()
    for proc in os.listdir("/proc"):
        if not proc.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{proc}/fd")
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{proc}/fd/{fd}")
            except OSError:  # closed since it was listed: the process's other fds still count
                continue
            if link in wanted:
                owners.add(int(proc))
                break
    return owners or None


def process_group(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[-1].split()[2])
    except (OSError, ValueError, IndexError):
        return None
