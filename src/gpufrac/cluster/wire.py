"""What node agents and the control plane send each other over HTTP, as pydantic models (strict,
unknown fields refused), and the conversions to the core's values.

* ``JoinBody``: a node's labels and GPUs (``POST /cluster/v1/nodes/NAME/join``);
* ``HeartbeatBody``: per workload the epoch of the run the node has, the jobs that ended, and what
  the node's agent shows of each (phase, reason, restarts...: the control plane's views);
* ``AnswerBody``: everything the node must run, and its lease.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufrac.cluster.core import Answer, Assignment, Ended, Report
from gpufrac.model.catalog import catalog
from gpufrac.model.mig import MigPlacement
from gpufrac.model.workload import spec_from_json, spec_to_json
from gpufrac.planning.sched_decision import decision_from_json, decision_to_json
from gpufrac.planning.sched_state import EXTERNAL, SchedGpu


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class InstanceWire(Wire):
    start: int = Field(ge=0)
    profile: str
    busy: bool = False  # in use outside gpufrac's placements


class GpuWire(Wire):
    uuid: str = Field(min_length=1, max_length=200)
    model: str
    mig: bool
    pinned: bool = False
    instances: list[InstanceWire] = []


class JoinBody(Wire):
    labels: dict[str, str] = {}
    gpus: list[GpuWire] = Field(max_length=64)
    address: str | None = None  # where the node's own API answers (logs)


class HeartbeatBody(Wire):
    running: dict[str, int] = {}
    ended: dict[str, tuple[int, Literal["succeeded", "failed"]]] = {}
    views: dict[str, dict[str, Any]] = {}  # per workload, what the node's agent shows of it
    gpus: list[dict[str, Any]] | None = None  # the node's GPUs as its agent shows them (admin)


class AssignmentWire(Wire):
    spec: dict[str, Any]
    decision: dict[str, Any]
    epoch: int


class AnswerBody(Wire):
    node: str
    lease_s: float
    run: list[AssignmentWire]
    status: Literal["ok", "lost", "join"] = "ok"
    keep: list[str] = []


def gpu_to_wire(g: SchedGpu) -> GpuWire:
    return GpuWire(
        uuid=g.uuid,
        model=g.model.key,
        mig=g.mig,
        pinned=g.pinned,
        instances=[
            InstanceWire(start=pl.start, profile=pl.profile, busy=owner == EXTERNAL)
            for pl, owner in sorted(g.instances.items())
        ],
    )


def gpu_from_wire(w: GpuWire) -> SchedGpu:
    """A node's GPU for the core; an unknown model is a ``KeyError``."""
    g = SchedGpu(w.uuid, 0, catalog()[w.model], mig=w.mig, pinned=w.pinned)
    g.instances = {
        MigPlacement(i.start, i.profile): (EXTERNAL if i.busy else None) for i in w.instances
    }
    return g


def report_to_wire(
    report: Report, views: dict[str, dict[str, Any]], gpus: list[dict[str, Any]] | None
) -> HeartbeatBody:
    return HeartbeatBody(
        running=dict(report.running),
        ended={k: (e, how) for k, (e, how) in report.ended.items()},
        views=views,
        gpus=gpus,
    )


def report_from_wire(body: HeartbeatBody) -> Report:
    ended: dict[str, tuple[int, Ended]] = {k: (e, how) for k, (e, how) in body.ended.items()}
    return Report(running=dict(body.running), ended=ended)


def answer_to_wire(answer: Answer) -> AnswerBody:
    return AnswerBody(
        node=answer.node,
        lease_s=answer.lease_s,
        status=answer.status,
        keep=list(answer.keep),
        run=[
            AssignmentWire(
                spec=spec_to_json(a.spec),
                decision=dict(decision_to_json(a.decision)),
                epoch=a.epoch,
            )
            for a in answer.run
        ],
    )


def answer_from_wire(body: AnswerBody) -> Answer:
    return Answer(
        body.node,
        tuple(
            Assignment(spec_from_json(a.spec), decision_from_json(a.decision), body.node, a.epoch)
            for a in body.run
        ),
        body.lease_s,
        body.status,
        tuple(body.keep),
    )
