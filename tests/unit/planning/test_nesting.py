"""Sharing inside a MIG instance: the nesting rule, per-workload accounting inside a shared
instance, the operator's switch, refusals, restore, and the scheduler's guarantees with nesting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrac.errors import InputError
from gpufrac.model.catalog import lookup_model
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.nesting import (
    NestFit,
    instance_memory,
    mps_clients,
    nest_mode,
    nested_fit,
    should_nest,
)
from gpufrac.planning.sched_state import NESTED, SchedGpu
from gpufrac.planning.scheduler import Decision, Scheduler

H100 = lookup_model("h100")  # 1g.10gb: 9984 MiB, 1 of 7 compute slices
GIB = 1024


def mig_fleet(n: int = 1) -> list[SchedGpu]:
    return [SchedGpu(f"GPU-{i}", i, H100, mig=True) for i in range(n)]


def w(name: str, tenant: str = "a", sharing: str = "auto", **gpu: object) -> WorkloadSpec:
    return WorkloadSpec(
        name=name, gpu=GpuRequest(**gpu), command=("x",), tenant=tenant, sharing=sharing
    )  # type: ignore[arg-type]


def placed(decisions: list[Decision]) -> Decision:
    d = decisions[0]
    assert d.outcome == "placed", d.reason
    return d


def fill_then_free(s: Scheduler, *small: WorkloadSpec) -> list[Decision]:
    """The GPU taken whole, ``small`` waiting, then the GPU freed: what the waiting get."""
    placed(s.submit(w("big", mig_profile="7g.80gb")))
    for spec in small:
        assert s.submit(spec)[0].outcome == "pending"
    return s.delete("a", "big")


# -- the rule ------------------------------------------------------------------------------------


def fit(half: bool) -> NestFit:
    return NestFit("1g.10gb", 3 * GIB, 37, 100, False, half)


@pytest.mark.parametrize(
    ("half", "room", "waiting", "nests"),
    [
        (True, True, 1, True),  # a shared instance of the model has room
        (True, False, 2, True),  # a new one serves two waiting needs
        (True, False, 5, True),
        (True, False, 1, False),  # alone, no shared instance with room: a whole instance
        (False, True, 1, False),  # more than half the profile: a whole instance
        (False, False, 3, False),
    ],
)
def test_the_nesting_rule(half: bool, room: bool, waiting: int, nests: bool) -> None:
    assert should_nest(fit(half), room=room, waiting=waiting) is nests


@pytest.mark.parametrize(
    ("gpu", "sharing", "profile", "half"),
    [
        ({"memory_mib": 3 * GIB}, "auto", "1g.10gb", True),  # 3 GiB of 9.75: at most half
        ({"memory_mib": 4992}, "auto", "1g.10gb", True),  # exactly half
        ({"memory_mib": 4993}, "auto", "1g.10gb", False),
        ({"memory_mib": 10000}, "auto", "1g.20gb", True),  # just over a 1g.10gb: half a 1g.20gb
        ({"memory_mib": 10 * GIB}, "auto", "1g.20gb", False),
        ({"memory_mib": 3 * GIB, "compute_pct": 5}, "auto", "1g.10gb", True),  # 35 % of a 1g
        ({"memory_mib": 3 * GIB, "compute_pct": 10}, "auto", "1g.10gb", False),  # 70 % of it
        ({"memory_pct": 5}, "mps", "1g.10gb", True),
    ],
)
def test_what_a_request_takes_inside_the_smallest_profile_that_fits_it(
    gpu: dict[str, int], sharing: str, profile: str, half: bool
) -> None:
    spec = w("x", sharing=sharing, **gpu)
    memory = gpu.get("memory_mib") or H100.memory_total_mib * gpu["memory_pct"] // 100
    found = nested_fit(spec, H100, memory)
    assert found is not None and (found.profile, found.half) == (profile, half)


@pytest.mark.parametrize(
    ("gpu", "sharing", "mode"),
    [
        ({"memory_mib": GIB}, "auto", "timeslice"),
        ({"memory_mib": GIB, "compute_pct": 5}, "auto", "mps"),
        ({"memory_mib": GIB}, "mps", "mps"),
        ({"memory_mib": GIB}, "timeslice", "timeslice"),
        ({"memory_mib": GIB}, "mig", None),  # sharing: mig is an instance of its own
        ({"memory_mib": GIB}, "exclusive", None),
        ({"mig_profile": "1g.10gb"}, "auto", None),
        ({"fraction_milli": 100}, "auto", None),
        ({"count": 1}, "auto", None),
        ({"compute_pct": 10}, "auto", None),  # a compute cap alone takes the whole memory
    ],
)
def test_which_requests_may_share_an_instance(
    gpu: dict[str, int], sharing: str, mode: str | None
) -> None:
    assert nest_mode(w("x", sharing=sharing, **gpu)) == mode


# -- the scheduler ----------------------------------------------------------------------------


def test_alone_a_small_request_takes_a_whole_instance() -> None:
    s = Scheduler(mig_fleet())
    d = placed(s.submit(w("e", memory_mib=3 * GIB)))
    assert (d.mode, str(d.mig)) == ("mig", "1g.10gb@6")


def test_a_new_shared_instance_serves_two_waiting_needs_then_more_join_it() -> None:
    s = Scheduler(mig_fleet())
    got = fill_then_free(s, w("e1", memory_mib=3 * GIB), w("e2", memory_mib=3 * GIB))
    assert [(d.workload, d.mode) for d in got] == [("a/e1", "timeslice"), ("a/e2", "timeslice")]
    assert got[0].mig == got[1].mig and got[0].mig is not None
    kinds = [a.kind for a in got[0].actions]
    assert kinds == ["destroy_mig_instance", "create_mig_instance", "start"]  # the idle 7g
    assert [a.kind for a in got[1].actions] == ["start"]
    g = s.state.gpus[0]
    pl = got[0].mig
    assert g.instances[pl] == NESTED
    nest = g.nests[pl]
    assert (nest.mem_used, nest.workloads) == (6 * GIB, {"a/e1", "a/e2"})
    # a shared instance with room takes the next small one, alone as it is
    d = placed(s.submit(w("e3", memory_mib=3 * GIB)))
    assert (d.mode, d.mig) == ("timeslice", pl)
    # the instance is full (9 GiB of 9.75): the next takes an instance of its own
    d = placed(s.submit(w("e4", memory_mib=3 * GIB)))
    assert d.mode == "mig" and d.mig != pl
    assert s.state.violations(False, {}) == []


def test_the_last_share_gone_leaves_the_instance_idle_and_free() -> None:
    s = Scheduler(mig_fleet())
    got = fill_then_free(s, w("e1", memory_mib=3 * GIB), w("e2", memory_mib=3 * GIB))
    pl = got[0].mig
    assert pl is not None
    s.delete("a", "e1")
    assert s.state.gpus[0].instances[pl] == NESTED
    s.delete("a", "e2")
    g = s.state.gpus[0]
    assert g.instances[pl] is None and pl not in g.nests
    assert (0, pl) in s.state.free_instances[(H100.key, pl.profile)]


def test_sharing_mig_and_large_requests_take_whole_instances_beside_a_shared_one() -> None:
    s = Scheduler(mig_fleet())
    fill_then_free(s, w("e1", memory_mib=3 * GIB), w("e2", memory_mib=2 * GIB))
    assert placed(s.submit(w("own", memory_mib=GIB, sharing="mig"))).mode == "mig"
    assert placed(s.submit(w("big", memory_mib=6 * GIB))).mode == "mig"  # over half a 1g.10gb


def test_nested_mps_accounts_compute_per_workload_in_percent_of_the_instance() -> None:
    s = Scheduler(mig_fleet())
    small = {"memory_mib": GIB, "compute_pct": 5}  # 5 % of an H100 is 35 % of a 1g.10gb
    got = fill_then_free(s, w("m1", **small), w("m2", **small))
    assert [d.mode for d in got] == ["mps", "mps"] and got[0].mig == got[1].mig
    assert [a.compute_pct for a in s.allocations("a/m1")] == [35]
    d = placed(s.submit(w("m3", **small)))  # 105 % would be over the instance's compute
    assert d.mig != got[0].mig
    assert s.state.gpus[0].nests[got[0].mig].compute_used == 70  # type: ignore[index]
    assert s.state.violations(False, {}) == []


def test_tenants_do_not_share_mps_inside_an_instance_unless_allowed() -> None:
    s = Scheduler(mig_fleet())
    small = {"memory_mib": GIB, "compute_pct": 5}
    less = {"memory_mib": GIB, "compute_pct": 3}  # 21 %: room for it beside the two
    got = fill_then_free(s, w("m1", **small), w("m2", **small))
    other = placed(s.submit(w("m3", tenant="b", **less)))
    assert other.mig != got[0].mig
    shared = Scheduler(mig_fleet(), OperatorSettings(mps_share_tenants=True))
    got = fill_then_free(shared, w("m1", **small), w("m2", **small))
    assert placed(shared.submit(w("m3", tenant="b", **less))).mig == got[0].mig


def test_the_operator_turns_nesting_off() -> None:
    off = OperatorSettings(mig_nesting=False)
    s = Scheduler(mig_fleet(), off)
    got = fill_then_free(s, w("e1", memory_mib=3 * GIB), w("e2", memory_mib=3 * GIB))
    assert [d.mode for d in got] == ["mig", "mig"] and got[0].mig != got[1].mig
    refused = Scheduler(mig_fleet(), off).submit(w("m", sharing="mps", memory_mib=GIB))[0]
    assert refused.outcome == "refused"
    assert "mig_nesting: false in gpufrac.yaml" in (refused.reason or "")


def test_an_mps_request_too_large_to_share_an_instance_is_refused_with_the_reason() -> None:
    d = Scheduler(mig_fleet()).submit(w("m", sharing="mps", memory_mib=8 * GIB))[0]
    assert d.outcome == "refused"
    assert "more than half of the smallest MIG profile" in (d.reason or "")


def test_an_explicit_mps_request_alone_opens_an_instance_of_its_mode_that_others_join() -> None:
    """No whole instance is an MPS one: a request that asked for mps (or timeslice) and shares no
    instance with room takes a new instance run under its mode, which the next small one joins
    (it waited before: the new user's review found it waiting while instances were free)."""
    s = Scheduler(mig_fleet())
    d = s.submit(w("m", sharing="mps", memory_mib=GIB))[0]
    assert d.outcome == "placed" and d.mode == "mps" and d.mig is not None
    d2 = s.submit(w("m2", sharing="mps", memory_mib=GIB))[0]
    assert (d2.outcome, d2.mode, d2.mig) == ("placed", "mps", d.mig)  # joined it
    assert s.state.gpus[0].nests[d.mig].workloads == {"a/m", "a/m2"}
    assert not s.pending
    # auto still takes a whole instance when it is alone
    d3 = s.submit(w("a1", memory_mib=GIB))[0]
    assert d3.mode == "mig" and d3.mig is not None and d3.mig != d.mig


def test_a_restore_takes_back_nested_shares_where_they_were() -> None:
    s = Scheduler(mig_fleet())
    got = fill_then_free(s, w("e1", memory_mib=3 * GIB), w("e2", memory_mib=3 * GIB))
    t = Scheduler(mig_fleet())
    for d in got:
        t.restore(s.requests[d.workload].spec, d)
    assert not t.pending
    pl = got[0].mig
    assert pl is not None and t.state.gpus[0].nests[pl].workloads == {"a/e1", "a/e2"}
    assert t.state.violations(False, {}) == []


SMALL = st.sampled_from(
    [
        GpuRequest(memory_mib=GIB),
        GpuRequest(memory_mib=3 * GIB),
        GpuRequest(memory_mib=8 * GIB),
        GpuRequest(memory_mib=GIB, compute_pct=5),
        GpuRequest(memory_mib=2 * GIB, compute_pct=3),
        GpuRequest(mig_profile="3g.40gb"),
    ]
)


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(
                st.just("submit"),
                SMALL,
                st.sampled_from(["a", "b"]),
                st.sampled_from(["auto", "auto", "mps", "timeslice", "mig"]),
            ),
            st.tuples(st.just("delete"), st.integers(0, 30)),
        ),
        max_size=30,
    ),
    share=st.booleans(),
)
def test_nested_shares_never_oversubscribe_an_instance(ops: list[tuple], share: bool) -> None:  # type: ignore[type-arg]
    s = Scheduler(mig_fleet(2), OperatorSettings(mps_share_tenants=share))
    names: list[tuple[str, str]] = []
    for k, op in enumerate(ops):
        if op[0] == "submit":
            _, req, tenant, sharing = op
            if req.mig_profile:
                sharing = "auto"
            if sharing == "timeslice" and req.compute_pct:
                sharing = "mps"
            spec = WorkloadSpec(
                name=f"w{k}", gpu=req, command=("x",), tenant=tenant, sharing=sharing
            )
            if s.submit(spec)[0].outcome != "refused":
                names.append((tenant, f"w{k}"))
        elif names:
            tenant, name = names.pop(op[1] % len(names))
            s.delete(tenant, name)
        assert s.state.violations(share, {}) == []
        assert set(s.pending).isdisjoint(s.state.allocs)
        for g in s.state.gpus:
            for pl, nest in g.nests.items():
                assert nest.mem_used <= instance_memory(H100, pl.profile)
                if nest.mode == "mps":
                    assert len(nest.workloads) <= mps_clients(H100, pl.profile)


def test_needs_submitted_together_share_a_new_instance() -> None:
    s = Scheduler(mig_fleet())
    got = s.submit_all([w("r0", memory_mib=2 * GIB), w("r1", memory_mib=2 * GIB)])
    assert [(d.workload, d.outcome, d.mode) for d in got] == [
        ("a/r0", "placed", "timeslice"),
        ("a/r1", "placed", "timeslice"),
    ]
    assert got[0].mig == got[1].mig and not s.pending
    # one by one, each takes an instance of its own
    t = Scheduler(mig_fleet())
    one = [t.submit(w(f"r{i}", memory_mib=2 * GIB))[0] for i in range(2)]
    assert [d.mode for d in one] == ["mig", "mig"] and one[0].mig != one[1].mig
    # a batch naming a workload twice, or one already there, is refused whole
    with pytest.raises(InputError, match="already submitted"):
        s.submit_all([w("x", memory_mib=GIB), w("x", memory_mib=GIB)])
    with pytest.raises(InputError, match="already submitted"):
        s.submit_all([w("r0", memory_mib=GIB)])
    assert "a/x" not in s.requests


def test_another_tenants_mps_instance_is_no_room_and_its_waiting_needs_do_not_count() -> None:
    s = Scheduler(mig_fleet())
    small = {"memory_mib": GIB, "compute_pct": 3}
    got = fill_then_free(s, w("m1", **small), w("m2", **small))
    # tenant b: a's shared instance has memory and compute left, but is no room for b (MPS)
    theirs = s.submit_all([w("n1", tenant="b", **small), w("n2", tenant="b", **small)])
    assert [d.mode for d in theirs] == ["mps", "mps"]
    assert theirs[0].mig == theirs[1].mig != got[0].mig
    # one of tenant c waits alongside one of tenant a: no pair to share a new MPS instance
    t = Scheduler(mig_fleet())
    placed(t.submit(w("big", mig_profile="7g.80gb")))
    for spec in (w("x", tenant="a", **small), w("y", tenant="c", **small)):
        assert t.submit(spec)[0].outcome == "pending"
    got = t.delete("a", "big")
    assert [d.mode for d in got] == ["mig", "mig"]
