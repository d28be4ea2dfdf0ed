"""The agent's side of the QoS arbiter: start its process, keep its members in step, read what it
gave.

The arbiter runs as a child process (``runtime/arbiter_server.py``, through
``runtime/child_link.py``), started the first time a GPU (or MIG instance) has two workloads to
arbitrate between. The agent talks to it over its own end of a socket pair (workloads use the public
socket, which takes no agent commands); when the agent exits, however it exits, that end closes, and
the arbiter resumes what it paused and stops. ``sync`` is called every reconcile pass with the
members that should exist; it sends only what changed, and sends everything again to an arbiter that
was restarted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufrac.model.qos import QosParams
from gpufrac.runtime.arbiter_server import SOCKET
from gpufrac.runtime.cgroups import WorkloadCgroup
from gpufrac.runtime.child_link import ChildLink


@dataclass(frozen=True, slots=True)
class MemberSpec:
    domain: str
    qos: QosParams
    pgid: int | None
    active: bool = True  # busy on the GPU now: a transparent member wants the GPU only then
    cgroup: WorkloadCgroup | None = None  # where it has one, the arbiter freezes it instead


def _resume(m: MemberSpec) -> None:
    if m.cgroup is not None:
        m.cgroup.thaw()
    if m.pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(m.pgid, signal.SIGCONT)


class ArbiterLink:
    def __init__(
        self,
        directory: Path,
        *,
        quantum_ms: float = 10.0,
        grace_ms: float = 2.0,
        window_s: float = 2.0,
        preempt: str = "overlap",
        trace: Path | None = None,
    ) -> None:
        self.dir = directory
        # there before the arbiter is: a container is handed it (mounted) when it starts
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
        self.args = [
            "--dir", str(directory), "--quantum-ms", str(quantum_ms), "--grace-ms", str(grace_ms),
            "--window-s", str(window_s), "--preempt", preempt,
            *(["--trace", str(trace)] if trace else []),
        ]  # fmt: skip
        self.child = ChildLink(
            "QoS arbiter", "gpufrac.runtime.arbiter_server", directory / "arbiter.log"
        )
        self._sent: dict[str, MemberSpec] = {}
        self.latest: dict[str, Any] = {}  # the last stats read (each reconcile pass reads them)
        self.ended: list[dict[str, Any]] = []  # the pauses that ended since the read before
        self.clock = 0.0  # the arbiter's monotonic clock at the last read
        self._epoch: object = None
        self._pauses_after = 0

    @property
    def address(self) -> str:
        """What workloads get as ``GPUFRAC_ARBITER``."""
        return str(self.dir / SOCKET)

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.child.proc

    @property
    def running(self) -> bool:
        return self.child.running

    def sync(self, members: dict[str, MemberSpec], *, start: bool = False) -> None:
        """Make the arbiter's members these. Starts it when a domain has two members to arbitrate
        (or at once with ``start``)."""
        if not self.running:
            # the arbiter is gone (killed, hung and killed, never started): what it paused must run
            for m in self._sent.values():
                _resume(m)
            self._sent = {}
            per_domain: dict[str, int] = {}
            for m in members.values():
                per_domain[m.domain] = per_domain.get(m.domain, 0) + 1
            if not start and self.proc is None and max(per_domain.values(), default=0) < 2:
                return  # nothing to arbitrate yet: a lone workload runs free
            self.child.start(self.args)  # it takes every member as running, as they now are
        try:
            for key, m in members.items():
                if self._sent.get(key) != m:
                    self.child.call(
                        "S "
                        + json.dumps(
                            {
                                "key": key,
                                "domain": m.domain,
                                "qos": m.qos.to_json(),
                                "pgid": m.pgid,
                                "cgroup": None if m.cgroup is None else m.cgroup.to_json(),
                                "active": m.active,
                            }
                        )
                    )
                    self._sent[key] = m
            for key in [k for k in self._sent if k not in members]:
                self.child.call(f"D {key}")
                del self._sent[key]
        except OSError:
            self.child.close()  # started again, with everything, on the next pass

    def stats(self) -> dict[str, Any]:
        """Per member: mode, paused, turns, held share, GPU share the SDK measured. Empty if not
        running. The pauses that ended since the last read are kept in ``ended`` (each once, for
        the events and counters), with ``clock``: the arbiter's monotonic time when it answered."""
        self.ended = []
        if not self.running:
            self.latest = {}
            return {}
        try:
            got = self.child.call("T " + json.dumps({"pauses_after": self._pauses_after}))
        except OSError:
            self.child.close()
            self.latest = {}
            return {}
        if got.get("epoch") != self._epoch:  # a new arbiter: its pause ids start again
            self._epoch, self._pauses_after = got.get("epoch"), 0
            got = self.child.call("T " + json.dumps({"pauses_after": 0}))
        self.ended = [p for p in got.get("pauses") or [] if isinstance(p, dict)]
        if self.ended:
            self._pauses_after = max(int(p["seq"]) for p in self.ended)
        self.clock = float(got.get("now") or 0.0)
        self.latest = dict(got.get("members") or {})
        return self.latest

    def close(self) -> None:
        self.child.close()
