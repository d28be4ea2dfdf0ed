"""The scheduler's plugins: what a workload needs on a GPU, filters that rule a GPU out (returning the
reason), and scores that rank the GPUs left. Each plugin is one small function."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpufrac.model.catalog import GpuModel
from gpufrac.model.deployment import LABEL as DEPLOYMENT_LABEL
from gpufrac.model.mig import MigPlacement
from gpufrac.model.units import format_mib
from gpufrac.model.workload import MILLI, WorkloadSpec

if TYPE_CHECKING:
    from gpufrac.planning.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class Need:
    memory_mib: int
    milli: int  # share of one GPU (quota and capacity accounting)
    compute_pct: int | None = None  # MPS active-thread percentage


@dataclass(frozen=True, slots=True)
class Candidate:
    gpu: int
    mode: str  # exclusive | timeslice | mps | mig
    need: Need
    mig: MigPlacement | None = None
    create: bool = False  # the MIG instance must be created first
    destroy: tuple[MigPlacement, ...] = ()  # idle MIG instances to destroy before (a re-cut)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def need_on(spec: WorkloadSpec, model: GpuModel, mode: str, profile: str | None = None) -> Need:
    """What ``spec`` takes on one GPU of ``model`` under ``mode`` (on a MIG ``profile``, if given)."""
    req = spec.gpu
    total = model.memory_total_mib
    if req.count is not None or mode == "exclusive":
        return Need(total, MILLI)
    if profile is not None:
        prof = model.profile(profile)
        memory = prof.memory_mib or total * prof.memory_slots // max(1, model.memory_slots)
        return Need(memory, _ceil_div(prof.compute_slices * MILLI, max(1, model.compute_slices)))
    if req.fraction_milli is not None:
        compute = _ceil_div(req.fraction_milli, 10) if mode == "mps" else None
        return Need(total * req.fraction_milli // MILLI, req.fraction_milli, compute)
    memory = req.memory_mib or 0
    milli = (
        memory * MILLI // total
    )  # rounded down: memory itself is checked exactly, and shares must add up
    if req.compute_pct is not None:
        milli = max(milli, req.compute_pct * 10)
    return Need(memory, min(MILLI, milli), req.compute_pct if mode == "mps" else None)


# -- filters: None means the GPU passes; otherwise the reason it does not ----------------------------

Filter = Callable[["Scheduler", WorkloadSpec, Candidate], str | None]


def schedulable(s: Scheduler, spec: WorkloadSpec, c: Candidate) -> str | None:
    g = s.state.gpus[c.gpu]
    return None if g.schedulable else f"GPU {g.index} is cordoned or unhealthy"


def capacity(s: Scheduler, spec: WorkloadSpec, c: Candidate) -> str | None:
    g = s.state.gpus[c.gpu]
    if c.mode == "mig":
        if c.mig is None or (not c.create and g.instances.get(c.mig, "") is not None):
            return f"GPU {g.index}: MIG instance taken"
        return None
    if c.mode == "exclusive":
        return None if not g.allocs and not g.mig else f"GPU {g.index} is not free"
    if g.mig or g.mode not in (None, c.mode):
        return f"GPU {g.index} is in {g.mode or 'MIG'} mode"
    if g.free_mib < c.need.memory_mib:
        return f"GPU {g.index} has {format_mib(g.free_mib)} free"
    if g.milli_used + c.need.milli > MILLI:
        return f"GPU {g.index}: its compute shares are taken"
    if c.mode == "mps" and g.compute_used + (c.need.compute_pct or 0) > 100:
        return f"GPU {g.index}: MPS compute is {g.compute_used}% taken"
    return None


def mps_tenants(s: Scheduler, spec: WorkloadSpec, c: Candidate) -> str | None:
    """One MPS client's fatal fault reaches every client: tenants do not share an MPS GPU unless allowed."""
    g = s.state.gpus[c.gpu]
    if c.mode != "mps" or s.settings.mps_share_tenants:
        return None
    others = [t for t in g.tenants if t != spec.tenant]
    return f"GPU {g.index} runs MPS clients of another tenant" if others else None


def quota(s: Scheduler, spec: WorkloadSpec, c: Candidate) -> str | None:
    q = s.settings.tenants.get(spec.tenant)
    if q is None:
        return None
    used_mem, used_milli = s.state.tenant_mem[spec.tenant], s.state.tenant_milli[spec.tenant]
    n = spec.gpu.count or 1  # a whole-GPU request takes this much on each of its GPUs
    need_mem, need_milli = c.need.memory_mib * n, c.need.milli * n
    if q.gpu_memory_mib is not None and used_mem + need_mem > q.gpu_memory_mib:
        return f"tenant {spec.tenant} quota: {format_mib(used_mem)} of {format_mib(q.gpu_memory_mib)} GPU memory used"
    if q.gpus_milli is not None and used_milli + need_milli > q.gpus_milli:
        return f"tenant {spec.tenant} quota: {used_milli / MILLI:g} of {q.gpus_milli / MILLI:g} GPUs used"
    return None


FILTERS: tuple[Filter, ...] = (schedulable, capacity, mps_tenants, quota)

# -- scores: higher is better ---------------------------------------------------------------------

Score = Callable[["Scheduler", WorkloadSpec, Candidate], int]


def packing(s: Scheduler, spec: WorkloadSpec, c: Candidate) -> int:
    """binpack: the less of the GPU is left after placing, the better; spread: the more; first-fit: the
    lowest index."""
    g = s.state.gpus[c.gpu]
    if s.policy == "first-fit":
        return -c.gpu
    # starting on an unused GPU costs a whole GPU, a small one a little more (it will hold less)
    opens = (
        0 if g.allocs else MILLI + (s.largest_gpu_mib - g.total_mib) * MILLI // s.largest_gpu_mib
    )
    if c.mode == "mig":
        used = sum(1 for owner in g.instances.values() if owner is not None) - (
            2 if c.create else 0
        )
        return used * 100 - opens if s.policy != "spread" else -used * 100
    # what is left of the GPU afterwards: the scarcer of memory and shares, in milli-GPU
    left = min(
        (g.free_mib - c.need.memory_mib) * MILLI // max(1, g.total_mib),
        MILLI - g.milli_used - c.need.milli,
    )
    return -left - opens if s.policy != "spread" else left


def tenant_isolation(s: Scheduler, spec: WorkloadSpec, c: Candidate) -> int:
    """A little preference for GPUs not shared with other tenants."""
    g = s.state.gpus[c.gpu]
    return -10 if any(t != spec.tenant for t in g.tenants) else 0


def mig_fit(s: Scheduler, spec: WorkloadSpec, c: Candidate) -> int:
    """On MIG, the instance that wastes the least memory beyond what was asked for."""
    if c.mode != "mig" or spec.gpu.mig_profile is not None:
        return 0
    g = s.state.gpus[c.gpu]
    asked = need_on(spec, g.model, "mig").memory_mib
    return -max(0, c.need.memory_mib - asked) * MILLI // max(1, g.total_mib)


def replica_spread(s: Scheduler, spec: WorkloadSpec, c: Candidate) -> int:
    """Replicas of one deployment go to different GPUs where they fit: a new replica should add GPU
    time, not split a GPU its siblings already keep busy. Outweighs packing; never a filter."""
    group = spec.labels.get(DEPLOYMENT_LABEL)
    if group is None:
        return 0
    g = s.state.gpus[c.gpu]
    siblings = sum(
        1
        for key in g.allocs
        if key in s.specs
        and s.specs[key].tenant == spec.tenant
        and s.specs[key].labels.get(DEPLOYMENT_LABEL) == group
    )
    return -4 * MILLI * siblings


SCORES: tuple[Score, ...] = (packing, tenant_isolation, mig_fit, replica_spread)
