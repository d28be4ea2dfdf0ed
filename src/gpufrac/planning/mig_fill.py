"""Filling empty GPUs: greedy by pattern, exact search on small fleets, and consolidation after."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gpufrac.planning.exact import search_fill
from gpufrac.planning.mig_work import Remaining, Weights, WorkGpu, add_placements
from gpufrac.planning.patterns import Layout


def fill_empty(
    work: list[WorkGpu],
    need: Remaining,
    cost: dict[str, float],
    weights: Weights | None,
) -> None:
    free: dict[str, list[WorkGpu]] = defaultdict(list)
    for w in work:
        if w.usable and not (w.kept or w.pinned or w.added):
            free[w.key].append(w)
    while need.total():
        best: tuple[tuple[Any, ...], str, Layout, list[tuple[int, int, int]]] | None = None
        for key, avail in free.items():
            if not avail:
                continue
            for counts, lay in avail[0].geo.patterns.items():
                value, taken = need.serve(key, counts, weights)
                if value <= 0:
                    continue
                surplus = sum(counts) - sum(t for _, _, t in taken)
                rank = (-cost[key] / value, value, -surplus, lay.free_score)
                if best is None or rank > best[0]:
                    best = (rank, key, lay, taken)
        if best is None:
            return
        _, key, lay, taken = best
        times = len(free[key])
        for _, ci, t in taken:
            times = min(times, need.remaining[ci] // t)
        for _ in range(max(1, times)):
            w = free[key].pop(0)
            w.fresh = True
            add_placements(w, lay.placements, (), need)


def fill_exact(
    work: list[WorkGpu], need: Remaining, cost: dict[str, float], incumbent: tuple[float, float]
) -> bool:
    """Fill empty GPUs by exact search (small fleets only); False if it found nothing better."""
    free: dict[str, list[WorkGpu]] = defaultdict(list)
    for w in work:
        if w.usable and not (w.kept or w.pinned or w.added):
            free[w.key].append(w)
    if not free or not need.total():
        return False
    moves = search_fill(
        {k: ws[0].geo for k, ws in free.items()},
        {k: len(ws) for k, ws in free.items()},
        cost,
        [c.value for c in need.classes],
        list(need.remaining),
        dict(need.by_profile),
        incumbent,
    )
    if moves is None:
        return False
    for move in moves:
        w = free[move.key].pop(0)
        w.fresh = True
        add_placements(w, w.geo.patterns[move.counts].placements, (), need)
    return True


def consolidate(fresh: list[WorkGpu], need: Remaining) -> None:
    """Empty the least-filled new GPUs into spare room on other new GPUs of the same model."""
    for _ in range(min(16, len(fresh))):
        live = [w for w in fresh if w.added]
        if len(live) < 2:
            return
        victim = min(
            live, key=lambda w: (sum(need.classes[c].value for c in w.added.values()), -w.gpu.index)
        )
        others = [w for w in live if w is not victim and w.key == victim.key]
        counts = {id(w): list(w.geo.counts_of(list(w.added))) for w in others}
        moves: list[tuple[WorkGpu, int, int]] = []
        for pl, ci in victim.added.items():
            q = victim.geo.index(pl.profile)
            for w in others:
                trial = counts[id(w)]
                trial[q] += 1
                if tuple(trial) in w.geo.patterns:
                    moves.append((w, q, ci))
                    break
                trial[q] -= 1
            else:
                return
        victim.added.clear()
        victim.fresh = False
        for w in {id(w): w for w, _, _ in moves}.values():
            items = [(pl.profile, ci) for pl, ci in w.added.items()]
            items += [(w.gpu.model.profiles[q].name, ci) for ww, q, ci in moves if ww is w]
            pool: dict[str, list[int]] = defaultdict(list)
            for profile, ci in items:
                pool[profile].append(ci)
            lay = w.geo.patterns[tuple(counts[id(w)])]
            w.added = {pl: pool[pl.profile].pop() for pl in lay.placements}


# -- 4. make room by moving idle instances ---------------------------------------------------------
