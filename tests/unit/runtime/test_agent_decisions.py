"""Decisions carried out by the agent (in-process, real processes, simulated GPUs): MIG changes made
even when their workload goes first, a placement that no longer fits after a restart, and operator
MIG changes that are checked before anything moves."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.devices.simfleet import SimulatedFleet
from gpufrac.errors import InputError
from gpufrac.model.mig import MigPlacement
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.sched_decision import Decision
from gpufrac.runtime.agent import Agent, WorkloadState
from tests.conftest import kill_leftover_runs

PY = sys.executable
FLEET = "h200:1:mig,h200:1"


def mig_job(
    name: str, profile: str, code: str = "import time; time.sleep(60)", **kw: object
) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        gpu=GpuRequest(mig_profile=profile),
        command=(PY, "-c", code),
        **kw,  # type: ignore[arg-type]
    )


def settle(agent: Agent, key: str, phases: set[str], timeout: float = 20.0) -> WorkloadState:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = {s.key: s for s in agent.reconcile()}
        if key in states and states[key].phase in phases:
            return states[key]
        time.sleep(0.05)
    raise AssertionError(f"{key} never reached {phases}: {states.get(key)}")


@pytest.fixture
def dev(data_dir: Path) -> Iterator[NvmlDevices]:
    yield open_simulated(FLEET, data_dir)
    kill_leftover_runs(data_dir)


def test_a_workload_deleted_before_its_instance_is_made_leaves_no_phantom(
    data_dir: Path, dev: NvmlDevices
) -> None:
    agent = Agent(data_dir, dev)
    agent.apply_workload(mig_job("gone", "3g.71gb"))
    agent.delete("default", "gone")  # before any reconcile pass
    agent.apply_workload(mig_job("next", "3g.71gb"))
    state = settle(agent, "default/next", {"running"})
    visible = state.env["CUDA_VISIBLE_DEVICES"]
    assert visible.startswith("MIG-"), state.env
    assert any(i.uuid == visible for i in dev.gpu(state.decision.gpus[0]).instances)  # type: ignore[union-attr]
    agent.close()


def test_a_placement_that_no_longer_fits_after_a_restart_waits_and_changes_nothing(
    data_dir: Path, dev: NvmlDevices
) -> None:
    first = Agent(data_dir, dev)
    d = first.apply_workload(mig_job("big", "7g.141gb"))[1]
    assert d is not None and d.outcome == "placed"
    first.mig.wait_idle(d.gpus[0])
    first.close()
    # meanwhile the 7g went, and something outside gpufrac took a slice of the GPU
    gpu = dev.gpu(d.gpus[0])
    dev.destroy_instance(gpu.uuid, gpu.instances[0].gi_id)
    squat = dev.create_instance(gpu.uuid, "1g.18gb", 0)
    SimulatedFleet.open(FLEET, data_dir).attach_process(
        gpu.uuid, os.getpid(), 10, gi_id=squat.gi_id
    )
    second = Agent(data_dir, open_simulated(FLEET, data_dir))
    placed = second.store.placement("default", "big")
    assert placed is not None and isinstance(placed.record, Decision), placed
    assert placed.record.outcome == "pending", placed
    state = settle(second, "default/big", {"pending"})
    assert state.attempts == 0 and "no longer fits" in placed.record.reason
    assert [str(i.placement) for i in dev.gpu(gpu.uuid).instances] == ["1g.18gb@0"]
    second.close()


def test_an_operator_mig_change_that_is_refused_moves_nothing(
    data_dir: Path, dev: NvmlDevices
) -> None:
    agent = Agent(data_dir, dev)
    agent.apply_workload(mig_job("svc", "1g.18gb", type="service", restart="always"))
    before = settle(agent, "default/svc", {"running"})
    assert before.decision is not None
    bad = [MigPlacement(3, "3g.71gb")]  # no placement of a 3g: bad input, and nothing moved
    with pytest.raises(InputError, match="not valid"):
        agent.set_mig_layout(before.decision.gpus[0], True, bad, drain=True)
    after = settle(agent, "default/svc", {"running"})
    assert after.attempts == 1 and after.decision == before.decision
    assert agent.scheduler.allocations("default/svc")
    agent.close()


def test_a_replica_that_displaces_work_is_told_on_its_deployment_and_by_gpufrac_up(
    data_dir: Path, dev: NvmlDevices, capsys: pytest.CaptureFixture[str]
) -> None:
    """A displacement caused later (the autoscaler's replica, applied by the serving layer) is told
    like an apply's: an event for the displaced workload naming its cause, one on the cause and one
    on its deployment (``describe deployment``), and ``gpufrac up`` prints them as they come."""
    import io

    from rich.console import Console

    from gpufrac.api.seen_by import event_seen_by
    from gpufrac.api.tokens import ADMIN
    from gpufrac.cli.serve_cmds import print_deployment
    from gpufrac.cli.up import _tell_displaced
    from gpufrac.model.deployment import LABEL

    agent = Agent(data_dir, dev)
    whole = GpuRequest(count=1)
    agent.apply_workload(
        WorkloadSpec(name="batch", gpu=whole, command=(PY, "-c", "pass"), priority=10)
    )
    replica = WorkloadSpec(
        name="web-abc-0",
        gpu=whole,
        command=(PY, "-c", "pass"),
        type="service",
        priority=100,
        labels={LABEL: "web"},
    )
    with agent.displacements() as told:
        agent.apply_workload(replica)
    assert [(x.workload, x.action, x.cause) for x in told] == [
        ("default/batch", "requeued", "default/web-abc-0")  # placed, not started yet
    ]
    (requeued,) = [e for e in agent.store.events("default/batch") if e.kind == "requeued"]
    assert requeued.cause == "default/web-abc-0"
    assert requeued.message == "preempted by default/web-abc-0 (priority 100)"
    (on_web,) = [e for e in agent.store.events("default/web") if e.kind == "displaced"]
    assert on_web.message == "its replica default/web-abc-0: requeued 1: default/batch"
    view = {"tenant": "default", "name": "web", "url": "-", "template": "abc", "replicas": []}
    shown_events = [event_seen_by(ADMIN, e) for e in agent.store.events("default/web")]
    print_deployment({**view, "replicas_ready": 1, "replicas_wanted": 1, "events": shown_events})
    assert "displaced: its replica default/web-abc-0: requeued 1: default/batch" in (
        capsys.readouterr().out
    )
    shown = io.StringIO()
    _tell_displaced(agent, 0, Console(file=shown, width=200))
    lines = shown.getvalue().splitlines()
    assert "default/web-abc-0 displaced (requeued 1: default/batch)" in lines
    assert any(
        line.startswith("    requeued default/batch at ")
        and "preempted by default/web-abc-0" in line
        for line in lines
    ), lines
    agent.close()
