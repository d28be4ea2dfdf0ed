"""Warnings about what a request probably meant: a memory request that lands on a MIG slice far
larger than it asked for; a sharing mode that whole GPUs (count) do not use. (How a size is
written, in an old unit spelling or one whose meaning changed, is said where it is read:
``model.units``, ``model.manifest.read_objects``.) A warning changes nothing: the request is
placed as written, and `apply` prints why it may not be what the user wanted and what to write
instead.
"""

from __future__ import annotations

from gpufrac.model.catalog import MigProfile
from gpufrac.model.units import format_mib
from gpufrac.model.workload import WorkloadSpec

FIELD = "spec.resources.gpu.memory"
OVERSIZE = 1.5  # a MIG slice this many times the memory asked for is worth a word


def request_warnings(spec: WorkloadSpec, mig: MigProfile | None = None) -> list[str]:
    """What ``apply`` says about ``spec`` (placed on a MIG instance of profile ``mig``, if so)."""
    out: list[str] = []
    if spec.gpu.count is not None and spec.sharing in ("mps", "timeslice"):
        out.append(
            f"spec.sharing: count asks for {spec.gpu.count} whole GPU(s), which are not shared: "
            f"they are placed exclusive (sharing: {spec.sharing} does nothing here); write "
            "sharing: exclusive or leave it out, or ask for a share beside count (memory, "
            "fraction) to share them"
        )
    asked = spec.gpu.memory_mib
    if asked is None:
        return out
    if mig is None or mig.memory_mib is None or mig.memory_mib < OVERSIZE * asked:
        return out
    pct = spec.gpu.compute_pct
    if pct is not None and spec.sharing == "auto":
        # a MIG instance has whole compute slices: a 30% cap takes 3 of an H200's 7, and their
        # memory with them
        out.append(
            f"{FIELD}: {asked:,} MiB with a {pct}% compute cap takes a MIG {mig.name} "
            f"({format_mib(mig.memory_mib)}, {mig.memory_mib / asked:.1f}x the memory asked): "
            f"sharing: auto takes a MIG instance first, and {mig.name} is the smallest with "
            f"that memory and {pct}% of the compute; for a {pct}% cap on a shared GPU (MPS, as "
            "HAMi's gpucores is) set sharing: mps"
        )
    else:
        out.append(
            f"{FIELD}: {asked:,} MiB takes a MIG {mig.name} ({format_mib(mig.memory_mib)}), "
            f"{mig.memory_mib / asked:.1f}x what was asked; a profile's size (like the 18gb of "
            "1g.18gb) is the slice, not a memory request: ask for a little less memory, "
            "or name the "
            "profile with mig:"
        )
    return out
