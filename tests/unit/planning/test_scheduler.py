"""The scheduler: table tests for its choices, Hypothesis properties for its guarantees."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrac.errors import InputError
from gpufrac.model.catalog import lookup_model
from gpufrac.model.manifest import load_manifest_file
from gpufrac.model.settings import OperatorSettings, TenantQuota
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.sched_state import SchedGpu
from gpufrac.planning.scheduler import Decision, Scheduler

H200, A100 = lookup_model("h200"), lookup_model("a100-80gb")
GIB = 1024
EXAMPLES = Path(__file__).parents[3] / "examples"


def fleet(plain: int = 2, mig: int = 0, model=H200) -> list[SchedGpu]:  # type: ignore[no-untyped-def]
    return [SchedGpu(f"GPU-{i}", i, model, mig=i >= plain) for i in range(plain + mig)]


def w(
    name: str, tenant: str = "a", priority: int = 50, sharing: str = "auto", **gpu: object
) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        gpu=GpuRequest(**gpu),
        command=("true",),
        tenant=tenant,
        priority=priority,
        sharing=sharing,
    )  # type: ignore[arg-type]


def one(decisions: list[Decision]) -> Decision:
    return decisions[0]


def test_auto_prefers_mig_then_mps_for_a_compute_cap_then_timeslice() -> None:
    s = Scheduler(fleet(plain=1, mig=1))
    d = one(s.submit(w("a", memory_mib=10 * GIB)))
    assert (d.mode, str(d.mig)) == ("mig", "1g.18gb@6")
    assert [a.kind for a in d.actions] == ["create_mig_instance", "start"]
    s2 = Scheduler(fleet(plain=2))
    assert one(s2.submit(w("b", memory_mib=10 * GIB, compute_pct=30))).mode == "mps"
    assert one(s2.submit(w("c", memory_mib=10 * GIB))).mode == "timeslice"


@pytest.mark.parametrize(
    ("fraction", "profile"),
    [(125, "1g.18gb"), (250, "2g.35gb"), (500, "4g.71gb"), (1000 - 1, "7g.141gb")],
)
def test_a_fraction_on_mig_takes_that_share_of_slots_and_compute(
    fraction: int, profile: str
) -> None:
    d = one(Scheduler(fleet(plain=0, mig=1)).submit(w("f", fraction_milli=fraction, sharing="mig")))
    assert d.mig is not None and d.mig.profile == profile


def test_a_freed_mig_instance_is_reused_without_creating_one() -> None:
    s = Scheduler(fleet(plain=0, mig=1))
    s.submit(w("a", mig_profile="3g.71gb"))
    s.delete("a", "a")
    d = one(s.submit(w("b", mig_profile="3g.71gb")))
    assert d.outcome == "placed" and [a.kind for a in d.actions] == ["start"]


@pytest.mark.parametrize(("policy", "same_gpu"), [("binpack", True), ("spread", False)])
def test_binpack_and_spread(policy: str, same_gpu: bool) -> None:
    s = Scheduler(fleet(plain=3), policy=policy)
    a = one(s.submit(w("a", memory_mib=8 * GIB)))
    b = one(s.submit(w("b", memory_mib=8 * GIB)))
    assert (a.gpus == b.gpus) is same_gpu


def test_whole_gpus_are_exclusive() -> None:
    s = Scheduler(fleet(plain=2))
    assert one(s.submit(w("a", count=2))).gpus == ("GPU-0", "GPU-1")
    d = one(s.submit(w("b", memory_mib=GIB)))
    assert d.outcome == "pending"
    assert (
        d.reason
        == "timeslice: every GPU open to it is in use under another sharing mode (2 exclusive)"
    )


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (w("big", memory_mib=200 * GIB), "could ever hold"),
        (w("many", count=3), "the fleet has 2 without MIG"),
        (w("mig", mig_profile="1g.18gb"), "could ever hold 1g.18gb"),
        (w("wrong", mig_profile="3g.40gb", mig_model="A100-80GB"), "could ever hold"),
    ],
)
def test_impossible_requests_are_refused_at_once(spec: WorkloadSpec, fragment: str) -> None:
    s = Scheduler(fleet(plain=2))
    d = one(s.submit(spec))
    assert d.outcome == "refused" and fragment in d.reason
    assert not s.pending and not s.state.allocs


def test_quotas() -> None:
    cfg = OperatorSettings(tenants={"a": TenantQuota(gpu_memory_mib=20 * GIB, gpus_milli=1000)})
    s = Scheduler(fleet(plain=2), cfg)
    assert one(s.submit(w("x", memory_mib=30 * GIB))).outcome == "refused"
    assert one(s.submit(w("y", memory_mib=16 * GIB))).outcome == "placed"
    d = one(s.submit(w("z", memory_mib=8 * GIB)))
    assert d.outcome == "pending" and "quota" in d.reason
    assert one(s.submit(w("other", tenant="b", memory_mib=8 * GIB))).outcome == "placed"
    placed = s.delete("a", "y")
    assert [x.workload for x in placed] == ["a/z"]


def test_tenants_do_not_share_an_mps_gpu_unless_allowed() -> None:
    s = Scheduler(fleet(plain=1))
    assert one(s.submit(w("a", memory_mib=8 * GIB, compute_pct=20))).mode == "mps"
    d = one(s.submit(w("b", tenant="b", memory_mib=8 * GIB, compute_pct=20)))
    assert d.outcome == "pending" and "another tenant" in d.reason
    shared = Scheduler(fleet(plain=1), OperatorSettings(mps_share_tenants=True))
    shared.submit(w("a", memory_mib=8 * GIB, compute_pct=20))
    assert (
        one(shared.submit(w("b", tenant="b", memory_mib=8 * GIB, compute_pct=20))).outcome
        == "placed"
    )


def test_preemption_evicts_the_fewest_lowest_priority_workloads() -> None:
    s = Scheduler(fleet(plain=1))
    for i, prio in enumerate([0, 0, 10, 60]):
        s.submit(w(f"w{i}", priority=prio, memory_mib=30 * GIB))
    ds = s.submit(w("urgent", priority=100, memory_mib=60 * GIB))  # 20 GiB free: two must go
    assert ds[0].outcome == "placed" and ds[0].evicted == ("a/w0", "a/w1")
    assert all(d.outcome == "pending" and "preempted" in d.reason for d in ds[1:])
    same = s.submit(w("peer", priority=0, memory_mib=100 * GIB))
    assert same[0].outcome == "pending" and not same[0].evicted  # never evicts equal priority


def test_delete_places_pending_work_and_bad_names_are_errors() -> None:
    s = Scheduler(fleet(plain=1))
    s.submit(w("a", count=1))
    assert one(s.submit(w("b", memory_mib=GIB))).outcome == "pending"
    assert [d.workload for d in s.delete("a", "a")] == ["a/b"]
    with pytest.raises(InputError):
        s.delete("a", "nope")
    with pytest.raises(InputError, match="already submitted"):
        s.submit(w("b", memory_mib=GIB))


def test_example_manifests_schedule() -> None:
    s = Scheduler(
        [
            # the third MIG GPU for HAMi's and KAI's examples, the last two plain GPUs for
            # HAMi's vGPUs with cores (an MPS domain of two)
            *fleet(plain=8, mig=3),
            SchedGpu("GPU-A", 11, A100, mig=True),
            SchedGpu("GPU-B", 12, A100, mig=True),
        ]
    )
    for path in sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "quickstart.yaml"):
        for spec in load_manifest_file(path):
            d = one(s.submit(spec))
            assert d.outcome == "placed", (path.name, spec.name, d.reason)
    assert s.state.violations(False, {}) == []


# -- properties ------------------------------------------------------------------------------------

REQUESTS = st.one_of(
    st.builds(lambda m: GpuRequest(memory_mib=m * GIB), st.integers(1, 90)),
    st.builds(
        lambda m, c: GpuRequest(memory_mib=m * GIB, compute_pct=c),
        st.integers(1, 40),
        st.sampled_from([10, 25, 50, 80]),
    ),
    st.builds(lambda f: GpuRequest(fraction_milli=f), st.sampled_from([100, 250, 500, 900])),
    st.builds(
        lambda p: GpuRequest(mig_profile=p),
        st.sampled_from(["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]),
    ),
    st.builds(lambda n: GpuRequest(count=n), st.integers(1, 2)),
    # HAMi's gpumem-percentage with or without gpucores, and gpucores alone
    st.builds(
        lambda p, c: GpuRequest(memory_pct=p, compute_pct=c),
        st.integers(1, 100),
        st.sampled_from([None, 10, 40, 60]),
    ),
    st.builds(lambda c: GpuRequest(compute_pct=c), st.sampled_from([10, 40, 60])),
    # a share of each of several GPUs (HAMi's nvidia.com/gpu: N with gpumem, KAI's num-devices)
    st.builds(
        lambda m, n: GpuRequest(memory_mib=m * GIB, devices=n),
        st.sampled_from([10, 40, 100]),
        st.integers(2, 3),
    ),
    st.builds(
        lambda f, n: GpuRequest(fraction_milli=f, devices=n),
        st.sampled_from([250, 500]),
        st.integers(2, 3),
    ),
    # with a compute cap on each (HAMi's nvidia.com/gpu: N with gpucores): one MPS domain
    st.builds(
        lambda m, c, n: GpuRequest(memory_mib=m, compute_pct=c, devices=n),
        st.sampled_from([None, 10 * GIB, 60 * GIB]),
        st.sampled_from([10, 30, 60]),
        st.integers(2, 3),
    ),
)
OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            REQUESTS,
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from([0, 50, 100]),
            st.sampled_from(["auto", "auto", "timeslice", "mps"]),
        ),
        st.tuples(st.just("delete"), st.integers(0, 30)),
    ),
    max_size=40,
)


@settings(max_examples=150)
@given(
    ops=OPS, share=st.booleans(), policy=st.sampled_from(["binpack", "spread"]), quota=st.booleans()
)
def test_no_oversubscription_and_preemption_only_of_lower_priority(
    ops: list[tuple], share: bool, policy: str, quota: bool
) -> None:  # type: ignore[type-arg]
    quotas = {"a": TenantQuota(gpu_memory_mib=150 * GIB, gpus_milli=1500)} if quota else {}
    cfg = OperatorSettings(tenants=quotas, mps_share_tenants=share, placement_policy=policy)
    s = Scheduler([*fleet(plain=3, mig=1), SchedGpu("GPU-A", 4, A100, mig=False)], cfg)
    names: list[tuple[str, str]] = []
    for k, op in enumerate(ops):
        if op[0] == "submit":
            _, req, tenant, prio, sharing = op
            if sharing != "auto" and (req.count or req.mig_profile):
                sharing = "auto"
            if sharing == "timeslice" and req.compute_pct:
                sharing = "mps"
            spec = WorkloadSpec(
                name=f"w{k}", gpu=req, command=("x",), tenant=tenant, priority=prio, sharing=sharing
            )
            decisions = s.submit(spec)
            if decisions[0].outcome != "refused":
                names.append((tenant, f"w{k}"))
            for d in decisions:
                if d.outcome == "placed" and d.workload == f"{tenant}/w{k}":
                    for victim in d.evicted:
                        assert s.requests[victim].priority < prio, (
                            "evicted a workload of equal or higher priority"
                        )
                assert d.outcome != "placed" or d.workload in s.state.allocs
        elif names:
            tenant, name = names.pop(op[1] % len(names))
            s.delete(tenant, name)
        qs = {t: (q.gpu_memory_mib, q.gpus_milli) for t, q in quotas.items()}
        assert s.state.violations(share, qs) == []
        # a GPU each, never two shares on one, all of one model on one node
        for key, allocs in s.state.allocs.items():
            gpus = [a.gpu for a in allocs]
            assert len(gpus) == len(set(gpus)) == s.requests[key].spec.gpu.gpus
            assert len({(s.state.gpus[g].node, s.state.gpus[g].model.key) for g in gpus}) == 1, (
                key,
                s.requests[key].spec.gpu,
            )
        # the MPS domain rule: every MPS workload on a GPU (outside MIG) is on the same GPUs
        assert all(len(sets) <= 1 for sets in mps_domain_sets(s).values())
        assert set(s.pending).isdisjoint(s.state.allocs)
        assert all(s.pending.values())


def mps_domain_sets(s: Scheduler) -> dict[int, set[tuple[int, ...]]]:
    """Per GPU, the sets of GPUs its MPS workloads (outside MIG) are on."""
    return {
        g.index: {
            tuple(sorted(a.gpu for a in s.state.allocs[x.workload]))
            for x in g.allocs.values()
            if x.mode == "mps" and x.mig is None
        }
        for g in s.state.gpus
    }


MPS_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.builds(
                lambda m, c, n: GpuRequest(memory_mib=m, compute_pct=c, devices=n),
                st.sampled_from([None, 5 * GIB, 40 * GIB]),
                st.sampled_from([None, 10, 30, 60]),
                st.integers(1, 3),
            ),
            st.sampled_from(["a", "b"]),
            st.sampled_from([0, 50, 100]),
        ),
        st.tuples(st.just("delete"), st.integers(0, 30)),
    ),
    max_size=30,
)


@settings(max_examples=100)
@given(ops=MPS_OPS, share=st.booleans(), policy=st.sampled_from(["binpack", "spread"]))
def test_every_gpu_under_mps_serves_one_set_of_gpus(
    ops: list[tuple], share: bool, policy: str
) -> None:  # type: ignore[type-arg]
    """MPS workloads on one and on several GPUs, placed, evicted and deleted in any order: every
    MPS workload on a GPU is on the same GPUs (one daemon per GPU), the GPU's ``mps_domain``."""
    cfg = OperatorSettings(mps_share_tenants=share, placement_policy=policy)
    s = Scheduler(nodes(2, 3), cfg)
    names: list[tuple[str, str]] = []
    for k, op in enumerate(ops):
        if op[0] == "submit":
            _, req, tenant, prio = op
            if req.memory_mib is None and req.compute_pct is None:
                req = dataclasses.replace(req, compute_pct=20)
            spec = WorkloadSpec(
                name=f"w{k}", gpu=req, command=("x",), tenant=tenant, priority=prio, sharing="mps"
            )
            if s.submit(spec)[0].outcome != "refused":
                names.append((tenant, f"w{k}"))
        elif names:
            s.delete(*names.pop(op[1] % len(names)))
        assert s.state.violations(share, {}) == []
        for g, sets in mps_domain_sets(s).items():
            assert sets == ({s.state.gpus[g].mps_domain} if sets else set()), (g, sets)
            assert all(len({s.state.gpus[i].node for i in d}) == 1 for d in sets)


# -- found in review -------------------------------------------------------------------------------


def test_whole_gpu_requests_count_every_gpu_against_the_quota() -> None:
    s = Scheduler(fleet(plain=3), OperatorSettings(tenants={"a": TenantQuota(gpus_milli=2000)}))
    assert one(s.submit(w("one", count=1))).outcome == "placed"
    d = one(s.submit(w("two", count=2)))
    assert d.outcome == "pending" and "quota" in d.reason
    assert s.state.violations(False, {"a": (None, 2000)}) == []


def test_preemption_never_breaks_a_quota() -> None:
    gpus = [SchedGpu("G0", 0, A100, mig=True), SchedGpu("G1", 1, H200, mig=False)]
    s = Scheduler(gpus, OperatorSettings(tenants={"a": TenantQuota(gpu_memory_mib=100 * GIB)}))
    s.submit(w("low", tenant="b", priority=0, mig_profile="1g.10gb"))
    d = one(s.submit(w("x", priority=100, count=1)))
    assert d.outcome == "refused" and "quota" in d.reason  # an H200 alone is over a 100 GiB quota
    assert s.state.violations(False, {"a": (100 * GIB, None)}) == []


def test_a_mig_request_over_the_whole_quota_is_refused() -> None:
    s = Scheduler(
        fleet(plain=0, mig=1), OperatorSettings(tenants={"a": TenantQuota(gpu_memory_mib=10 * GIB)})
    )
    assert one(s.submit(w("big", mig_profile="7g.141gb"))).outcome == "refused"


def test_room_freed_by_preemption_goes_to_waiting_work() -> None:
    s = Scheduler(fleet(plain=1))
    s.submit(w("low", priority=0, sharing="timeslice", memory_mib=100 * GIB))
    assert (
        one(s.submit(w("small", priority=0, sharing="timeslice", memory_mib=45 * GIB))).outcome
        == "pending"
    )
    decisions = s.submit(w("high", priority=100, sharing="timeslice", memory_mib=90 * GIB))
    assert {d.workload: d.outcome for d in decisions}["a/small"] == "placed"


def test_an_exact_fit_is_found_despite_rounding() -> None:
    s = Scheduler(fleet(plain=1))
    s.submit(w("a", sharing="timeslice", memory_mib=100000))
    assert (
        one(
            s.submit(w("b", sharing="timeslice", memory_mib=H200.memory_total_mib - 100000))
        ).outcome
        == "placed"
    )


def test_an_idle_mig_gpu_is_cut_again_for_a_larger_profile() -> None:
    s = Scheduler(fleet(plain=0, mig=1))
    for i in range(7):
        s.submit(w(f"s{i}", mig_profile="1g.18gb"))
    for i in range(7):
        s.delete("a", f"s{i}")
    d = one(s.submit(w("big", mig_profile="7g.141gb")))
    assert d.outcome == "placed" and str(d.mig) == "7g.141gb@0"
    kinds = [a.kind for a in d.actions]
    assert kinds.count("destroy_mig_instance") == 7 and kinds[-2:] == [
        "create_mig_instance",
        "start",
    ]
    assert s.state.violations(False, {}) == []


def test_restore_refuses_a_mig_instance_that_no_longer_fits() -> None:
    from gpufrac.model.mig import MigPlacement

    s = Scheduler(fleet(plain=0, mig=1))
    g = s.state.gpus[0]
    g.instances = {MigPlacement(0, "3g.71gb"): None, MigPlacement(4, "3g.71gb"): None}
    s.state = type(s.state)([g])
    recorded = Decision(
        "a/big", "placed", mode="mig", gpus=("GPU-0",), mig=MigPlacement(0, "7g.141gb")
    )
    s.restore(w("big", mig_profile="7g.141gb"), recorded)
    assert "a/big" in s.pending and s.state.violations(False, {}) == []


def test_busy_mig_instances_from_a_snapshot_are_not_handed_out_until_their_workload_is_restored(
    data_dir: Path,
) -> None:
    import os

    from gpufrac.devices import open_simulated
    from gpufrac.devices.simfleet import SimulatedFleet
    from gpufrac.model.mig import MigPlacement
    from gpufrac.planning.sched_state import sched_gpus_from_states

    dev = open_simulated("h200:1:mig", data_dir)
    uuid = dev.gpus()[0].uuid
    inst = dev.create_instance(uuid, "7g.141gb", 0)
    SimulatedFleet.open("h200:1:mig", data_dir).attach_process(
        uuid, os.getpid(), 100, gi_id=inst.gi_id
    )
    states = dev.gpus()
    s = Scheduler(sched_gpus_from_states(states, {uuid: dev.model(uuid)}))
    assert one(s.submit(w("other", mig_profile="7g.141gb"))).outcome == "pending"
    s2 = Scheduler(sched_gpus_from_states(states, {uuid: dev.model(uuid)}))
    s2.restore(
        w("mine", mig_profile="7g.141gb"),
        Decision("a/mine", "placed", mode="mig", gpus=(uuid,), mig=MigPlacement(0, "7g.141gb")),
    )
    assert s2.allocations("a/mine") and s2.state.violations(False, {}) == []


def test_a_live_priority_change_reaches_preemption() -> None:
    s = Scheduler(fleet(plain=1))
    a = w("a", priority=10, count=1)
    assert s.submit(a)[0].outcome == "placed"
    assert s.update_live(dataclasses.replace(a, priority=90)) == []
    decided = s.submit(w("b", priority=50, count=1))
    assert decided[0].outcome == "pending"  # a now outranks b: not evicted
    lowered = s.update_live(dataclasses.replace(a, priority=0))
    assert lowered == [] and s.state.min_priority() == 0


def test_a_pending_workload_raised_live_is_placed_with_preemption() -> None:
    s = Scheduler(fleet(plain=1))
    s.submit(w("x", priority=50, count=1))
    y = w("y", priority=10, count=1)
    assert s.submit(y)[0].outcome == "pending"
    decided = s.update_live(dataclasses.replace(y, priority=90))
    assert decided[0].outcome == "placed" and decided[0].workload.endswith("/y")
    assert [d.workload.split("/")[1] for d in decided[1:]] == ["x"]  # evicted for it


def test_replicas_of_one_deployment_spread_over_gpus_while_others_pack() -> None:
    s = Scheduler(fleet(plain=2))
    label = {"gpufrac.io/deployment": "m"}

    def replica(i: int) -> WorkloadSpec:
        spec = w(f"m-{i}", sharing="timeslice", fraction_milli=200)
        return dataclasses.replace(spec, labels=label)

    gpus = [one(s.submit(replica(i))).gpus[0] for i in range(3)]
    assert gpus[0] != gpus[1]  # the second replica goes to the other GPU
    assert len(set(gpus)) == 2  # with two GPUs, the third shares one (a preference, not a rule)
    plain = [
        one(s.submit(w(f"p-{i}", sharing="timeslice", fraction_milli=100))).gpus[0]
        for i in range(2)
    ]
    assert plain[0] == plain[1]  # workloads that are not replicas still pack


@pytest.mark.parametrize(
    ("bound", "evicted"),
    [
        ("lower-priority", ["b/low"]),  # the lowest priority, of any tenant
        ("own-tenant", ["a/low"]),
        ("never", []),
    ],
)
def test_a_tenants_preemption_bound_caps_whom_its_workloads_evict(
    bound: str, evicted: list[str]
) -> None:
    quota = TenantQuota(preemption=bound)  # type: ignore[arg-type]
    s = Scheduler(fleet(plain=2), OperatorSettings(tenants={"a": quota}))
    s.submit(w("low", tenant="b", priority=0, count=1))
    s.submit(w("low", tenant="a", priority=10, count=1))
    decisions = s.submit(w("urgent", tenant="a", priority=100, count=1))
    victims = [d.workload for d in decisions[1:]]
    if evicted:
        assert decisions[0].outcome == "placed" and len(victims) == 1 and victims[0] in evicted
    else:
        assert decisions[0].outcome == "pending" and victims == []
        assert "its tenant's preemption: never" in decisions[0].reason
    assert s.allocations("b/low") or bound == "lower-priority"


def test_a_priority_above_the_tenants_bound_is_refused() -> None:
    settings = OperatorSettings(tenants={"a": TenantQuota(max_priority=100)})
    settings.check_priority("a", 100)
    with pytest.raises(InputError) as exc:
        settings.check_priority("a", 1_000_000_000)
    assert exc.value.field == "spec.priority" and "tenants.a.max_priority" in (exc.value.fix or "")
    with pytest.raises(InputError, match="maximum of 1000"):
        OperatorSettings().check_priority("b", 1001)


# -- a share of each of several GPUs (issue 31: HAMi's nvidia.com/gpu: N with gpumem) --------------


def nodes(*sizes: int) -> list[SchedGpu]:
    """Nodes n0, n1, ... with ``sizes`` H200s each, GPUs numbered across them."""
    out: list[SchedGpu] = []
    for n, size in enumerate(sizes):
        for _ in range(size):
            i = len(out)
            out.append(SchedGpu(f"GPU-{i}", i, H200, mig=False, node=f"n{n}"))
    return out


def test_a_share_of_several_gpus_takes_one_share_on_each_of_n_gpus_of_one_node() -> None:
    s = Scheduler(nodes(1, 3))
    d = one(s.submit(w("x", memory_mib=10 * GIB, devices=2)))
    assert d.outcome == "placed" and d.mode == "timeslice"
    assert d.gpus == ("GPU-1", "GPU-2")  # node n1: n0 has one GPU only
    allocs = s.allocations("a/x")
    assert [(a.gpu, a.memory_mib, a.mode) for a in allocs] == [
        (1, 10 * GIB, "timeslice"),
        (2, 10 * GIB, "timeslice"),
    ]
    # beside it, a second one packs onto the same two GPUs, one share on each
    assert one(s.submit(w("y", memory_mib=10 * GIB, devices=2))).gpus == ("GPU-1", "GPU-2")
    assert s.state.violations(False, {}) == []


def test_a_share_of_several_gpus_never_takes_two_shares_of_one_gpu() -> None:
    s = Scheduler(nodes(2))
    s.submit(w("whole", count=1))  # GPU 0 taken: one GPU with room is left
    d = one(s.submit(w("x", fraction_milli=250, devices=2)))
    assert d.outcome == "pending"
    assert d.reason == (
        "timeslice: a share of each of 2 GPUs needs 2 timeslice or empty GPUs with 35942MiB and "
        "the share asked for free on each; the most such now: 1"
    )
    assert not s.allocations("a/x")
    placed = s.delete("a", "whole")
    assert [(p.workload, p.gpus) for p in placed] == [("a/x", ("GPU-0", "GPU-1"))]


def test_a_share_of_several_gpus_waits_rather_than_evicts() -> None:
    s = Scheduler(nodes(2))
    s.submit(w("low", priority=0, sharing="timeslice", memory_mib=100 * GIB))
    d = one(s.submit(w("x", priority=100, memory_mib=100 * GIB, devices=2)))
    assert d.outcome == "pending" and not d.evicted
    assert "a share of each of 2 GPUs evicts no one: it waits for room on each" in d.reason
    assert [p.workload for p in s.delete("a", "low")] == ["a/x"]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (w("many", memory_mib=GIB, devices=3), "at most 2 such GPU(s) without MIG"),
        (w("mps", compute_pct=30, devices=3), "at most 2 such GPU(s) without MIG"),
        (w("mig", sharing="mig", memory_mib=GIB, devices=2), "sharing: mig gives a workload one"),
    ],
)
def test_a_share_of_several_gpus_that_could_never_run_is_refused(
    spec: WorkloadSpec, fragment: str
) -> None:
    d = one(Scheduler(nodes(1, 2, 1)).submit(spec))
    assert d.outcome == "refused" and fragment in d.reason, d.reason


def test_a_share_of_several_gpus_counts_every_share_against_the_quota() -> None:
    cfg = OperatorSettings(tenants={"a": TenantQuota(gpu_memory_mib=200 * GIB, gpus_milli=1000)})
    s = Scheduler(nodes(4), cfg)
    d = one(s.submit(w("x", memory_mib=110 * GIB, devices=2)))  # 220 GiB in all
    assert d.outcome == "refused" and "tenant a would use 220GiB" in d.reason
    assert one(s.submit(w("y", fraction_milli=400, devices=2))).outcome == "placed"
    d = one(s.submit(w("z", fraction_milli=200, devices=2)))  # 0.8 held + 0.4 asked
    assert d.outcome == "pending" and "tenant a would use 1.2 GPUs" in d.reason


def test_a_share_of_several_gpus_is_restored_on_each_of_its_gpus() -> None:
    s = Scheduler(nodes(3))
    spec = w("x", memory_mib=10 * GIB, devices=3)
    d = one(s.submit(spec))
    again = Scheduler(nodes(3))
    again.restore(spec, d)
    assert again.allocations("a/x") == s.allocations("a/x")
    assert "a/x" not in again.pending


def test_a_share_of_several_gpus_evicted_leaves_room_on_each_of_its_gpus() -> None:
    """Evicted from one GPU, a share of two GPUs gives up the other's share too: what waits for
    room there is placed at once."""
    s = Scheduler(nodes(2))
    s.submit(w("pair", priority=0, memory_mib=100 * GIB, devices=2))  # on GPUs 0 and 1
    s.submit(w("left", priority=0, sharing="timeslice", memory_mib=40 * GIB))  # on one of them
    assert (
        one(s.submit(w("waits", priority=0, sharing="timeslice", memory_mib=60 * GIB))).outcome
        == "pending"
    )
    decisions = s.submit(w("urgent", priority=100, sharing="timeslice", memory_mib=100 * GIB))
    outcomes = {d.workload: d.outcome for d in decisions}
    assert outcomes["a/urgent"] == "placed" and decisions[0].evicted == ("a/pair",)
    assert outcomes["a/waits"] == "placed"  # on the GPU the evicted pair left
    assert s.state.violations(False, {}) == []


# -- a compute cap on each of several GPUs: one MPS daemon serving them (an MPS domain) ------------


def test_a_compute_cap_on_several_gpus_is_placed_under_mps_on_one_nodes_gpus() -> None:
    s = Scheduler(nodes(1, 3))
    d = one(s.submit(w("x", memory_mib=10 * GIB, compute_pct=30, devices=2)))  # auto: MPS
    assert (d.outcome, d.mode, d.gpus) == ("placed", "mps", ("GPU-1", "GPU-2"))
    assert [(a.gpu, a.mode, a.memory_mib, a.compute_pct) for a in s.allocations("a/x")] == [
        (1, "mps", 10 * GIB, 30),
        (2, "mps", 10 * GIB, 30),
    ]
    # a second one packs onto the same two GPUs: the same MPS domain, one daemon for both
    assert one(s.submit(w("y", memory_mib=10 * GIB, compute_pct=30, devices=2))).gpus == (
        "GPU-1",
        "GPU-2",
    )
    assert [g.mps_domain for g in s.state.gpus] == [(), (1, 2), (1, 2), ()]
    assert [g.compute_used for g in s.state.gpus] == [0, 60, 60, 0]
    # sharing: mps without a cap: MPS all the same, with all the threads
    d = one(s.submit(w("z", sharing="mps", memory_mib=10 * GIB, devices=2)))
    assert (d.outcome, d.mode, d.gpus) == ("placed", "mps", ("GPU-1", "GPU-2"))
    assert s.state.violations(False, {}) == []
    for name in ("x", "y", "z"):
        s.delete("a", name)
    assert [g.mps_domain for g in s.state.gpus] == [()] * 4


def test_a_gpu_of_a_two_gpu_mps_domain_takes_no_one_gpu_mps_workload() -> None:
    s = Scheduler(nodes(2))
    s.submit(w("pair", memory_mib=10 * GIB, compute_pct=30, devices=2))
    d = one(s.submit(w("single", memory_mib=10 * GIB, compute_pct=30)))
    assert d.outcome == "pending"
    assert d.reason.startswith(
        "mps: GPUs 0, 1 are one MPS domain: a one-GPU MPS workload cannot join it "
        "(one MPS daemon serves each GPU)"
    ), d.reason
    assert d.reason.count("are one MPS domain") == 1  # said once for the domain, not per GPU
    # time-sliced work is refused for the GPU's mode, as ever; the pair gone, it is placed
    placed = s.delete("a", "pair")
    assert [(p.workload, p.mode, p.gpus) for p in placed] == [("a/single", "mps", ("GPU-0",))]
    assert s.state.violations(False, {}) == []


def test_a_two_gpu_mps_workload_takes_no_gpu_of_a_one_gpu_mps_domain() -> None:
    s = Scheduler(nodes(2))
    s.submit(w("single", memory_mib=10 * GIB, compute_pct=30))  # GPU 0, its own domain
    d = one(s.submit(w("pair", memory_mib=10 * GIB, compute_pct=30, devices=2)))
    assert d.outcome == "pending"
    assert d.reason.startswith(
        "mps: a share of each of 2 GPUs needs 2 empty GPUs, or the 2 GPUs of one MPS domain, "
        "with 10GiB and the share asked for free on each; the most such now: 1; GPU 0 is an "
        "MPS domain of its own: a share of each of 2 GPUs under MPS cannot join it"
    ), d.reason
    # with a third GPU, it takes the two empty ones, never GPU 0 with an empty one
    s3 = Scheduler(nodes(3))
    s3.submit(w("single", memory_mib=10 * GIB, compute_pct=30))
    d = one(s3.submit(w("pair", memory_mib=10 * GIB, compute_pct=30, devices=2)))
    assert (d.outcome, d.gpus) == ("placed", ("GPU-1", "GPU-2"))
    # nor does a share of three GPUs join the domain of two
    d = one(s3.submit(w("three", memory_mib=GIB, compute_pct=5, devices=3)))
    assert d.outcome == "pending" and "GPUs 1, 2 are one MPS domain" in d.reason
    assert s3.state.violations(False, {}) == []


def test_memory_and_compute_are_two_capacities_on_each_gpu_of_an_mps_domain() -> None:
    s = Scheduler(nodes(2))
    assert one(s.submit(w("x", memory_mib=100 * GIB, compute_pct=30, devices=2))).mode == "mps"
    # 130 GiB and 90 % on each GPU: fits both capacities
    assert one(s.submit(w("y", memory_mib=30 * GIB, compute_pct=60, devices=2))).outcome == (
        "placed"
    )
    compute_over = one(s.submit(w("c", memory_mib=GIB, compute_pct=20, devices=2)))
    memory_over = one(s.submit(w("m", memory_mib=12 * GIB, compute_pct=5, devices=2)))
    for d in (compute_over, memory_over):
        assert d.outcome == "pending" and d.reason.startswith("mps: a share of each of 2 GPUs")
    assert one(s.submit(w("fits", memory_mib=10 * GIB, compute_pct=10, devices=2))).outcome == (
        "placed"
    )
    assert [(g.compute_used, g.mem_used) for g in s.state.gpus] == [(100, 140 * GIB)] * 2
    assert s.state.violations(False, {}) == []


def test_tenants_share_an_mps_domain_only_where_allowed() -> None:
    for allowed in (False, True):
        s = Scheduler(nodes(2), OperatorSettings(mps_share_tenants=allowed))
        s.submit(w("x", tenant="a", memory_mib=10 * GIB, compute_pct=30, devices=2))
        d = one(s.submit(w("y", tenant="b", memory_mib=10 * GIB, compute_pct=30, devices=2)))
        assert d.outcome == ("placed" if allowed else "pending"), d.reason
        assert s.state.violations(allowed, {}) == []


def test_an_mps_domain_is_restored_whole_or_not_at_all() -> None:
    s = Scheduler(nodes(3))
    spec = w("x", memory_mib=10 * GIB, compute_pct=30, devices=2)
    d = one(s.submit(spec))
    again = Scheduler(nodes(3))
    again.restore(spec, d)
    again.restore(w("y", memory_mib=10 * GIB, compute_pct=30, devices=2), d)  # the same GPUs
    assert [g.mps_domain for g in again.state.gpus] == [(0, 1), (0, 1), ()]
    # recorded on GPUs 1 and 2, across the domain of GPUs 0 and 1: it waits instead
    other = Decision("a/z", "placed", mode="mps", gpus=("GPU-1", "GPU-2"))
    again.restore(w("z", memory_mib=GIB, compute_pct=5, devices=2), other)
    assert not again.allocations("a/z") and "a/z" in again.pending
    assert again.state.violations(False, {}) == []


def test_preemption_for_one_gpu_under_mps_leaves_no_domain_of_several_beside_it() -> None:
    """Evicting the low-priority member of a two-GPU MPS domain leaves its other member there:
    a one-GPU MPS workload still cannot join that GPU's daemon (found writing the domain rule:
    preemption's own room check must know it)."""
    s = Scheduler(nodes(2))
    s.submit(w("keep", priority=100, memory_mib=10 * GIB, compute_pct=50, devices=2))
    s.submit(w("low", priority=0, memory_mib=10 * GIB, compute_pct=50, devices=2))
    d = one(s.submit(w("one", priority=50, memory_mib=10 * GIB, compute_pct=30)))
    assert d.outcome == "pending" and not d.evicted
    assert s.allocations("a/low") and s.state.violations(False, {}) == []


def test_preemption_for_whole_gpus_takes_them_of_one_model() -> None:
    """Found by the property test: preemption took an H200 and an A100 for one request of two
    whole GPUs (its GPUs were grouped by node only); placed without eviction, they are of one
    model."""
    gpus = [
        SchedGpu("GPU-0", 0, H200, mig=False),
        SchedGpu("GPU-1", 1, A100, mig=False),
        SchedGpu("GPU-2", 2, H200, mig=False),
    ]
    s = Scheduler(gpus)
    for i in range(3):
        s.submit(w(f"low{i}", priority=0, count=1))
    d = one(s.submit(w("pair", priority=100, count=2)))
    assert d.outcome == "placed" and d.gpus == ("GPU-0", "GPU-2")
