"""A workload's log read with bounds: from the end of its file, never more than a byte cap of it
(a 150 MiB log asked for whole answers its newest lines that fit, not 150 MiB), and the bounds on
how many such reads (or a control plane's relays of them) run at once per tenant and per node,
each tried without waiting: one over its bound is refused (``errors.Busy``, 429), not queued.

The operator's settings (``log_relay_*`` in ``gpufrac.yaml``) give the numbers: ``LogReads``.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpufrac.errors import Busy
from gpufrac.model.settings import SETTINGS_FILE, OperatorSettings

MIB = 1024 * 1024
CHUNK = 64 * 1024  # how far back each step of the search for the first line asked for reads


def read_tail(path: Path, *, tail: int, max_bytes: int) -> tuple[list[str], bool]:
    """The last ``tail`` lines of ``path`` (0: all of them), read from its end and at most
    ``max_bytes`` of it, as text; and whether the cap left out lines that were asked for
    (``read_window``, ``lines_of``)."""
    window, truncated = read_window(path, tail=tail, max_bytes=max_bytes)
    return lines_of(window, tail), truncated


def lines_of(window: bytes | bytearray, tail: int) -> list[str]:
    """The last ``tail`` lines (0: all) of a log's bytes, as text (bytes that are not UTF-8
    replaced, never refused: a workload writes what it writes)."""
    lines = window.decode("utf-8", errors="replace").splitlines()
    return lines[-tail:] if tail > 0 else lines


def read_window(path: Path, *, tail: int, max_bytes: int) -> tuple[bytes, bool]:
    """The end of ``path`` that holds its last ``tail`` lines (0: all of them), at most
    ``max_bytes`` of it, starting where a line starts (unless one line alone is longer than the
    cap: then its newest ``max_bytes``); and whether the cap left out lines that were asked for.
    It may hold a few lines more than ``tail``. No file, or one that cannot be read: nothing.

    Memory: the window, once (the search for its start reads and drops one chunk at a time)."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be at least 1, not {max_bytes}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b"", False
    try:
        end = os.fstat(fd).st_size
        start = _window_start(fd, end, tail=tail, max_bytes=max_bytes)
        partial = False
        # the window starts inside a line, maybe: then it keeps from the next one
        if start > 0 and os.pread(fd, 1, start - 1) != b"\n":
            newline = _next_newline(fd, start, end)
            if newline is None or newline + 1 == end:
                partial = True  # the last line is longer than the cap: its newest part
            else:
                start = newline + 1
        window = os.pread(fd, end - start, start)
    except OSError:
        return b"", False
    finally:
        os.close(fd)
    if start == 0:
        return window, False
    whole = window.count(b"\n") + (0 if window.endswith(b"\n") or not window else 1)
    return window, partial or tail == 0 or whole < tail


def _window_start(fd: int, end: int, *, tail: int, max_bytes: int) -> int:
    """Where the read starts: ``max_bytes`` before the end, or (``tail`` > 0) later, just before
    the ``tail`` last lines (more than ``tail`` newlines after it: the first line is whole)."""
    earliest = max(0, end - max_bytes)
    if tail == 0:
        return earliest
    pos, newlines = end, 0
    while pos > earliest and newlines <= tail:
        step = min(CHUNK, pos - earliest)
        pos -= step
        newlines += os.pread(fd, step, pos).count(b"\n")
    return pos


def _next_newline(fd: int, start: int, end: int) -> int | None:
    """Where the first newline at or after ``start`` (before ``end``) is; None for none."""
    pos = start
    while pos < end:
        chunk = os.pread(fd, min(CHUNK, end - pos), pos)
        if not chunk:
            return None
        found = chunk.find(b"\n")
        if found >= 0:
            return pos + found
        pos += len(chunk)
    return None


class Slots:
    """How many of one kind of call are under way per key (a tenant, a node), each key bounded,
    tried without waiting: ``taken`` raises ``Busy`` over the bound."""

    def __init__(self, bound: int, *, what: str, setting: str, retry_after_s: int) -> None:
        """``what``: the calls, with ``{}`` for the key ("log reads of tenant {}");
        ``setting``: the operator's setting that bounds them, named in the refusal."""
        if bound < 1:
            raise ValueError(f"a bound of {bound}: give at least 1")
        self.bound = bound
        self.what = what
        self.setting = setting
        self.retry_after_s = retry_after_s
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def held(self, key: str) -> int:
        with self._lock:
            return self._held.get(key, 0)

    @contextmanager
    def taken(self, key: str) -> Iterator[None]:
        """One slot of ``key`` for the block; ``Busy`` (nothing taken) when all are."""
        with self._lock:
            n = self._held.get(key, 0)
            if n >= self.bound:
                raise Busy(
                    f"{self.bound} {self.what.format(key)} are under way at once, the most "
                    f"allowed ({self.setting} in {SETTINGS_FILE}); try again in "
                    f"{self.retry_after_s} s",
                    retry_after_s=self.retry_after_s,
                )
            self._held[key] = n + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._held[key] - 1
                if left:
                    self._held[key] = left
                else:
                    del self._held[key]


class LogReads:
    """A server's bounds on log reads, from the operator's settings: the byte cap of one answer,
    the deadline of one relay, and the reads under way at once per tenant and per node (a refused
    one is told to try again once the deadline has passed: a slot is free by then)."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.max_bytes = settings.log_relay_max_mib * MIB
        self.deadline_s = settings.log_relay_deadline_s
        retry = max(1, math.ceil(self.deadline_s))
        self.per_tenant = Slots(
            settings.log_relay_per_tenant,
            what="log reads of tenant {}",
            setting="log_relay_per_tenant",
            retry_after_s=retry,
        )
        self.per_node = Slots(
            settings.log_relay_per_node,
            what="log reads from node {}",
            setting="log_relay_per_node",
            retry_after_s=retry,
        )
