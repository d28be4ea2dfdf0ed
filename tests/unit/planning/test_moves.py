"""Moves that make room (planning/moves.py, ``Scheduler.plan_moves``): a replica is replaced off a
fragmented MIG GPU, a movable service restarted, a job never moved; the GPU is kept for the waiting
request meanwhile; the budget holds; a plan that does not finish is given up."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpufrac.errors import InputError
from gpufrac.model.catalog import lookup_model
from gpufrac.model.deployment import LABEL
from gpufrac.model.manifest import parse_manifests
from gpufrac.model.mig import MigPlacement
from gpufrac.model.settings import OperatorSettings, TenantQuota
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.moves import MoveBudget
from gpufrac.planning.sched_decision import decision_from_json, decision_to_json
from gpufrac.planning.sched_state import SchedGpu
from gpufrac.planning.scheduler import Decision, Scheduler

H100 = lookup_model("h100")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fleet(n: int) -> list[SchedGpu]:
    return [SchedGpu(f"GPU-{i}", i, H100, mig=True) for i in range(n)]


def replica(name: str, tenant: str = "a") -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        tenant=tenant,
        gpu=GpuRequest(mig_profile="1g.10gb"),
        command=("serve",),
        type="service",
        labels={LABEL: name.rsplit("-", 1)[0]},
    )


def job(name: str, profile: str = "1g.10gb", tenant: str = "a", **kw: Any) -> WorkloadSpec:
    return WorkloadSpec(
        name=name, tenant=tenant, gpu=GpuRequest(mig_profile=profile), command=("x",), **kw
    )


def at(s: Scheduler, spec: WorkloadSpec, gpu: int, start: int, profile: str = "1g.10gb") -> None:
    """Put ``spec`` on GPU ``gpu``'s instance at ``start`` (as an agent restores a placement)."""
    s.restore(
        spec,
        Decision(
            f"{spec.tenant}/{spec.name}",
            "placed",
            mode="mig",
            gpus=(f"GPU-{gpu}",),
            mig=MigPlacement(start, profile),
        ),
    )
    assert s.allocations(f"{spec.tenant}/{spec.name}"), "restored where asked"


def fragmented(
    settings: OperatorSettings | None = None, first: WorkloadSpec | None = None
) -> tuple[Scheduler, Clock]:
    """GPU 0: a replica (or ``first``) on a 1g.10gb; GPU 1: a job on a 1g.10gb, room for more.
    A 7g.80gb fits neither."""
    clock = Clock()
    s = Scheduler(fleet(2), settings or OperatorSettings(), clock=clock)
    at(s, first or replica("web-0"), 0, 6)
    at(s, job("train"), 1, 6)
    return s, clock


def test_a_replica_in_the_way_is_replaced_elsewhere_and_the_request_placed_once_it_goes() -> None:
    s, _ = fragmented()
    decisions = s.submit(job("big", "7g.80gb"))
    big = decisions[0]
    assert big.outcome == "pending"
    assert [(m.workload, m.gpu, m.how, m.cause) for m in big.moves] == [
        ("a/web-0", "GPU-0", "replace", "a/big")
    ]
    assert big.reason == (
        "waiting for 1 move(s) that make room for a 7g.80gb on GPU 0: 1 replica(s) replaced "
        "first, then drained"
    )  # counted, not named: the movers may be another tenant's
    assert list(s.moving) == ["a/web-0"]
    # the replacement lands off the GPU kept for the request, though it has room
    repl = s.submit(replica("web-1"))[0]
    assert repl.outcome == "placed" and repl.gpus == ("GPU-1",)
    # another small request keeps off it too
    other = s.submit(job("small", tenant="b"))[0]
    assert other.outcome == "placed" and other.gpus == ("GPU-1",)
    # the replica drained and deleted: the request is placed by a re-cut there
    after = s.delete("a", "web-0")
    placed = next(d for d in after if d.workload == "a/big")
    assert placed.outcome == "placed" and placed.gpus == ("GPU-0",)
    kinds = [a.kind for a in placed.actions]
    assert kinds == ["destroy_mig_instance", "create_mig_instance", "start"]
    assert s.moving == {}
    # a record of the decision with its moves reads back the same
    assert decision_from_json(decision_to_json(big)) == big


def test_a_job_is_never_moved() -> None:
    s, _ = fragmented(first=job("eval"))
    big = s.submit(job("big", "7g.80gb"))[0]
    assert big.outcome == "pending" and big.moves == ()
    assert s.moving == {}
    assert s.plan_moves() == []


def test_moves_off_when_the_operator_says_so() -> None:
    s, _ = fragmented(OperatorSettings(mig_moves=False))
    big = s.submit(job("big", "7g.80gb"))[0]
    assert big.outcome == "pending" and big.moves == ()


def test_a_movable_service_is_restarted_elsewhere_and_the_request_placed_at_once() -> None:
    svc = job("api", type="service", movable=True)
    s, _ = fragmented(first=svc)
    decisions = s.submit(job("big", "7g.80gb"))
    big = decisions[0]
    assert big.outcome == "placed" and big.gpus == ("GPU-0",)
    assert big.evicted == ("a/api",)
    assert [m.how for m in big.moves] == ["restart"]
    assert (
        big.actions[0].kind == "evict" and "moved to make room for a/big" in big.actions[0].reason
    )
    moved = next(d for d in decisions if d.workload == "a/api")
    assert moved.outcome == "placed" and moved.gpus == ("GPU-1",) and moved.cause == "a/big"


def test_a_movable_service_of_higher_priority_is_not_restarted_for_a_lower_request() -> None:
    s, _ = fragmented(first=job("api", type="service", movable=True, priority=100))
    big = s.submit(job("big", "7g.80gb", priority=50))[0]
    assert big.outcome == "pending" and big.moves == ()


def test_no_move_where_the_mover_has_no_room_elsewhere() -> None:
    clock = Clock()
    s = Scheduler(fleet(2), OperatorSettings(), clock=clock)
    at(s, replica("web-0"), 0, 6)
    s.submit(job("full", "7g.80gb"))  # GPU 1 whole: the replacement would have nowhere to go
    big = s.submit(job("big", "7g.80gb"))[0]
    assert big.outcome == "pending" and big.moves == ()
    assert s.moving == {}


def test_the_budget_per_minute_holds_and_a_request_refused_for_it_gets_its_moves_later() -> None:
    clock = Clock()
    s = Scheduler(fleet(3), OperatorSettings(max_moves_per_minute=1), clock=clock)
    at(s, replica("web-0"), 0, 6)
    at(s, replica("api-0"), 1, 6)
    at(s, job("train"), 2, 6)
    first = s.submit(job("big", "7g.80gb"))[0]
    second = s.submit(job("big2", "7g.80gb"))[0]
    assert len(first.moves) == 1 and second.moves == ()
    assert s.plan_moves() == []  # still within the minute
    clock.now += 61
    later = s.plan_moves()
    assert [(d.workload, [m.workload for m in d.moves]) for d in later] == [("a/big2", ["a/api-0"])]


def test_the_budget_per_workload_counts_a_deployments_replicas_together() -> None:
    budget = MoveBudget(100, 2, Clock())
    budget.spend("b", ["a/web", "a/web"])
    why = budget.refusal("b", ["a/web"]) or ""
    assert "work in the way was moved 2 time(s) in the last hour" in why
    assert "a/web" not in why  # the reason reaches the requester: no other tenant's name
    assert budget.refusal("b", ["a/api"]) is None
    budget.clock.now += 3601  # type: ignore[attr-defined]
    assert budget.refusal("b", ["a/web"]) is None


def test_the_budget_per_minute_is_each_tenants_own() -> None:
    budget = MoveBudget(2, 100, Clock())
    budget.spend("b", ["x/one", "x/two"])
    assert "tenant b's requests" in (budget.refusal("b", ["x/three"]) or "")
    assert budget.refusal("a", ["x/three"]) is None  # b's moves do not use up a's


def test_a_plan_that_does_not_finish_is_given_up_and_its_gpu_no_longer_kept() -> None:
    s, clock = fragmented()
    assert s.submit(job("big", "7g.80gb"))[0].moves
    clock.now += 601
    given_up = s.plan_moves()
    assert given_up[0].workload == "a/big" and "given up" in given_up[0].reason
    assert s.moving == {}
    # GPU 0 takes other work again
    assert s.submit(job("small", "4g.40gb"))[0].gpus == ("GPU-0",)


def test_a_request_placed_otherwise_ends_its_moves() -> None:
    s, _ = fragmented()
    assert s.submit(job("big", "7g.80gb"))[0].moves
    s.delete("a", "train")  # GPU 1 empties: the request takes it
    assert s.moving == {}
    assert s.allocations("a/big")[0].gpu == 1


def test_a_deleted_request_ends_its_moves() -> None:
    s, _ = fragmented()
    assert s.submit(job("big", "7g.80gb"))[0].moves
    s.delete("a", "big")
    assert s.moving == {}


def test_spec_movable_is_for_services_only() -> None:
    doc = """
apiVersion: gpufrac/v1
kind: Workload
metadata: {name: j}
spec:
  command: [x]
  movable: true
  resources: {gpu: {mig: 1g.10gb}}
"""
    with pytest.raises(InputError) as e:
        parse_manifests(doc)
    assert "movable" in str(e.value) and "type: service" in str(e.value)
    ok = parse_manifests(doc.replace("movable: true", "movable: true\n  type: service"))
    assert ok[0].movable


def test_the_reason_says_why_no_move_makes_room() -> None:
    s, _ = fragmented(first=job("eval"))  # a job in the way
    big = s.submit(job("big", "7g.80gb"))[0]
    assert "moving what is in the way on GPU 0 would make room, but it may not move" in big.reason
    assert "eval" not in big.reason and "train" not in big.reason  # counted, never named
    off, _ = fragmented(OperatorSettings(mig_moves=False))
    reason = off.submit(job("big", "7g.80gb"))[0].reason
    assert "moves are off (mig_moves: false in gpufrac.yaml)" in reason
    held, _ = fragmented(OperatorSettings(max_moves_per_minute=0))
    reason = held.submit(job("big", "7g.80gb"))[0].reason
    assert "held back for now" in reason and "max_moves_per_minute in gpufrac.yaml" in reason


def test_a_move_is_tried_before_anyone_is_evicted() -> None:
    """With ``drain`` the request could evict the low-priority job on GPU 1; moving the replica
    off GPU 0 loses nothing, so that is done instead."""
    clock = Clock()
    s = Scheduler(fleet(2), OperatorSettings(mig_reconfigure="drain"), clock=clock)
    at(s, replica("web-0"), 0, 6)
    at(s, job("train", priority=0), 1, 6)
    big = s.submit(job("big", "7g.80gb", priority=100))[0]
    assert big.outcome == "pending" and big.evicted == ()
    assert [m.workload for m in big.moves] == ["a/web-0"]
    assert s.allocations("a/train"), "the job still runs"


def test_with_replicas_and_a_service_in_the_way_the_service_restarts_only_after_the_replicas() -> (
    None
):
    clock = Clock()
    s = Scheduler(fleet(2), OperatorSettings(), clock=clock)
    at(s, replica("web-0"), 0, 6)
    at(s, job("api", type="service", movable=True), 0, 5)
    at(s, job("train"), 1, 6)
    big = s.submit(job("big", "7g.80gb"))[0]
    assert sorted(m.how for m in big.moves) == ["replace", "restart"]
    assert big.evicted == () and "once the replicas are gone" in big.reason
    assert s.allocations("a/api")[0].gpu == 0, "not restarted yet"
    s.submit(replica("web-1"))
    s.delete("a", "web-0")
    assert s.allocations("a/api")[0].gpu == 0 and not s.allocations("a/big")
    then = s.plan_moves()  # the next pass: the service's turn, and the request's
    placed = then[0]
    assert placed.workload == "a/big" and placed.outcome == "placed" and placed.gpus == ("GPU-0",)
    assert placed.evicted == ("a/api",) and len(placed.moves) == 2
    assert next(d for d in then if d.workload == "a/api").gpus == ("GPU-1",)


def test_a_request_deleted_before_the_replicas_went_restarts_no_service() -> None:
    clock = Clock()
    s = Scheduler(fleet(2), OperatorSettings(), clock=clock)
    at(s, replica("web-0"), 0, 6)
    at(s, job("api", type="service", movable=True), 0, 5)
    at(s, job("train"), 1, 6)
    assert s.submit(job("big", "7g.80gb"))[0].moves
    s.delete("a", "big")
    assert s.plan_moves() == [] and s.allocations("a/api")[0].gpu == 0


def test_the_placed_request_keeps_the_moves_that_made_room() -> None:
    s, _ = fragmented()
    s.submit(job("big", "7g.80gb"))
    s.submit(replica("web-1"))
    placed = next(d for d in s.delete("a", "web-0") if d.workload == "a/big")
    assert [m.workload for m in placed.moves] == ["a/web-0"]


# -- from the hostile review -----------------------------------------------------------------------


def test_a_job_with_the_deployment_label_is_no_replica_and_the_label_is_refused() -> None:
    s, _ = fragmented(first=job("fake-0", labels={LABEL: "fake"}))
    big = s.submit(job("big", "7g.80gb"))[0]
    assert big.moves == () and "may not move" in big.reason
    doc = """
apiVersion: gpufrac/v1
kind: Workload
metadata: {name: j, labels: {gpufrac.io/deployment: fake}}
spec: {command: [x], resources: {gpu: {mig: 1g.10gb}}}
"""
    with pytest.raises(InputError) as e:
        parse_manifests(doc)
    assert "metadata.labels['gpufrac.io/deployment']" in str(e.value)


def test_a_dropped_plans_gpu_goes_to_what_waited_for_it() -> None:
    s, _ = fragmented()
    at(s, job("block"), 1, 0)  # no 4g.40gb on GPU 1
    assert s.submit(job("big", "7g.80gb"))[0].moves
    held = s.submit(job("mid", "4g.40gb"))[0]  # GPU 0 has room, but it is kept
    assert held.outcome == "pending"
    s.delete("a", "big")  # the plan ends: GPU 0 is no longer kept
    placed = [d for d in s.plan_moves() if d.outcome == "placed"]
    assert [(d.workload, d.gpus) for d in placed] == [("a/mid", ("GPU-0",))]


def test_requests_no_move_helps_do_not_keep_others_from_moves() -> None:
    s, _ = fragmented()
    for i in range(20):  # ahead in the queue, each its own shape: a node selector no node has
        s.submit(job(f"lost{i}", "7g.80gb", node_selector={"zone": f"z{i}"}))
    at(s, job("fill"), 1, 0)  # GPU 1 full: the replica has nowhere to go ...
    at(s, job("fill2"), 1, 1)
    at(s, job("fill3", "2g.20gb"), 1, 2, "2g.20gb")
    at(s, job("fill4", "2g.20gb"), 1, 4, "2g.20gb")
    big = s.submit(job("big", "7g.80gb"))[0]
    assert big.moves == () and "no room elsewhere now" in big.reason
    for name in ("fill", "fill2", "fill3", "fill4"):  # ... until now: the next pass moves it
        s.delete("a", name)
    begun = [d for _ in range(2) for d in s.plan_moves() if d.moves]
    assert [d.workload for d in begun] == ["a/big"]


def test_another_tenants_service_is_restarted_only_where_its_tenant_may_evict_theirs() -> None:
    own = OperatorSettings(tenants={"b": TenantQuota(preemption="own-tenant")})
    s, _ = fragmented(own, first=job("api", type="service", movable=True))
    big = s.submit(job("big", "7g.80gb", tenant="b"))[0]
    assert big.moves == () and big.outcome == "pending"
    open_ = OperatorSettings(tenants={"b": TenantQuota(preemption="lower-priority")})
    s, _ = fragmented(open_, first=job("api", type="service", movable=True))
    assert s.submit(job("big", "7g.80gb", tenant="b"))[0].outcome == "placed"


def test_another_tenants_replica_of_higher_priority_is_not_moved_for_a_lower_request() -> None:
    high = replace(replica("web-0"), priority=100)
    s, _ = fragmented(first=high)
    assert s.submit(job("big", "7g.80gb", tenant="b", priority=50))[0].moves == ()
    s, _ = fragmented(first=high)  # its own tenant's may
    assert s.submit(job("big", "7g.80gb", priority=50))[0].moves


def test_a_higher_priority_request_takes_a_gpu_kept_for_a_lower_one() -> None:
    s, _ = fragmented()
    assert s.submit(job("big", "7g.80gb", priority=0))[0].moves
    urgent = s.submit(job("urgent", "4g.40gb", priority=100))[0]
    assert urgent.outcome == "placed" and urgent.gpus == ("GPU-0",)
    assert s.moving == {}  # the plan is over: its GPU was taken


def test_a_movable_service_may_not_say_restart_never() -> None:
    doc = """
apiVersion: gpufrac/v1
kind: Workload
metadata: {name: s}
spec:
  type: service
  movable: true
  restart: never
  command: [x]
  resources: {gpu: {mig: 1g.10gb}}
"""
    with pytest.raises(InputError) as e:
        parse_manifests(doc)
    assert "spec.movable" in str(e.value) and "restart: never" in str(e.value)


# -- from the second hostile review ----------------------------------------------------------------


def test_a_plan_outrun_by_a_higher_request_retries_what_waited_and_its_own_request() -> None:
    clock = Clock()
    s = Scheduler(fleet(3), OperatorSettings(), clock=clock)
    at(s, replica("web-0"), 0, 6)
    at(s, job("full", "7g.80gb", tenant="c"), 1, 0, "7g.80gb")
    at(s, job("g2a", "4g.40gb", tenant="c"), 2, 0, "4g.40gb")
    at(s, job("g2b", "2g.20gb", tenant="c"), 2, 4, "2g.20gb")
    assert s.submit(job("big", "7g.80gb"))[0].moves
    assert s.submit(job("small", "2g.20gb", tenant="b"))[0].outcome == "pending"  # GPU 0 kept
    hi = s.submit(job("hi", "2g.20gb", tenant="c", priority=60))[0]
    assert hi.gpus == ("GPU-0",)  # the plan is over
    after = {d.workload: d for d in s.plan_moves()}
    assert after["b/small"].outcome == "placed" and after["b/small"].gpus == ("GPU-0",)
    assert "waiting for 1 move(s)" not in (s.pending.get("a/big") or "")


def test_another_tenant_cannot_spend_a_deployments_hourly_moves_for_its_owner() -> None:
    clock = Clock()
    s = Scheduler(fleet(3), OperatorSettings(), clock=clock)
    at(s, replica("web-0", "b"), 0, 6)
    at(s, job("t1", tenant="c"), 1, 6)
    at(s, job("t2", tenant="c"), 2, 6)
    for i in range(2):  # a begins a move of b's replica and withdraws, twice
        assert s.submit(job(f"grief{i}", "7g.80gb", tenant="a"))[0].moves
        s.delete("a", f"grief{i}")
        s.plan_moves()
        clock.now += 5
    assert s.submit(job("grief2", "7g.80gb", tenant="a"))[0].moves == ()  # a's two are spent
    s.delete("a", "grief2")
    assert s.submit(job("own", "7g.80gb", tenant="b"))[0].moves  # b's own are not


def test_a_service_whose_priority_rose_meanwhile_is_not_restarted_and_the_plan_ends() -> None:
    clock = Clock()
    st = OperatorSettings(tenants={"a": TenantQuota(preemption="lower-priority")})
    s = Scheduler(fleet(2), st, clock=clock)
    at(s, replica("web-0"), 0, 6)
    api = job("api", tenant="b", type="service", movable=True)
    at(s, api, 0, 5)
    at(s, job("train", tenant="c"), 1, 6)
    assert len(s.submit(job("big", "7g.80gb"))[0].moves) == 2
    s.update_live(replace(api, priority=90))
    s.submit(replica("web-1"))
    s.delete("a", "web-0")
    after = s.plan_moves()
    assert all("b/api" not in d.evicted for d in after)
    assert s.allocations("b/api")[0].gpu == 0 and s.moves_of("a/big") == ()


def test_a_replacement_of_higher_priority_still_goes_off_the_gpu_being_emptied() -> None:
    s = Scheduler(fleet(2), OperatorSettings(), clock=Clock())
    at(s, replace(replica("web-0"), priority=90), 0, 6)
    at(s, job("full", "7g.80gb", tenant="c"), 1, 0, "7g.80gb")
    # the only room for a replacement is GPU 0 itself: no move is begun
    big = s.submit(job("big", "7g.80gb", priority=10))[0]
    assert big.moves == () and s.move_budget.begun == 0
    s = Scheduler(fleet(2), OperatorSettings(), clock=Clock())
    at(s, replace(replica("web-0"), priority=90), 0, 6)
    at(s, job("half", "4g.40gb", tenant="c"), 1, 0, "4g.40gb")  # room for a 1g on GPU 1
    assert s.submit(job("big", "7g.80gb", priority=10))[0].moves
    repl = s.submit(replace(replica("web-1"), priority=90))[0]
    assert repl.gpus == ("GPU-1",)  # not back onto GPU 0, which it outranks the request for
    assert s.moves_of("a/big")


def test_a_request_of_another_name_gets_no_new_moves_on_a_gpu_where_its_tenants_timed_out() -> None:
    clock = Clock()
    s = Scheduler(fleet(2), OperatorSettings(), clock=clock)
    at(s, replica("web-0"), 0, 6)
    at(s, job("train", tenant="c"), 1, 6)
    assert s.submit(job("big1", "7g.80gb"))[0].moves
    s.submit(replica("web-1"))  # a replacement that never becomes ready
    clock.now += 601
    s.plan_moves()  # given up
    s.delete("a", "web-1")
    s.delete("a", "big1")
    again = s.submit(job("big2", "7g.80gb"))[0]
    assert again.moves == () and "none are begun there again for as long" in again.reason


def test_a_replacement_that_finds_no_room_moves_nothing_in_turn() -> None:
    def wide(name: str) -> WorkloadSpec:
        return replace(replica(name), gpu=GpuRequest(mig_profile="2g.20gb"))

    s = Scheduler(fleet(4), OperatorSettings(), clock=Clock())
    at(s, wide("web-0"), 0, 0, "2g.20gb")
    at(s, job("c1", "2g.20gb", tenant="c"), 1, 0, "2g.20gb")  # GPU 1: a 2g only where api-0 is
    at(s, replica("api-0"), 1, 2)
    at(s, job("c2", "2g.20gb", tenant="c"), 1, 4, "2g.20gb")
    at(s, job("c3", tenant="c"), 1, 6)
    at(s, job("train", tenant="c"), 2, 6)  # GPU 2: room for one 2g
    at(s, job("fill", "4g.40gb", tenant="c"), 2, 0, "4g.40gb")
    at(s, job("c4", "4g.40gb", tenant="c"), 3, 0, "4g.40gb")  # GPU 3: room for one 1g
    at(s, job("c5", "2g.20gb", tenant="c"), 3, 4, "2g.20gb")
    assert [m.workload for m in s.submit(job("big", "7g.80gb"))[0].moves] == ["a/web-0"]
    # the room the trial found for web-0's replacement is taken before it is submitted
    at(s, job("late", "2g.20gb", tenant="c"), 2, 4, "2g.20gb")
    repl = s.submit(wide("web-1"))[0]
    assert repl.outcome == "pending" and repl.moves == ()  # api-0 is not moved for it
    assert list(s.moving) == ["a/web-0"] and s.move_budget.begun == 1
