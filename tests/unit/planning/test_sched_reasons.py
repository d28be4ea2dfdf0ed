"""Why a workload waits: one clause per cause, in the order a person fixes them (quota, node
selector, cordon, lost node, capacity by mode), naming only the modes and GPUs the fleet has. (A
lost node's clause: tests/unit/cluster/test_core.py.)"""

from __future__ import annotations

from gpufrac.model.catalog import lookup_model
from gpufrac.model.settings import OperatorSettings, TenantQuota
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.sched_reasons import Reasons
from gpufrac.planning.sched_state import CORDONED, SchedGpu
from gpufrac.planning.scheduler import Scheduler

H200 = lookup_model("h200")
GIB = 1024


def fleet(plain: int, mig: int = 0) -> list[SchedGpu]:
    return [SchedGpu(f"GPU-{i}", i, H200, mig=i >= plain) for i in range(plain + mig)]


def w(name: str, tenant: str = "research", **gpu: object) -> WorkloadSpec:
    return WorkloadSpec(name=name, gpu=GpuRequest(**gpu), command=("true",), tenant=tenant)  # type: ignore[arg-type]


def test_over_its_quota_on_a_fleet_without_mig_it_says_the_quota_alone() -> None:
    quota = OperatorSettings(tenants={"research": TenantQuota(gpu_memory_mib=50 * GIB)})
    s = Scheduler(fleet(plain=2), quota)
    assert s.submit(w("a", memory_mib=30 * GIB))[0].outcome == "placed"
    d = s.submit(w("b", memory_mib=30 * GIB))[0]
    assert d.outcome == "pending"
    # before: "no free MIG instance fits ...; tenant research quota: ...; timeslice: no GPU has
    # 30GiB ... free (the most any timeslice GPU has left: 100.0% of a GPU)"
    assert d.reason == (
        "tenant research would use 60GiB of GPU memory (30GiB held + 30GiB asked), over its "
        "50GiB quota (tenants.research.gpu_memory in gpufrac.yaml)"
    )


def test_a_cordoned_gpu_that_would_hold_it_is_named_with_what_it_has_free() -> None:
    s = Scheduler(fleet(plain=2))
    s.state.set_closed(s.state.gpus[1], CORDONED)
    assert s.submit(w("big", memory_mib=100 * GIB))[0].outcome == "placed"  # on GPU 0
    d = s.submit(w("more", memory_mib=90 * GIB))[0]
    assert d.outcome == "pending"
    assert d.reason == (
        "GPU 1 is cordoned (140.4GiB free); timeslice: no timeslice or empty GPU has 90GiB and "
        "the share asked for free (1 such GPU, the most left on one: 28.7% of a GPU, not "
        "counting 1 that takes no new work)"
    )
    # a cordoned GPU that could not hold it anyway is not named
    s2 = Scheduler(fleet(plain=2))
    assert s2.submit(w("filler", memory_mib=100 * GIB))[0].gpus == ("GPU-0",)
    assert s2.submit(w("filler2", memory_mib=100 * GIB))[0].gpus == ("GPU-1",)
    s2.state.set_closed(s2.state.gpus[1], CORDONED)
    assert "cordoned" not in s2.submit(w("more", memory_mib=90 * GIB))[0].reason


def test_only_the_modes_the_fleet_has_are_named() -> None:
    plain = Scheduler(fleet(plain=1))
    plain.submit(w("a", count=1))
    d = plain.submit(w("b", memory_mib=10 * GIB))[0]  # auto: MIG, then timeslice
    assert d.outcome == "pending" and "MIG" not in d.reason, d.reason
    assert plain.submit(w("c", count=1))[0].reason == "needs 1 whole GPU(s); 0 free now"
    mig = Scheduler(fleet(plain=0, mig=1))
    assert mig.submit(w("a", mig_profile="7g.141gb"))[0].outcome == "placed"
    d = mig.submit(w("b", memory_mib=10 * GIB))[0]
    assert d.outcome == "pending" and "timeslice" not in d.reason, d.reason
    assert d.reason.startswith("no free MIG instance fits on its 1 MIG GPU(s)"), d.reason


def test_clauses_come_in_the_order_they_are_fixed_one_per_cause() -> None:
    r = Reasons()
    r.set_capacity("timeslice", lambda: "timeslice: full")
    r.add("cordon", "GPU 1 is cordoned (1.0GiB free)")
    r.add("quota", "tenant a would use too much")
    r.add("quota", "tenant a would use too much again")  # the first said stays
    r.set_capacity("mig", lambda: "no free MIG instance fits")
    r.set_capacity(
        "timeslice", lambda: "timeslice: full, looked further"
    )  # a later look replaces it
    r.add("node_lost", "node n2 is lost (no heartbeat for 7 s)")
    assert r.text() == (
        "tenant a would use too much; GPU 1 is cordoned (1.0GiB free); node n2 is lost (no "
        "heartbeat for 7 s); timeslice: full, looked further; no free MIG instance fits"
    )


def test_an_autoscaled_replica_waits_saying_why_it_evicts_no_one() -> None:
    from dataclasses import replace

    from gpufrac.model.deployment import LABEL

    s = Scheduler(fleet(plain=1), OperatorSettings())
    low = replace(w("low", tenant="search", count=1), priority=0)
    assert s.submit(low)[0].outcome == "placed"
    replica = replace(
        w("summer-abc-2", tenant="search", count=1),
        priority=100,
        preemption="never",
        labels={LABEL: "summer"},
    )
    d = s.submit(replica)[0]
    assert d.outcome == "pending"
    assert "beyond autoscale.min_replicas" in d.reason, d.reason
    plain = replace(replica, name="plain", labels={})
    assert "it evicts no one (preemption: never)" in s.submit(plain)[0].reason
