"""The MIG planner: table tests for its choices, Hypothesis properties for its guarantees."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrac.model.catalog import GpuModel, lookup_model
from gpufrac.model.gpu import MigInstanceState
from gpufrac.model.mig import MigPlacement, check_layout, format_layout
from gpufrac.model.migplan import MigPlan
from gpufrac.planning.demand import (
    DemandClass,
    parse_need_demand,
    parse_profile_demand,
    resolve_demand,
)
from gpufrac.planning.mig_planner import PlanGpu, PlanOptions, plan_mig
from gpufrac.planning.patterns import geometry, layout_for_counts

H200, H100, A100_40, A30 = (lookup_model(n) for n in ("h200", "h100", "a100-40gb", "a30"))


def fleet(*models: GpuModel) -> list[PlanGpu]:
    return [PlanGpu(f"GPU-{i}", i, m) for i, m in enumerate(models)]


def plan(gpus: list[PlanGpu], demand: str, **opts: object) -> MigPlan:
    classes = resolve_demand(
        parse_profile_demand(demand), {g.model.key: g.model for g in gpus}.values()
    )
    return plan_mig(gpus, classes, PlanOptions(**opts))  # type: ignore[arg-type]


def layouts(p: MigPlan) -> list[str]:
    return [format_layout(g.instances) for g in p.gpus]


def test_h200_geometry_counts() -> None:
    geo = geometry(H200)
    assert len(geo.layouts) == 2319 and len(geo.patterns) == 128


def test_small_instances_leave_room_for_large_ones() -> None:
    assert layouts(plan(fleet(H200), "1g.18gb=1")) == ["1g.18gb@6"]
    assert layouts(plan(fleet(H200), "1g.18gb=3,4g.71gb=1")) == [
        "4g.71gb@0,1g.18gb@4,1g.18gb@5,1g.18gb@6"
    ]
    # two 1g at 4 and 5 keep 0-3 for a 4g and 6-7 for a two-slot profile (at 5 and 6 they would not)
    assert layout_for_counts(H200, {"1g.18gb": 2}) == (
        MigPlacement(4, "1g.18gb"),
        MigPlacement(5, "1g.18gb"),
    )


def test_fewest_gpus() -> None:
    p = plan(fleet(*[H200] * 4), "1g.18gb=5,3g.71gb=2")
    assert p.summary["gpus_used"] == 2 and not p.unplaced
    p = plan(fleet(*[H200] * 4), "2g.35gb=2,3g.71gb=2")
    assert p.summary["gpus_used"] == 2  # 2g+2g+3g on one, 3g on the other


def test_mixed_fleet_prefers_the_cheapest_fitting_model() -> None:
    gpus = fleet(H200, H100)
    classes = resolve_demand(parse_need_demand("8GiB=2"), [H200, H100])
    p = plan_mig(gpus, classes)
    assert p.summary["gpus_used_by_model"] == {"H100-80GB": 1}
    pricey_h100 = plan_mig(gpus, classes, PlanOptions(cost={"H200-141GB": 1, "H100-80GB": 5}))
    assert pricey_h100.summary["gpus_used_by_model"] == {"H200-141GB": 1}


def test_unplaced_demand_says_why() -> None:
    p = plan(fleet(H200), "7g.141gb=2")
    assert [(u.label, u.count) for u in p.unplaced] == [("7g.141gb", 1)]
    assert "no room left" in p.unplaced[0].reason
    off = [PlanGpu("GPU-0", 0, H200, mig_enabled=False)]
    p = plan(off, "1g.18gb=1")
    assert "MIG mode is off" in p.unplaced[0].reason
    p = plan(off, "1g.18gb=1", allow_mode_change=True)
    assert [a.kind for a in p.actions] == ["enable_mig", "create_gi", "create_ci"]


def inst(profile: str, start: int, gi: int, busy: bool = False) -> MigInstanceState:
    return MigInstanceState(profile, start, gi, f"MIG-{gi}", busy, ci_ids=(0,))


def test_keeps_what_it_can_and_destroys_idle_surplus() -> None:
    gpus = [
        PlanGpu(
            "GPU-0", 0, H200, (inst("3g.71gb", 0, 1), inst("1g.18gb", 4, 2), inst("1g.18gb", 5, 3))
        )
    ]
    p = plan(gpus, "3g.71gb=1,1g.18gb=1,2g.35gb=0")
    assert [str(x) for x in p.gpus[0].kept] == ["3g.71gb@0", "1g.18gb@4"]
    assert [str(x) for x in p.gpus[0].destroyed] == ["1g.18gb@5"]
    assert [a.kind for a in p.actions] == ["destroy_ci", "destroy_gi"]


def test_busy_instances_stay_unless_drain() -> None:
    gpus = [PlanGpu("GPU-0", 0, H200, (inst("1g.18gb", 0, 1, busy=True),))]
    p = plan(gpus, "7g.141gb=1")
    assert p.summary["busy_destroyed"] == 0 and p.unplaced and "--drain" in p.unplaced[0].reason
    assert [str(x) for x in p.gpus[0].busy_kept] == ["1g.18gb@0"]
    drained = plan(gpus, "7g.141gb=1", drain=True)
    assert drained.summary["busy_destroyed"] == 1 and not drained.unplaced
    assert layouts(drained) == ["7g.141gb@0"]


def test_moves_idle_instances_only_when_it_must() -> None:
    # 1g at slot 0 blocks a 4g; moving it (idle) makes room, keeping the GPU
    gpus = [PlanGpu("GPU-0", 0, H200, (inst("1g.18gb", 0, 1),))]
    p = plan(gpus, "1g.18gb=1,4g.71gb=1")
    assert not p.unplaced
    assert layouts(p) == ["4g.71gb@0,1g.18gb@4"] or layouts(p)[0].startswith("4g.71gb@0")
    assert p.summary["destroyed"] == 1
    busy = [PlanGpu("GPU-0", 0, H200, (inst("1g.18gb", 0, 1, busy=True),))]
    assert plan(busy, "1g.18gb=1,4g.71gb=1").unplaced  # a busy one is never moved


def test_replanning_the_plan_changes_nothing() -> None:
    gpus = fleet(*[H200] * 3)
    first = plan(gpus, "1g.18gb=4,2g.35gb=3,3g.71gb=2")
    current = [
        PlanGpu(
            g.uuid,
            g.index,
            g.model,
            tuple(inst(x.profile, x.start, k + 1) for k, x in enumerate(pg.instances)),
        )
        for g, pg in zip(gpus, first.gpus, strict=True)
    ]
    again = plan(current, "1g.18gb=4,2g.35gb=3,3g.71gb=2")
    assert again.actions == () and again.summary["kept"] == first.summary["instances"]


# -- Hypothesis properties -------------------------------------------------------------------------

MODELS = [H200, H100, A100_40, A30]


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[PlanGpu], list[DemandClass], bool]:
    """A small fleet with random current layouts (some instances busy) and a random demand."""
    gpus = []
    for i in range(draw(st.integers(1, 5))):
        model = draw(st.sampled_from(MODELS))
        geo = geometry(model)
        lay = draw(st.sampled_from(geo.layouts)) if draw(st.booleans()) else geo.layouts[0]
        insts = tuple(
            MigInstanceState(p.profile, p.start, k + 1, None, draw(st.booleans()), ci_ids=(0,))
            for k, p in enumerate(lay.placements)
        )
        gpus.append(
            PlanGpu(f"GPU-{i}", i, model, insts, mig_enabled=draw(st.booleans()) or bool(insts))
        )
    names = sorted({p.name for g in gpus for p in g.model.profiles})
    picked = draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True))
    classes = [DemandClass(label=n, count=draw(st.integers(0, 6)), profile=n) for n in picked]
    return gpus, classes, draw(st.booleans())


@settings(max_examples=120)
@given(scenario())
def test_plans_are_valid_and_never_destroy_busy_instances_without_drain(
    case: tuple[list[PlanGpu], list[DemandClass], bool],
) -> None:
    gpus, classes, drain = case
    resolved = resolve_demand(classes, {g.model.key: g.model for g in gpus}.values())
    p = plan_mig(gpus, resolved, PlanOptions(drain=drain, allow_mode_change=True))
    by_uuid = {g.uuid: g for g in gpus}
    placed: Counter[str] = Counter()
    for pg in p.gpus:
        g = by_uuid[pg.uuid]
        assert check_layout(g.model, pg.instances) == [], format_layout(pg.instances)
        busy = {i.placement for i in g.instances if i.busy}
        if not drain:
            assert busy <= set(pg.instances), "a busy instance was destroyed without --drain"
        assert set(pg.destroyed) == {i.placement for i in g.instances} - set(pg.instances)
        placed.update(x.profile for x in pg.instances if x not in pg.busy_kept)
    if not drain:
        assert p.summary["busy_destroyed"] == 0
    # never more instances of a profile than asked for (busy ones nobody asked for aside)
    asked: Counter[str] = Counter()
    for c in resolved:
        for profile in set(c.options.values()):
            asked[profile] += c.count
    for profile, n in placed.items():
        assert n <= asked[profile], profile
    # what is unplaced is exactly the shortfall
    total = sum(c.count for c in resolved)
    assert p.summary["unplaced"] == total - sum(
        1 for pg in p.gpus for x in pg.instances if x not in pg.busy_kept
    )
