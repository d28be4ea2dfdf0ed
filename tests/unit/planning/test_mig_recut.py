"""Re-cutting a MIG GPU for a waiting request (``mig_recut``), the scheduler's use of it under each
``mig_reconfigure`` setting, and trial changes that roll back (``Statement``)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrac.model.catalog import lookup_model
from gpufrac.model.mig import MigPlacement, check_layout, parse_layout
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning import scheduler
from gpufrac.planning.mig_recut import best_recut
from gpufrac.planning.patterns import geometry
from gpufrac.planning.sched_state import CORDONED, Allocation, ClusterState, SchedGpu
from gpufrac.planning.scheduler import Scheduler

H200 = lookup_model("h200")


def layout(text: str) -> list[MigPlacement]:
    return list(parse_layout(text))


def test_two_idle_small_instances_make_room_for_a_whole_gpu() -> None:
    got = best_recut(H200, {p: None for p in layout("1g.18gb@4,1g.18gb@6")}, "7g.141gb")
    assert got is not None and str(got.create) == "7g.141gb@0"
    assert sorted(map(str, got.destroy)) == ["1g.18gb@4", "1g.18gb@6"] and got.evict == ()


def test_only_the_idle_instances_in_the_way_go() -> None:
    # a busy 1g at 0 stays; of the idle 1g at 4, 5 and 6, a 2g needs only the two at 4 and 5 ... or
    # the slots 2-3 are free already: then it is an addition, not a re-cut
    instances: dict[MigPlacement, str | None] = {
        MigPlacement(0, "1g.18gb"): "a/busy",
        MigPlacement(2, "1g.18gb"): None,
        MigPlacement(3, "1g.18gb"): None,
        MigPlacement(4, "1g.18gb"): None,
        MigPlacement(5, "1g.18gb"): None,
        MigPlacement(6, "1g.18gb"): None,
        MigPlacement(1, "1g.18gb"): None,
    }
    got = best_recut(H200, instances, "2g.35gb")
    assert got is not None and len(got.destroy) == 2
    kept = {p for p in instances if p not in got.destroy}
    assert MigPlacement(0, "1g.18gb") in kept
    assert not check_layout(H200, tuple(sorted({*kept, got.create})))


def test_no_recut_when_it_fits_beside_or_when_only_busy_instances_are_in_the_way() -> None:
    assert best_recut(H200, {MigPlacement(6, "1g.18gb"): None}, "3g.71gb") is None  # an addition
    busy: dict[MigPlacement, str | None] = {MigPlacement(0, "4g.71gb"): "a/x"}
    assert best_recut(H200, busy, "7g.141gb") is None
    got = best_recut(H200, busy, "7g.141gb", frozenset({"a/x"}))  # drain: x may be evicted
    assert got is not None and got.evict == ("a/x",)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_recut_is_valid_keeps_every_busy_instance_and_destroys_no_more_than_needed(
    data: st.DataObject,
) -> None:
    geo = geometry(H200)
    lay = data.draw(st.sampled_from(geo.layouts))
    owners = {
        pl: (f"a/w{i}" if data.draw(st.booleans()) else None) for i, pl in enumerate(lay.placements)
    }
    profile = data.draw(st.sampled_from([p.name for p in H200.profiles]))
    got = best_recut(H200, owners, profile)
    if got is None:
        return
    assert all(owners[p] is None for p in got.destroy)  # never a busy one
    kept = [p for p in owners if p not in got.destroy]
    assert not check_layout(H200, tuple(sorted([*kept, got.create])))
    for p in got.destroy:  # keeping any destroyed one as well would not fit: none went for nothing
        assert check_layout(H200, tuple(sorted([*kept, p, got.create])))


def w(name: str, priority: int = 50, **gpu: object) -> WorkloadSpec:
    return WorkloadSpec(name=name, gpu=GpuRequest(**gpu), command=("true",), priority=priority)  # type: ignore[arg-type]


def mig_fleet() -> list[SchedGpu]:
    return [SchedGpu("GPU-0", 0, H200, mig=True)]


def fill_with_ones(s: Scheduler) -> None:
    for i in range(7):
        assert s.submit(w(f"s{i}", mig_profile="1g.18gb"))[0].outcome == "placed"


def test_idle_recuts_around_busy_instances_and_never_recuts_nothing() -> None:
    s = Scheduler(mig_fleet(), OperatorSettings(mig_reconfigure="idle"))
    fill_with_ones(s)
    g = s.state.gpus[0]
    for pl, owner in sorted(g.instances.items()):  # the ones on slots 4-6 finish
        if pl.start >= 4 and owner is not None:
            s.delete(*owner.split("/"))
    d = s.submit(w("mid", mig_profile="3g.71gb"))[0]
    assert d.outcome == "placed" and str(d.mig) == "3g.71gb@4"
    destroyed = sorted(str(a.mig) for a in d.actions if a.kind == "destroy_mig_instance")
    assert destroyed == ["1g.18gb@4", "1g.18gb@5", "1g.18gb@6"]
    assert [a.kind for a in d.actions][-2:] == ["create_mig_instance", "start"]
    assert sum(1 for o in g.instances.values() if o is not None) == 5  # four busy ones, and mid
    assert s.state.violations(False, {}) == []
    # slots 0-3 are busy: a second 3g has nowhere to go, and waits with a reason
    assert "re-cut" in s.submit(w("mid2", mig_profile="3g.71gb"))[0].reason

    static = Scheduler(mig_fleet(), OperatorSettings(mig_reconfigure="never"))
    d = static.submit(w("x", mig_profile="1g.18gb"))[0]  # static: only instances that exist
    assert d.outcome == "pending" and "mig_reconfigure is never" in d.reason


def test_a_pinned_gpu_uses_only_the_instances_it_has() -> None:
    gpu = SchedGpu("GPU-0", 0, H200, mig=True, pinned=True)
    gpu.instances = {MigPlacement(0, "4g.71gb"): None}
    s = Scheduler([gpu])
    assert s.submit(w("a", mig_profile="1g.18gb"))[0].outcome == "pending"  # no create
    assert s.submit(w("b", mig_profile="7g.141gb"))[0].outcome == "pending"  # no re-cut
    assert s.submit(w("c", mig_profile="4g.71gb"))[0].outcome == "placed"
    decided = s.set_pinned("GPU-0", False)  # released: the waiting ones get a cut
    assert [d.workload for d in decided if d.outcome == "placed"] == ["default/a"]


def test_preemption_on_mig_takes_another_profile_only_with_drain() -> None:
    for setting in ("idle", "drain"):
        s = Scheduler(mig_fleet(), OperatorSettings(mig_reconfigure=setting))  # type: ignore[arg-type]
        fill_with_ones(s)
        d = s.submit(w("urgent", priority=100, mig_profile="3g.71gb"))[0]
        if setting == "idle":
            assert d.outcome == "pending"
            continue
        assert d.outcome == "placed" and len(d.evicted) == 3
        kinds = [a.kind for a in d.actions]
        assert kinds == ["evict"] * 3 + ["destroy_mig_instance"] * 3 + [
            "create_mig_instance",
            "start",
        ]
        assert all(a.reason.startswith("preempted by default/urgent") for a in d.actions[:3])
        assert s.state.violations(False, {}) == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.sampled_from([0, 1])), max_size=12))
def test_a_statement_rolled_back_leaves_the_state_as_it_was(
    ops: list[tuple[bool, int, int]],
) -> None:
    gpus = [SchedGpu("GPU-0", 0, H200, mig=True), SchedGpu("GPU-1", 1, H200, mig=False)]
    state = ClusterState(gpus)
    state.allocate(
        [Allocation("a/base", "a", 50, 1, "timeslice", 4096, 30)],
    )
    state.allocate(
        [Allocation("a/m", "a", 50, 0, "mig", 16384, 143, None, MigPlacement(6, "1g.18gb"))],
        create=((0, MigPlacement(6, "1g.18gb")),),
    )

    def snapshot() -> tuple[object, ...]:
        return (
            {k: list(v) for k, v in state.allocs.items()},
            [dict(g.instances) for g in gpus],
            [(g.mode, g.mem_used, g.milli_used) for g in gpus],
            dict(state.tenant_mem),
            {k: sorted(v) for k, v in state.free_instances.items() if v},
            {k: sorted(v) for k, v in state.addable.items() if v},
            {k: list(v) for k, v in state.shared.items() if v},
        )

    before = snapshot()
    with state.statement() as trial:
        for i, (release, slot, gpu) in enumerate(ops):
            if release and state.allocs:
                trial.release(sorted(state.allocs)[0])
            elif gpu == 0:
                pl = MigPlacement(slot, "1g.18gb")
                if pl in gpus[0].instances or check_layout(
                    H200, tuple(sorted({*gpus[0].instances, pl}))
                ):
                    continue
                alloc = Allocation(f"a/x{i}", "a", 10, 0, "mig", 16384, 143, None, pl)
                trial.allocate([alloc], create=((0, pl),))
            elif gpus[1].free_mib > 8192:
                trial.allocate([Allocation(f"a/y{i}", "a", 10, 1, "timeslice", 8192, 60)])
        trial.rollback()
    assert snapshot() == before
    assert state.violations(False, {}) == []


def test_a_restore_that_does_not_fit_leaves_no_trace() -> None:
    from gpufrac.planning.sched_decision import Decision
    from gpufrac.planning.sched_state import EXTERNAL

    gpu = SchedGpu("GPU-0", 0, H200, mig=True)
    gpu.instances = {MigPlacement(0, "3g.71gb"): EXTERNAL}
    s = Scheduler([gpu])
    s.state.set_closed(gpu, CORDONED)  # the filters refuse it after the claim
    recorded = Decision(
        "default/x", "placed", mode="mig", gpus=("GPU-0",), mig=MigPlacement(0, "3g.71gb")
    )
    s.restore(w("x", mig_profile="3g.71gb"), recorded)
    assert "default/x" in s.pending
    assert gpu.instances == {MigPlacement(0, "3g.71gb"): EXTERNAL}  # the claim was rolled back


def test_a_request_needs_are_worked_out_once() -> None:
    from gpufrac.planning import sched_request

    calls = 0
    real = sched_request.need_on

    def counting(*args: object, **kw: object) -> object:
        nonlocal calls
        calls += 1
        return real(*args, **kw)  # type: ignore[arg-type]

    sched_request.need_on = counting  # type: ignore[assignment]
    try:
        s = Scheduler([SchedGpu(f"GPU-{i}", i, H200, mig=False) for i in range(8)])
        for i in range(8):
            s.submit(dataclasses.replace(w(f"f{i}", memory_mib=60_000), sharing="timeslice"))
    finally:
        sched_request.need_on = real
    assert calls <= 8 * 2  # per submission: once for its refusal check, once for placing


def test_a_large_idle_instance_is_the_last_to_be_cut_up() -> None:
    # one idle 7g on a GPU, or two idle 1g on another: a 2g request cuts the small ones
    big: dict[MigPlacement, str | None] = {MigPlacement(0, "7g.141gb"): None}
    small: dict[MigPlacement, str | None] = {
        **{MigPlacement(i, "1g.18gb"): f"a/b{i}" for i in range(4)},
        MigPlacement(4, "1g.18gb"): None,
        MigPlacement(5, "1g.18gb"): None,
        MigPlacement(6, "1g.18gb"): "a/b6",
    }
    g_big, g_small = SchedGpu("GPU-0", 0, H200, mig=True), SchedGpu("GPU-1", 1, H200, mig=True)
    g_big.instances, g_small.instances = big, small
    s = Scheduler([g_big, g_small])
    d = s.submit(w("mid", mig_profile="2g.35gb"))[0]
    assert d.gpus == ("GPU-1",) and [
        str(a.mig) for a in d.actions if a.kind == "destroy_mig_instance"
    ] == [
        "1g.18gb@4",
        "1g.18gb@5",
    ]


def test_a_busy_instance_of_the_profile_asked_for_does_not_hide_the_other_places() -> None:
    # a busy 3g at 4, idle 1g at 0-3: a second 3g goes at 0, the four 1g destroyed
    owners: dict[MigPlacement, str | None] = {
        MigPlacement(4, "3g.71gb"): "b/busy",
        **{MigPlacement(i, "1g.18gb"): None for i in range(4)},
    }
    got = best_recut(H200, owners, "3g.71gb")
    assert got is not None and str(got.create) == "3g.71gb@0" and len(got.destroy) == 4


def test_one_tenants_waiting_request_never_holds_another_tenant_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheduler, "RECUT_BYPASS", 1)
    s = Scheduler(mig_fleet())
    fill_with_ones(s)
    for i in (2, 3, 4, 5, 6):  # slots 2-6 go idle
        owner = s.state.gpus[0].instances[MigPlacement(i, "1g.18gb")]
        assert owner is not None
        s.delete(*owner.split("/"))

    def spec(name: str, profile: str, tenant: str) -> WorkloadSpec:
        return WorkloadSpec(
            name=name, gpu=GpuRequest(mig_profile=profile), command=("x",), tenant=tenant
        )

    assert s.submit(spec("big", "7g.141gb", "alpha"))[0].outcome == "pending"  # the whole GPU
    d = s.submit(spec("mid", "3g.71gb", "bravo"))[0]
    assert d.outcome == "placed" and str(d.mig) == "3g.71gb@4"  # a re-cut, though alpha waits
    assert s._passed.get("alpha/big", 0) == 0  # another tenant's re-cut does not count for it
    # alpha's own later request may go ahead of it by a re-cut, RECUT_BYPASS times (backfill) ...
    d = s.submit(spec("mid2", "2g.35gb", "alpha"))[0]
    assert d.outcome == "placed" and str(d.mig) == "2g.35gb@2"
    for pl in (MigPlacement(0, "1g.18gb"), MigPlacement(1, "1g.18gb")):  # room for another 2g
        owner = s.state.gpus[0].instances[pl]
        assert owner is not None
        s.delete(*owner.split("/"))
    # ... then re-cuts serve alpha in order: the next does not cut away alpha's room
    d = s.submit(spec("mid3", "2g.35gb", "alpha"))[0]
    assert d.outcome == "pending" and "an earlier MIG request of tenant alpha waits" in d.reason
    s.delete("alpha", "big")  # once it no longer waits, the re-cut goes through
    d = s.retry_pending()[0]
    assert d.workload == "alpha/mid3" and d.outcome == "placed" and str(d.mig) == "2g.35gb@0"


def test_a_held_request_gets_a_gpu_kept_for_it_until_it_is_placed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheduler, "RECUT_BYPASS", 1)
    s = Scheduler([SchedGpu(f"GPU-{i}", i, H200, mig=True) for i in range(2)])
    for i in range(14):  # both GPUs cut into seven busy 1g
        assert s.submit(w(f"s{i}", mig_profile="1g.18gb"))[0].outcome == "placed"

    def owner(gpu: int, start: int) -> str:
        o = s.state.gpus[gpu].instances[MigPlacement(start, "1g.18gb")]
        assert o is not None
        return o

    assert s.submit(w("big", mig_profile="7g.141gb"))[0].outcome == "pending"
    for start in (0, 1):
        s.delete(*owner(1, start).split("/"))
    d = s.submit(w("mid", mig_profile="2g.35gb"))[0]  # goes ahead of big by a re-cut: big is held
    assert d.outcome == "placed" and d.gpus == ("GPU-1",)
    s.delete(*owner(0, 6).split("/"))  # big is tried again, fails, and a GPU is kept for it
    assert s.pending.get("default/big") is not None
    kept = s._reserved["default/big"]
    assert kept == 0  # six busy instances on each; GPU 0's hold fewer memory slots
    # a later request takes nothing on the kept GPU, though a free 1g is there
    d = s.submit(w("small", mig_profile="1g.18gb"))[0]
    assert d.outcome == "pending" and "kept for a MIG request waiting before it" in d.reason
    # nor is another tenant's (one tenant's waiting request never holds another's back)
    other = WorkloadSpec(
        name="o", gpu=GpuRequest(mig_profile="1g.18gb"), command=("x",), tenant="other"
    )
    d = s.submit(other)[0]
    assert d.outcome == "placed" and d.gpus == ("GPU-0",)
    s.delete("other", "o")
    # a request that outranks big is not held back by it
    d = s.submit(w("urgent", priority=90, mig_profile="1g.18gb"))[0]
    assert d.outcome == "placed" and str(d.mig) == "1g.18gb@6" and d.gpus == ("GPU-0",)
    s.delete("default", "urgent")
    decided = []
    for start in range(6):  # the kept GPU's work ends: big is placed there
        decided += s.delete(*owner(0, start).split("/"))
    placed = {x.workload: x for x in decided if x.outcome == "placed"}
    assert placed["default/big"].gpus == ("GPU-0",) and "default/big" not in s._reserved
