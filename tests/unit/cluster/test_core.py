"""The control plane's core: placement over nodes, leases, epochs, and what happens to a lost
node's work. Table tests, then a Hypothesis simulation of nodes that vanish and return: no workload
ever runs on two nodes at once, and the scheduler's books stay right."""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrac.cluster.core import FENCE_S, LEASE_S, Answer, ClusterCore, Report
from gpufrac.model.catalog import lookup_model
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.sched_state import SchedGpu

H200 = lookup_model("h200")
GIB = 1024
SERIAL = itertools.count()


def gpus(n: int, mig: bool = False) -> list[SchedGpu]:
    return [SchedGpu(f"GPU-{next(SERIAL)}", 0, H200, mig=mig) for _ in range(n)]


def core_with(*nodes: tuple[str, int], now: float = 0.0) -> ClusterCore:
    core = ClusterCore()
    for name, n in nodes:
        core.join(name, {"name": name}, gpus(n), now)
    return core


def w(name: str, *, priority: int = 50, restart: str = "on-failure", **gpu: object) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        gpu=GpuRequest(**gpu),  # type: ignore[arg-type]
        command=("true",),
        tenant="a",
        priority=priority,
        restart=restart,  # type: ignore[arg-type]
    )


def running(answer: Answer) -> dict[str, int]:
    return {a.workload: a.epoch for a in answer.run}


def test_placements_spread_over_nodes_each_under_its_own_epoch() -> None:
    core = core_with(("n1", 1), ("n2", 1))
    d1 = core.decide(w("x", count=1))
    d2 = core.decide(w("y", count=1))
    assert d1.outcome == d2.outcome == "placed"
    a1, a2 = core.assigned["a/x"], core.assigned["a/y"]
    assert {a1.node, a2.node} == {"n1", "n2"} and a2.epoch > a1.epoch
    assert running(core.heartbeat(a1.node, Report(), 1.0)) == {"a/x": a1.epoch}
    assert core.decide(w("x", count=1)) == d1  # the same spec again changes nothing
    assert core.assigned["a/x"].epoch == a1.epoch
    assert core.decide(w("z", count=1)).outcome == "pending"


def test_an_ended_job_frees_its_gpu_for_what_waits() -> None:
    core = core_with(("n1", 1))
    core.decide(w("first", count=1))
    assert core.decide(w("second", count=1)).outcome == "pending"
    epoch = core.assigned["a/first"].epoch
    stale = core.heartbeat("n1", Report(ended={"a/first": (epoch - 1, "succeeded")}), 1.0)
    assert running(stale) == {"a/first": epoch}  # an end under an old epoch changes nothing
    answer = core.heartbeat("n1", Report(ended={"a/first": (epoch, "succeeded")}), 2.0)
    assert list(running(answer)) == ["a/second"]
    assert core.ended == {"a/first": "succeeded"}
    assert core.decide(w("first", count=1)).reason == "it ended (succeeded)"  # not run again


def test_a_lost_nodes_work_moves_after_its_lease_and_a_job_that_may_not_restart_fails() -> None:
    core = core_with(("n1", 2), ("n2", 1))
    for name in ("svc", "once"):
        assert core.decide(w(name, count=1, restart="never" if name == "once" else "always"))
    core.decide(w("filler", count=1))
    on = {k: a.node for k, a in core.assigned.items()}
    lost = on["a/svc"]
    survivor = "n2" if lost == "n1" else "n1"
    core.heartbeat(survivor, Report(), LEASE_S)
    assert core.tick(LEASE_S) == []  # a lease that has just run out is not yet over
    moved = {m.workload: m for m in core.tick(LEASE_S + 0.5)}
    assert core.nodes[lost].state == "lost"
    assert all(a.node == survivor for a in core.assigned.values())
    if on["a/once"] == lost:
        assert core.ended["a/once"] == "failed" and "restart: never" in moved["a/once"].reason
    for m in moved.values():
        assert m.lost == lost and (m.to == survivor or m.to is None)
    # the lost node, heard again, is told to run nothing until it joins again
    assert core.heartbeat(lost, Report(running=dict.fromkeys(on, 1)), LEASE_S + 1).run == ()
    assert not core.scheduler.state.violations(False, {})


def test_a_returning_node_takes_work_again_and_never_gets_its_old_epochs_back() -> None:
    core = core_with(("n1", 1), ("n2", 1))
    core.decide(w("x", count=1))
    first = core.assigned["a/x"]
    other = "n2" if first.node == "n1" else "n1"
    core.heartbeat(other, Report(), LEASE_S)
    core.tick(LEASE_S + 1)
    moved = core.assigned["a/x"]
    assert moved.node == other and moved.epoch > first.epoch
    core.decide(w("y", count=1))
    assert core.decision("a/y").outcome == "pending"  # the lost node's GPU takes nothing
    again = [
        SchedGpu(g.uuid.split("/", 1)[1], 0, H200, mig=False)
        for g in core.scheduler.state.gpus
        if g.node == first.node
    ]  # the same GPUs as when it joined
    decided = core.join(first.node, {"name": first.node}, again, LEASE_S + 2)
    assert [d.workload for d in decided] == ["a/y"]
    answer = core.heartbeat(first.node, Report(running={"a/x": first.epoch}), LEASE_S + 2)
    assert running(answer) == {"a/y": core.assigned["a/y"].epoch}  # a/x is not its to run


def test_a_workload_taken_from_a_live_node_starts_elsewhere_only_once_that_node_let_it_go() -> None:
    core = core_with(("n1", 1), ("n2", 1))
    core.decide(dataclasses.replace(w("x", count=1), node_selector={"name": "n1"}))
    old = core.assigned["a/x"]
    assert old.node == "n1"
    core.heartbeat("n1", Report(running={"a/x": old.epoch}), 1.0)
    core.decide(dataclasses.replace(w("x", count=1), node_selector={"name": "n2"}))  # replaced
    new = core.assigned["a/x"]
    assert (new.node, new.epoch > old.epoch) == ("n2", True)
    # n1 still runs the old copy: n2 is not told to start it, n1 is told to stop it
    assert "a/x" not in running(core.heartbeat("n2", Report(), 1.5))
    assert "a/x" not in running(core.heartbeat("n1", Report(running={"a/x": old.epoch}), 2.0))
    assert "a/x" not in running(core.heartbeat("n2", Report(), 2.5))
    core.heartbeat("n1", Report(), 3.0)  # now it is gone there
    assert running(core.heartbeat("n2", Report(), 3.5)) == {"a/x": new.epoch}


def test_preemption_across_nodes_takes_the_victims_assignment_away() -> None:
    core = core_with(("n1", 1))
    core.decide(w("low", priority=0, count=1))
    d = core.decide(w("high", priority=100, count=1))
    assert d.outcome == "placed" and d.evicted == ("a/low",)
    assert running(core.heartbeat("n1", Report(), 1.0)) == {"a/high": core.assigned["a/high"].epoch}


def test_a_restarted_core_restores_placements_and_epochs_and_moves_nothing() -> None:
    core = core_with(("n1", 2), ("n2", 2))
    for i in range(3):
        core.decide(w(f"w{i}", memory_mib=100 * GIB))
    before = dict(core.assigned)
    again = ClusterCore()
    for name, node in core.nodes.items():
        fresh = [dataclasses.replace(core.scheduler.state.gpus[i]) for i in node.gpus]
        for g in fresh:  # as the node reports them: by UUID alone, nothing placed
            g.uuid = g.uuid.split("/", 1)[1]
            g.allocs, g.mode, g.mem_used, g.milli_used = {}, None, 0, 0
            g.tenants.clear()
        again.join(name, node.labels, fresh, 100.0)
    for a in before.values():
        again.restore(a.spec, a.decision, a.node, a.epoch)
    again.renew_all(100.0)
    assert again.assigned == before
    assert again.tick(100.0 + LEASE_S) == []
    new = again.decide(w("later", memory_mib=100 * GIB))
    assert new.outcome == "placed"
    assert again.assigned["a/later"].epoch > max(a.epoch for a in before.values())


# -- nodes that vanish and return -------------------------------------------------------------

STEP = 0.5
Op = st.one_of(
    st.tuples(st.just("apply"), st.integers(0, 5), st.sampled_from([1, 2]), st.integers(0, 2)),
    st.tuples(st.just("delete"), st.integers(0, 5), st.just(0), st.just(0)),
    st.tuples(st.just("cut"), st.integers(0, 2), st.just(0), st.just(0)),  # a node falls silent
    st.tuples(st.just("heal"), st.integers(0, 2), st.just(0), st.just(0)),
    st.tuples(st.just("wait"), st.integers(1, 20), st.just(0), st.just(0)),
)


class SimNode:
    """A node agent as ``NodeAgent`` behaves: it runs what the last answer said, and once it has
    gone ``FENCE_S`` without an answer it stops everything."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.runs: dict[str, int] = {}
        self.answered = 0.0
        self.silent = False

    def step(self, core: ClusterCore, now: float) -> None:
        if not self.silent:
            if core.nodes[self.name].state == "lost":  # back, with the GPUs it had
                st = core.scheduler.state
                had = [st.gpus[gi] for gi in core.nodes[self.name].gpus]
                again = [SchedGpu(g.uuid.split("/", 1)[1], 0, H200, mig=False) for g in had]
                core.join(self.name, dict(core.nodes[self.name].labels), again, now)
            answer = core.heartbeat(self.name, Report(running=dict(self.runs)), now)
            self.answered = now
            self.runs = running(answer)
        elif now - self.answered >= FENCE_S:
            self.runs = {}


@settings(max_examples=300, deadline=None)
@given(st.lists(Op, min_size=1, max_size=40))
def test_no_workload_ever_runs_on_two_nodes(ops: list[tuple[str, int, int, int]]) -> None:
    core = ClusterCore()
    nodes = [SimNode(f"n{i}") for i in range(3)]
    for n in nodes:
        core.join(n.name, {}, gpus(2), 0.0)
    for i in range(3):  # work on every node from the start
        core.decide(w(f"w{i}", count=2))
    now = 0.0

    def advance(steps: int) -> None:
        nonlocal now
        for _ in range(steps):
            now += STEP
            for n in nodes:
                n.step(core, now)
            core.tick(now)
            holders: dict[str, list[str]] = {}
            for n in nodes:
                for key in n.runs:
                    holders.setdefault(key, []).append(n.name)
            twice = {k: v for k, v in holders.items() if len(v) > 1}
            assert not twice, f"at {now}: {twice}"
            for a in core.assigned.values():
                assert core.nodes[a.node].state == "alive"
            assert not core.scheduler.state.violations(False, {})

    for kind, i, count, prio in ops:
        match kind:
            case "apply":
                core.decide(w(f"w{i}", priority=prio * 50, count=count))
            case "delete":
                core.delete("a", f"w{i}")
            case "cut":
                nodes[i].silent = True
            case "heal":
                nodes[i].silent = False
            case "wait":
                advance(i)
        advance(1)


def test_a_node_joins_again_with_the_gpus_it_had_and_its_labels_as_they_are_now() -> None:
    core = core_with(("n1", 1))
    same = [
        SchedGpu(g.uuid.split("/", 1)[1], 0, H200, mig=False) for g in core.scheduler.state.gpus
    ]
    core.join("n1", {"zone": "eu"}, same, 1.0)  # relabelled: new placements see the new labels
    assert core.nodes["n1"].labels == {"zone": "eu"}
    assert core.scheduler.state.gpus[0].node_labels == {"zone": "eu"}
    placed = core.decide(dataclasses.replace(w("x", count=1), node_selector={"zone": "eu"}))
    assert placed.outcome == "placed"
    try:
        core.join("n1", {"zone": "eu"}, gpus(2), 2.0)  # other GPUs under the same name
    except ValueError as e:
        assert "joined before with other GPUs" in str(e)
    else:
        raise AssertionError("a node's GPUs changed under its name")
    assert len(core.scheduler.state.gpus) == 1 and core.assigned["a/x"].node == "n1"


def test_a_workload_waiting_for_its_labelled_node_says_that_node_takes_no_new_work() -> None:
    core = ClusterCore()
    core.join("n1", {"kind": "mps"}, gpus(1), 0.0)
    core.join("n2", {"kind": "timeslice"}, gpus(1), 0.0)
    core.cordon(f"n1/{core.scheduler.state.gpus[0].uuid.split('/', 1)[1]}", "maintenance")
    d = core.decide(dataclasses.replace(w("x", memory_mib=GIB), node_selector={"kind": "mps"}))
    assert d.outcome == "pending"
    assert "nodes with its spec.node_selector labels: n1 (takes no new work)" in d.reason, d.reason


def test_a_workload_that_only_a_lost_node_could_hold_says_the_node_is_lost() -> None:
    core = ClusterCore()
    for name in ("n1", "n2"):
        core.join(name, {}, [SchedGpu(f"GPU-{name}", 0, H200, mig=False)], 0.0)
    assert core.decide(w("busy", count=1)).outcome == "placed"
    busy_on, epoch = core.assigned["a/busy"].node, core.assigned["a/busy"].epoch
    lost = "n2" if busy_on == "n1" else "n1"
    core.heartbeat(busy_on, Report(running={"a/busy": epoch}), 12.0)
    core.tick(12.0)  # the other node, silent since 0.0, is lost
    assert core.nodes[lost].state == "lost"
    d = core.decide(w("x", count=1))
    assert d.outcome == "pending"
    assert d.reason == (
        f"node {lost} is lost (no heartbeat for 12 s); needs 1 whole GPU(s); 0 free now, not "
        "counting 1 that takes no new work"
    )
    core.heartbeat(busy_on, Report(running={"a/busy": epoch}), 20.0)
    core.tick(20.0)  # still lost: the time without a heartbeat grows
    assert f"node {lost} is lost (no heartbeat for 20 s)" in core.decide(w("y", count=1)).reason
