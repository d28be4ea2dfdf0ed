"""The agent's side of the QoS arbiter: start its process, keep its members in step, read what it gave.

The arbiter runs as a child process (``runtime/arbiter_server.py``), started the first time a GPU (or
MIG instance) has two workloads to arbitrate between. The agent talks to it over its own end of a socket
pair (workloads use the public socket, which takes no agent commands); when the agent exits, however it
exits, that end closes, and the arbiter resumes what it paused and stops. ``sync`` is called every reconcile pass with the members that should exist; it sends only what
changed, and sends everything again to an arbiter that was restarted.
"""

from __future__ import annotations

import contextlib
import json
import select
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufrac.model.qos import QosParams
from gpufrac.runtime.arbiter_server import SOCKET


@dataclass(frozen=True, slots=True)
class MemberSpec:
    domain: str
    qos: QosParams
    pgid: int | None


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
        self.preempt = preempt
        self.dir = directory
        self.quantum_ms, self.grace_ms, self.window_s = quantum_ms, grace_ms, window_s
        self.trace = trace
        self.proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._sent: dict[str, MemberSpec] = {}
        self._lock = threading.Lock()
        self.restarts = 0

    @property
    def address(self) -> str:
        """What workloads get as ``GPUFRAC_ARBITER``."""
        return str(self.dir / SOCKET)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self._sock is not None

    def _start(self) -> None:
        self._close_process()
        self.dir.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair()
        cmd = [
            sys.executable,
            "-m",
            "gpufrac.runtime.arbiter_server",
            "--dir",
            str(self.dir),
            "--admin-fd",
            str(theirs.fileno()),
            "--quantum-ms",
            str(self.quantum_ms),
            "--grace-ms",
            str(self.grace_ms),
            "--window-s",
            str(self.window_s),
            "--preempt",
            self.preempt,
            *(["--trace", str(self.trace)] if self.trace else []),
        ]
        try:
            with open(self.dir / "arbiter.log", "ab") as log:
                self.proc = subprocess.Popen(
                    cmd,
                    pass_fds=(theirs.fileno(),),
                    stdout=subprocess.PIPE,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(10.0)
        self._sock = ours
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 15.0)
        if not ready or self.proc.stdout.readline().strip() != b"ready":
            self._close_process()
            raise RuntimeError(f"the QoS arbiter did not start; see {self.dir / 'arbiter.log'}")
        self._sent = {}
        self.restarts += 1

    def _call(self, line: str) -> dict[str, Any]:
        with self._lock:  # the reconcile loop and the API share the connection
            if self._sock is None:
                raise OSError("the arbiter is not running")
            self._sock.sendall(line.encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = self._sock.recv(65536)
                if not chunk:
                    raise OSError("the arbiter closed the connection")
                data += chunk
        reply = data.decode().strip()
        if not reply.startswith("K"):
            raise OSError(f"the arbiter refused {line[:40]!r}: {reply}")
        value = json.loads(reply[2:] or "{}")
        return value if isinstance(value, dict) else {}

    def sync(self, members: dict[str, MemberSpec], *, start: bool = False) -> None:
        """Make the arbiter's members these. Starts it when a domain has two members to arbitrate
        (or at once with ``start``)."""
        if not self.running:
            per_domain: dict[str, int] = {}
            for m in members.values():
                per_domain[m.domain] = per_domain.get(m.domain, 0) + 1
            if not start and self.proc is None and max(per_domain.values(), default=0) < 2:
                return  # nothing to arbitrate yet: a lone workload runs free
            self._start()
        try:
            for key, m in members.items():
                if self._sent.get(key) != m:
                    self._call(
                        "S "
                        + json.dumps(
                            {"key": key, "domain": m.domain, "qos": m.qos.to_json(), "pgid": m.pgid}
                        )
                    )
                    self._sent[key] = m
            for key in [k for k in self._sent if k not in members]:
                self._call(f"D {key}")
                del self._sent[key]
        except OSError:
            self._close_process()  # started again, with everything, on the next pass

    def stats(self) -> dict[str, Any]:
        """Per member: mode, paused, turns, held share, GPU share the SDK measured. Empty if not running."""
        if not self.running:
            return {}
        try:
            return dict(self._call("T").get("members") or {})
        except OSError:
            self._close_process()
            return {}

    def _close_process(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None  # the arbiter sees its end close: it resumes all and exits
        if self.proc is not None:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=5)
            self.proc = None

    def close(self) -> None:
        self._close_process()
