"""MIG demand: instances asked for by profile (``1g.18gb=5``) or by need (``20GiB=6``,
``60GiB/3c=2``).

A demand class is resolved against the GPU models of a fleet into the one profile it takes on each
model: the named profile, or for a need the smallest profile that fits it (fewest memory slots, then
fewest compute slices, then least memory; never a ``+me`` profile unless named).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpufrac.errors import InputError
from gpufrac.model.catalog import GpuModel, MigProfile, lookup_model
from gpufrac.model.mig import parse_profile_name
from gpufrac.model.numbers import digits_note, is_digits
from gpufrac.model.units import read_size

__all__ = [
    "DemandClass",
    "ResolvedClass",
    "parse_need_demand",
    "parse_profile_demand",
    "read_size",
    "resolve_demand",
]


@dataclass(frozen=True, slots=True)
class DemandClass:
    """Some number of identical instance requests."""

    label: str
    count: int
    profile: str | None = None  # by profile
    model: str | None = None  # by profile, on this model only (catalog key)
    memory_mib: int | None = None  # by need
    compute_slices: int | None = None  # by need, optional
    warning: str | None = None  # how the need's size is written (an old unit spelling)


@dataclass(frozen=True, slots=True)
class ResolvedClass:
    """A demand class with the profile it takes on each GPU model of the fleet."""

    label: str
    count: int
    value: int  # what placing one instance is worth: the memory it asks for, in MiB
    options: dict[str, str]  # model key -> profile name


def _split_items(text: str, field: str) -> list[tuple[str, int]]:
    items = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, count = part.rpartition("=")
        if not sep or not key.strip():
            raise InputError(
                f"{part!r} has no count", field=field, fix="write each item as WHAT=COUNT"
            )
        digits = count.strip()
        if digits.startswith("-") and is_digits(digits[1:]):
            raise InputError(
                f"negative count in {part!r}", field=field, fix="counts are whole numbers >= 0"
            )
        if not is_digits(digits):  # ASCII only: int() also reads '١٢' and '1_2'
            raise InputError(
                f"count {count!r} in {part!r} is not a whole number{digits_note(count)}",
                field=field,
                fix="write each item as WHAT=COUNT, the count in digits 0-9",
            )
        items.append((key.strip(), int(digits)))
    if not items:
        raise InputError("nothing asked for", field=field, fix="write WHAT=COUNT,...")
    return items


def parse_profile_demand(text: str, *, field: str = "--demand") -> list[DemandClass]:
    """``1g.18gb=5,3g.71gb=2``; a profile may name its model: ``a100-40gb:1g.10gb=3``."""
    classes = []
    for key, n in _split_items(text, field):
        model, sep, profile = key.rpartition(":")
        model_key = None
        if sep:
            try:
                model_key = lookup_model(model).key
            except InputError as e:
                raise e.at(field) from None
        name = parse_profile_name(profile, field=field)
        if name.compute_instance_slices is not None:
            raise InputError(
                f"{profile!r} is a compute-instance profile",
                field=field,
                fix=f"ask for the GPU instance {name.gpu_instance_name}",
            )
        classes.append(DemandClass(label=key, count=n, profile=str(name), model=model_key))
    return classes


def parse_need_demand(text: str, *, field: str = "--need") -> list[DemandClass]:
    """``20GiB=6,60GiB=2``; a compute need as ``60GiB/3c=2``."""
    classes = []
    for key, n in _split_items(text, field):
        size, sep, compute = key.partition("/")
        slices = None
        if sep:
            c = compute.strip().lower().removesuffix("c")
            if not is_digits(c) or int(c) < 1:
                raise InputError(
                    f"{compute!r} is not a compute need{digits_note(compute)}",
                    field=field,
                    fix="write it like 60GiB/3c",
                )
            slices = int(c)
        read = read_size(size, field=field)
        classes.append(
            DemandClass(
                label=key,
                count=n,
                memory_mib=read.mib,
                compute_slices=slices,
                warning=None if read.warning is None else f"{field}: {read.warning}",
            )
        )
    return classes


def smallest_fitting(
    model: GpuModel, memory_mib: int, compute_slices: int | None
) -> MigProfile | None:
    fits = [
        p
        for p in model.profiles
        if not p.media_extensions
        and _profile_memory(model, p) >= memory_mib
        and p.compute_slices >= (compute_slices or 1)
    ]
    if not fits:
        return None
    return min(fits, key=lambda p: (p.memory_slots, p.compute_slices, _profile_memory(model, p)))


def _profile_memory(model: GpuModel, p: MigProfile) -> int:
    """A profile's memory; where unknown (unverified models), its share of the GPU's memory."""
    if p.memory_mib is not None:
        return p.memory_mib
    return model.memory_total_mib * p.memory_slots // max(1, model.memory_slots)


def resolve_demand(
    classes: Iterable[DemandClass], models: Iterable[GpuModel], *, field: str = "--demand"
) -> list[ResolvedClass]:
    """Map each class to its profile on each model; a class no model can take is an InputError."""
    fleet = {m.key: m for m in models}
    resolved = []
    for c in classes:
        options: dict[str, str] = {}
        value = 0
        for key, model in fleet.items():
            if c.profile is not None:
                if (c.model is None or c.model == key) and model.has_profile(c.profile):
                    prof = model.profile(c.profile)
                    options[key] = prof.name
                    value = max(value, _profile_memory(model, prof))
            else:
                assert c.memory_mib is not None
                fit = smallest_fitting(model, c.memory_mib, c.compute_slices)
                if fit is not None:
                    options[key] = fit.name
                value = c.memory_mib
        if not options:
            if c.profile is not None:
                where = c.model or ", ".join(fleet) or "the fleet"
                have = "; ".join(
                    f"{k}: {', '.join(p.name for p in m.profiles)}" for k, m in fleet.items()
                )
                raise InputError(
                    f"no GPU in the fleet has profile {c.profile} (looked on {where})",
                    field=field,
                    fix=f"use a profile of the fleet's models ({have})",
                )
            largest = "; ".join(
                f"{k}: {max(m.profiles, key=lambda p: _profile_memory(m, p)).name}"
                for k, m in fleet.items()
                if m.profiles
            )
            raise InputError(
                f"{c.label} fits no MIG profile of the fleet's GPUs",
                field=field,
                fix=f"ask for less; the largest profiles are {largest or 'none'}",
            )
        if c.count > 0:
            resolved.append(ResolvedClass(c.label, c.count, value, options))
    return resolved
