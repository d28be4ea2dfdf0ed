"""Where a request could go: candidate GPUs per model, best first, taken from the state's indexes
(the filters and scores then decide).

On MIG GPUs, in order: a free instance of the profile; a new instance in free space; a re-cut that
destroys the fewest idle instances in the way (``mig_recut``). How far that may go is the
``RecutScope``: ``none`` uses existing instances only (static layouts), ``create`` also creates
instances in free space, ``whole_gpu`` also cuts a GPU again once all its instances are idle (the
old behaviour, kept as the benchmark's baseline), ``idle`` and ``drain`` re-cut around busy
instances (``drain`` lets preemption take busy ones too; see ``sched_preempt``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterator
from dataclasses import replace
from typing import Literal

from gpufrac.model.catalog import GpuModel
from gpufrac.model.settings import MigReconfigure
from gpufrac.model.workload import MILLI, Mode
from gpufrac.planning.mig_recut import best_recut
from gpufrac.planning.nesting import should_nest
from gpufrac.planning.sched_plugins import Candidate, PluginContext, Policy, first_refusal
from gpufrac.planning.sched_request import Need, SchedRequest
from gpufrac.planning.sched_state import ClusterState, SchedGpu, additions

CANDIDATES_PER_MODEL = 4  # candidates that pass the filters, scored per model
SCAN_LIMIT = 64  # GPUs looked at per model and pool before giving up on it

RecutScope = Literal["none", "create", "whole_gpu", "idle", "drain"]

Waiting = Callable[[GpuModel, str], int]  # the needs waiting to share a new instance of a profile


def recut_scope(setting: MigReconfigure) -> RecutScope:
    match setting:
        case "never":
            return "none"
        case "idle" | "drain":
            return setting


def mig_candidates_on(
    st: ClusterState, req: SchedRequest, g: SchedGpu, scope: RecutScope
) -> Iterator[Candidate]:
    """The MIG candidates on one GPU, best first: a free instance, a new one, a re-cut."""
    profile = req.mig_profile(g.model)
    if profile is None or not g.mig:
        return
    need = req.need(g.model, "mig", profile)
    free = [pl for pl, owner in g.instances.items() if owner is None and pl.profile == profile]
    if free:
        yield Candidate(g.index, "mig", need, min(free), False)
        return
    if scope == "none" or g.pinned:
        return
    new = st.addition(g, profile)
    if new is not None:
        yield Candidate(g.index, "mig", need, new, True)
        return
    recut = None if scope == "create" else _recut_on(g, profile, need, scope)
    if recut is not None:
        yield recut


def _recut_on(g: SchedGpu, profile: str, need: Need, scope: RecutScope) -> Candidate | None:
    """A re-cut of ``g`` that makes room for ``profile`` by destroying idle instances."""
    if scope == "whole_gpu":
        if not g.instances or any(o is not None for o in g.instances.values()):
            return None
        fresh = additions(g.model, ()).get(profile)
        if fresh is None:
            return None
        return Candidate(g.index, "mig", need, fresh, True, tuple(sorted(g.instances)))
    found = best_recut(g.model, g.instances, profile)
    if found is None:
        return None
    return Candidate(g.index, "mig", need, found.create, True, found.destroy)


def _recuts(
    st: ClusterState,
    model_key: str,
    profile: str,
    need: Need,
    scope: RecutScope,
    kept: Collection[int] = (),
) -> Iterator[Candidate]:
    """Re-cuts on the model's MIG GPUs with idle instances, fewest instances destroyed first."""
    if scope in ("none", "create"):
        return
    pool = st.idle_mig if scope == "whole_gpu" else st.with_idle
    found = [
        c
        for gi in sorted(g for g in pool.get(model_key, ()) if g not in kept)[:SCAN_LIMIT]
        if (c := _recut_on(st.gpus[gi], profile, need, scope)) is not None
    ]
    found.sort(key=lambda c: (len(c.destroy), c.gpu))
    yield from found[:CANDIDATES_PER_MODEL]


def candidates_on(
    st: ClusterState, req: SchedRequest, mode: Mode, only: set[int], scope: RecutScope
) -> Iterator[Candidate]:
    """Candidates on the given GPUs only (the filters still decide)."""
    for gi in sorted(only):
        g = st.gpus[gi]
        if mode == "mig":
            yield from mig_candidates_on(st, req, g, scope)
        elif not g.mig:
            yield Candidate(gi, mode, req.need(g.model, mode))


def candidates(
    st: ClusterState,
    ctx: PluginContext,
    req: SchedRequest,
    mode: Mode,
    policy: Policy,
    scope: RecutScope,
    passed: dict[str, int] | None = None,
    kept: Collection[int] = (),
) -> Iterator[Candidate]:
    """Candidates per GPU model, best first by the state's indexes; a model is left as soon as
    ``passed`` says enough of its candidates got through the filters. MIG GPUs in ``kept`` (kept
    for another request) offer none: their free instances do not hide room elsewhere."""
    done = passed if passed is not None else {}
    spread = policy == "spread"
    first_fit = policy == "first-fit"
    for model in st.models:
        key = model.key
        n = 0
        if mode == "mig":
            profile = req.mig_profile(model)
            if profile is None:
                continue
            need = req.need(model, "mig", profile)
            free = {x for x in st.free_instances.get((key, profile), set()) if x[0] not in kept}
            # the instance's start last: the same state always gives the same choice (the set's
            # order follows string hashing, which changes from process to process)
            order = (
                (lambda x: (x[0], x[1].start))
                if first_fit
                else (
                    lambda x: (len(st.gpus[x[0]].allocs) * (1 if spread else -1), x[0], x[1].start)
                )
            )
            for gi, pl in sorted(free, key=order)[:CANDIDATES_PER_MODEL]:
                yield Candidate(gi, mode, need, pl, False)
                n += 1
            if n or scope == "none":
                continue
            addable = {gi for gi in st.addable.get((key, profile), set()) if gi not in kept}
            order2 = (
                (lambda i: i)
                if first_fit
                else (lambda i: (len(st.gpus[i].instances) * (1 if spread else -1), i))
            )
            for gi in sorted(addable, key=order2)[:CANDIDATES_PER_MODEL]:
                new = st.addition(st.gpus[gi], profile)
                if new is not None:
                    n += 1
                    yield Candidate(gi, mode, need, new, True)
            if n:
                continue
            yield from _recuts(st, model.key, profile, need, scope, kept)
            continue
        need = req.need(model, mode)
        if need.memory_mib > model.memory_total_mib:
            continue
        shared = st.shared.get((key, mode), [])
        empty = st.empty.get(key, [])
        if first_fit:  # the baseline: GPUs in index order, the first that passes every filter wins
            pool = sorted([i for _, i in shared] + empty)
            for gi in pool:
                cand = Candidate(gi, mode, need)
                if first_refusal(ctx, req, cand) is None:
                    yield cand
                    n += 1
                    if n >= CANDIDATES_PER_MODEL:
                        break
            continue
        # headroom is the scarcer of free memory and free shares: a GPU with room has at least the
        # scarcer of the two needs (memory and shares are checked apart: a compute cap's share may
        # be less than its memory's)
        need_h = min(-(-need.memory_mib * MILLI // model.memory_total_mib), need.milli)
        start = bisect.bisect_left(shared, (need_h - 1, -1))  # headroom rounds down: 1 of slack
        fitting = (
            shared[start:] if not spread else shared[: start - 1 : -1] if start else shared[::-1]
        )
        ordered = [gi for _, gi in fitting[:SCAN_LIMIT]]
        pools = (empty, ordered) if spread else (ordered, empty)
        for pool in pools:
            for gi in pool[:SCAN_LIMIT]:
                if done.get(key, 0) >= CANDIDATES_PER_MODEL:
                    break
                yield Candidate(gi, mode, need)


def nest_candidates(
    st: ClusterState,
    ctx: PluginContext,
    req: SchedRequest,
    mode: Mode,
    scope: RecutScope,
    waiting: Waiting,
    only: set[int] | None = None,
) -> Iterator[Candidate]:
    """Shares of MIG instances shared inside under ``mode``, per GPU model where the nesting rule
    (``nesting.should_nest``) lets ``req`` share one: shared instances with room first (fullest
    first), else, where a new one would serve at least two waiting needs, a free instance of the
    smallest profile that fits it, one created in free space, or one made by re-cutting idle
    instances as for a whole instance (``scope``; busy instances are never destroyed). A shared
    instance has room for ``req`` where the filters pass it there (its tenants, MPS compute and
    clients too). ``only``: on those GPUs alone."""
    for model in st.mig_models:
        fit = req.nest(model)
        need = req.nest_need(model)
        if fit is None or need is None or not fit.half:
            continue
        shared = [
            (gi, pl)
            for gi, pl in st.nested.get((model.key, mode), ())
            if (only is None or gi in only)
            and st.gpus[gi].nests[pl].free_mib >= need.memory_mib
            and st.gpus[gi].nests[pl].milli_used + need.milli <= st.gpus[gi].nests[pl].milli
        ]
        shared.sort(key=lambda x: (st.gpus[x[0]].nests[x[1]].free_mib, x))
        room = [
            cand
            for gi, pl in shared[:SCAN_LIMIT]
            if first_refusal(ctx, req, cand := Candidate(gi, mode, need, pl, False)) is None
        ]
        yield from room[:CANDIDATES_PER_MODEL]  # the rule: a shared instance with room for it
        if room or not should_nest(fit, room=False, waiting=waiting(model, fit.profile)):
            continue  # else: a new one, where it would serve two waiting needs
        free = [
            (gi, pl)
            for gi, pl in st.free_instances.get((model.key, fit.profile), ())
            if only is None or gi in only
        ]
        for gi, pl in sorted(free, key=lambda x: (-len(st.gpus[x[0]].allocs), x))[
            :CANDIDATES_PER_MODEL
        ]:
            yield Candidate(gi, mode, need, pl, False)
        if free or scope == "none":
            continue
        addable = [
            gi for gi in st.addable.get((model.key, fit.profile), ()) if only is None or gi in only
        ]
        made = 0
        for gi in sorted(addable, key=lambda i: (-len(st.gpus[i].instances), i))[
            :CANDIDATES_PER_MODEL
        ]:
            new = st.addition(st.gpus[gi], fit.profile)
            if new is not None:
                made += 1
                yield Candidate(gi, mode, need, new, True)
        if made:
            continue
        recuts = (
            _recuts(st, model.key, fit.profile, need, scope)
            if only is None
            else (
                c
                for gi in sorted(only)
                if st.gpus[gi].mig
                and st.gpus[gi].model.key == model.key
                and not st.gpus[gi].pinned
                and scope not in ("none", "create")
                and (c := _recut_on(st.gpus[gi], fit.profile, need, scope)) is not None
            )
        )
        for c in recuts:
            yield replace(c, mode=mode)
