"""A helper process the agent owns and commands over its own end of a socket pair.

The QoS arbiter and the request gateway both run this way: started with ``--admin-fd N`` (the
child's end of the pair), they print ``ready ...`` on stdout once listening, answer each command
line with ``K {json}`` (or ``E {json}``), and stop, cleaning up after themselves, when the agent's
end closes: however the agent exits, even ``kill -9``, its helpers follow.

A helper that does not answer a command within ``call_timeout`` (hung, stopped, or spinning) is
taken for dead: the caller closes the link, and ``close`` gives the process ``grace`` seconds to
exit after its end of the pair closes, then kills it (SIGKILL, which also ends a stopped process).
The caller's next pass starts a new one. So a hung helper costs at most ``call_timeout + grace``
once.
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
from pathlib import Path
from typing import Any


class ChildRefused(OSError):
    """The helper answered ``E``: it is alive and refused one command (nothing to restart)."""


class ChildLink:
    def __init__(
        self, what: str, module: str, log: Path, *, call_timeout: float = 5.0, grace: float = 1.0
    ) -> None:
        self.what, self.module, self.log = what, module, log
        self.call_timeout, self.grace = call_timeout, grace
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_line = ""
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self.starts = 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self._sock is not None

    def start(self, args: list[str]) -> None:
        """Start the process (stopping any earlier one) and wait for its ``ready`` line."""
        self.close()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair()
        cmd = [sys.executable, "-m", self.module, "--admin-fd", str(theirs.fileno()), *args]
        try:
            with open(self.log, "ab") as log:
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
        ours.settimeout(self.call_timeout)
        self._sock = ours
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 15.0)
        line = self.proc.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("ready"):
            self.close()
            raise RuntimeError(f"the {self.what} did not start; see {self.log}")
        self.ready_line = line
        self.starts += 1

    def call(self, line: str) -> dict[str, Any]:
        """One command, one answer. OSError if the process is gone or refused it."""
        with self._lock:  # the reconcile loop and the API share the connection
            if self._sock is None:
                raise OSError(f"the {self.what} is not running")
            self._sock.sendall(line.encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = self._sock.recv(65536)
                if not chunk:
                    raise OSError(f"the {self.what} closed the connection")
                data += chunk
        reply = data.decode().strip()
        if not reply.startswith("K"):
            raise ChildRefused(f"the {self.what} refused {line[:40]!r}: {reply}")
        value = json.loads(reply[2:] or "{}")
        return value if isinstance(value, dict) else {}

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None  # the child sees its end close: it cleans up and exits
        if self.proc is not None:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            try:
                self.proc.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:  # hung: it did not see its end close, or ignored it
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait()
            self.proc = None
