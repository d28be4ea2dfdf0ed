"""Sharing inside a MIG instance: which requests may share one instance with others (by MPS or by
time-slices), what each takes of it, and the rule for when to share one rather than take a whole
instance. Pure.

A shared ("nested") instance is a device of its own: its memory and compute are accounted per
workload as on a GPU shared by MPS or time-slices (memory adds up to at most the instance's,
shares to at most its share of the GPU, MPS compute to at most 100 % of the instance), and its
hardware isolation from its neighbours stays.

The rule (``should_nest``): a request shares an instance when its need is at most half the
smallest profile that fits it (memory, and compute where asked), and either a shared instance of
that GPU model already has room for it, or a new one would serve at least two waiting needs (this
one and another that waits for the same profile and mode); otherwise it takes a whole instance
(a request that asked for ``mps`` or ``timeslice`` by name: a new instance under that mode, opened
for it alone, that later ones may join: the scheduler's last step).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufrac.model.catalog import GpuModel
from gpufrac.model.workload import MILLI, Mode, WorkloadSpec
from gpufrac.planning.demand import smallest_fitting

MPS_CLIENTS_PER_GPU = 48
"""NVIDIA's MIG user guide: MPS runs on top of MIG, with the most clients (48 per GPU) lowered in
proportion to the compute instance's size."""


@dataclass(frozen=True, slots=True)
class NestFit:
    """What a request takes inside a shared instance of ``profile`` on one GPU model."""

    profile: str
    memory_mib: int  # of the instance's memory
    milli: int  # share of the whole GPU (quotas; capacity within the instance's share)
    instance_pct: int  # percent of the instance's compute (its MPS active-thread percentage)
    capped: bool  # it asked for a compute cap (MPS gets an active-thread percentage)
    half: bool  # at most half the profile: the rule's first condition


def nest_mode(spec: WorkloadSpec) -> Mode | None:
    """The mode ``spec`` would share an instance under: ``mps`` or ``timeslice`` as it asks, or for
    ``auto`` MPS where it asks for a compute cap, else time-slices (as on a whole GPU). None for
    what never shares an instance: whole GPUs, a named profile, a fraction of a GPU, a share of
    several GPUs, ``sharing: mig`` (an instance of its own) or ``exclusive``."""
    req = spec.gpu
    if req.count is not None or req.mig_profile is not None or req.fraction_milli is not None:
        return None
    if req.devices > 1:
        return None
    if req.memory_mib is None and req.memory_pct is None:
        return None  # a compute cap alone takes the whole memory: nothing to share
    match spec.sharing:
        case "auto":
            return "mps" if req.compute_pct is not None else "timeslice"
        case "mps" | "timeslice":
            return spec.sharing
        case "mig" | "exclusive":
            return None


def nested_fit(spec: WorkloadSpec, model: GpuModel, memory_mib: int) -> NestFit | None:
    """What ``spec`` (needing ``memory_mib``) takes inside the smallest profile of ``model`` that
    fits it; None where no profile fits it or it never shares an instance."""
    if nest_mode(spec) is None:
        return None
    pct = spec.gpu.compute_pct
    slices = None if pct is None else -(-pct * model.compute_slices // 100)
    prof = smallest_fitting(model, memory_mib, slices)
    if prof is None:
        return None
    inst_mib = instance_memory(model, prof.name)
    inst_milli = instance_milli(model, prof.name)
    if pct is None:
        share = memory_mib * MILLI // model.memory_total_mib
        inst_pct = 100
    else:
        share = min(inst_milli, pct * 10)
        inst_pct = min(100, -(-pct * model.compute_slices // prof.compute_slices))
    half = 2 * memory_mib <= inst_mib and (pct is None or 2 * inst_pct <= 100)
    return NestFit(prof.name, memory_mib, share, inst_pct, pct is not None, half)


def instance_memory(model: GpuModel, profile: str) -> int:
    """The memory of one instance of ``profile`` (MiB)."""
    prof = model.profile(profile)
    return prof.memory_mib or model.memory_total_mib * prof.memory_slots // max(
        1, model.memory_slots
    )


def instance_milli(model: GpuModel, profile: str) -> int:
    """An instance's share of the GPU: its compute slices over the GPU's, in milli-GPU."""
    prof = model.profile(profile)
    return -(-prof.compute_slices * MILLI // max(1, model.compute_slices))


def mps_clients(model: GpuModel, profile: str) -> int:
    """The most MPS clients one instance of ``profile`` takes (at least one)."""
    prof = model.profile(profile)
    return max(1, MPS_CLIENTS_PER_GPU * prof.compute_slices // max(1, model.compute_slices))


def should_nest(fit: NestFit, *, room: bool, waiting: int) -> bool:
    """The rule: share an instance when the need is at most half the smallest profile that fits
    it and a shared instance of that model has ``room`` for it, or a new one would serve at least
    two ``waiting`` needs (this one included)."""
    return fit.half and (room or waiting >= 2)
