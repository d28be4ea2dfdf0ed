"""Warnings about what a request probably meant: sizes in decimal units where binary ones were
likely meant, and a memory request that lands on a MIG slice far larger than it asked for.

A warning changes nothing: the request is placed as written, and `apply` prints why it may not be
what the user wanted and what to write instead.
"""

from __future__ import annotations

from gpufrac.model.catalog import MigProfile
from gpufrac.model.units import format_mib
from gpufrac.model.workload import WorkloadSpec

FIELD = "spec.resources.gpu.memory"
OVERSIZE = 1.5  # a MIG slice this many times the memory asked for is worth a word


def decimal_gb(mib: int) -> int | None:
    """N where ``mib`` is what ``NGB`` (N x 10^9 bytes) becomes, and not a whole number of GiB."""
    if mib % 1024 == 0:
        return None
    gb = mib * 2**20 / 1e9
    n = round(gb)
    # NGB is rounded up to whole MiB when read: anything within one MiB of it
    return n if n >= 1 and abs(mib - n * 1e9 / 2**20) < 1 else None


def request_warnings(spec: WorkloadSpec, mig: MigProfile | None = None) -> list[str]:
    """What ``apply`` says about ``spec`` (placed on a MIG instance of profile ``mig``, if so)."""
    out: list[str] = []
    asked = spec.gpu.memory_mib
    if asked is None:
        return out
    n = decimal_gb(asked)
    if n is not None:
        out.append(
            f"{FIELD}: {n}GB is decimal ({n} x 10^9 bytes = {asked:,} MiB), not {n}GiB "
            f"({n * 1024:,} MiB); write {n}GiB if you meant binary gigabytes"
        )
    if mig is not None and mig.memory_mib is not None and mig.memory_mib >= OVERSIZE * asked:
        out.append(
            f"{FIELD}: {asked:,} MiB takes a MIG {mig.name} ({format_mib(mig.memory_mib)}), "
            f"{mig.memory_mib / asked:.1f}x what was asked; a profile's size (like the 18gb of "
            "1g.18gb) is the slice, not a memory request: ask for a little less memory, "
            "or name the "
            "profile with mig:"
        )
    return out
