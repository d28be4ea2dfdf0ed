"""Every way one GPU of a model can be cut: all valid MIG layouts, grouped into patterns.

A *pattern* is a multiset of profiles (how many of each) that fits on one GPU; its *layout* is the
placement gpufrac uses for it, chosen to leave the free space most useful for large profiles (no 1g
at slot 0 while a 4g could still go there). On the H200, 2,319 valid layouts make 128 patterns, so
both are enumerated once per model and cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from gpufrac.model.catalog import GpuModel, MigProfile
from gpufrac.model.mig import MigPlacement

Counts = tuple[int, ...]  # instances per profile, in the model's profile order


@dataclass(frozen=True, slots=True)
class Layout:
    placements: tuple[MigPlacement, ...]
    counts: Counts
    free_score: tuple[
        int, ...
    ]  # what could still be added, large profiles first (higher is better)


@dataclass(frozen=True, slots=True)
class Geometry:
    """The enumerated geometry of one GPU model."""

    model: GpuModel
    layouts: tuple[Layout, ...]
    patterns: dict[Counts, Layout]  # every realizable multiset -> its best layout
    by_placement: dict[MigPlacement, int]  # placement -> bit set of layout indices containing it

    def index(self, profile: str) -> int:
        for i, p in enumerate(self.model.profiles):
            if p.name == profile:
                return i
        raise KeyError(profile)

    def counts_of(self, placements: tuple[MigPlacement, ...] | list[MigPlacement]) -> Counts:
        counts = [0] * len(self.model.profiles)
        for pl in placements:
            counts[self.index(pl.profile)] += 1
        return tuple(counts)

    def layouts_containing(self, fixed: tuple[MigPlacement, ...]) -> list[Layout]:
        """Every valid layout that keeps all of ``fixed`` where it is."""
        mask = (1 << len(self.layouts)) - 1
        for pl in fixed:
            mask &= self.by_placement.get(pl, 0)
            if not mask:
                return []
        out = []
        while mask:
            low = mask & -mask
            out.append(self.layouts[low.bit_length() - 1])
            mask ^= low
        return out


def _free_score(model: GpuModel, state: tuple[int, int, Counts, bool]) -> tuple[int, ...]:
    """For each profile, largest first: how many more of it alone would still fit."""
    mask, compute, counts, media = state
    score = []
    order = sorted(
        range(len(model.profiles)),
        key=lambda i: (-model.profiles[i].memory_slots, -model.profiles[i].compute_slices),
    )
    for i in order:
        prof = model.profiles[i]
        if prof.media_extensions and media:
            score.append(0)
            continue
        n, m, c = 0, mask, compute
        for start in prof.placement_starts:
            bits = ((1 << prof.memory_slots) - 1) << start
            if m & bits or c + prof.compute_slices > model.compute_slices:
                continue
            if counts[i] + n >= prof.max_instances or (prof.media_extensions and n >= 1):
                break
            m |= bits
            c += prof.compute_slices
            n += 1
        score.append(n)
    return tuple(score)


@cache
def geometry(model: GpuModel) -> Geometry:
    profiles: list[MigProfile] = list(model.profiles)
    options = [(i, p, s) for i, p in enumerate(profiles) for s in p.placement_starts]
    layouts: list[Layout] = []

    def grow(
        first: int, mask: int, compute: int, counts: list[int], media: bool, acc: list[MigPlacement]
    ) -> None:
        c = tuple(counts)
        layouts.append(Layout(tuple(sorted(acc)), c, _free_score(model, (mask, compute, c, media))))
        for j in range(first, len(options)):
            i, p, s = options[j]
            bits = ((1 << p.memory_slots) - 1) << s
            if mask & bits or compute + p.compute_slices > model.compute_slices:
                continue
            if counts[i] >= p.max_instances or (media and p.media_extensions):
                continue
            counts[i] += 1
            acc.append(MigPlacement(s, p.name))
            grow(
                j + 1,
                mask | bits,
                compute + p.compute_slices,
                counts,
                media or p.media_extensions,
                acc,
            )
            acc.pop()
            counts[i] -= 1

    grow(0, 0, 0, [0] * len(profiles), False, [])
    patterns: dict[Counts, Layout] = {}
    by_placement: dict[MigPlacement, int] = {}
    for idx, lay in enumerate(layouts):
        best = patterns.get(lay.counts)
        if best is None or _better(lay, best):
            patterns[lay.counts] = lay
        for pl in lay.placements:
            by_placement[pl] = by_placement.get(pl, 0) | (1 << idx)
    return Geometry(model, tuple(layouts), patterns, by_placement)


def _better(a: Layout, b: Layout) -> bool:
    """Prefer more room for large profiles, then instances packed towards high slots."""
    if a.free_score != b.free_score:
        return a.free_score > b.free_score
    return [-p.start for p in a.placements] < [-p.start for p in b.placements]


def layout_for_counts(model: GpuModel, counts: dict[str, int]) -> tuple[MigPlacement, ...] | None:
    """A placement for ``counts`` instances per profile on one GPU, or None if they cannot fit."""
    geo = geometry(model)
    vec = [0] * len(model.profiles)
    for name, n in counts.items():
        vec[geo.index(model.profile(name).name)] += n
    lay = geo.patterns.get(tuple(vec))
    return None if lay is None else lay.placements
