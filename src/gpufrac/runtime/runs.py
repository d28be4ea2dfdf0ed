"""Run directories, and the runners that run the workloads in them.

``Runs`` owns ``runs/<tenant>/<name>/g<generation>-<attempt>``: one directory per attempt. In it
the attempt's runner keeps its records (the process runner's shim: ``runtime/shim.py``), and the
agent its own notes (``Note``: why it was stopped, its peak GPU memory, what QoS gave it, its
health check). The agent reads the truth from these directories, so a restarted agent knows what
ran. Whatever the agent asks of a run goes through ``Runs`` to the run's runner
(``runtime.runner.Runner``), never to a runner's files: which runner started a run is recorded
with it (``runner.json``), so the same runner is asked after a restart.

Registering a runner: its kind in ``runtime.runner.RunnerKind`` and its case in ``make_runner``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal, assert_never, get_args

from gpufrac.model.deployment import REPLICA_KEY_ENV
from gpufrac.model.settings import ContainerSettings
from gpufrac.model.workload import VolumeMount
from gpufrac.runtime.cgroups import HostLimits, Layout, detect
from gpufrac.runtime.container_runner import ContainerRunner, check_mount_sources
from gpufrac.runtime.process_runner import ProcessRunner, port_owners
from gpufrac.runtime.python_view import PythonView
from gpufrac.runtime.runner import (
    RUNNER_KINDS,
    ContainerLaunch,
    Grant,
    Launch,
    Pausable,
    RunHandle,
    Runner,
    RunnerKind,
    RunStatus,
)

__all__ = [
    "Note",
    "Runs",
    "make_runner",
    "port_owners",
    "probe",
    "read_json",
    "read_note",
    "write_json",
    "write_note",
]

GONE = ".gone"  # attempts of removed workloads that are still ending
HANDED_OVER = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_", "GPUFRAC_")
RUNNER_NOTE = "runner.json"  # which runner started the run: {"kind": ...}

# the agent's own notes on a run, each ``<note>.json`` in its directory beside the runner's records
# (no runner reads or writes them): ``killed`` why the agent stopped it (and whether to make room),
# ``usage`` its peak GPU memory, ``qos`` what the QoS arbiter gave it, ``probe``, ``ready`` and
# ``port-taken`` its health check, ``limit-told`` that a host limit's stop was told as an event
Note = Literal["killed", "usage", "qos", "probe", "ready", "port-taken", "limit-told"]
NOTES: tuple[Note, ...] = get_args(Note)

NO_CGROUPS = (
    "gpufrac: warning: no cgroup hierarchy is writable here, so workloads run in their process "
    "group only: a process that leaves its group (setsid) is not paused by QoS, not counted by "
    "the memory watchdog and not stopped with the workload until it ends, and host limits "
    "(host_memory, cpus, pids) are not applied (docs/agent.md, Cgroups)"
)


def make_runner(
    kind: RunnerKind, cgroups: Layout, containers: ContainerSettings | None = None
) -> Runner:
    """The runner of ``kind`` (``cgroups``: where workloads' cgroups live on this machine;
    ``containers``: the operator's container settings). A new runner is its module, its name in
    ``RunnerKind`` and its case here."""
    match kind:
        case "process":
            return ProcessRunner(cgroups)
        case "container":
            return ContainerRunner(cgroups, containers)
        case _:
            assert_never(kind)


def note_path(run: Path, note: Note) -> Path:
    return run / f"{note}.json"


def read_note(run: Path, note: Note) -> dict[str, object]:
    """One of the agent's notes on a run ({} where there is none)."""
    return read_json(note_path(run, note))


def write_note(run: Path, note: Note, value: dict[str, object]) -> None:
    write_json(note_path(run, note), value)


def has_note(run: Path, note: Note) -> bool:
    return note_path(run, note).exists()


class Runs:
    def __init__(
        self,
        root: Path,
        *,
        stop_grace: float = 10.0,
        cgroups: Layout | None = None,
        runner: RunnerKind = "process",
        containers: ContainerSettings | None = None,
    ) -> None:
        """``cgroups``: where workloads' cgroups live (default: what this machine offers the
        agent, ``cgroups.detect``); a layout that is not ``usable`` runs them in process groups.
        ``runner``: the runner new runs start with."""
        self.root = root
        self.stop_grace = stop_grace
        self.cgroups = detect() if cgroups is None else cgroups
        if not self.cgroups.usable and cgroups is None:
            print(NO_CGROUPS, file=sys.stderr)
        self.kind: RunnerKind = runner
        self.containers = containers or ContainerSettings()
        self._runners: dict[RunnerKind, Runner] = {
            runner: make_runner(runner, self.cgroups, self.containers)
        }
        self._kinds: dict[Path, RunnerKind] = {}  # a run -> its runner (a run never changes it)
        # a cluster node's lease file (cluster/node.py): each run's shim stops its workload once
        # the lease in it has run out; None on a machine on its own
        self.lease_file: Path | None = None
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)  # specs (their env) and logs: the agent's alone

    # -- which runner ---------------------------------------------------------------------------

    def runner(self, kind: RunnerKind) -> Runner:
        """The runner of ``kind``, made the first time it is asked for."""
        found = self._runners.get(kind)
        if found is None:
            found = self._runners[kind] = make_runner(kind, self.cgroups, self.containers)
        return found

    def _containers(self) -> ContainerRunner:
        """The container runner (made the first time it is asked for)."""
        found = self.runner("container")
        assert isinstance(found, ContainerRunner)
        return found

    def check_mount_sources(self, mounts: Sequence[VolumeMount], sources: Sequence[str]) -> None:
        """Where each container mount leads exists and only root can change it
        (``container_runner.check_mount_sources``)."""
        check_mount_sources(mounts, sources)

    def check_image(self, image: str) -> None:
        """Refuse (``InputError`` on ``spec.image``) an image the container engine does not have
        here, or any where no engine runs; nothing is pulled."""
        self._containers().check_image(image)

    def refresh_cdi(self, spec: Mapping[str, object], *, create: bool = True) -> bool:
        """Write gpufrac's CDI spec (``runtime/cdi.py``) where it changed; ``create=False``: only
        where it is there already (containers use it). True if it was written."""
        cdi = self._containers().cdi
        if not create and not cdi.exists():
            return False
        return cdi.refresh(spec)

    def handle(self, run: Path) -> RunHandle:
        """The handle of a run: its directory and the runner that started it (read once from
        ``runner.json``; a run from before it was written is the process runner's)."""
        kind = self._kinds.get(run)
        if kind is None:
            raw = read_json(run / RUNNER_NOTE).get("kind", "process")
            kind = next((k for k in RUNNER_KINDS if k == raw), None)
            if kind is None:
                raise RuntimeError(
                    f"{run} was started by the runner {raw!r}, which this gpufrac does not have"
                )
            self._kinds[run] = kind
        return RunHandle(run, kind)

    def runner_of(self, run: Path) -> tuple[Runner, RunHandle]:
        handle = self.handle(run)
        return self.runner(handle.runner), handle

    # -- the runs of a workload -----------------------------------------------------------------

    def of(self, tenant: str, name: str) -> Path:
        return self.root / tenant / name

    def attempts(self, tenant: str, name: str, generation: int) -> list[Path]:
        """The attempts of one generation, oldest first."""
        root = self.of(tenant, name)
        if not root.exists():
            return []
        found = [p for p in root.glob(f"g{generation}-*") if p.name.split("-")[-1].isdigit()]
        return sorted(found, key=lambda p: int(p.name.split("-")[-1]))

    def latest(self, tenant: str, name: str, generation: int) -> Path | None:
        """The newest attempt (``log`` is the workload's log)."""
        attempts = self.attempts(tenant, name, generation)
        return attempts[-1] if attempts else None

    def launch(
        self,
        tenant: str,
        name: str,
        generation: int,
        attempt: int,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        workdir: str | None,
        user: str | int | None,
        group: int | None = None,
        view: PythonView | None = None,
        limits: HostLimits | None = None,
        grant: Grant | None = None,
        container: ContainerLaunch | None = None,
    ) -> Path:
        """Start an attempt (``env``: its whole environment, ``grant``'s included): with the
        container runner where ``container`` is given, else the runner new runs start with."""
        kind: RunnerKind = "container" if container is not None else self.kind
        run_dir = self.of(tenant, name) / f"g{generation}-{attempt}"
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / RUNNER_NOTE, {"kind": kind})
        self._kinds[run_dir] = kind
        self.runner(kind).start(
            RunHandle(run_dir, kind),
            Launch(
                command,
                env,
                workdir,
                user,
                group,
                view,
                limits or HostLimits(),
                self.lease_file,
                grant or Grant({}),
                container,
            ),
        )
        return run_dir

    # -- what a run's runner says ---------------------------------------------------------------

    def status(self, run: Path) -> RunStatus:
        runner, handle = self.runner_of(run)
        return runner.status(handle)

    def live(self, run: Path, status: RunStatus | None = None) -> bool:
        """Whether the run's workload runs, or is about to: its supervisor is alive or still on
        its way."""
        runner, handle = self.runner_of(run)
        status = status or runner.status(handle)
        return not status.done and (status.shim_alive or runner.launching(handle, status))

    def launching(self, run: Path, status: RunStatus) -> bool:
        runner, handle = self.runner_of(run)
        return runner.launching(handle, status)

    def pending_outcome(self, run: Path, status: RunStatus) -> str | None:
        runner, handle = self.runner_of(run)
        return runner.pending_outcome(handle, status)

    def abandon(self, run: Path, status: RunStatus) -> RunStatus:
        runner, handle = self.runner_of(run)
        return runner.abandon(handle, status)

    def clear_unknown(self, run: Path, by: str) -> bool:
        runner, handle = self.runner_of(run)
        return runner.clear_unknown(handle, by)

    def limit_hit(self, run: Path) -> str | None:
        runner, handle = self.runner_of(run)
        return runner.limit_hit(handle)

    def owns(self, run: Path, *, pid: int | None = None, port: int | None = None) -> bool:
        """Whether process ``pid`` (or the listener on ``port``) is the run's workload's."""
        runner, handle = self.runner_of(run)
        return runner.owns(handle, pid=pid, port=port)

    def members(self, run: Path, pids: Iterable[int]) -> frozenset[int]:
        """Those of ``pids`` that are the run's workload's processes."""
        runner, handle = self.runner_of(run)
        return runner.members(handle, pids)

    def pausable(self, run: Path) -> Pausable | None:
        runner, handle = self.runner_of(run)
        return runner.pausable(handle)

    def resume(self, run: Path) -> bool:
        runner, handle = self.runner_of(run)
        return runner.resume(handle)

    def log(self, run: Path) -> Path:
        """The file the run's workload's output goes to."""
        runner, handle = self.runner_of(run)
        return runner.log(handle)

    def handed_env(self, run: Path | None) -> dict[str, str]:
        """The GPU environment a run was started with (what gpufrac handed it)."""
        if run is None:
            return {}
        runner, handle = self.runner_of(run)
        # a replica's key is a secret between it and its gateway: not shown
        return {
            k: v
            for k, v in runner.env(handle).items()
            if k.startswith(HANDED_OVER) and k != REPLICA_KEY_ENV
        }

    # -- stopping and forgetting ----------------------------------------------------------------

    def stop_live(self, tenant: str, name: str, reason: str = "") -> bool:
        """Stop every attempt still running (SIGTERM, SIGKILL after the grace); ``reason`` is kept
        in the run as why it was stopped. True if one was running."""
        root = self.of(tenant, name)
        stopped = False
        if not root.exists():
            return False
        for run_dir in root.iterdir():
            if not run_dir.is_dir():
                continue
            runner, handle = self.runner_of(run_dir)
            if not runner.status(handle).done:
                if reason:
                    write_note(run_dir, "killed", {"reason": reason})
                runner.stop(handle, grace=self.stop_grace)
                stopped = True
        return stopped

    def remove(self, tenant: str, name: str) -> None:
        """Stop what runs and forget every attempt (the workload is deleted or replaced). Attempts
        still ending (a workload in its grace after SIGTERM) are moved aside to ``.gone`` until
        they have ended (``sweep``), so the name is free at once."""
        self.stop_live(tenant, name)
        root = self.of(tenant, name)
        if not root.exists():
            return
        runs = [r for r in root.iterdir() if r.is_dir()]
        ended = all(self._ended(r) for r in runs)
        for r in runs:
            self._kinds.pop(r, None)  # the directory goes: a new run there may be another's
        if ended:
            shutil.rmtree(root, ignore_errors=True)
            return
        gone = self.root / GONE
        gone.mkdir(parents=True, exist_ok=True)
        os.replace(root, gone / f"{tenant}.{name}.{time.time_ns()}")

    def _ended(self, run: Path) -> bool:
        return not self.live(run)

    def sweep(self) -> None:
        """Forget removed attempts that have ended since."""
        gone = self.root / GONE
        if not gone.exists():
            return
        for entry in gone.iterdir():
            runs = [r for r in entry.iterdir() if r.is_dir()] if entry.is_dir() else []
            if all(self._ended(r) for r in runs):
                for r in runs:
                    self._kinds.pop(r, None)
                shutil.rmtree(entry, ignore_errors=True)

    def wait_stopped(self, timeout: float) -> bool:
        """Wait until every removed attempt has ended; True if they all did within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            self.sweep()
            gone = self.root / GONE
            if not gone.exists() or not any(gone.iterdir()):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def probe(kind: str, port: int, path: str, host: str = "127.0.0.1") -> bool:
    """One readiness probe on this machine: a TCP connect, or an HTTP GET answered with 2xx/3xx,
    at ``host`` (where workloads listen: ``$GPUFRAC_HOST``)."""
    try:
        if kind == "tcp":
            with socket.create_connection((host, port), timeout=0.5):
                return True
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=1.0) as r:
            return 200 <= int(r.status) < 400
    except (OSError, ValueError):
        return False


def read_json(path: Path) -> dict[str, object]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def write_json(path: Path, value: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)
