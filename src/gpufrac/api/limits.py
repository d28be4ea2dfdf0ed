"""How many applies each tenant may have at once and how often: a pure core (events in, answers
out; the clock is given), kept by the user API for every tenant's token (the admin's applies,
the operator's own, are not limited).

Each tenant has at most ``concurrent`` applies in progress, and a token bucket of ``burst`` applies
refilled at ``rate`` a second. An apply over either bound is refused at once, before its manifest
is read, with the seconds after which one would be taken (the 429's ``Retry-After``): a tenant
that sends big manifests in parallel holds at most ``concurrent`` of the server's threads, and
never delays another tenant's calls or a node's heartbeat by more than that.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Refusal:
    """An apply not taken: why (said in the 429) and when to try again."""

    reason: str
    retry_after_s: int


class ApplyLimits:
    def __init__(
        self,
        *,
        concurrent: int,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if concurrent < 1 or not rate > 0 or burst < 1:
            raise ValueError("limits must be positive")
        self.concurrent, self.rate, self.burst, self.clock = concurrent, rate, burst, clock
        self._in_flight: dict[str, int] = {}
        # tenant -> (tokens, when counted); one entry per tenant that has applied (the tenants are
        # the API tokens' few)
        self._bucket: dict[str, tuple[float, float]] = {}

    def take(self, tenant: str) -> Refusal | None:
        """Start one apply of ``tenant`` (None), or say why not; each one taken ends with
        ``done``."""
        now = self.clock()
        tokens, at = self._bucket.get(tenant, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if self._in_flight.get(tenant, 0) >= self.concurrent:
            self._bucket[tenant] = (tokens, now)
            return Refusal(
                f"{self.concurrent} of this tenant's applies are in progress already (the "
                "operator's max_concurrent_applies in gpufrac.yaml)",
                1,
            )
        if tokens < 1.0:
            self._bucket[tenant] = (tokens, now)
            return Refusal(
                f"this tenant applies more often than {self.rate:g} a second (bursts of "
                f"{self.burst}; the operator's apply_rate and apply_burst in gpufrac.yaml)",
                max(1, math.ceil((1.0 - tokens) / self.rate)),
            )
        self._bucket[tenant] = (tokens - 1.0, now)
        self._in_flight[tenant] = self._in_flight.get(tenant, 0) + 1
        return None

    def done(self, tenant: str) -> None:
        """An apply ``take`` started has ended (answered, refused or failed)."""
        left = self._in_flight.get(tenant, 0) - 1
        if left > 0:
            self._in_flight[tenant] = left
        else:
            self._in_flight.pop(tenant, None)

    def in_flight(self, tenant: str) -> int:
        return self._in_flight.get(tenant, 0)


class TenantOrder:
    """Applies of one tenant one after the other (its bound checked, then its workloads stored,
    with no other apply of it between), while the server's lock is taken per document. Striped:
    ``stripes`` locks, a tenant's by a hash of its name (two tenants may share one, which only
    orders them too), taken in order, so a manifest naming several tenants takes no lock twice
    and two never wait on each other in a circle."""

    def __init__(self, stripes: int = 64) -> None:
        self._locks = [threading.Lock() for _ in range(stripes)]

    @contextlib.contextmanager
    def held(self, tenants: Iterable[str]) -> Iterator[None]:
        stripes = sorted({zlib.crc32(t.encode()) % len(self._locks) for t in tenants})
        with contextlib.ExitStack() as stack:
            for i in stripes:
                stack.enter_context(self._locks[i])
            yield
