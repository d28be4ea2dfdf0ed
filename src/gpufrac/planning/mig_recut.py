"""Re-cutting one MIG GPU for a waiting request: the fewest instances destroyed to make room. Pure.

A MIG GPU's layout was cut for earlier demand. When a request waits for a profile that no free
instance offers and no free space can take, some of the GPU's instances may be in the way while
nothing runs on them. ``best_recut`` looks through the model's enumerated layouts
(``planning.patterns``, the MIG planner's own geometry) for the one that keeps every instance that
must stay where it is, adds the profile asked for, and keeps as many of the other instances as it
can: so the idle instances destroyed are only those in the way, and a busy instance is destroyed
only when the caller says its owner may be evicted (``mig_reconfigure: drain``, lower priority), and
then as few as possible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from gpufrac.model.catalog import GpuModel
from gpufrac.model.mig import MigPlacement
from gpufrac.planning.patterns import geometry


@dataclass(frozen=True, slots=True)
class Recut:
    """Destroy ``destroy`` (idle instances, and the instances of ``evict``'s owners), then create
    ``create``."""

    create: MigPlacement
    destroy: tuple[MigPlacement, ...]
    evict: tuple[str, ...] = ()


def best_recut(
    model: GpuModel,
    instances: Mapping[MigPlacement, str | None],
    profile: str,
    evictable: frozenset[str] = frozenset(),
) -> Recut | None:
    """The cheapest way to fit one instance of ``profile`` by destroying instances of this GPU: idle
    ones (owner ``None``) and those owned by a workload in ``evictable``. Cheapest: fewest
    evictions, then the fewest memory slots destroyed, then the fewest instances destroyed, then the
    most room left for large profiles. None if no such way exists, or if the profile fits without
    destroying anything (that is an addition, not a re-cut).

    Slots count before instances: one large idle instance destroyed is harder to get back (its whole
    span must be idle at once) than two small ones."""
    fixed = tuple(sorted(pl for pl, o in instances.items() if o is not None and o not in evictable))
    loose = tuple(
        sorted((pl, o or "") for pl, o in instances.items() if o is None or o in evictable)
    )
    if not loose:
        return None
    return _best(model, fixed, loose, profile)


@lru_cache(maxsize=4096)
def _best(
    model: GpuModel,
    fixed: tuple[MigPlacement, ...],
    loose: tuple[tuple[MigPlacement, str], ...],
    profile: str,
) -> Recut | None:
    geo = geometry(model)
    if not model.has_profile(profile):
        return None
    prof = model.profile(profile)
    owner = dict(loose)
    slots = {p.name: p.memory_slots for p in model.profiles}
    best: tuple[tuple[int, ...], Recut] | None = None
    for start in prof.placement_starts:
        new = MigPlacement(start, prof.name)
        if new in owner or new in fixed:  # that very instance exists: not a place for a new one
            continue
        allowed = {*fixed, new, *owner}
        for lay in geo.layouts_containing((*fixed, new)):
            if not all(pl in allowed for pl in lay.placements):
                continue
            kept = set(lay.placements)
            gone = tuple(pl for pl in owner if pl not in kept)
            if not gone:
                return None  # it fits beside everything: an addition, not a re-cut
            evicted = tuple(sorted({owner[pl] for pl in gone if owner[pl]}))
            # then: the most room left for large profiles (the planner's free score), as placed
            room = tuple(-x for x in lay.free_score)
            cost = (len(evicted), sum(slots[pl.profile] for pl in gone), len(gone), *room, start)
            if best is None or cost < best[0]:
                best = (cost, Recut(new, gone, evicted))
    return None if best is None else best[1]
