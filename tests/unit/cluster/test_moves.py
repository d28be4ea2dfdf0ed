"""Moves that make room on a cluster (docs/scheduler.md, "Moves that make room"): the control
plane's tick begins moves for a waiting 7g.80gb that fragmentation keeps out of two nodes' MIG
GPUs; the cluster's deployments replace a replica in the way (a replacement on the other node
first, the old one drained and deleted once it serves), a movable service is restarted on the
other node under a new epoch, a job is never moved; the request is placed by a re-cut on the GPU
freed. Nodes are a test's heartbeats, as in test_control."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufrac.cluster.control import ControlPlane
from gpufrac.cluster.core import Report
from gpufrac.cluster.serving import ClusterServing
from gpufrac.model.catalog import lookup_model
from gpufrac.model.deployment import LABEL
from gpufrac.model.manifest import parse_objects
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.sched_decision import Decision
from gpufrac.planning.sched_state import SchedGpu
from tests.integration.conftest import free_port

H100 = lookup_model("h100")
N1, N2 = "n1/GPU-n1", "n2/GPU-n2"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def mig(name: str, profile: str = "1g.10gb", **kw: object) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        tenant="team",
        gpu=GpuRequest(mig_profile=profile),
        command=("sleep", "600"),
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def control(tmp_path: Path) -> Iterator[ControlPlane]:
    """Two nodes, each with one H100 in MIG mode."""
    control = ControlPlane(tmp_path, clock=Clock())
    for name in ("n1", "n2"):
        gpu = SchedGpu(f"GPU-{name}", 0, H100, mig=True)
        control.admitted_join(name, control.bootstrap(name), {}, [gpu], None)
    yield control
    control.close()


def node_of(control: ControlPlane, key: str) -> str | None:
    a = control.core.assigned.get(key)
    return None if a is None else a.node


def runs(control: ControlPlane, node: str, *running: str) -> set[str]:
    """``node`` calls in, running ``running`` (each under its epoch now, shown running); what it
    must run now."""
    epochs = {k: control.core.assigned[k].epoch for k in running}
    views = {k: {"phase": "running"} for k in running}
    return {a.workload for a in control.heartbeat(node, Report(running=epochs), views).run}


def replicas(control: ControlPlane) -> list[str]:
    """Deployment web's replicas (``team/web-TEMPLATE-INDEX``), by index."""
    keys = [w.key for w in control.store.workloads() if w.name.startswith("web-")]
    return sorted(keys, key=lambda k: int(k.rsplit("-", 1)[1]))


def on(control: ControlPlane, uuid: str, spec: WorkloadSpec) -> int:
    """Place ``spec`` on GPU ``uuid`` alone (the other cordoned meanwhile); its epoch."""
    other = N2 if uuid == N1 else N1
    control.cordon(other)
    result, decision = control.apply_workload(spec)
    control.uncordon(other)
    assert (result, decision.outcome, decision.gpus) == ("created", "placed", (uuid,)), decision
    return control.core.assigned[decision.workload].epoch


def waits_until_the_tick(control: ControlPlane) -> None:
    """The 7g.80gb applied while n2 takes no new work (no room for a mover anywhere: no moves),
    then n2 back: it still fits nowhere, and the next tick finds the moves."""
    control.cordon(N2)
    result, big = control.apply_workload(mig("big", "7g.80gb"))
    assert (result, big.outcome, big.moves) == ("created", "pending", ()), big
    control.uncordon(N2)
    assert control.core.decision("team/big").outcome == "pending"
    assert control.core.decision("team/big").moves == ()


def test_a_replica_in_the_way_is_replaced_on_the_other_node_then_the_request_placed(
    control: ControlPlane,
) -> None:
    serving = ClusterServing(control, gateway_port=free_port())
    try:
        (web,) = parse_objects(
            "apiVersion: gpufrac/v1\nkind: Deployment\nmetadata: {name: web, tenant: team}\n"
            "spec:\n  template:\n    command: [sleep, '600']\n"
            "    resources: {gpu: {mig: 1g.10gb}}\n  replicas: 1\n"
        )
        control.cordon(N2)
        serving.deployments.apply_deployment(web)  # type: ignore[arg-type]
        serving.reconcile()
        control.uncordon(N2)
        (old,) = replicas(control)
        assert node_of(control, old) == "n1"
        assert runs(control, "n1", old) == {old}
        serving.reconcile()  # shown running: it serves
        on(control, N2, mig("train"))
        train = control.core.assigned["team/train"].epoch
        waits_until_the_tick(control)

        control.tick()
        assert list(serving.host.moving()) == [old]
        # its decision says so, as the control plane holds it and as describe reads it
        stored = control.store.placement("team", "big")
        assert stored is not None
        for big in (control.core.decision("team/big"), stored.record):
            assert isinstance(big, Decision) and big.outcome == "pending", big
            assert big.reason.startswith("waiting for 1 move(s) that make room for a 7g.80gb")
            assert [(m.workload, m.gpu, m.how) for m in big.moves] == [(old, N1, "replace")], big

        serving.reconcile()  # a replacement first, on the other node (n1's GPU is kept)
        old_again, new = replicas(control)
        assert old_again == old
        assert node_of(control, new) == "n2"
        assert node_of(control, old) == "n1"  # it serves until the new one does
        kinds = [e.kind for e in control.store.events(old, limit=20)]
        assert "moving" in kinds, kinds
        runs(control, "n2", "team/train", new)
        serving.reconcile()  # the new one ready: the old one out of the gateway, draining
        assert old in serving.deployments.draining
        kinds = [e.kind for e in control.store.events(old, limit=20)]
        assert "moved" in kinds, kinds
        serving.reconcile()  # drained (no request on it): deleted, and the 7g.80gb goes in
        assert replicas(control) == [new]
        placed = control.core.decision("team/big")
        assert (placed.outcome, placed.gpus, node_of(control, "team/big")) == (
            "placed",
            (N1,),
            "n1",
        ), placed
        assert [a.kind for a in placed.actions] == [
            "destroy_mig_instance",
            "create_mig_instance",
            "start",
        ]
        assert serving.host.moving() == {}
        assert runs(control, "n1") == {"team/big"}  # the old replica gone from n1
        # the job beside was never touched
        assert control.core.assigned["team/train"].epoch == train
        assert node_of(control, new) == "n2"
    finally:
        serving.close()


def test_a_movable_service_is_restarted_on_the_other_node_and_the_request_placed_at_once(
    control: ControlPlane,
) -> None:
    api = on(control, N1, mig("api", type="service", movable=True))
    train = on(control, N2, mig("train"))
    assert runs(control, "n1", "team/api") == {"team/api"}
    waits_until_the_tick(control)

    control.tick()
    big = control.core.assigned["team/big"]
    assert (big.node, big.decision.gpus) == ("n1", (N1,))
    assert [(m.workload, m.how) for m in big.decision.moves] == [("team/api", "restart")]
    moved = control.core.assigned["team/api"]
    assert moved.node == "n2" and moved.epoch > api, moved
    assert control.core.assigned["team/train"].epoch == train  # the job stays
    # one copy at a time: n2 starts it once n1 has stopped it
    assert runs(control, "n2", "team/train") == {"team/train"}
    stop = Report(running={"team/api": api})
    assert {a.workload for a in control.heartbeat("n1", stop, {}).run} == {"team/big"}
    assert runs(control, "n1") == {"team/big"}  # it stopped it
    assert runs(control, "n2", "team/train") == {"team/train", "team/api"}
    assert control.status("team/api")[0] == "starting"
    kinds = [e.kind for e in control.store.events("team/api", limit=20)]
    assert "moved" in kinds, kinds


def test_a_job_in_the_way_is_never_moved(control: ControlPlane) -> None:
    before = {"eval": on(control, N1, mig("eval")), "train": on(control, N2, mig("train"))}
    waits_until_the_tick(control)
    for _ in range(2):
        control.tick()
    big = control.core.decision("team/big")
    assert (big.outcome, big.moves) == ("pending", ()), big
    assert control.core.scheduler.moving == {}
    assert {k: control.core.assigned[f"team/{k}"].epoch for k in before} == before


def test_moves_begun_at_apply_are_in_the_requests_stored_decision(control: ControlPlane) -> None:
    """Where the apply itself begins them (room for the mover at once), the decision the control
    plane stores (what describe reads) has them too, not only the apply's answer."""
    on(control, N1, mig("web-0", type="service", labels={LABEL: "web"}))
    on(control, N2, mig("train"))
    result, answered = control.apply_workload(mig("big", "7g.80gb"))
    stored = control.store.placement("team", "big")
    assert result == "created" and stored is not None
    for big in (answered, control.core.decision("team/big"), stored.record):
        assert isinstance(big, Decision) and big.outcome == "pending", big
        assert [(m.workload, m.how) for m in big.moves] == [("team/web-0", "replace")], big
    assert list(control.core.scheduler.moving) == ["team/web-0"]
