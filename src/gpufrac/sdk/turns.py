"""GPU turns: how a workload asks the node's QoS arbiter before it submits GPU work.

``with gpu_turn(): ...`` around one request or one training step. The turn is taken when the block
starts and given back when the GPU work it queued is done (a CUDA event is recorded at the end of
the block and waited for; CUDA is asynchronous, so the Python call returning is not the GPU being
free). Inside a turn, ``turn.checkpoint()`` (the PyTorch integration calls it at module boundaries)
keeps the work in flight short and, when the arbiter has asked this workload to yield (one byte in
shared memory, read without a system call), finishes the work in flight, gives the turn back and
waits for the next.

Everything fails open: without an arbiter (no ``GPUFRAC_ARBITER``, or it cannot be reached), or when
the connection breaks, turns are granted at once and the client tries to reconnect at most once a
second. The environment the agent hands over: ``GPUFRAC_ARBITER`` (socket), ``GPUFRAC_QOS_DOMAIN``
(the GPU or MIG instance), ``GPUFRAC_TENANT``/``GPUFRAC_WORKLOAD`` and ``GPUFRAC_QOS_RANK``,
``..._WEIGHT``, ``..._MIN_SHARE_MILLI`` (used only where the agent did not register the workload
itself).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RECONNECT_SECONDS = 1.0
FLAGS = "arbiter.flags"
_UNIX_PATH_MAX = 100


class TurnClient:
    """One connection to the arbiter (thread-safe; one per process is enough)."""

    def __init__(
        self,
        address: str | None,
        *,
        workload: str,
        domain: str,
        qos: dict[str, int] | None = None,
    ) -> None:
        self.address = address
        self.workload, self.domain, self.qos = workload, domain, qos or {}
        self._sock: socket.socket | None = None
        self._flags: mmap.mmap | None = None
        self._slot = 0
        self._retry_at = 0.0
        self._lock = threading.RLock()
        self.granted_free = 0  # turns taken without an arbiter (fail-open)

    @classmethod
    def from_env(cls) -> TurnClient:
        env = os.environ
        workload = (
            f"{env.get('GPUFRAC_TENANT', 'default')}/"
            f"{env.get('GPUFRAC_WORKLOAD', str(os.getpid()))}"
        )
        qos = {
            k: int(env[f"GPUFRAC_QOS_{k.upper()}"])
            for k in ("rank", "weight", "min_share_milli")
            if _integer(env.get(f"GPUFRAC_QOS_{k.upper()}", ""))
        }
        return cls(
            env.get("GPUFRAC_ARBITER") or None,
            workload=workload,
            domain=env.get("GPUFRAC_QOS_DOMAIN") or env.get("CUDA_VISIBLE_DEVICES", "") or "0",
            qos=qos,
        )

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        if self._flags is not None:
            with contextlib.suppress(BufferError, ValueError):
                self._flags.close()
        self._sock, self._flags = None, None
        self._retry_at = time.monotonic() + RECONNECT_SECONDS

    def _connect(self) -> bool:
        if self._sock is not None:
            return True
        if self.address is None or time.monotonic() < self._retry_at:
            return False
        path, dir_fd = self.address, None
        if len(path) > _UNIX_PATH_MAX:
            dir_fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
            path = f"/proc/self/fd/{dir_fd}/{os.path.basename(path)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            hello = {"workload": self.workload, "domain": self.domain, "qos": self.qos}
            sock.sendall(b"H " + json.dumps(hello).encode() + b"\n")
            line = _read_line(sock)
            if not line.startswith(b"K "):
                raise ValueError(line.decode(errors="replace"))
            reply = json.loads(line[2:])
            flags_path = Path(self.address).parent / str(reply.get("flags", FLAGS))
            slot = int(reply["slot"])
            with open(flags_path, "rb") as f:
                flags = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError, KeyError, TypeError):
            sock.close()
            self._retry_at = time.monotonic() + RECONNECT_SECONDS
            return False
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        self._sock, self._flags, self._slot = sock, flags, slot
        return True

    def acquire(self) -> bool:
        """Wait for a turn. True if the arbiter granted it; False if it ran free (no arbiter)."""
        with self._lock:
            if not self._connect():
                self.granted_free += 1
                return False
            assert self._sock is not None
            try:
                self._sock.sendall(b"A\n")
                if (
                    _read_line(self._sock) != b"G"
                ):  # an error answer: run free, as without an arbiter
                    raise ValueError("the arbiter did not grant the turn")
            except (OSError, ValueError):
                self._drop()
                self.granted_free += 1
                return False
            return True

    def release(self, gpu_seconds: float | None = None) -> None:
        with self._lock:
            if self._sock is None:
                return
            msg = b"R\n" if gpu_seconds is None else f"R {gpu_seconds:.6f}\n".encode()
            try:
                self._sock.sendall(msg)
            except OSError:
                self._drop()

    def should_yield(self) -> bool:
        """Has the arbiter asked this workload to give its turn back? (A memory read, no system
        call.)"""
        flags = self._flags
        try:
            return flags is not None and flags[self._slot] == 1
        except (ValueError, IndexError):  # closed by another thread meanwhile
            return False


def _integer(text: str) -> bool:
    """An integer in ASCII digits, with an optional minus (``"²".isdigit()`` is true, and
    ``int("²")`` raises; ``int("١٢")`` is 12)."""
    digits = text.removeprefix("-")
    return digits.isascii() and digits.isdigit()


def _read_line(sock: socket.socket) -> bytes:
    """One answer. A client has at most one request outstanding, so one answer is all there is."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise OSError("the arbiter closed the connection")
        data += chunk
    return data[:-1]


class Turn:
    """One turn: GPU work between ``begin`` and ``end``, timed by CUDA events where CUDA is in
    use."""

    def __init__(self, client: TurnClient, *, max_in_flight: int = 2) -> None:
        self.client = client
        self.max_in_flight = max_in_flight
        self.yields = 0
        self._torch = _cuda_torch()
        self._start: Any = None
        self._in_flight: deque[Any] = deque()
        self._gpu_s = 0.0
        self._epoch = 0  # turns begun: threads at one yield point give the turn back only once
        self._yield_lock = threading.Lock()

    def begin(self) -> None:
        self.client.acquire()
        self._epoch += 1
        self._gpu_s = 0.0
        if self._torch is not None:
            self._start = self._torch.cuda.Event(enable_timing=True)
            self._start.record()

    def _finish_gpu_work(self) -> None:
        if self._torch is None or self._start is None:
            return
        end = self._torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        self._gpu_s += self._start.elapsed_time(end) / 1000.0
        self._in_flight.clear()

    def checkpoint(self) -> None:
        """A yield point: bound the work in flight, and give the turn back if the arbiter asks."""
        if self._torch is not None and self.max_in_flight > 0:
            mark = self._torch.cuda.Event()
            mark.record()
            self._in_flight.append(mark)
            while len(self._in_flight) > self.max_in_flight:
                self._in_flight.popleft().synchronize()
        if not self.client.should_yield():
            return
        seen = self._epoch
        with self._yield_lock:
            if self._epoch != seen or not self.client.should_yield():
                return  # another thread of this process already yielded for this request
            self._finish_gpu_work()
            self.client.release(self._gpu_s)
            self.yields += 1
            self.begin()

    def end(self) -> None:
        self._finish_gpu_work()
        self.client.release(self._gpu_s if self._torch is not None else None)


def _cuda_torch() -> Any:
    """PyTorch, if this process already imported it and initialised CUDA (never imported here)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_initialized() else None
    except AttributeError:
        return None


_client: TurnClient | None = None
_client_lock = threading.Lock()
_current: Turn | None = None
_holders = 0  # blocks (in any thread) inside the current turn
_turn_lock = threading.Lock()


def default_client() -> TurnClient:
    global _client
    with _client_lock:
        if _client is None:
            _client = TurnClient.from_env()
        return _client


def current_turn() -> Turn | None:
    """The turn this process holds now, if any (the PyTorch hooks use it)."""
    return _current


@contextlib.contextmanager
def gpu_turn(
    client: TurnClient | None = None, *, max_in_flight: int | None = None
) -> Iterator[Turn]:
    """Hold the GPU turn for the block: one request, or one training step. ``max_in_flight``: how
    many modules' work may be queued ahead of the GPU at a yield point (default 2, or
    ``GPUFRAC_QOS_MAX_IN_FLIGHT``); fewer makes a yield quicker, more keeps the GPU fed better."""
    global _current, _holders
    if max_in_flight is None:
        env = os.environ.get("GPUFRAC_QOS_MAX_IN_FLIGHT", "")
        max_in_flight = int(env) if _integer(env) and not env.startswith("-") else 2
    with _turn_lock:  # the turn is the process's: another thread (or a nested block) joins it
        if _current is None:
            turn = Turn(client or default_client(), max_in_flight=max_in_flight)
            turn.begin()
            _current = turn
        _holders += 1
        turn = _current
    try:
        yield turn
    finally:
        with _turn_lock:
            _holders -= 1
            if _holders == 0:
                _current = None
                turn.end()
