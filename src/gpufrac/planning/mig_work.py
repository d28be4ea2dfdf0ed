"""The planner's working state: GPUs being planned and the demand still to place."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from gpufrac.model.catalog import GpuModel
from gpufrac.model.gpu import MigInstanceState
from gpufrac.model.mig import MigPlacement
from gpufrac.planning.demand import ResolvedClass
from gpufrac.planning.patterns import Counts, Geometry

Weights = dict[tuple[str, int], float]  # (model key, profile index) -> price of one instance


@dataclass(frozen=True, slots=True)
class PlanGpu:
    """A GPU as the planner sees it."""

    uuid: str
    index: int
    model: GpuModel
    instances: tuple[MigInstanceState, ...] = ()
    mig_enabled: bool = True
    idle: bool = True  # no process outside MIG instances: its MIG mode could be switched
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class PlanOptions:
    cost: dict[str, float] | None = None  # model key -> cost of one GPU (default: its memory)
    drain: bool = False  # busy instances may be destroyed
    allow_mode_change: bool = False  # idle GPUs with MIG off may be used (MIG gets enabled)


@dataclass
class WorkGpu:
    gpu: PlanGpu
    geo: Geometry
    usable: bool
    pinned: list[MigPlacement] = field(default_factory=list)  # busy, not asked for, kept
    kept: dict[MigPlacement, int] = field(default_factory=dict)  # placement -> class served
    added: dict[MigPlacement, int] = field(default_factory=dict)
    fresh: bool = False  # filled in step 3 (its layout may still be rearranged)

    @property
    def key(self) -> str:
        return self.gpu.model.key

    def target(self) -> list[MigPlacement]:
        return sorted([*self.pinned, *self.kept, *self.added])

    def assignments(self) -> list[tuple[MigPlacement, int]]:
        return [*self.kept.items(), *self.added.items()]


class Remaining:
    """Remaining demand, and which classes each (model, profile) can serve, most valuable first."""

    def __init__(self, classes: list[ResolvedClass], geos: dict[str, Geometry]) -> None:
        self.classes = classes
        self.remaining = [c.count for c in classes]
        self.by_profile: dict[tuple[str, int], list[int]] = defaultdict(list)
        for ci, c in sorted(enumerate(classes), key=lambda x: -x[1].value):
            for key, profile in c.options.items():
                if key in geos:
                    self.by_profile[(key, geos[key].index(profile))].append(ci)

    def total(self) -> int:
        return sum(self.remaining)

    def serve(
        self, key: str, counts: Counts, weights: dict[tuple[str, int], float] | None = None
    ) -> tuple[float, list[tuple[int, int, int]]]:
        """Value of placing ``counts`` on a model-``key`` GPU, and (profile, class, n) taken.

        The value is the memory asked for, or with ``weights`` the share of the GPU each instance
        uses.
        """
        value: float = 0
        taken = []
        for q, n in enumerate(counts):
            if not n:
                continue
            for ci in self.by_profile.get((key, q), ()):
                avail = self.remaining[ci]
                if avail <= 0:
                    continue
                t = min(n, avail)
                value += t * (self.classes[ci].value if weights is None else weights[(key, q)])
                taken.append((q, ci, t))
                n -= t
                if not n:
                    break
        return value, taken

    def take(self, taken: list[tuple[int, int, int]], times: int = 1) -> None:
        for _, ci, t in taken:
            self.remaining[ci] -= t * times


def add_placements(
    w: WorkGpu,
    placements: tuple[MigPlacement, ...],
    fixed: tuple[MigPlacement, ...],
    need: Remaining,
) -> None:
    """Add ``placements`` beyond ``fixed`` to ``w``, each serving a class (extras dropped)."""
    new = [p for p in placements if p not in set(fixed)]
    for pl in sorted(new, key=lambda p: p.start):
        q = w.geo.index(pl.profile)
        for ci in need.by_profile.get((w.key, q), ()):
            if need.remaining[ci] > 0:
                need.remaining[ci] -= 1
                w.added[pl] = ci
                break


# -- 3. fill empty GPUs ----------------------------------------------------------------------------
