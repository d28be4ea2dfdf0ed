"""The scheduler's plugins, as in the Kubernetes scheduler framework: small functions that get a
narrow, read-only view of the fleet (``PluginContext``), the request (``SchedRequest``, its needs
worked out once) and one candidate placement.

* pre-filters run once per request and GPU model: they rule out every GPU of the model at once (a
  tenant's quota);
* filters rule one GPU out, returning a ``Status``: ``unschedulable`` (taken now; room may come
  back, or be made by preemption) or ``unresolvable`` (nothing on that GPU can change the answer:
  cordoned, the wrong mode); ``None`` means the GPU passes;
* scores rank the GPUs that passed (higher is better).

Plugins never change anything: the context offers no way to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gpufrac.model.catalog import GpuModel
from gpufrac.model.deployment import LABEL as DEPLOYMENT_LABEL
from gpufrac.model.mig import MigPlacement
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.units import format_mib
from gpufrac.model.workload import MILLI, Mode
from gpufrac.planning.nesting import instance_memory, instance_milli, mps_clients
from gpufrac.planning.sched_request import Need, SchedRequest
from gpufrac.planning.sched_state import Allocation, Nest

Policy = Literal["binpack", "spread", "first-fit"]  # first-fit: the benchmark's baseline
StatusCode = Literal["unschedulable", "unresolvable"]
PluginName = Literal[
    "quota", "node_selector", "tenant_nodes", "schedulable", "capacity", "mps_tenants", "mps_domain"
]


@dataclass(frozen=True, slots=True)
class Status:
    code: StatusCode
    reason: str
    plugin: PluginName


@dataclass(frozen=True, slots=True)
class Candidate:
    gpu: int
    mode: Mode
    need: Need
    mig: MigPlacement | None = None
    create: bool = False  # the MIG instance must be created first
    destroy: tuple[MigPlacement, ...] = ()  # MIG instances to destroy before (a re-cut)
    # a share of each of several GPUs: all its GPUs (this one among them), where they are known
    # (a placement restored); () while they are being chosen
    together: tuple[int, ...] = ()


class GpuInfo(Protocol):
    """One GPU, read-only."""

    @property
    def index(self) -> int: ...
    @property
    def model(self) -> GpuModel: ...
    @property
    def mig(self) -> bool: ...
    @property
    def schedulable(self) -> bool: ...
    @property
    def mode(self) -> Mode | None: ...
    @property
    def mps_domain(self) -> tuple[int, ...]: ...
    @property
    def total_mib(self) -> int: ...
    @property
    def free_mib(self) -> int: ...
    @property
    def milli_used(self) -> int: ...
    @property
    def compute_used(self) -> int: ...
    @property
    def tenants(self) -> Mapping[str, int]: ...
    @property
    def allocs(self) -> Mapping[str, Allocation]: ...
    @property
    def instances(self) -> Mapping[MigPlacement, str | None]: ...
    @property
    def nests(self) -> Mapping[MigPlacement, Nest]: ...
    @property
    def node(self) -> str: ...
    @property
    def node_labels(self) -> Mapping[str, str]: ...


class PluginContext(Protocol):
    """What a plugin may read of the scheduler: the GPUs, the settings, usage per tenant."""

    @property
    def gpus(self) -> Sequence[GpuInfo]: ...
    @property
    def settings(self) -> OperatorSettings: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def largest_gpu_mib(self) -> int: ...
    def tenant_use(self, tenant: str) -> tuple[int, int]:
        """(GPU memory in MiB, milli-GPU) the tenant holds now."""
        ...

    def labels_of(self, workload: str) -> Mapping[str, str]:
        """The labels of a placed workload (empty for one the scheduler does not know)."""
        ...


# -- pre-filters: once per request and GPU model --------------------------------------------------

PreFilter = Callable[[PluginContext, SchedRequest, Need, int], Status | None]


def quota(ctx: PluginContext, req: SchedRequest, need: Need, count: int) -> Status | None:
    """The tenant's quota: what it holds plus ``count`` times ``need`` (a whole-GPU request takes
    ``need`` on each of its GPUs)."""
    q = ctx.settings.tenants.get(req.tenant)
    if q is None:
        return None
    used_mem, used_milli = ctx.tenant_use(req.tenant)
    if q.gpu_memory_mib is not None and used_mem + need.memory_mib * count > q.gpu_memory_mib:
        return Status(
            "unschedulable",
            over_memory_quota(req.tenant, used_mem, need.memory_mib * count, q.gpu_memory_mib),
            "quota",
        )
    if q.gpus_milli is not None and used_milli + need.milli * count > q.gpus_milli:
        return Status(
            "unschedulable",
            over_gpus_quota(req.tenant, used_milli, need.milli * count, q.gpus_milli),
            "quota",
        )
    return None


def over_memory_quota(tenant: str, used: int, more: int, limit: int) -> str:
    """Why ``more`` MiB of GPU memory does not fit ``tenant``'s quota, which it uses ``used`` of."""
    held = f"{format_mib(used)} held + {format_mib(more)} asked" if used else "asked"
    return (
        f"tenant {tenant} would use {format_mib(used + more)} of GPU memory ({held}), over its "
        f"{format_mib(limit)} quota (tenants.{tenant}.gpu_memory in gpufrac.yaml)"
    )


def over_gpus_quota(tenant: str, used: int, more: int, limit: int) -> str:
    """Why ``more`` milli-GPU does not fit ``tenant``'s quota, which it uses ``used`` of."""
    held = f"{used / MILLI:g} held + {more / MILLI:g} asked" if used else "asked"
    return (
        f"tenant {tenant} would use {(used + more) / MILLI:g} GPUs ({held}), over its "
        f"{limit / MILLI:g} GPU quota (tenants.{tenant}.gpus in gpufrac.yaml)"
    )


PREFILTERS: tuple[PreFilter, ...] = (quota,)

# -- filters: one GPU ------------------------------------------------------------------------------

Filter = Callable[[PluginContext, SchedRequest, Candidate], Status | None]


def schedulable(ctx: PluginContext, req: SchedRequest, c: Candidate) -> Status | None:
    g = ctx.gpus[c.gpu]
    if g.schedulable:
        return None
    return Status("unresolvable", f"GPU {g.index} is cordoned or unhealthy", "schedulable")


def capacity(ctx: PluginContext, req: SchedRequest, c: Candidate) -> Status | None:
    g = ctx.gpus[c.gpu]

    def taken(why: str) -> Status:
        return Status("unschedulable", why, "capacity")

    if c.mode == "mig":
        if not g.mig:
            return Status("unresolvable", f"GPU {g.index} is not in MIG mode", "capacity")
        if c.mig is None or (not c.create and g.instances.get(c.mig, "") is not None):
            return taken(f"GPU {g.index}: MIG instance taken")
        return None
    if c.mig is not None:
        return _nest_capacity(g, c)
    if g.mig:
        return Status("unresolvable", f"GPU {g.index} is in MIG mode", "capacity")
    if c.mode == "exclusive":
        return None if not g.allocs else taken(f"GPU {g.index} is not free")
    if g.mode not in (None, c.mode):
        return taken(f"GPU {g.index} is in {g.mode} mode")
    if g.free_mib < c.need.memory_mib:
        return taken(f"GPU {g.index} has {format_mib(g.free_mib)} free")
    if g.milli_used + c.need.milli > MILLI:
        return taken(f"GPU {g.index}: its compute shares are taken")
    if c.mode == "mps" and g.compute_used + (c.need.compute_pct or 0) > 100:
        return taken(f"GPU {g.index}: MPS compute is {g.compute_used}% taken")
    return None


def _nest_capacity(g: GpuInfo, c: Candidate) -> Status | None:
    """Room for a share of the MIG instance ``c.mig``, shared inside under ``c.mode``: a free
    instance (or one created for it) starts empty; a shared one must be of that mode and have the
    memory, the shares, the MPS compute and an MPS client left."""
    assert c.mig is not None
    if not g.mig:
        return Status("unresolvable", f"GPU {g.index} is not in MIG mode", "capacity")
    name = f"GPU {g.index} MIG {c.mig}"
    nest = g.nests.get(c.mig)
    if nest is None:
        if not c.create and g.instances.get(c.mig, "") is not None:
            return Status("unschedulable", f"{name} is taken whole", "capacity")
        used_mib, used_milli, used_pct, clients = 0, 0, 0, 0
    elif nest.mode != c.mode:
        return Status("unschedulable", f"{name} is shared under {nest.mode}", "capacity")
    else:
        used_mib, used_milli = nest.mem_used, nest.milli_used
        used_pct, clients = nest.compute_used, len(nest.workloads)
    mib = instance_memory(g.model, c.mig.profile)
    if used_mib + c.need.memory_mib > mib:
        return Status("unschedulable", f"{name} has {format_mib(mib - used_mib)} free", "capacity")
    if used_milli + c.need.milli > instance_milli(g.model, c.mig.profile):
        return Status("unschedulable", f"{name}: its compute shares are taken", "capacity")
    if c.mode == "mps":
        if used_pct + (c.need.compute_pct or 0) > 100:
            return Status("unschedulable", f"{name}: MPS compute is {used_pct}% taken", "capacity")
        if clients >= mps_clients(g.model, c.mig.profile):
            return Status("unschedulable", f"{name}: it has its most MPS clients", "capacity")
    return None


def mps_tenants(ctx: PluginContext, req: SchedRequest, c: Candidate) -> Status | None:
    """One MPS client's fatal fault reaches every client: tenants do not share an MPS GPU (or MPS
    inside a MIG instance) unless allowed."""
    g = ctx.gpus[c.gpu]
    if c.mode != "mps" or ctx.settings.mps_share_tenants:
        return None
    if c.mig is not None:
        nest = g.nests.get(c.mig)
        if nest is not None and any(t != req.tenant for t in nest.tenants):
            why = f"GPU {g.index} MIG {c.mig} runs MPS clients of another tenant"
            return Status("unschedulable", why, "mps_tenants")
        return None
    if any(t != req.tenant for t in g.tenants):
        why = f"GPU {g.index} runs MPS clients of another tenant"
        return Status("unschedulable", why, "mps_tenants")
    return None


def mps_domain(ctx: PluginContext, req: SchedRequest, c: Candidate) -> Status | None:
    """One MPS control daemon serves a GPU, and a workload's MPS client reaches one daemon, which
    serves all its GPUs: so every MPS workload on a GPU asks for the same GPUs (its MPS domain).
    A GPU whose daemon serves it alone takes one-GPU MPS workloads only; one whose daemon serves
    it with others (a share of each of several GPUs) takes only a share of each of those same
    GPUs (checked on each GPU by their number, and against all of them where they are known:
    the scheduler takes a domain's GPUs together)."""
    g = ctx.gpus[c.gpu]
    if c.mode != "mps" or c.mig is not None or g.mode != "mps" or not g.mps_domain:
        return None
    n = req.spec.gpu.devices
    served = g.mps_domain
    if len(served) == n and (not c.together or sorted(c.together) == list(served)):
        return None
    if len(served) == 1:
        has = f"GPU {g.index} is an MPS domain of its own"
    else:  # said alike for each of its GPUs: one clause for the domain
        has = f"GPUs {', '.join(str(i) for i in served)} are one MPS domain"
    wants = "a one-GPU MPS workload" if n == 1 else f"a share of each of {n} GPUs under MPS"
    if c.together and len(served) == n:
        wants = f"an MPS workload on GPUs {', '.join(str(i) for i in sorted(c.together))}"
    why = f"{has}: {wants} cannot join it (one MPS daemon serves each GPU)"
    return Status("unschedulable", why, "mps_domain")


def node_selector(ctx: PluginContext, req: SchedRequest, c: Candidate) -> Status | None:
    """The GPU's node has every label of the request's ``spec.node_selector``."""
    g = ctx.gpus[c.gpu]
    missing = req.missing_labels(g.node_labels)
    if not missing:
        return None
    where = f"node {g.node}" if g.node else f"the node of GPU {g.index}"
    why = f"{where} lacks label{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    return Status("unresolvable", why, "node_selector")


def tenant_nodes(ctx: PluginContext, req: SchedRequest, c: Candidate) -> Status | None:
    """The GPU's node has every label its tenant is kept to (the operator's ``tenants.NAME.
    nodes``): no workload of the tenant, whatever its own selector, runs elsewhere."""
    g = ctx.gpus[c.gpu]
    missing = req.missing_kept(g.node_labels)
    if not missing:
        return None
    return Status("unresolvable", kept_to_reason(req), "tenant_nodes")


def kept_to_reason(req: SchedRequest) -> str:
    labels = ", ".join(f"{k}={v}" for k, v in req.kept_to)
    return (
        f"tenant {req.tenant} is kept to nodes labelled {labels} (tenants.{req.tenant}.nodes "
        "in gpufrac.yaml)"
    )


FILTERS: tuple[Filter, ...] = (
    node_selector,
    tenant_nodes,
    schedulable,
    capacity,
    mps_tenants,
    mps_domain,
)


def first_refusal(ctx: PluginContext, req: SchedRequest, c: Candidate) -> Status | None:
    """The first filter that rules the candidate out, or None if every filter passes it."""
    for f in FILTERS:
        status = f(ctx, req, c)
        if status is not None:
            return status
    return None


def refusal_if_open(ctx: PluginContext, req: SchedRequest, c: Candidate) -> Status | None:
    """``first_refusal`` for a GPU that takes no new work, as if it did: whether opening it (an
    uncordon, its node back) would let the request in."""
    for f in FILTERS:
        status = None if f is schedulable else f(ctx, req, c)
        if status is not None:
            return status
    return None


# -- scores: higher is better ----------------------------------------------------------------------

Score = Callable[[PluginContext, SchedRequest, Candidate], int]


def packing(ctx: PluginContext, req: SchedRequest, c: Candidate) -> int:
    """binpack: the less of the GPU is left after placing, the better; spread: the more; first-fit:
    the lowest index."""
    g = ctx.gpus[c.gpu]
    if ctx.policy == "first-fit":
        return -c.gpu
    # starting on an unused GPU costs a whole GPU, a small one a little more (it will hold less)
    largest = ctx.largest_gpu_mib
    opens = 0 if g.allocs else MILLI + (largest - g.total_mib) * MILLI // largest
    if c.mig is not None and c.mode != "mig":  # a share of an instance shared inside
        # what is left of the instance afterwards; a new shared instance costs what it holds
        # (and a new one to create, a little more), so shared instances fill before new ones
        nest = g.nests.get(c.mig)
        left = instance_milli(g.model, c.mig.profile) - c.need.milli
        left -= 0 if nest is None else nest.milli_used
        fresh = 0 if nest is not None else MILLI // 2 + (100 if c.create else 0)
        return -left - fresh - opens if ctx.policy != "spread" else left
    if c.mode == "mig":
        used = sum(1 for owner in g.instances.values() if owner is not None) - (
            2 if c.create else 0
        )
        return used * 100 - opens if ctx.policy != "spread" else -used * 100
    # what is left of the GPU afterwards: the scarcer of memory and shares, in milli-GPU
    left = min(
        (g.free_mib - c.need.memory_mib) * MILLI // max(1, g.total_mib),
        MILLI - g.milli_used - c.need.milli,
    )
    return -left - opens if ctx.policy != "spread" else left


def recut_cost(ctx: PluginContext, req: SchedRequest, c: Candidate) -> int:
    """Each MIG instance destroyed for a re-cut costs as much as one created: an existing layout is
    cut again only where it must be."""
    return -200 * len(c.destroy)


def tenant_isolation(ctx: PluginContext, req: SchedRequest, c: Candidate) -> int:
    """A little preference for GPUs not shared with other tenants."""
    return -10 if any(t != req.tenant for t in ctx.gpus[c.gpu].tenants) else 0


def mig_fit(ctx: PluginContext, req: SchedRequest, c: Candidate) -> int:
    """On MIG, the instance that wastes the least memory beyond what was asked for."""
    if c.mode != "mig" or req.spec.gpu.mig_profile is not None:
        return 0
    g = ctx.gpus[c.gpu]
    asked = req.need(g.model, "mig").memory_mib
    return -max(0, c.need.memory_mib - asked) * MILLI // max(1, g.total_mib)


def replica_spread(ctx: PluginContext, req: SchedRequest, c: Candidate) -> int:
    """Replicas of one deployment go to different GPUs where they fit: a new replica should add GPU
    time, not split a GPU its siblings already keep busy; on a cluster, to different nodes too, so
    that losing a node leaves replicas serving. Outweighs packing; never a filter."""
    group = req.spec.labels.get(DEPLOYMENT_LABEL)
    if group is None:
        return 0

    def siblings(g: GpuInfo) -> int:
        return sum(
            1
            for key in g.allocs
            if key.startswith(f"{req.tenant}/")
            and ctx.labels_of(key).get(DEPLOYMENT_LABEL) == group
        )

    here = ctx.gpus[c.gpu]
    on_gpu = siblings(here)
    on_node = 0
    if here.node:  # a cluster's GPU: every sibling on its node counts again, this one's too
        on_node = sum(
            siblings(g) if g is not here else on_gpu for g in ctx.gpus if g.node == here.node
        )
    return -4 * MILLI * on_gpu - 8 * MILLI * on_node


SCORES: tuple[Score, ...] = (packing, recut_cost, tenant_isolation, mig_fit, replica_spread)


def score(ctx: PluginContext, req: SchedRequest, c: Candidate) -> int:
    return sum(s(ctx, req, c) for s in SCORES)
