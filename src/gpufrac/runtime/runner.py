"""The runner seam: how a workload is started, signalled, paused, stopped and recognised.

One protocol, ``Runner``, over a value for a workload's run, ``RunHandle`` (its run directory,
where the runner keeps what it needs to find the workload again after an agent restart, and which
runner owns it). Today's runner is ``runtime.process_runner.ProcessRunner``: a host command under
its shim, in its own process group and cgroup.

Everything the rest of the agent asks of a run goes through here, never through a runner's files
or a pid taken as the workload's identity:

* starting and stopping: ``start`` (with a ``Launch``: the command, its environment and the
  ``Grant`` of devices and mounts it was handed), ``stop``, ``signal``, ``pause`` and ``resume``;
* how it goes: ``status`` (a ``RunStatus``), ``launching`` (on its way), ``pending_outcome`` (its
  workload ended but how is not recorded yet), ``abandon`` (its supervisor is gone: record it as
  ended), ``clear_unknown`` (an admin's word on an unknown outcome), ``limit_hit`` (the runner
  stopped it for a host limit);
* what it is: ``owns`` and ``members`` (which processes, or the listener on which port, are the
  workload's: GPU memory and SM use are attributed by them), ``pausable`` (how the QoS arbiter, a
  process of its own, pauses it), ``env`` (the environment it was started with) and ``log`` (its
  output).

A new runner (an OCI container, say) is one module with a class implementing ``Runner``, plus its
registration: its name in ``RunnerKind`` and its case in ``runtime.runs.make_runner`` (mypy holds
the ``match`` there to every kind). ``runtime.runs.Runs`` records which runner started each run, so
a restarted agent asks the same runner again.
"""

from __future__ import annotations

import signal as signals
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, get_args

from gpufrac.runtime.cgroups import HostLimits, WorkloadCgroup
from gpufrac.runtime.python_view import PythonView

RunnerKind = Literal["process", "container"]
RUNNER_KINDS: tuple[RunnerKind, ...] = get_args(RunnerKind)


@dataclass(frozen=True, slots=True)
class RunStatus:
    """How a run is going, whatever runs it. Its supervisor is the process that watches the
    workload and records how it ended (the process runner's shim)."""

    shim_pid: int | None  # the supervisor's pid
    child_pid: int | None  # the workload's first process (its process group's leader)
    started: float | None
    exit_code: int | None  # None while running (or if it died by a signal)
    signal: int | None
    finished: float | None
    shim_alive: bool  # the supervisor runs
    error: str | None = None  # why the workload could not start at all
    # how it ended is not known: its supervisor died without a record (``abandon``) and nobody
    # cleared it
    unknown: bool = False

    @property
    def done(self) -> bool:
        return self.finished is not None

    def ended_by(self) -> str:
        """How the run ended, as a person reads it: ``exit 3``, ``signal SIGKILL (9)``, or, where
        no exit status was recorded (its supervisor died), ``killed`` (with why, where known)."""
        if self.exit_code is not None:
            return f"exit {self.exit_code}"
        if self.signal is not None:
            try:
                return f"signal {signals.Signals(self.signal).name} ({self.signal})"
            except ValueError:
                return f"signal {self.signal}"
        return f"killed ({self.error})" if self.error else "killed"


@dataclass(frozen=True, slots=True)
class RunHandle:
    """A workload's run: the directory a runner keeps its records in, and which runner owns it."""

    run_dir: Path
    runner: RunnerKind = "process"


@dataclass(frozen=True, slots=True)
class BindMount:
    """A path of this machine a workload must see at ``target`` (a container's bind mount)."""

    source: Path
    target: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class Grant:
    """What a workload is handed of this machine (``runtime.handover.Handover.grant``): its
    environment (GPU, limits, QoS, MPS: docs/design.md), the devices it may see (GPU or MIG
    device UUIDs, as ``NVIDIA_VISIBLE_DEVICES`` names them) and the paths it must see (the MPS
    pipe directory). A process sees every device and file of the host, and is held to its GPU by
    its environment alone, so the process runner needs only ``env``; a container runner turns
    ``devices`` into its devices (CDI names, ``--device``), ``mounts`` into bind mounts and
    ``host_ipc`` into the host's IPC namespace and ``/dev/shm`` (an MPS client's: it and the MPS
    server share memory there, as a host process does anyway)."""

    env: Mapping[str, str]
    devices: tuple[str, ...] = ()
    mounts: tuple[BindMount, ...] = ()
    host_ipc: bool = False


@dataclass(frozen=True, slots=True)
class ContainerLaunch:
    """What a container runner needs beyond a process's: the image, the environment the container
    gets (its manifest's ``env`` and the grant's: never the agent's own ``PATH`` or ``HOME``),
    the tenant's bind mounts and the ports published on ``publish_host`` (where the agent
    reaches workloads: ``127.0.0.1``, or a cluster node's address)."""

    image: str
    env: Mapping[str, str]
    mounts: tuple[BindMount, ...] = ()
    ports: tuple[int, ...] = ()
    publish_host: str = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Launch:
    """What a runner needs to start a workload. ``env`` is its whole environment (what it starts
    from, its manifest's ``env`` and ``grant.env``)."""

    command: Sequence[str]
    env: Mapping[str, str]
    workdir: str | None = None
    user: str | int | None = None
    group: int | None = None
    view: PythonView | None = None
    limits: HostLimits = field(default_factory=HostLimits)
    lease: Path | None = None  # a cluster node's lease file: the run stops once it runs out
    grant: Grant = field(default_factory=lambda: Grant({}))
    container: ContainerLaunch | None = None  # for the container runner
    # the command is a container engine's client, which puts the container below the workload's
    # cgroup itself: the client stays out of its memory cgroup, whose limit bounds the container
    engine_client: bool = False


@dataclass(frozen=True, slots=True)
class Pausable:
    """How a process other than the agent (the QoS arbiter) recognises and pauses a running
    workload: its cgroup is frozen where it has one, else its process group is stopped; a client
    process belongs to the workload when it is in either."""

    group: int
    cgroup: WorkloadCgroup | None = None


class Runner(Protocol):
    kind: RunnerKind

    def start(self, handle: RunHandle, launch: Launch) -> None:
        """Start the workload without waiting for it (``status`` tells when it runs)."""
        ...

    def stop(self, handle: RunHandle, *, grace: float, wait: float = 0.5) -> bool:
        """SIGTERM, then SIGKILL after ``grace``; True if it has ended within ``wait`` seconds."""
        ...

    def signal(self, handle: RunHandle, sig: int) -> int:
        """Send ``sig`` to every process of the workload; how many got it."""
        ...

    def pause(self, handle: RunHandle) -> bool:
        """Stop every process of the workload where it is (True if there was one)."""
        ...

    def resume(self, handle: RunHandle) -> bool: ...

    def owns(self, handle: RunHandle, *, pid: int | None = None, port: int | None = None) -> bool:
        """Whether process ``pid`` is one of the workload's, or the listener on ``port`` is
        (True where the owner of the port cannot be told)."""
        ...

    def members(self, handle: RunHandle, pids: Iterable[int]) -> frozenset[int]:
        """Those of ``pids`` that are the workload's processes (``owns`` for many at once, its
        records read once): GPU memory and SM use are attributed by it. Empty once it ended."""
        ...

    def status(self, handle: RunHandle) -> RunStatus:
        """How the run is going, from what its runner recorded (after an agent restart too)."""
        ...

    def launching(self, handle: RunHandle, status: RunStatus) -> bool:
        """Started, and its supervisor has not reported yet, but may still (it is on its way)."""
        ...

    def pending_outcome(self, handle: RunHandle, status: RunStatus) -> str | None:
        """Why how the run ended is not known yet, where its workload has ended but its
        supervisor, still alive, could not record how (a full disk); None otherwise."""
        ...

    def abandon(self, handle: RunHandle, status: RunStatus) -> RunStatus:
        """A run that is not done and whose supervisor is gone without a record (it never
        reported, or it died: ``kill -9``, a reboot): what is left of the workload is killed, and
        the run is recorded as ended, once, with why (``error``): failed where it never started,
        with an outcome nobody knows (``unknown``) where it had; its status after."""
        ...

    def clear_unknown(self, handle: RunHandle, by: str) -> bool:
        """An admin's word (``by``) that a run whose outcome is unknown counts as failed; False
        if its outcome is not unknown."""
        ...

    def limit_hit(self, handle: RunHandle) -> str | None:
        """Why the runner stopped the workload for a host limit (``host_memory``), as a person
        reads it; None if it did not."""
        ...

    def pausable(self, handle: RunHandle) -> Pausable | None:
        """How the QoS arbiter pauses the workload while it runs; None while nothing of it runs
        (not started, ended, or its supervisor gone)."""
        ...

    def env(self, handle: RunHandle) -> Mapping[str, str]:
        """The environment the run was started with (empty where none was recorded)."""
        ...

    def log(self, handle: RunHandle) -> Path:
        """The file the workload's output goes to (it may not exist yet)."""
        ...
