"""The runner seam: how a workload is started, signalled, paused, stopped and recognised.

One protocol, ``Runner``, over a value for a workload's run, ``RunHandle`` (its run directory,
where the runner keeps what it needs to find the workload again after an agent restart). Today's
runner is ``runtime.process_runner.ProcessRunner``: a host command under its shim, in its own
process group and cgroup. A new runner (an OCI container, say) is one module implementing
``Runner``, plus its name in ``RunnerKind`` and its choice in ``runtime.runs.Runs``.

What the rest of the agent asks of a run goes through here: ``status`` (how it is going, the
shim's record), ``owns`` (is this process, or the listener on this port, the workload's: GPU
memory and SM use are attributed by it, a health check's port is checked by it), ``pause`` and
``resume`` (QoS, where the arbiter is not running), ``signal`` and ``stop``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from gpufrac.runtime.cgroups import HostLimits
from gpufrac.runtime.python_view import PythonView
from gpufrac.runtime.shim import ShimStatus

RunnerKind = Literal["process"]
RunStatus = ShimStatus  # how a run is going, whatever runs it


@dataclass(frozen=True, slots=True)
class RunHandle:
    """A workload's run: the directory a runner keeps its records in, and which runner owns it."""

    run_dir: Path
    runner: RunnerKind = "process"


@dataclass(frozen=True, slots=True)
class Launch:
    """What a runner needs to start a workload."""

    command: Sequence[str]
    env: Mapping[str, str]
    workdir: str | None = None
    user: str | int | None = None
    group: int | None = None
    view: PythonView | None = None
    limits: HostLimits = field(default_factory=HostLimits)
    lease: Path | None = None  # a cluster node's lease file: the run stops once it runs out


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

    def status(self, handle: RunHandle) -> RunStatus: ...
