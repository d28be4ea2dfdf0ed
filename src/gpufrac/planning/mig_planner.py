"""The MIG planner: target layouts per GPU from demand, and the ordered actions that reach them.
Pure.

Order of work, so that running instances are disturbed as little as possible:

1. keep every current instance some demand can use (busy ones first); busy instances nobody asked
   for stay (unless ``drain``); idle ones nobody asked for go;
2. grow GPUs that keep instances, leaving those instances where they are;
3. fill empty GPUs, pattern by pattern, choosing each time the pattern of the model with the lowest
   cost per MiB placed (on a mixed fleet: the cheapest fitting model), then empty the least-filled
   new GPUs into spare room elsewhere;
4. only if demand is still left: move idle kept instances (never busy ones) to make room.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gpufrac.model.gpu import MigInstanceState
from gpufrac.model.mig import MigPlacement
from gpufrac.model.migplan import MigPlan, PlannedGpu, Unplaced, actions_between
from gpufrac.planning.demand import ResolvedClass
from gpufrac.planning.mig_fill import consolidate, fill_empty, fill_exact
from gpufrac.planning.mig_work import (
    PlanGpu,
    PlanOptions,
    Remaining,
    Weights,
    WorkGpu,
    add_placements,
)
from gpufrac.planning.patterns import Counts, Geometry, Layout, geometry

__all__ = ["PlanGpu", "PlanOptions", "plan_mig"]

_SVC_PASSES = 8


def plan_mig(
    gpus: list[PlanGpu], demand: list[ResolvedClass], options: PlanOptions | None = None
) -> MigPlan:
    """The best of several fills of the empty GPUs; every other step is the same in each.

    1. greedy by memory placed;
    2. greedy by price, the prices corrected pass after pass (sequential value correction, a classic
       cutting-stock heuristic): each profile starts at its share of a GPU (half memory slots, half
       compute slices) and moves towards what it actually cost in the last pass, so profiles that
       ended up on wasteful GPUs are placed earlier next time;
    3. on small fleets, exact search (``planning.exact``), given the best so far to beat.

    The best plan places the most value, then costs least, then destroys least.
    """
    opts = options or PlanOptions()
    geos = {g.model.key: geometry(g.model) for g in gpus if g.model.profiles}
    weights: Weights = {
        (key, q): 0.5 * p.memory_slots / geo.model.memory_slots
        + 0.5 * p.compute_slices / geo.model.compute_slices
        for key, geo in geos.items()
        for q, p in enumerate(geo.model.profiles)
    }
    strategies: list[Weights | str | None] = [None, *([weights] * _SVC_PASSES), "exact"]
    best: tuple[MigPlan, float] | None = None
    last: MigPlan | None = None
    for i, strategy in enumerate(strategies):
        if isinstance(strategy, dict) and i > 1 and last is not None:
            strategy = weights = _corrected(weights, last, geos)
        incumbent = (best[0].summary["unplaced_value"], best[1]) if best else (float("inf"), 0.0)
        last, fresh_cost = _plan_once(gpus, demand, opts, strategy, incumbent)
        if best is None or _rank(last) < _rank(best[0]):
            best = (last, fresh_cost)
        if not last.summary["fresh_gpus"] and strategy is None:
            break  # no empty GPU was filled: every strategy gives the same plan
    assert best is not None
    return best[0]


def _corrected(weights: Weights, plan: MigPlan, geos: dict[str, Geometry]) -> Weights:
    """Move each price halfway towards its average share of the GPUs it was placed on last time."""
    paid: dict[tuple[str, int], list[float]] = defaultdict(list)
    for g in plan.gpus:
        if not g.created or g.kept:
            continue
        geo = geos[g.model]
        qs = [geo.index(p.profile) for p in g.created]
        total = sum(weights[(g.model, q)] for q in qs)
        for q in qs:
            paid[(g.model, q)].append(weights[(g.model, q)] / total)
    return {
        k: (w + sum(paid[k]) / len(paid[k])) / 2 if paid.get(k) else w for k, w in weights.items()
    }


def _rank(plan: MigPlan) -> tuple[float, float, int]:
    s = plan.summary
    return (s["unplaced_value"], s["cost"], s["destroyed"])


def _plan_once(
    gpus: list[PlanGpu],
    demand: list[ResolvedClass],
    opts: PlanOptions,
    strategy: Weights | str | None,
    incumbent: tuple[float, float],
) -> tuple[MigPlan, float]:
    """One plan; ``strategy`` says how empty GPUs are filled. Also returns what the filled GPUs
    cost."""
    work = [WorkGpu(g, geometry(g.model), _usable(g, opts)) for g in gpus]
    geos = {w.key: w.geo for w in work if w.usable}
    need = Remaining(demand, geos)
    cost = {
        k: float((opts.cost or {}).get(k, g.model.memory_total_mib))
        for k, g in ((w.key, w.gpu) for w in work)
    }
    weights = strategy if isinstance(strategy, dict) else None
    _keep_current(work, need, opts)
    _grow_partial(work, need)
    if strategy != "exact" or not fill_exact(work, need, cost, incumbent):
        fill_empty(work, need, cost, weights)
        consolidate([w for w in work if w.fresh], need)
    fresh_cost = sum(cost[w.key] for w in work if w.fresh and w.added)
    if need.total():
        _repack(work, need)
    return _build_plan(work, need, opts, cost), fresh_cost


def _usable(g: PlanGpu, opts: PlanOptions) -> bool:
    if not g.healthy or not g.model.profiles:
        return False
    return g.mig_enabled or (opts.allow_mode_change and g.idle)


# -- 1. keep what demand can use -------------------------------------------------------------------


def _keep_current(work: list[WorkGpu], need: Remaining, opts: PlanOptions) -> None:
    def claim(w: WorkGpu, inst: MigInstanceState) -> bool:
        q = w.geo.index(inst.profile) if w.gpu.model.has_profile(inst.profile) else -1
        for ci in need.by_profile.get((w.key, q), ()):
            if need.remaining[ci] > 0:
                need.remaining[ci] -= 1
                w.kept[inst.placement] = ci
                return True
        return False

    usable = [w for w in work if w.usable]
    for w in usable:  # busy instances first: they are what must not move
        for inst in w.gpu.instances:
            if inst.busy and not claim(w, inst) and not opts.drain:
                w.pinned.append(inst.placement)
    # then idle ones, on the GPUs that already hold the most, so emptier GPUs are the ones cleared
    order = sorted(
        usable, key=lambda w: (-len(w.kept) - len(w.pinned), -len(w.gpu.instances), w.gpu.index)
    )
    for w in order:
        for inst in w.gpu.instances:
            if not inst.busy:
                claim(w, inst)


# -- 2. grow GPUs that keep instances --------------------------------------------------------------


def _grow_partial(work: list[WorkGpu], need: Remaining) -> None:
    partial = [w for w in work if w.usable and (w.kept or w.pinned)]
    partial.sort(key=lambda w: (-(len(w.kept) + len(w.pinned)), w.gpu.index))
    for w in partial:
        if not need.total():
            return
        fixed = tuple(sorted([*w.pinned, *w.kept]))
        best = _best_extension(w, fixed, w.geo.counts_of(fixed), need)
        if best is not None:
            add_placements(w, best.placements, fixed, need)


def _best_extension(
    w: WorkGpu, fixed: tuple[MigPlacement, ...], base: Counts, need: Remaining
) -> Layout | None:
    """The layout keeping ``fixed`` in place that serves the most demand (no idle extras)."""
    best: tuple[tuple[Any, ...], Layout] | None = None
    for lay in _extensions(w.geo, fixed):
        extra = tuple(a - b for a, b in zip(lay.counts, base, strict=True))
        value, taken = need.serve(w.key, extra)
        if value <= 0:
            continue
        surplus = sum(extra) - sum(t for _, _, t in taken)
        rank = (value, -surplus, lay.free_score)
        if best is None or rank > best[0]:
            best = (rank, lay)
    return None if best is None else best[1]


_EXTENSIONS: dict[tuple[int, tuple[MigPlacement, ...]], list[Layout]] = {}


def _extensions(geo: Geometry, fixed: tuple[MigPlacement, ...]) -> list[Layout]:
    """Layouts containing ``fixed``, one per distinct multiset (the one with the best free
    space)."""
    key = (id(geo), fixed)
    if key not in _EXTENSIONS:
        best: dict[Counts, Layout] = {}
        for lay in geo.layouts_containing(fixed):
            cur = best.get(lay.counts)
            if cur is None or lay.free_score > cur.free_score:
                best[lay.counts] = lay
        if len(_EXTENSIONS) > 4096:
            _EXTENSIONS.clear()
        _EXTENSIONS[key] = list(best.values())
    return _EXTENSIONS[key]


def _repack(work: list[WorkGpu], need: Remaining) -> None:
    for w in sorted((w for w in work if w.usable and w.kept), key=lambda w: w.gpu.index):
        if not need.total():
            return
        busy = {i.placement for i in w.gpu.instances if i.busy}
        fixed = tuple(sorted({*w.pinned, *(p for p in w.kept if p in busy)}))
        have = w.geo.counts_of([*w.pinned, *w.kept, *w.added])
        best: tuple[tuple[Any, ...], Layout] | None = None
        for lay in _extensions(w.geo, fixed):
            if any(a < b for a, b in zip(lay.counts, have, strict=True)):
                continue
            extra = tuple(a - b for a, b in zip(lay.counts, have, strict=True))
            value, taken = need.serve(w.key, extra)
            if value <= 0:
                continue
            moved = sum(1 for p in [*w.kept, *w.added] if p not in lay.placements)
            rank = (value, -moved, -(sum(extra) - sum(t for _, _, t in taken)))
            if best is None or rank > best[0]:
                best = (rank, lay)
        if best is None:
            continue
        lay = best[1]
        # keep instances that stay put; those that move take the new placements of their profile
        staying = {p: c for p, c in [*w.kept.items(), *w.added.items()] if p in lay.placements}
        movers = [(p, c) for p, c in [*w.kept.items(), *w.added.items()] if p not in lay.placements]
        free = [p for p in lay.placements if p not in staying and p not in w.pinned]
        kept = {p: c for p, c in w.kept.items() if p in staying}
        added = {p: c for p, c in w.added.items() if p in staying}
        for p, c in movers:
            spot = next(f for f in free if f.profile == p.profile)
            free.remove(spot)
            added[spot] = c
        w.kept, w.added = kept, added
        add_placements(w, tuple(free), (), need)


# -- the plan --------------------------------------------------------------------------------------


def _build_plan(
    work: list[WorkGpu], need: Remaining, opts: PlanOptions, cost: dict[str, float]
) -> MigPlan:
    planned, actions = [], []
    created = destroyed = busy_destroyed = kept_total = 0
    per_model: dict[str, int] = defaultdict(int)
    for w in work:
        g = w.gpu
        current = {i.placement: i for i in g.instances}
        target = w.target() if w.usable else sorted(current)
        gone = [current[p] for p in sorted(current) if p not in set(target)]
        new = [p for p in target if p not in current]
        enable = bool(target) and not g.mig_enabled
        actions += actions_between(
            g.uuid,
            g.index,
            g.model,
            g.instances,
            g.mig_enabled,
            tuple(target),
            g.mig_enabled or enable,
        )
        created += len(new)
        destroyed += len(gone)
        busy_destroyed += sum(1 for i in gone if i.busy)
        kept_total += len(target) - len(new)
        if target:
            per_model[g.model.key] += 1
        planned.append(
            PlannedGpu(
                uuid=g.uuid,
                index=g.index,
                model=g.model.key,
                instances=tuple(target),
                mig_enabled=g.mig_enabled or enable,
                kept=tuple(p for p in target if p in current),
                created=tuple(new),
                destroyed=tuple(i.placement for i in gone),
                busy_kept=tuple(sorted(w.pinned)),
            )
        )
    unplaced = tuple(
        _why(c, n, work, opts) for c, n in zip(need.classes, need.remaining, strict=True) if n > 0
    )
    summary = {
        "gpus_used": sum(per_model.values()),
        "gpus_used_by_model": dict(sorted(per_model.items())),
        "cost": sum(cost[k] * n for k, n in per_model.items()),
        "instances": sum(len(p.instances) for p in planned),
        "kept": kept_total,
        "created": created,
        "destroyed": destroyed,
        "busy_destroyed": busy_destroyed,
        "unplaced": sum(u.count for u in unplaced),
        "unplaced_value": sum(
            c.value * n for c, n in zip(need.classes, need.remaining, strict=True)
        ),
        "fresh_gpus": sum(1 for w in work if w.fresh),
    }
    return MigPlan(tuple(planned), tuple(actions), unplaced, summary)


def _why(c: ResolvedClass, n: int, work: list[WorkGpu], opts: PlanOptions) -> Unplaced:
    models = sorted(c.options)
    same = [w for w in work if w.key in c.options]
    usable = [w for w in same if w.usable]
    if not usable:
        off = [w for w in same if w.gpu.healthy and not w.gpu.mig_enabled]
        hint = (
            " (their MIG mode is off: --allow-mode-change lets the plan enable it on idle GPUs)"
            if off and not opts.allow_mode_change
            else ""
        )
        return Unplaced(c.label, n, f"no usable GPU of {', '.join(models)}{hint}")
    pinned = sum(len(w.pinned) for w in usable)
    text = f"no room left on the {len(usable)} usable GPU(s) of {', '.join(models)}"
    if pinned and not opts.drain:
        text += f"; {pinned} busy instance(s) nobody asked for hold space (--drain would free it)"
    return Unplaced(c.label, n, text)
