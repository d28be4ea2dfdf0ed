"""The scheduler's picture of the GPUs: what is allocated where, in fixed-point units, with indexes.

Every change goes through ``allocate`` and ``release``, which keep the accounting and the indexes in
step:

* per (model, mode) a list of (headroom, GPU index) sorted by headroom (the smaller of free memory
  and free shares, in milli-GPU), for GPUs shared by time-slicing or MPS, so the best-fitting GPU is
  found by bisection, not by scanning 1,000 GPUs;
* per model the empty whole GPUs;
* per (model, profile) the free MIG instances, and the MIG GPUs where an instance of that profile
  could still be created (looked up in the model's enumerated layouts, cached per layout);
* per model the MIG GPUs with an idle instance (where a re-cut could make room);
* per (model, mode) the MIG instances shared inside by MPS or time-slices (``Nest``: a MIG instance
  as a shareable device, its memory, shares and MPS compute accounted per workload).

Trial changes go through a ``Statement`` (KAI-Scheduler's): every change made through it is undone
by ``rollback``, in reverse order, and kept by ``commit``.

``violations`` recomputes everything from the allocations alone: what the property tests check.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Literal

from gpufrac.model.catalog import GpuModel
from gpufrac.model.gpu import GpuState
from gpufrac.model.mig import MigPlacement, check_layout
from gpufrac.model.workload import MILLI, Mode
from gpufrac.planning.nesting import instance_memory, instance_milli, mps_clients
from gpufrac.planning.patterns import geometry

SHARED_MODES: tuple[Mode, ...] = ("timeslice", "mps")
EXTERNAL = (
    "(in use outside gpufrac)"  # the owner of a MIG instance busy with a process nobody placed
)
NESTED = "(shared inside)"  # the owner of a MIG instance shared by several workloads (``Nest``)


@dataclass(frozen=True, slots=True)
class Allocation:
    """One workload's share of one GPU (a workload asking for N whole GPUs has N of these)."""

    workload: str  # tenant/name
    tenant: str
    priority: int
    gpu: int  # GPU index in the state
    mode: Mode
    memory_mib: int
    milli: int  # share of the GPU, for quotas and for capacity (1000 = whole)
    compute_pct: int | None = None  # MPS active-thread percentage
    mig: MigPlacement | None = None


@dataclass
class Nest:
    """A MIG instance shared inside by MPS or time-slices: a device of its own with its capacity
    (``memory_mib``, ``milli``: its share of the GPU) and what its workloads hold of it. MPS
    compute is in percent of the instance."""

    mode: Mode
    memory_mib: int
    milli: int
    mem_used: int = 0
    milli_used: int = 0
    compute_used: int = 0
    tenants: Counter[str] = field(default_factory=Counter)
    workloads: set[str] = field(default_factory=set)

    @property
    def free_mib(self) -> int:
        return self.memory_mib - self.mem_used


def nested(a: Allocation) -> bool:
    """Whether ``a`` is a share of a MIG instance shared inside (not the instance whole)."""
    return a.mig is not None and a.mode in SHARED_MODES


Closure = Literal["cordoned", "node_lost"]  # why a GPU takes no new work


@dataclass(frozen=True, slots=True)
class Closed:
    """Why a GPU takes no new work: it is cordoned (by an operator, or drained after a health
    event), or its node is lost; ``detail`` says what a reason shows of it (a lost node: how long
    it has gone without a heartbeat)."""

    cause: Closure
    detail: str = ""


CORDONED = Closed("cordoned")


@dataclass
class SchedGpu:
    uuid: str
    index: int
    model: GpuModel
    mig: bool
    closed: Closed | None = None  # None: it takes new work
    mode: Mode | None = None  # for non-MIG GPUs: None while empty
    # under MPS, the GPUs its MPS daemon serves (its MPS domain): those of each of its MPS
    # workloads, the same for all of them (the ``mps_domain`` filter); () when not under MPS
    mps_domain: tuple[int, ...] = ()
    mem_used: int = 0
    milli_used: int = 0
    compute_used: int = 0
    allocs: dict[str, Allocation] = field(default_factory=dict)
    tenants: Counter[str] = field(default_factory=Counter)
    instances: dict[MigPlacement, str | None] = field(
        default_factory=dict
    )  # MIG: instance -> workload (``NESTED`` where several share it)
    nests: dict[MigPlacement, Nest] = field(default_factory=dict)  # MIG instances shared inside
    pinned: bool = False  # an operator set its MIG layout: no instance is created or destroyed
    node: str = ""  # the machine it is in ("" where the fleet is one machine with no name)
    node_labels: Mapping[str, str] = field(default_factory=dict)  # that machine's labels

    @property
    def schedulable(self) -> bool:
        return self.closed is None

    @property
    def total_mib(self) -> int:
        return self.model.memory_total_mib

    @property
    def free_mib(self) -> int:
        return self.total_mib - self.mem_used

    @property
    def headroom(self) -> int:
        """What is left of this GPU in milli-GPU: the smaller of free memory and free shares."""
        return min(self.free_mib * MILLI // max(1, self.total_mib), MILLI - self.milli_used)

    @property
    def used(self) -> bool:
        return bool(self.allocs)

    def holders(self, pl: MigPlacement) -> set[str]:
        """The workloads holding MIG instance ``pl``: its owner, or every share of it where it is
        shared inside (none for an idle instance, or one busy outside gpufrac)."""
        owner = self.instances.get(pl)
        if owner == NESTED:
            return set(self.nests[pl].workloads)
        return set() if owner is None or owner == EXTERNAL else {owner}


@cache
def additions(model: GpuModel, layout: tuple[MigPlacement, ...]) -> dict[str, MigPlacement]:
    """For each profile that still fits beside ``layout``: where to put it (most room left
    after)."""
    geo = geometry(model)
    base = list(geo.counts_of(layout))
    best: dict[str, tuple[tuple[int, ...], MigPlacement]] = {}
    for lay in geo.layouts_containing(layout):
        if sum(lay.counts) != sum(base) + 1:
            continue
        (new,) = [p for p in lay.placements if p not in layout]
        rank = lay.free_score
        if new.profile not in best or rank > best[new.profile][0]:
            best[new.profile] = (rank, new)
    return {name: pl for name, (_, pl) in best.items()}


class ClusterState:
    """GPUs and allocations. No I/O; every method is a pure change of this in-memory value."""

    def __init__(self, gpus: list[SchedGpu]) -> None:
        self.gpus = gpus
        self.by_uuid = {g.uuid: g for g in gpus}
        self.allocs: dict[str, list[Allocation]] = {}
        self.tenant_mem: Counter[str] = Counter()
        self.tenant_milli: Counter[str] = Counter()
        self.priorities: Counter[int] = Counter()  # placed workloads per priority
        self.shared: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
        self.empty: dict[str, list[int]] = defaultdict(list)
        self.free_instances: dict[tuple[str, str], set[tuple[int, MigPlacement]]] = defaultdict(set)
        self.addable: dict[tuple[str, str], set[int]] = defaultdict(set)
        self.idle_mig: dict[str, set[int]] = defaultdict(set)  # MIG GPUs with instances, all unused
        self.with_idle: dict[str, set[int]] = defaultdict(set)  # MIG GPUs with an unused instance
        # per (model, mode): the MIG instances shared inside under that mode
        self.nested: dict[tuple[str, str], set[tuple[int, MigPlacement]]] = defaultdict(set)
        self.closed: set[int] = {g.index for g in gpus if not g.schedulable}  # no new work there
        for g in gpus:
            if g.mig:
                self._index_mig(g)
            elif g.schedulable:
                bisect.insort(self.empty[g.model.key], g.index)
        self._fleet_views()

    def _fleet_views(self) -> None:
        """What the fleet offers by mode (recomputed when a GPU's MIG mode changes)."""
        gpus = self.gpus
        self.models = sorted({g.model.key: g.model for g in gpus}.values(), key=lambda m: m.key)
        self.plain_models = sorted(
            {g.model.key: g.model for g in gpus if not g.mig}.values(), key=lambda m: m.key
        )
        self.mig_models = sorted(
            {g.model.key: g.model for g in gpus if g.mig}.values(), key=lambda m: m.key
        )
        self.plain_count = sum(1 for g in gpus if not g.mig)
        self.largest_gpu_mib = max((g.total_mib for g in gpus), default=1)
        self.nodes: dict[str, Mapping[str, str]] = {g.node: g.node_labels for g in gpus}
        self.mig_gpus = [g for g in gpus if g.mig]
        self.plain_gpus = [g for g in gpus if not g.mig]

    # -- indexes -------------------------------------------------------------------------------

    def _unindex(self, g: SchedGpu) -> None:
        if g.mig:
            self.idle_mig[g.model.key].discard(g.index)
            self.with_idle[g.model.key].discard(g.index)
            for name in g.model.profiles:
                self.addable[(g.model.key, name.name)].discard(g.index)
            for pl in g.instances:
                self.free_instances[(g.model.key, pl.profile)].discard((g.index, pl))
            for pl, nest in g.nests.items():
                self.nested[(g.model.key, nest.mode)].discard((g.index, pl))
            return
        if g.mode is None:
            lst = self.empty[g.model.key]
            i = bisect.bisect_left(lst, g.index)
            if i < len(lst) and lst[i] == g.index:
                del lst[i]
        elif g.mode in SHARED_MODES:
            lst2 = self.shared[(g.model.key, g.mode)]
            i = bisect.bisect_left(lst2, (g.headroom, g.index))
            if i < len(lst2) and lst2[i] == (g.headroom, g.index):
                del lst2[i]

    def _index(self, g: SchedGpu) -> None:
        if not g.schedulable:
            return
        if g.mig:
            self._index_mig(g)
        elif g.mode is None:
            bisect.insort(self.empty[g.model.key], g.index)
        elif g.mode in SHARED_MODES:
            bisect.insort(self.shared[(g.model.key, g.mode)], (g.headroom, g.index))

    def _index_mig(self, g: SchedGpu) -> None:
        if not g.schedulable:
            return
        for pl, owner in g.instances.items():
            if owner is None:
                self.free_instances[(g.model.key, pl.profile)].add((g.index, pl))
        for pl, nest in g.nests.items():
            self.nested[(g.model.key, nest.mode)].add((g.index, pl))
        if g.pinned:
            return
        if g.instances and all(owner is None for owner in g.instances.values()):
            self.idle_mig[g.model.key].add(g.index)
        if any(owner is None for owner in g.instances.values()):
            self.with_idle[g.model.key].add(g.index)
        for name in additions(g.model, tuple(sorted(g.instances))):
            self.addable[(g.model.key, name)].add(g.index)

    def addition(self, g: SchedGpu, profile: str) -> MigPlacement | None:
        return additions(g.model, tuple(sorted(g.instances))).get(profile)

    def relayout(
        self, g: SchedGpu, mig: bool, placements: list[MigPlacement], *, pinned: bool
    ) -> None:
        """Take a GPU's new MIG mode and instances (instances kept keep their owners). A GPU that
        holds work outside MIG keeps its mode: the caller moves that work first."""
        if g.mig == mig and not mig:
            self.set_pinned(g, pinned)
            return
        if any(a.mig is None for a in g.allocs.values()):
            raise ValueError(f"GPU {g.index} holds work outside MIG; its MIG mode cannot change")
        self._unindex(g)
        g.mig = mig
        g.instances = {pl: g.instances.get(pl) for pl in placements} if mig else {}
        g.pinned = pinned
        g.mode = None
        self._index(g)
        self._fleet_views()

    def set_pinned(self, g: SchedGpu, pinned: bool) -> None:
        self._unindex(g)
        g.pinned = pinned
        self._index(g)

    def claim_external(self, g: SchedGpu, pl: MigPlacement) -> bool:
        """An instance marked busy from outside becomes free again (its workload is being restored).
        True if it was so marked."""
        if g.instances.get(pl) != EXTERNAL:
            return False
        self._unindex(g)
        g.instances[pl] = None
        self._index(g)
        return True

    def mark_external(self, g: SchedGpu, pl: MigPlacement) -> None:
        """The inverse of ``claim_external``."""
        self._unindex(g)
        g.instances[pl] = EXTERNAL
        self._index(g)

    def statement(self) -> Statement:
        return Statement(self)

    def add_gpus(self, gpus: list[SchedGpu]) -> None:
        """GPUs that joined (a node of a cluster): indexed after those there are."""
        for g in gpus:
            if g.index != len(self.gpus) or g.uuid in self.by_uuid:
                raise ValueError(f"GPU {g.uuid} must come next (index {len(self.gpus)}), once")
            self.gpus.append(g)
            self.by_uuid[g.uuid] = g
            if not g.schedulable:
                self.closed.add(g.index)
            self._index(g)
        self._fleet_views()

    def set_closed(self, g: SchedGpu, closed: Closed | None) -> None:
        """Close ``g`` to new work, saying why, or open it again (``None``)."""
        self._unindex(g)
        g.closed = closed
        if closed is None:
            self.closed.discard(g.index)
        else:
            self.closed.add(g.index)
        self._index(g)

    # -- changes -------------------------------------------------------------------------------

    def allocate(
        self,
        allocs: list[Allocation],
        create: tuple[tuple[int, MigPlacement], ...] = (),
        destroy: tuple[tuple[int, MigPlacement], ...] = (),
    ) -> None:
        key = allocs[0].workload
        for gpu_index, pl in destroy:
            assert self.gpus[gpu_index].instances.get(pl, "") is None, "only idle ones go"
            self._instance(gpu_index, pl, present=False)
        for gpu_index, pl in create:
            self._instance(gpu_index, pl, present=True)
        for a in allocs:
            g = self.gpus[a.gpu]
            self._unindex(g)
            if nested(a):
                assert a.mig is not None
                self._join(g, a, a.mig)
            elif a.mig is not None:
                g.instances[a.mig] = a.workload
            else:
                g.mode = a.mode
                if a.mode == "mps":  # one daemon serves the workload's GPUs together
                    g.mps_domain = tuple(sorted(x.gpu for x in allocs))
                g.mem_used += a.memory_mib
                g.milli_used += a.milli
                g.compute_used += a.compute_pct or 0
            g.allocs[a.workload] = a
            g.tenants[a.tenant] += 1
            self.tenant_mem[a.tenant] += a.memory_mib
            self.tenant_milli[a.tenant] += a.milli
            self._index(g)
        self.allocs[key] = list(allocs)
        self.priorities[allocs[0].priority] += 1

    def unallocate(
        self,
        workload: str,
        create: tuple[tuple[int, MigPlacement], ...] = (),
        destroy: tuple[tuple[int, MigPlacement], ...] = (),
    ) -> None:
        """The inverse of ``allocate``: release, remove the instances it created, bring back the
        idle ones it destroyed."""
        self.release(workload)
        for gpu_index, pl in create:
            self._instance(gpu_index, pl, present=False)
        for gpu_index, pl in destroy:
            self._instance(gpu_index, pl, present=True)

    def _instance(self, gpu_index: int, pl: MigPlacement, *, present: bool) -> None:
        """An idle MIG instance made (``present``) or gone, with the indexes kept in step."""
        g = self.gpus[gpu_index]
        self._unindex(g)
        if present:
            g.instances[pl] = None
        else:
            del g.instances[pl]
        self._index(g)

    def release(self, workload: str) -> list[Allocation]:
        allocs = self.allocs.pop(workload, [])
        if allocs:
            self.priorities[allocs[0].priority] -= 1
            if not self.priorities[allocs[0].priority]:
                del self.priorities[allocs[0].priority]
        for a in allocs:
            g = self.gpus[a.gpu]
            self._unindex(g)
            del g.allocs[a.workload]
            g.tenants[a.tenant] -= 1
            if not g.tenants[a.tenant]:
                del g.tenants[a.tenant]
            if nested(a):
                assert a.mig is not None
                self._leave(g, a, a.mig)
            elif a.mig is not None:
                g.instances[a.mig] = None
            else:
                g.mem_used -= a.memory_mib
                g.milli_used -= a.milli
                g.compute_used -= a.compute_pct or 0
                if not g.allocs:
                    g.mode = None
                    g.mps_domain = ()
            self.tenant_mem[a.tenant] -= a.memory_mib
            self.tenant_milli[a.tenant] -= a.milli
            self._index(g)
        return allocs

    def _join(self, g: SchedGpu, a: Allocation, pl: MigPlacement) -> None:
        """``a`` takes its share of the instance ``pl``, which becomes shared if it is not."""
        nest = g.nests.get(pl)
        if nest is None:
            assert g.instances.get(pl, "") is None, "only a free instance becomes shared"
            nest = g.nests[pl] = Nest(
                a.mode, instance_memory(g.model, pl.profile), instance_milli(g.model, pl.profile)
            )
            g.instances[pl] = NESTED
        nest.mem_used += a.memory_mib
        nest.milli_used += a.milli
        nest.compute_used += a.compute_pct or 0
        nest.tenants[a.tenant] += 1
        nest.workloads.add(a.workload)

    def _leave(self, g: SchedGpu, a: Allocation, pl: MigPlacement) -> None:
        """The inverse of ``_join``: the last share gone, the instance is free (idle) again."""
        nest = g.nests[pl]
        nest.mem_used -= a.memory_mib
        nest.milli_used -= a.milli
        nest.compute_used -= a.compute_pct or 0
        nest.tenants[a.tenant] -= 1
        if not nest.tenants[a.tenant]:
            del nest.tenants[a.tenant]
        nest.workloads.discard(a.workload)
        if not nest.workloads:
            del g.nests[pl]
            g.instances[pl] = None

    def min_priority(self) -> int:
        """The lowest priority of any placed workload (no preemption can help a request at or below
        it)."""
        return min(self.priorities, default=2**62)

    def gpus_used(self) -> int:
        return sum(1 for g in self.gpus if g.used)

    # -- invariants, recomputed from scratch -----------------------------------------------------

    def violations(
        self, mps_share_tenants: bool, quotas: dict[str, tuple[int | None, int | None]]
    ) -> list[str]:
        out = []
        mem: Counter[str] = Counter()
        milli: Counter[str] = Counter()
        for g in self.gpus:
            plain = [a for a in g.allocs.values() if a.mig is None]
            if g.mig:
                owners = Counter(a.mig for a in g.allocs.values() if not nested(a))
                if plain or any(n > 1 for n in owners.values()):
                    out.append(f"GPU {g.index}: a MIG instance holds more than one workload")
                if any(pl not in g.instances for pl in owners):
                    out.append(f"GPU {g.index}: allocation on a MIG instance that does not exist")
                if check_layout(g.model, tuple(sorted(g.instances))):
                    out.append(f"GPU {g.index}: invalid MIG layout")
                out += _nest_violations(g, mps_share_tenants, set(owners))
            else:
                if sum(a.memory_mib for a in plain) > g.total_mib:
                    out.append(f"GPU {g.index}: memory oversubscribed")
                if sum(a.milli for a in plain) > MILLI:
                    out.append(f"GPU {g.index}: more than one GPU's worth of shares")
                modes = {a.mode for a in plain}
                if len(modes) > 1 or ("exclusive" in modes and len(plain) > 1):
                    out.append(f"GPU {g.index}: mixed or shared exclusive modes {modes}")
                if "mps" in modes:
                    if sum(a.compute_pct or 0 for a in plain) > 100:
                        out.append(f"GPU {g.index}: MPS compute over 100%")
                    if not mps_share_tenants and len({a.tenant for a in plain}) > 1:
                        out.append(f"GPU {g.index}: tenants share an MPS GPU")
                    # one daemon per GPU: every MPS workload on it is on the same GPUs
                    domains = {
                        tuple(sorted(x.gpu for x in self.allocs.get(a.workload, []))) for a in plain
                    }
                    if domains != {g.mps_domain}:
                        out.append(
                            f"GPU {g.index}: MPS workloads on different sets of GPUs "
                            f"{sorted(domains)} (its MPS domain: {g.mps_domain})"
                        )
                elif g.mps_domain:
                    out.append(f"GPU {g.index}: an MPS domain without MPS workloads")
            for a in g.allocs.values():
                mem[a.tenant] += a.memory_mib
                milli[a.tenant] += a.milli
        for tenant, (qmem, qmilli) in quotas.items():
            if qmem is not None and mem[tenant] > qmem:
                out.append(f"tenant {tenant}: memory quota exceeded")
            if qmilli is not None and milli[tenant] > qmilli:
                out.append(f"tenant {tenant}: GPU quota exceeded")
        return out


def _nest_violations(
    g: SchedGpu, mps_share_tenants: bool, whole: set[MigPlacement | None]
) -> list[str]:
    """What is wrong with the instances of MIG GPU ``g`` shared inside, from its allocations."""
    out = []
    shares: dict[MigPlacement, list[Allocation]] = defaultdict(list)
    for a in g.allocs.values():
        if nested(a) and a.mig is not None:
            shares[a.mig].append(a)
    if set(shares) != set(g.nests) or any(g.instances.get(pl) != NESTED for pl in shares):
        out.append(f"GPU {g.index}: shared MIG instances out of step with their workloads")
    for pl, allocs in shares.items():
        name = f"GPU {g.index} MIG {pl}"
        if pl in whole:
            out.append(f"{name}: held whole and shared at once")
        if sum(a.memory_mib for a in allocs) > instance_memory(g.model, pl.profile):
            out.append(f"{name}: memory oversubscribed")
        if sum(a.milli for a in allocs) > instance_milli(g.model, pl.profile):
            out.append(f"{name}: more shares than the instance has")
        modes = {a.mode for a in allocs}
        if len(modes) > 1:
            out.append(f"{name}: mixed sharing modes {modes}")
        if "mps" in modes:
            if sum(a.compute_pct or 0 for a in allocs) > 100:
                out.append(f"{name}: MPS compute over 100%")
            if len(allocs) > mps_clients(g.model, pl.profile):
                out.append(f"{name}: more MPS clients than the instance takes")
            if not mps_share_tenants and len({a.tenant for a in allocs}) > 1:
                out.append(f"{name}: tenants share an MPS instance")
    return out


class Statement:
    """Trial changes to a ``ClusterState``: made at once, undone in reverse order by ``rollback``.

    Used as a context manager, a block that raises is rolled back; ``commit`` keeps what was
    done."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> Statement:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is not None:
            self.rollback()

    def allocate(
        self,
        allocs: list[Allocation],
        create: tuple[tuple[int, MigPlacement], ...] = (),
        destroy: tuple[tuple[int, MigPlacement], ...] = (),
    ) -> None:
        self.state.allocate(allocs, create, destroy)
        key = allocs[0].workload
        self._undo.append(lambda: self.state.unallocate(key, create, destroy))

    def release(self, workload: str) -> list[Allocation]:
        allocs = self.state.release(workload)
        if allocs:
            self._undo.append(lambda: self.state.allocate(allocs))
        return allocs

    def claim_external(self, g: SchedGpu, pl: MigPlacement) -> None:
        if self.state.claim_external(g, pl):
            self._undo.append(lambda: self.state.mark_external(g, pl))

    def on_rollback(self, undo: Callable[[], None]) -> None:
        """Something outside the state (the scheduler's queue) to put back on rollback."""
        self._undo.append(undo)

    def commit(self) -> None:
        self._undo.clear()

    def rollback(self) -> None:
        while self._undo:
            self._undo.pop()()


def sched_gpus_from_states(
    states: list[GpuState],
    models: dict[str, GpuModel],
    pinned: frozenset[str] = frozenset(),
    *,
    node: str = "",
    node_labels: Mapping[str, str] | None = None,
) -> list[SchedGpu]:
    """The scheduler's GPUs from a device snapshot: healthy GPUs with a known model (``models`` maps
    UUID to the driver's table). Existing MIG instances become free instances, except busy ones,
    which count as taken (``EXTERNAL``) until a restored workload claims its own. Processes outside
    MIG are not accounted here: the agent restores its own placements, and memory it did not place
    is not known. GPUs in ``pinned`` (UUIDs) keep the MIG layout an operator set. They are all in
    ``node``, labelled ``node_labels``."""
    out: list[SchedGpu] = []
    labels = dict(node_labels or {})
    for g in states:
        model = models.get(g.uuid)
        if g.health != "ok" or model is None:
            continue
        sg = SchedGpu(
            g.uuid,
            len(out),
            model,
            mig=g.mig_enabled,
            pinned=g.uuid in pinned,
            node=node,
            node_labels=labels,
        )
        sg.instances = {i.placement: (EXTERNAL if i.busy else None) for i in g.instances}
        out.append(sg)
    return out
