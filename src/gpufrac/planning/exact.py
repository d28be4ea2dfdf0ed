"""Exact search for small fleets: which pattern to put on each empty GPU, by branch and bound.

The greedy fill is near the optimum on large fleets but can be a GPU off on small ones, where one
GPU is a large share. For up to ``MAX_GPUS`` empty GPUs this search tries pattern combinations in a
canonical order (so each multiset of GPU patterns is visited once), pruned by a lower bound, and
stops after a node or time budget with the best combination found so far. Objective: least unplaced
value, then least cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpufrac.planning.patterns import Counts, Geometry

MAX_GPUS = 16
MAX_ITEMS = 96


@dataclass(frozen=True, slots=True)
class Move:
    key: str  # GPU model
    counts: Counts  # instances per profile, only those that serve demand


@dataclass
class _Search:
    geos: dict[str, Geometry]
    cost: dict[str, float]
    values: list[int]  # per class
    by_profile: dict[tuple[str, int], list[int]]
    patterns: list[tuple[str, Counts]]
    best_value: float
    best_cost: float
    best: list[Move] | None
    capacity: dict[str, int]
    nodes: int = 0
    node_limit: int = 4000
    deadline: float = 0.0

    def serve(
        self, key: str, counts: Counts, remaining: list[int]
    ) -> tuple[int, Counts, list[int]]:
        left = list(remaining)
        served = [0] * len(counts)
        value = 0
        for q, n in enumerate(counts):
            for ci in self.by_profile.get((key, q), ()):
                if not n:
                    break
                t = min(n, left[ci])
                if t:
                    left[ci] -= t
                    served[q] += t
                    value += t * self.values[ci]
                    n -= t
        return value, tuple(served), left

    def run(
        self,
        remaining: list[int],
        free: dict[str, int],
        first: int,
        cost: float,
        chosen: list[Move],
    ) -> None:
        self.nodes += 1
        unplaced = sum(v * n for v, n in zip(self.values, remaining, strict=True))
        if (unplaced, cost) < (self.best_value, self.best_cost):
            self.best_value, self.best_cost, self.best = unplaced, cost, list(chosen)
        if not unplaced or self.nodes >= self.node_limit or time.monotonic() > self.deadline:
            return
        # lower bounds: what the free GPUs can hold at most, and the cheapest cost per unit of value
        cap = {k: self.capacity[k] for k, n in free.items() if n}
        lb_unplaced = max(0, unplaced - sum(cap[k] * free[k] for k in cap))
        ratio = min((self.cost[k] / cap[k] for k in cap if cap[k]), default=0.0)
        if (lb_unplaced, cost + ratio * (unplaced - lb_unplaced)) >= (
            self.best_value,
            self.best_cost,
        ):
            return
        seen: set[tuple[str, tuple[int, ...]]] = set()
        options = []
        for i in range(first, len(self.patterns)):
            key, counts = self.patterns[i]
            if not free.get(key):
                continue
            value, served, left = self.serve(key, counts, remaining)
            sig = (key, tuple(left))
            if value <= 0 or sig in seen:
                continue
            seen.add(sig)
            options.append((self.cost[key] / value, -value, i, key, served, left))
        options.sort()
        for _, _, i, key, served, left in options:
            free[key] -= 1
            chosen.append(Move(key, served))
            self.run(left, free, i, cost + self.cost[key], chosen)
            chosen.pop()
            free[key] += 1


def search_fill(
    geos: dict[str, Geometry],
    free: dict[str, int],
    cost: dict[str, float],
    values: list[int],
    remaining: list[int],
    by_profile: dict[tuple[str, int], list[int]],
    incumbent: tuple[float, float],
    *,
    node_limit: int = 4000,
    seconds: float = 0.5,
) -> list[Move] | None:
    """A better fill of the empty GPUs than ``incumbent`` (unplaced value, cost), or None."""
    if sum(free.values()) > MAX_GPUS or sum(remaining) > MAX_ITEMS:
        return None
    patterns = [(k, c) for k in sorted(free) for c in geos[k].patterns if any(c)]

    def _serve_value(
        key: str, counts: Counts
    ) -> int:  # most value one GPU could hold, demand aside
        return sum(
            n * max((values[ci] for ci in by_profile.get((key, q), ())), default=0)
            for q, n in enumerate(counts)
        )

    search = _Search(
        geos,
        cost,
        values,
        by_profile,
        patterns,
        best_value=incumbent[0],
        best_cost=incumbent[1] - 1e-9,
        best=None,
        capacity={k: max(_serve_value(k, c) for c in geos[k].patterns) for k in free},
        node_limit=node_limit,
        deadline=time.monotonic() + seconds,
    )
    search.run(list(remaining), dict(free), 0, 0.0, [])
    return search.best
