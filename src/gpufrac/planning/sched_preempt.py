"""Priority preemption: the fewest, lowest-priority workloads whose eviction makes room. Never one of
equal or higher priority, never past the requester's quota."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpufrac.model.workload import MILLI, WorkloadSpec
from gpufrac.planning.sched_plugins import Candidate, Need, need_on
from gpufrac.planning.sched_state import Allocation, SchedGpu

if TYPE_CHECKING:
    from gpufrac.planning.scheduler import Scheduler


def preemption(s: Scheduler, spec: WorkloadSpec) -> tuple[list[str], list[Candidate]] | None:
    """The cheapest set of lower-priority workloads whose eviction makes room, and where it goes."""
    best: tuple[tuple[int, int, int], list[str], list[Candidate]] | None = None
    lowest = s.state.min_priority()
    floor = (1, lowest, lowest)  # one victim of the lowest priority there is: nothing beats it
    for mode in s._modes(spec):
        for victims, cands in _preemption_options(s, spec, mode):
            prios = [s.specs[v].priority for v in victims]
            cost = (len(victims), max(prios, default=-(10**9)), sum(prios))
            if best is None or cost < best[0]:
                best = (cost, victims, cands)
                if cost <= floor:
                    return victims, cands
    return None if best is None else (best[1], best[2])


def _quota_after(s: Scheduler, spec: WorkloadSpec, victims: list[str], total: Need) -> bool:
    """Would ``spec``, taking ``total`` in all, fit its tenant's quota once ``victims`` are gone?"""
    q = s.settings.tenants.get(spec.tenant)
    if q is None:
        return True
    freed = [a for v in victims for a in s.state.allocs.get(v, []) if a.tenant == spec.tenant]
    mem = s.state.tenant_mem[spec.tenant] - sum(a.memory_mib for a in freed)
    milli = s.state.tenant_milli[spec.tenant] - sum(a.milli for a in freed)
    if q.gpu_memory_mib is not None and mem + total.memory_mib > q.gpu_memory_mib:
        return False
    return q.gpus_milli is None or milli + total.milli <= q.gpus_milli


def _preemption_options(
    s: Scheduler, spec: WorkloadSpec, mode: str
) -> Iterator[tuple[list[str], list[Candidate]]]:
    st = s.state
    prio = spec.priority
    if st.min_priority() >= prio:
        return

    class _Lower:  # membership by the allocation's own priority: no scan of every workload
        def __contains__(self, key: object) -> bool:
            allocs = st.allocs.get(key) if isinstance(key, str) else None
            return allocs is not None and bool(allocs) and allocs[0].priority < prio

    lower = _Lower()
    if mode == "exclusive":
        count = spec.gpu.count or 1
        options = []
        for g in s._plain_gpus:
            if not g.schedulable or not all(a.priority < prio for a in g.allocs.values()):
                continue
            options.append((len(g.allocs), g.index, sorted(g.allocs)))
        if len(options) >= count:
            options.sort()
            chosen = options[:count]
            gone = sorted({v for _, _, vs in chosen for v in vs})
            cands = [
                Candidate(gi, "exclusive", need_on(spec, st.gpus[gi].model, "exclusive"))
                for _, gi, _ in chosen
            ]
            total = Need(sum(c.need.memory_mib for c in cands), sum(c.need.milli for c in cands))
            if gone and _quota_after(s, spec, gone, total):
                yield gone, cands
        return
    for g in s._mig_gpus if mode == "mig" else s._plain_gpus:
        if not g.schedulable or not any(a.priority < prio for a in g.allocs.values()):
            continue
        if mode == "mig":
            profile = s._mig_profile(spec, g.model)
            for pl, owner in g.instances.items():
                if owner is not None and owner in lower and pl.profile == profile:
                    need = need_on(spec, g.model, mode, profile)
                    if _quota_after(s, spec, [owner], need):
                        yield [owner], [Candidate(g.index, mode, need, pl, False)]
            continue
        need = need_on(spec, g.model, mode)
        victims: list[str] = []
        keep = [a for a in g.allocs.values() if a.workload not in lower]
        if any(a.mode != mode for a in keep):
            continue
        evictable = sorted(
            (a for a in g.allocs.values() if a.workload in lower),
            key=lambda a: (s.specs[a.workload].priority, -a.memory_mib),
        )
        remaining = list(g.allocs.values())
        for a in [None, *evictable]:
            if a is not None:
                victims.append(a.workload)
                remaining = [r for r in remaining if r.workload != a.workload]
            if _room(g, remaining, need, mode, spec, s.settings.mps_share_tenants):
                if victims and _quota_after(s, spec, victims, need):
                    yield list(victims), [Candidate(g.index, mode, need)]
                break


def _room(
    g: SchedGpu,
    remaining: list[Allocation],
    need: Need,
    mode: str,
    spec: WorkloadSpec,
    mps_share: bool,
) -> bool:
    if any(a.mode != mode for a in remaining):
        return False
    if sum(a.memory_mib for a in remaining) + need.memory_mib > g.total_mib:
        return False
    if sum(a.milli for a in remaining) + need.milli > MILLI:
        return False
    if mode == "mps":
        if sum(a.compute_pct or 0 for a in remaining) + (need.compute_pct or 0) > 100:
            return False
        if not mps_share and any(a.tenant != spec.tenant for a in remaining):
            return False
    return True
