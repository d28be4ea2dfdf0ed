"""Priority preemption: the fewest, lowest-priority workloads whose eviction makes room. Never one
of equal or higher priority, never past the requester's quota, and only of its own tenant where the
operator says so (``tenants.NAME.preemption: own-tenant``).

What it can take, by mode:

* whole GPUs and shared (time-sliced, MPS) GPUs: any lower-priority workloads on one GPU whose going
  leaves room for the request there (the GPU's other work must be of the request's mode);
* MIG: with ``mig_reconfigure: idle`` (or ``never``), only an instance of exactly the profile asked
  for whose owner has a lower priority; with ``drain``, instances of any profile on one GPU, as few
  and as low as possible, destroyed with the GPU's idle instances in the way (``mig_recut``) to
  create the profile asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import MILLI, Mode
from gpufrac.planning.mig_recut import best_recut
from gpufrac.planning.sched_candidates import RecutScope
from gpufrac.planning.sched_plugins import Candidate
from gpufrac.planning.sched_request import Need, SchedRequest
from gpufrac.planning.sched_state import Allocation, ClusterState, SchedGpu

Option = tuple[list[str], list[Candidate]]


def preemption(
    st: ClusterState, req: SchedRequest, settings: OperatorSettings, scope: RecutScope
) -> Option | None:
    """The cheapest set of lower-priority workloads whose eviction makes room, and where it goes."""
    if req.spec.gpu.devices > 1:
        return None  # a share of several GPUs evicts no one (it waits for room on each)
    best: tuple[tuple[int, int, int], list[str], list[Candidate]] | None = None
    lowest = st.min_priority()
    floor = (1, lowest, lowest)  # one victim of the lowest priority there is: nothing beats it
    for mode in req.modes:
        for victims, cands in _options(st, req, mode, settings, scope):
            prios = [_priority(st, v) for v in victims]
            cost = (len(victims), max(prios, default=-(10**9)), sum(prios))
            if best is None or cost < best[0]:
                best = (cost, victims, cands)
                if cost <= floor:
                    return victims, cands
    return None if best is None else (best[1], best[2])


def _priority(st: ClusterState, key: str) -> int:
    return st.allocs[key][0].priority


def _quota_after(
    st: ClusterState, req: SchedRequest, settings: OperatorSettings, victims: list[str], total: Need
) -> bool:
    """Would the request, taking ``total`` in all, fit its tenant's quota once ``victims`` are
    gone?"""
    q = settings.tenants.get(req.tenant)
    if q is None:
        return True
    freed = [a for v in victims for a in st.allocs.get(v, []) if a.tenant == req.tenant]
    mem = st.tenant_mem[req.tenant] - sum(a.memory_mib for a in freed)
    milli = st.tenant_milli[req.tenant] - sum(a.milli for a in freed)
    if q.gpu_memory_mib is not None and mem + total.memory_mib > q.gpu_memory_mib:
        return False
    return q.gpus_milli is None or milli + total.milli <= q.gpus_milli


def _options(
    st: ClusterState, req: SchedRequest, mode: Mode, settings: OperatorSettings, scope: RecutScope
) -> Iterator[Option]:
    prio = req.priority
    if st.min_priority() >= prio:
        return
    own_only = settings.preemption(req.tenant, req.spec.preemption) == "own-tenant"

    def may_evict(a: Allocation) -> bool:
        return a.priority < prio and (not own_only or a.tenant == req.tenant)

    def lower(key: str) -> bool:  # by the allocation's own priority: no scan of every workload
        allocs = st.allocs.get(key)
        return allocs is not None and bool(allocs) and may_evict(allocs[0])

    if mode == "exclusive":
        yield from _whole_gpus(st, req, settings, may_evict)
        return
    for g in st.mig_gpus if mode == "mig" else st.plain_gpus:
        if not g.schedulable or not req.admits(g.node_labels):
            continue
        if not any(may_evict(a) for a in g.allocs.values()):
            continue
        if mode == "mig":
            yield from _mig(st, req, g, settings, scope, lower)
            continue
        need = req.need(g.model, mode)
        victims: list[str] = []
        keep = [a for a in g.allocs.values() if not lower(a.workload)]
        if any(a.mode != mode for a in keep):
            continue
        evictable = sorted(
            (a for a in g.allocs.values() if lower(a.workload)),
            key=lambda a: (a.priority, -a.memory_mib),
        )
        remaining = list(g.allocs.values())
        for a in [None, *evictable]:
            if a is not None:
                victims.append(a.workload)
                remaining = [r for r in remaining if r.workload != a.workload]
            if _room(st, g, remaining, need, mode, req.tenant, settings.mps_share_tenants):
                if victims and _quota_after(st, req, settings, victims, need):
                    yield list(victims), [Candidate(g.index, mode, need)]
                break


def _whole_gpus(
    st: ClusterState,
    req: SchedRequest,
    settings: OperatorSettings,
    may_evict: Callable[[Allocation], bool],
) -> Iterator[Option]:
    count = req.spec.gpu.gpus
    # a request's GPUs are of one model on one node, as when nothing is evicted for them
    by_node: dict[tuple[str, str], list[tuple[int, int, list[str]]]] = {}
    for g in st.plain_gpus:
        if not g.schedulable or not req.admits(g.node_labels):
            continue
        if not all(may_evict(a) for a in g.allocs.values()):
            continue
        by_node.setdefault((g.node, g.model.key), []).append(
            (len(g.allocs), g.index, sorted(g.allocs))
        )
    for options in by_node.values():
        if len(options) < count:
            continue
        options.sort()
        chosen = options[:count]
        gone = sorted({v for _, _, vs in chosen for v in vs})
        cands = [
            Candidate(gi, "exclusive", req.need(st.gpus[gi].model, "exclusive"))
            for _, gi, _ in chosen
        ]
        total = Need(sum(c.need.memory_mib for c in cands), sum(c.need.milli for c in cands))
        if gone and _quota_after(st, req, settings, gone, total):
            yield gone, cands


def _mig(
    st: ClusterState,
    req: SchedRequest,
    g: SchedGpu,
    settings: OperatorSettings,
    scope: RecutScope,
    lower: Callable[[str], bool],
) -> Iterator[Option]:
    profile = req.mig_profile(g.model)
    if profile is None:
        return
    need = req.need(g.model, "mig", profile)
    for pl, owner in sorted(g.instances.items()):
        same = owner is not None and lower(owner) and pl.profile == profile
        if same and owner is not None and _quota_after(st, req, settings, [owner], need):
            yield [owner], [Candidate(g.index, "mig", need, pl, False)]
    if scope != "drain" or g.pinned:
        return
    evictable = frozenset(o for o in g.instances.values() if o is not None and lower(o))
    recut = best_recut(g.model, g.instances, profile, evictable)
    if recut is not None and recut.evict:
        victims = list(recut.evict)
        if _quota_after(st, req, settings, victims, need):
            yield victims, [Candidate(g.index, "mig", need, recut.create, True, recut.destroy)]


def _room(
    st: ClusterState,
    g: SchedGpu,
    remaining: list[Allocation],
    need: Need,
    mode: Mode,
    tenant: str,
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
        if not mps_share and any(a.tenant != tenant for a in remaining):
            return False
        # the request is on one GPU (a share of several evicts no one): what stays under MPS
        # must be too, its daemon serving this GPU alone (the mps_domain filter's rule)
        if any(len(st.allocs.get(a.workload, ())) > 1 for a in remaining):
            return False
    return True
