"""Where a request could go: candidate GPUs per model, best first, taken from the state's indexes (the
filters and scores then decide)."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpufrac.model.workload import MILLI, WorkloadSpec
from gpufrac.planning.sched_plugins import FILTERS, Candidate, need_on
from gpufrac.planning.sched_state import additions

if TYPE_CHECKING:
    from gpufrac.planning.scheduler import Scheduler

CANDIDATES_PER_MODEL = 4  # candidates that pass the filters, scored per model
SCAN_LIMIT = 64  # GPUs looked at per model and pool before giving up on it


def candidates_on(
    s: Scheduler, spec: WorkloadSpec, mode: str, only: set[int]
) -> Iterator[Candidate]:
    """Candidates on the given GPUs only (the filters still decide)."""
    for gi in sorted(only):
        g = s.state.gpus[gi]
        if mode == "mig":
            if not g.mig:
                continue
            profile = s._mig_profile(spec, g.model)
            if profile is None:
                continue
            need = need_on(spec, g.model, "mig", profile)
            free = [
                pl for pl, owner in g.instances.items() if owner is None and pl.profile == profile
            ]
            if free:
                yield Candidate(gi, mode, need, min(free), False)
            elif (new := s.state.addition(g, profile)) is not None:
                yield Candidate(gi, mode, need, new, True)
        elif not g.mig:
            yield Candidate(gi, mode, need_on(spec, g.model, mode))


def candidates(
    s: Scheduler, spec: WorkloadSpec, mode: str, passed: dict[str, int] | None = None
) -> Iterator[Candidate]:
    """Candidates per GPU model, best first by the state's indexes; a model is left as soon as
    ``passed`` says enough of its candidates got through the filters."""
    done = passed if passed is not None else {}
    st = s.state
    spread = s.policy == "spread"
    first_fit = s.policy == "first-fit"
    for model in s.models:
        key = model.key
        n = 0
        if mode == "mig":
            profile = s._mig_profile(spec, model)
            if profile is None:
                continue
            need = need_on(spec, model, "mig", profile)
            free = st.free_instances.get((key, profile), set())
            order = (
                (lambda x: x[0])
                if first_fit
                else (lambda x: (len(st.gpus[x[0]].allocs) * (1 if spread else -1), x[0]))
            )
            for gi, pl in sorted(free, key=order)[:CANDIDATES_PER_MODEL]:
                yield Candidate(gi, mode, need, pl, False)
                n += 1
            if n:
                continue
            addable = st.addable.get((key, profile), set())
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
            # a MIG GPU whose instances are all idle can be cut again from scratch
            fresh = additions(model, ()).get(profile)
            for gi in sorted(st.idle_mig.get(key, ()))[:1] if fresh is not None else ():
                g = st.gpus[gi]
                yield Candidate(gi, mode, need, fresh, True, tuple(sorted(g.instances)))
            continue
        need = need_on(spec, model, mode)
        if need.memory_mib > model.memory_total_mib:
            continue
        shared = st.shared.get((key, mode), [])
        empty = st.empty.get(key, [])
        if first_fit:  # the baseline: GPUs in index order, the first that passes every filter wins
            pool = sorted([i for _, i in shared] + empty)
            for gi in pool:
                cand = Candidate(gi, mode, need)
                if not any(f(s, spec, cand) for f in FILTERS):
                    yield cand
                    n += 1
                    if n >= CANDIDATES_PER_MODEL:
                        break
            continue
        need_h = max(-(-need.memory_mib * MILLI // model.memory_total_mib), need.milli)
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
