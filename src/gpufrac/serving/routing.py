"""The gateway's routing state: replicas (their pooled connections are the gateway's), and per
deployment the route that picks one (least outstanding requests, power of two choices, weighted by
how busy the replica's GPU is) and the FIFO of requests waiting for a free slot."""

from __future__ import annotations

import asyncio
import random
import time
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Any

# upper bounds (seconds) of the request latency histogram's buckets; one more bucket above the last
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(eq=False)
class Replica:
    id: str
    host: str
    port: int
    busy: float = 0.0
    outstanding: int = 0
    down_until: float = 0.0
    served: int = 0
    retired: bool = False  # taken out of the route: its connections are closed, not pooled
    codes: dict[int, int] = field(default_factory=dict)  # answers by status code
    latency: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0
    key: bytes = b""  # the header line with the key the replica knows its gateway by, or b""

    def observe(self, code: int, seconds: float) -> None:
        """Count one answered request: a few increments, no container made."""
        self.codes[code] = self.codes.get(code, 0) + 1
        self.latency[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds

    def counts(self) -> dict[str, Any]:
        return {
            "codes": {str(c): n for c, n in self.codes.items()},
            "latency": list(self.latency),  # per bucket, not cumulative; the last is above all
            "latency_sum": self.latency_sum,
        }


@dataclass(eq=False)
class Route:
    name: str
    replicas: dict[str, Replica] = field(default_factory=dict)
    max_concurrency: int = 8
    queue_limit: int = 256
    timeout_s: float = 60.0
    cold_start_timeout_s: float = 120.0
    tenant: str = "default"
    public: bool = False
    waiters: deque[asyncio.Future[Replica]] = field(default_factory=deque)
    retiring: dict[str, Replica] = field(default_factory=dict)  # removed, requests still on them
    done: deque[tuple[float, float]] = field(default_factory=deque)  # (at, latency s)
    rejected: int = 0
    errors: int = 0
    retries: int = 0
    cold_starts: int = 0  # requests that came with no replica at all and waited for one
    codes: dict[int, int] = field(default_factory=dict)  # answered by the gateway, no replica

    def pick(self, now: float, avoid: Replica | None = None) -> Replica | None:
        """Power of two choices among replicas with a free slot, by outstanding x GPU busy."""
        free = [
            r
            for r in self.replicas.values()
            if r.outstanding < self.max_concurrency and r.down_until <= now and r is not avoid
        ]
        if not free:
            return None
        if len(free) == 1:
            return free[0]
        a, b = random.sample(free, 2)
        return a if (a.outstanding + 1) * (1 + a.busy) <= (b.outstanding + 1) * (1 + b.busy) else b

    def wake(self) -> None:
        """Hand free slots to waiters, oldest first."""
        now = time.monotonic()
        while self.waiters:
            fut = self.waiters[0]
            if fut.done():
                self.waiters.popleft()
                continue
            r = self.pick(now)
            if r is None:
                return
            self.waiters.popleft()
            r.outstanding += 1
            fut.set_result(r)
