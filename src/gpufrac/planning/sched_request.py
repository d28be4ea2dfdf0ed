"""One workload as the scheduler sees it: its spec, the sharing modes it may use, and what it needs
on each GPU model, worked out once per submission and remembered (not recomputed by every
plugin)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpufrac.model.catalog import GpuModel
from gpufrac.model.workload import MILLI, Mode, WorkloadSpec
from gpufrac.planning.demand import smallest_fitting
from gpufrac.planning.nesting import NestFit, nest_mode, nested_fit


@dataclass(frozen=True, slots=True)
class Need:
    memory_mib: int
    milli: int  # share of one GPU (quota and capacity accounting)
    compute_pct: int | None = None  # MPS active-thread percentage


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def need_on(spec: WorkloadSpec, model: GpuModel, mode: Mode, profile: str | None = None) -> Need:
    """What ``spec`` takes on one GPU of ``model`` under ``mode`` (on a MIG ``profile``, if
    given).

    On a shared GPU memory and compute are two capacities, each checked on its own: ``memory_mib``
    against the GPU's memory, ``milli`` against its shares. A request with a compute cap takes
    that share of the GPU (its memory apart), so 40% of the memory with 60% of the compute fits
    beside 60% with 40%; one without takes the share of the memory it asks for."""
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
    memory = memory_of(spec, model)
    # without a cap, the share of its memory, rounded down: memory itself is checked exactly, and
    # shares must add up
    milli = req.compute_pct * 10 if req.compute_pct is not None else memory * MILLI // total
    return Need(memory, min(MILLI, milli), req.compute_pct if mode == "mps" else None)


def memory_of(spec: WorkloadSpec, model: GpuModel) -> int:
    """The GPU memory a memory request (or a compute cap alone) takes on a GPU of ``model``: the
    MiB it names, its percentage of the GPU's memory (rounded down), or without either the whole
    memory (HAMi's default where gpumem is not given)."""
    req = spec.gpu
    if req.memory_mib is not None:
        return req.memory_mib
    if req.memory_pct is not None:
        return model.memory_total_mib * req.memory_pct // 100
    return model.memory_total_mib


def sharing_modes(spec: WorkloadSpec) -> tuple[Mode, ...]:
    """The modes a request may be placed under, in the order they are tried."""
    req = spec.gpu
    if req.count is not None:
        return ("exclusive",)
    if req.mig_profile is not None:
        return ("mig",)
    if req.devices > 1 and spec.sharing == "auto":
        # a share of each of several GPUs: under MPS for a compute cap (one daemon serving its
        # GPUs together), else time-sliced; never MIG (an instance is one GPU's: sharing: mig is
        # refused, _never_fits)
        return ("mps",) if req.compute_pct is not None else ("timeslice",)
    match spec.sharing:
        case "auto":
            return ("mig", "mps" if req.compute_pct is not None else "timeslice")
        case "mig" | "mps" | "timeslice" | "exclusive":
            return (spec.sharing,)


def mig_profile_on(spec: WorkloadSpec, model: GpuModel) -> str | None:
    """The MIG profile ``spec`` takes on ``model``: the one named, the share of slots and compute a
    fraction asks for, or for a memory need (with its compute cap, if any, as compute slices) the
    profile ``gpufrac mig plan --need`` takes for the same need (``demand.smallest_fitting``);
    None if none holds it."""
    req = spec.gpu
    if req.mig_profile is not None:
        if req.mig_model not in (None, model.key) or not model.has_profile(req.mig_profile):
            return None
        return model.profile(req.mig_profile).name
    if req.fraction_milli is not None:  # that share of the memory slots and of the compute slices
        slots = -(-req.fraction_milli * model.memory_slots // MILLI)
        compute = -(-req.fraction_milli * model.compute_slices // MILLI)
        fits = [
            p
            for p in model.profiles
            if not p.media_extensions and p.memory_slots >= slots and p.compute_slices >= compute
        ]
        best = min(fits, key=lambda p: (p.memory_slots, p.compute_slices), default=None)
        return None if best is None else best.name
    # memory and compute needs decide, as for ``gpufrac mig plan --need``: one function
    slices = None
    if req.compute_pct is not None:
        slices = _ceil_div(req.compute_pct * model.compute_slices, 100)
    prof = smallest_fitting(model, memory_of(spec, model), slices)
    return None if prof is None else prof.name


_SHAPES: dict[tuple[object, ...], int] = {}


def _shape_id(shape: tuple[object, ...]) -> int:
    """A small number per distinct shape, so that sets of shapes hash an int, not dataclasses."""
    found = _SHAPES.get(shape)
    if found is None:
        if len(_SHAPES) > 100_000:
            _SHAPES.clear()  # ids need only be equal for equal shapes while both are alive
        found = _SHAPES[shape] = len(_SHAPES) + 1
    return found


class SchedRequest:
    """A submitted workload with its needs remembered per (model, mode, profile)."""

    __slots__ = (
        "_needs",
        "_nests",
        "_profiles",
        "kept_to",
        "key",
        "kinds",
        "modes",
        "nest_mode",
        "order",
        "priority",
        "selector",
        "shape",
        "spec",
        "tenant",
    )

    def __init__(
        self, spec: WorkloadSpec, order: int = 0, kept_to: Mapping[str, str] | None = None
    ) -> None:
        self.spec = spec
        self.key = f"{spec.tenant}/{spec.name}"
        self.tenant = spec.tenant
        self.priority = spec.priority
        # requests of one shape fit where each other fit: a retry that fails one skips its twins
        self.selector = tuple(sorted(spec.node_selector.items()))
        # the labels the operator keeps its tenant's work to (tenants.NAME.nodes)
        self.kept_to = tuple(sorted((kept_to or {}).items()))
        self.shape = _shape_id((spec.gpu, spec.sharing, spec.tenant, self.selector, self.kept_to))
        self.modes = sharing_modes(spec)
        # the kinds of GPU it can use: "mig" (a GPU in MIG mode), "plain" (one that is not)
        self.kinds = frozenset("mig" if m == "mig" else "plain" for m in self.modes)
        self.order = order  # submission order: ties in priority go first come, first served
        # the mode it would share a MIG instance under (None: it never shares one)
        self.nest_mode = nest_mode(spec)
        self._needs: dict[tuple[str, Mode, str | None], Need] = {}
        self._profiles: dict[str, str | None] = {}
        self._nests: dict[str, NestFit | None] = {}

    def missing_labels(self, node_labels: Mapping[str, str]) -> list[str]:
        """The ``spec.node_selector`` labels a node with ``node_labels`` lacks, as ``key=value``."""
        return [f"{k}={v}" for k, v in self.selector if node_labels.get(k) != v]

    def missing_kept(self, node_labels: Mapping[str, str]) -> list[str]:
        """The labels of its tenant's ``nodes`` setting a node with ``node_labels`` lacks."""
        return [f"{k}={v}" for k, v in self.kept_to if node_labels.get(k) != v]

    def admits(self, node_labels: Mapping[str, str]) -> bool:
        """Whether a node with ``node_labels`` has every label of ``spec.node_selector`` and of
        its tenant's ``nodes`` setting."""
        return all(node_labels.get(k) == v for k, v in (*self.selector, *self.kept_to))

    def need(self, model: GpuModel, mode: Mode, profile: str | None = None) -> Need:
        key = (model.key, mode, profile)
        found = self._needs.get(key)
        if found is None:
            found = self._needs[key] = need_on(self.spec, model, mode, profile)
        return found

    def mig_profile(self, model: GpuModel) -> str | None:
        if model.key not in self._profiles:
            self._profiles[model.key] = mig_profile_on(self.spec, model)
        return self._profiles[model.key]

    def mig_need(self, model: GpuModel) -> Need | None:
        """What it takes on a MIG GPU of ``model`` (None: no profile there holds it)."""
        profile = self.mig_profile(model)
        return None if profile is None else self.need(model, "mig", profile)

    def nest(self, model: GpuModel) -> NestFit | None:
        """What it takes inside a shared MIG instance of ``model`` (None: it never shares one
        there)."""
        if model.key not in self._nests:
            self._nests[model.key] = (
                None
                if self.nest_mode is None
                else nested_fit(self.spec, model, memory_of(self.spec, model))
            )
        return self._nests[model.key]

    def nest_need(self, model: GpuModel) -> Need | None:
        """``nest`` as a ``Need``: its memory, its share of the GPU and, under MPS, its percent of
        the instance's compute."""
        fit = self.nest(model)
        if fit is None:
            return None
        pct = fit.instance_pct if self.nest_mode == "mps" and fit.capped else None
        return Need(fit.memory_mib, fit.milli, pct)

    def with_spec(self, spec: WorkloadSpec) -> SchedRequest:
        """The same submission with a spec changed live (priority, QoS): needs stay valid."""
        out = SchedRequest(spec, self.order, dict(self.kept_to))
        out._needs, out._profiles, out._nests = self._needs, self._profiles, self._nests
        return out
