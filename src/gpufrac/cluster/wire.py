"""What node agents and the control plane send each other over HTTP, as pydantic models (strict,
unknown fields refused), and the conversions to the core's values.

* ``JoinBody``: a node's labels and GPUs (``POST /cluster/v1/nodes/NAME/join``);
* ``HeartbeatBody``: per workload the epoch of the run the node has, the jobs that ended, and what
  the node's agent shows of each (phase, reason, restarts...: the control plane's views);
* ``AnswerBody``: everything the node must run, and its lease.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufrac.api.schemas import GpuJson
from gpufrac.cluster.core import Answer, AnswerStatus, Assignment, Ended, NodeEvent, Report
from gpufrac.errors import InputError
from gpufrac.model.catalog import catalog
from gpufrac.model.manifest_types import NodeLabelKey, NodeLabelValue
from gpufrac.model.mig import MigPlacement, check_layout
from gpufrac.model.workload import spec_from_json, spec_to_json
from gpufrac.planning.sched_decision import decision_from_json, decision_to_json
from gpufrac.planning.sched_state import EXTERNAL, SchedGpu

CREDENTIAL_HEADER = "x-gpufrac-node-credential"  # a joining node's own, where it has one


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class InstanceWire(Wire):
    start: int = Field(ge=0)
    profile: str
    busy: bool = False  # in use outside gpufrac's placements


class GpuWire(Wire):
    uuid: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    model: str
    mig: bool
    pinned: bool = False
    instances: list[InstanceWire] = []


class JoinBody(Wire):
    labels: dict[NodeLabelKey, NodeLabelValue] = Field({}, max_length=64)
    gpus: list[GpuWire] = Field(max_length=64)
    address: str | None = Field(None, max_length=200, pattern=r"^https?://[^\s/]+$")
    version: str | None = Field(None, max_length=64, pattern=r"^[0-9A-Za-z.+_-]+$")

    @model_validator(mode="after")
    def _each_gpu_once(self) -> JoinBody:
        uuids = [g.uuid for g in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise ValueError("a GPU is listed twice")
        if any(g.instances and not g.mig for g in self.gpus):
            raise ValueError("a GPU not in MIG mode has no MIG instances")
        return self


class EventWire(Wire):
    """One of a node's own events (a workload started, exited, backed off; fenced ...), for the
    control plane's events."""

    kind: str = Field(min_length=1, max_length=64, pattern=r"^[a-z_]+$")
    subject: str = Field(min_length=1, max_length=300)
    message: str = Field(max_length=2000)


class HeartbeatBody(Wire):
    running: dict[str, int] = {}
    ended: dict[str, tuple[int, Literal["succeeded", "failed"]]] = {}
    views: dict[str, dict[str, Any]] = {}  # per workload, what the node's agent shows of it
    gpus: list[GpuJson] | None = Field(None, max_length=64)  # the node's GPUs, as its agent
    # shows them (every workload named: the control plane hides other tenants' from a tenant)
    events: list[EventWire] = Field([], max_length=200)  # its events since the last answered


class AssignmentWire(Wire):
    spec: dict[str, Any]
    decision: dict[str, Any]
    epoch: int


class AnswerBody(Wire):
    node: str
    lease_s: float
    run: list[AssignmentWire]
    status: AnswerStatus = "ok"
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
    """A node's GPU for the core; an unknown model or a MIG layout it cannot have is an
    ``InputError`` naming the field."""
    model = catalog().get(w.model)
    if model is None:
        raise InputError(
            f"unknown GPU model {w.model!r}", field="gpus.model", fix="send a known one"
        )
    placements = [MigPlacement(i.start, i.profile) for i in w.instances]
    bad = [p for p in placements if not model.has_profile(p.profile)]
    broken = check_layout(model, tuple(sorted(placements))) if not bad else []
    problem = f"{model.key} has no MIG profile {bad[0].profile!r}" if bad else ""
    problem = problem or (broken[0].message if broken else "")
    if problem:
        raise InputError(problem, field="gpus.instances", fix="send the GPU's real MIG layout")
    g = SchedGpu(w.uuid, 0, model, mig=w.mig, pinned=w.pinned)
    g.instances = {
        p: (EXTERNAL if i.busy else None) for p, i in zip(placements, w.instances, strict=True)
    }
    return g


def report_to_wire(
    report: Report,
    views: dict[str, dict[str, Any]],
    gpus: list[dict[str, Any]] | None,
    events: Sequence[NodeEvent] = (),
) -> HeartbeatBody:
    return HeartbeatBody(
        running=dict(report.running),
        ended={k: (e, how) for k, (e, how) in report.ended.items()},
        views=views,
        gpus=None if gpus is None else [GpuJson.model_validate(g) for g in gpus],
        events=[EventWire(kind=e.kind, subject=e.subject, message=e.message) for e in events],
    )


def events_from_wire(body: HeartbeatBody) -> list[NodeEvent]:
    return [NodeEvent(e.kind, e.subject, e.message) for e in body.events]


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
