"""The control API's bodies and answers as pydantic models: what ``/openapi.json`` describes, what
the agent checks every answer against before it is sent, and what the CLI reads answers with.

Bodies (``*Body``) are strict: a field the endpoint does not know, or a value of the wrong type
(``"true"`` for true, ``2.0`` for 2), is refused. Answers keep fields they do not declare (a newer
agent may add some; docs/json.md: fields are added, never renamed or removed), so a reader of an
older version still reads a newer agent's answer, and the agent sends exactly what it built.

Only pydantic here (no FastAPI): the CLI imports this module.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from gpufrac.model.gpu import Health, MigMode
from gpufrac.model.gpu_manifest import PROFILE_PATTERN
from gpufrac.model.migplan import MigActionKind
from gpufrac.model.workload import Mode, QosMode
from gpufrac.planning.moves import MoveHow
from gpufrac.planning.sched_decision import ActionKind, DisplaceAction, EndPhase, Outcome
from gpufrac.planning.views import Capability

# JSON numbers as the agent computes them: an int stays an int, a float a float (not 5 -> 5.0)
Number = int | float
# runtime.agent.Phase (not imported: the CLI reads answers without loading the agent; a test checks
# that the two are the same)
Phase = Literal[
    "pending", "starting", "running", "paused", "backoff", "unknown", "succeeded", "failed"
]
ApplyResult = Literal["created", "replaced", "updated", "unchanged", "refused"]
DeploymentApplyResult = Literal["created", "updated", "unchanged"]


class Answer(BaseModel):
    """An answer (or part of one): the fields named are always there; others are kept."""

    model_config = ConfigDict(extra="allow")


class Body(BaseModel):
    """A request body: only the fields named, of exactly their types."""

    model_config = ConfigDict(extra="forbid", strict=True)


# -- errors --------------------------------------------------------------------------------------


class ErrorAnswer(Answer):
    """A refusal: 401 (no valid token), 403 (not this token's), 404 (no such thing), 409 (not now,
    nothing changed), 413 (a body over the limit), 503 (the store cannot be written; try again)."""

    detail: str


class Problem(Answer):
    """One problem of bad input: ``loc`` is the field path (``["body", ...]`` for the body, the
    manifest's field path for a manifest), ``msg`` what is wrong, ``fix`` how to fix it."""

    loc: list[str | int]
    msg: str
    type: str
    fix: str | None = None


class ProblemsAnswer(Answer):
    """Bad input (422): each problem, or one sentence."""

    detail: list[Problem] | str


# -- requests ------------------------------------------------------------------------------------


class MigInstanceBody(Body):
    profile: str = Field(
        description="a GPU instance profile: 1g.18gb, 3g.71gb, 1g.18gb+me ...",
        json_schema_extra={"pattern": PROFILE_PATTERN},
    )
    start: int = Field(ge=0, description="its first memory slot")


class MigBody(Body):
    """``POST /api/v1/gpus/{gpu}/mig``. ``instances`` must be given: the layout is exactly them, so
    an empty body would destroy every idle instance (the hostile review's ``{}``); ``[]`` says so
    on purpose (and is what turning MIG off sends)."""

    mig_enabled: bool = True
    instances: list[MigInstanceBody] = Field(
        description="the layout, every instance ([] removes them all; required)",
    )
    drain: bool = Field(False, description="move workloads off instances that go")
    allow_mode_change: bool = Field(False, description="turn MIG mode on or off as asked")
    pin: bool = Field(True, description="keep the layout as set until released")
    dry_run: bool = Field(
        False, description="make every check of the change and list its actions; change nothing"
    )


class ScaleBody(Body):
    """``POST /api/v1/deployments/{tenant}/{name}/scale``."""

    replicas: int = Field(ge=0, le=1000)


# -- scheduling ----------------------------------------------------------------------------------


class MigPlacementJson(Answer):
    profile: str
    start: int


# decisions and completions are stored; the defaults are what the agent reads a field an older
# gpufrac did not store as (planning.sched_decision.decision_from_json, runtime.agent)


class SchedActionJson(Answer):
    kind: ActionKind
    workload: str
    gpu_uuid: str | None = None
    mig: MigPlacementJson | None = None
    reason: str = ""


class MoveJson(Answer):
    """Running work moved to make room for a waiting request (docs/scheduler.md, Moves)."""

    workload: str
    gpu: str
    mig: MigPlacementJson
    how: MoveHow
    cause: str


class DecisionJson(Answer):
    """Where a workload runs, why it waits, or why it is refused (docs/json.md)."""

    workload: str
    outcome: Outcome
    reason: str = ""
    mode: Mode | None = None
    gpus: list[str] = Field(default_factory=list)
    mig: MigPlacementJson | None = None
    evicted: list[str] = Field(default_factory=list)
    actions: list[SchedActionJson] = Field(default_factory=list)
    cause: str | None = Field(
        None, description="the workload that took its place (its reason names it), if one did"
    )
    moves: list[MoveJson] = Field(
        default_factory=list, description="running work moved to make room for it, if any"
    )


class WhereJson(Answer):
    mode: Mode | None
    gpus: list[str]
    mig: MigPlacementJson | None


UNKNOWN_COUNT = "null: not kept (completed under an older gpufrac, or by a cluster's control plane)"


class CompletedJson(Answer):
    """How a finished workload ended, and where it ran."""

    outcome: Literal["completed"]
    phase: EndPhase
    reason: str = ""
    where: WhereJson | None = None
    attempts: int | None = Field(None, description=UNKNOWN_COUNT)
    restarts: int | None = Field(None, description=UNKNOWN_COUNT)
    evictions: int | None = Field(None, description=UNKNOWN_COUNT)
    exit_code: int | None = None
    env: dict[str, str] = Field(default_factory=dict)


PlacementJson = DecisionJson | CompletedJson  # a workload's placement: a decision, or how it ended
_PLACEMENT: TypeAdapter[PlacementJson | None] = TypeAdapter(PlacementJson | None)


def placement_answer(raw: object) -> PlacementJson | None:
    """A workload's ``placement`` as the API answers it, read with its models."""
    return _PLACEMENT.validate_python(raw)


# -- workloads -----------------------------------------------------------------------------------


class QosJson(Answer):
    """A workload's QoS (docs/qos.md)."""

    model_config = ConfigDict(populate_by_name=True)

    class_: int = Field(alias="class")
    priority: int
    qos: QosMode
    weight: int
    min_share: Number
    mode: Literal["cooperative", "transparent"] | None
    paused: bool | None
    paused_by: str | None
    paused_s: Number | None
    pauses: int | None  # pauses counted by the arbiter since the agent started, however short
    paused_total_s: Number | None
    longest_pause_1h_s: Number | None
    run_s: Number | None  # the time it was allowed to run on its GPU (arbiter's accounting)
    busy_s: Number | None  # its GPU's busy time meanwhile (at least one workload ran)
    active: bool | None
    turns: int | None
    arbiter_share: Number | None
    measured_share: Number | None
    measured_by: Literal["nvml", "sdk"] | None


class EventJson(Answer):
    id: int
    at: Number
    kind: str
    subject: str
    message: str
    cause: str | None = Field(
        None,
        description="the workload that caused it (one that took the subject's place), or "
        '"another tenant\'s workload" for a tenant that may not see it',
    )


class DisplacedJson(Answer):
    """A workload a call (or the autoscaler, a drain, a MIG change) took the place of."""

    workload: str = Field(description='TENANT/NAME, or "another tenant\'s workload"')
    action: DisplaceAction = Field(
        description="moved: placed again elsewhere at once; evicted: stopped, it waits; "
        "requeued: it waits again, not started yet"
    )
    reason: str


class WorkloadJson(Answer):
    tenant: str
    name: str
    generation: int
    spec: dict[str, Any] = Field(description="the workload as applied, every default filled in")
    phase: Phase
    reason: str
    attempts: int
    restarts: int = Field(description="attempts after a failure or an exit (its restart policy's)")
    evictions: int = Field(
        0, description="attempts stopped to make room (preempted, moved, drained): no failures"
    )
    exit_code: int | None
    env: dict[str, str]
    node: str | None = Field(
        None, description="the node it runs on, or a finished one ran on; null while it waits"
    )
    placement: PlacementJson | None
    qos: QosJson


class WorkloadDetail(WorkloadJson):
    events: list[EventJson]


class WorkloadList(Answer):
    workloads: list[WorkloadJson]


class EventList(Answer):
    events: list[EventJson]


class LogsAnswer(Answer):
    run: str | None = Field(description="the newest attempt's run directory, null before one")
    lines: list[str]
    truncated: bool = Field(
        False,
        description="older lines asked for were left out: the answer holds the newest that fit "
        "the operator's log_relay_max",
    )


class Deleted(Answer):
    deleted: str


class WorkloadResult(Answer):
    kind: Literal["Workload"]
    workload: str
    result: ApplyResult
    decision: DecisionJson | None
    spec: dict[str, Any]
    diff: list[str]
    warnings: list[str]
    displaced: list[DisplacedJson] = Field(
        default_factory=list, description="the workloads its placement took the place of"
    )


class DeploymentResult(Answer):
    kind: Literal["Deployment"]
    deployment: str
    result: DeploymentApplyResult
    decision: None
    diff: list[str]
    url: str
    warnings: list[str] = Field(default=[], description="its replicas fit on no node now, say")


class ApplyAnswer(Answer):
    results: list[Annotated[WorkloadResult | DeploymentResult, Field(discriminator="kind")]]


# -- deployments ---------------------------------------------------------------------------------


class ReplicaJson(Answer):
    name: str
    template: str
    host: str = Field(description="where the gateway reaches it: its node's address on a cluster")
    port: int
    node: str | None = Field(description="the node it is placed on (a cluster), else null")
    phase: str
    ready: bool
    draining: bool
    current: bool
    gpus: list[str]
    mode: Mode | None
    outstanding: int
    served: int
    reason: str
    last_error: str | None


class DeploymentJson(Answer):
    tenant: str
    name: str
    url: str
    template: str
    replicas_wanted: int | None = Field(description="null: as many as the autoscaler wants")
    replicas_ready: int
    replicas: list[ReplicaJson]
    traffic: dict[str, Any] = Field(description="the gateway's counts (docs/serving.md)")
    spec: dict[str, Any]


class DeploymentDetail(DeploymentJson):
    events: list[EventJson]


class DeploymentList(Answer):
    deployments: list[DeploymentJson]


class ScaleAnswer(Answer):
    deployment: str
    replicas: int
    warnings: list[str] | None = Field(None, description="only when it autoscales")


# -- GPUs ----------------------------------------------------------------------------------------


class MigModeJson(Answer):
    current: MigMode
    pending: MigMode


class MigInstanceJson(Answer):
    profile: str
    start: int
    gi_id: int
    ci_ids: list[int]
    uuid: str | None
    busy: bool
    memory_mib: int | None


class ProcessJson(Answer):
    pid: int
    used_memory_mib: int | None
    gi_id: int | None


class AllocationMigJson(Answer):
    profile: str
    start: int
    gi_id: int | None


class AllocationJson(Answer):
    """One workload's share of a GPU; another tenant's has tenant, name and use null."""

    tenant: str | None
    name: str | None
    phase: Phase
    mode: Mode
    mig: AllocationMigJson | None
    memory_mib: int
    compute_pct: int | None
    used_memory_mib: int | None
    sm_percent: int | None


class GpuJson(Answer):
    """A GPU as ``gpufrac gpus --json`` shows it, with what is placed on it (docs/json.md)."""

    uuid: str
    index: int
    model: str | None
    name: str
    pci_device_id: str
    pci_subsystem_id: str = "unknown"
    memory_total_mib: int
    memory_used_mib: int
    utilization_gpu: int | None
    mig_mode: MigModeJson
    instances: list[MigInstanceJson]
    processes: list[ProcessJson]
    simulated: bool
    health: Health
    warnings: list[str]
    node: str
    mig_layout_pinned: bool
    cordoned: str | None
    allocations: list[AllocationJson]
    reserved_memory_mib: int
    reserved_compute_pct: int


class GpuList(Answer):
    gpus: list[GpuJson]


class Cordoned(Answer):
    cordoned: str


class Uncordoned(Answer):
    uncordoned: str
    placed: list[str]


class Drained(Answer):
    drained: str
    decisions: list[DecisionJson]
    displaced: list[DisplacedJson] = Field(default_factory=list)


class MigActionJson(Answer):
    kind: MigActionKind
    gpu_uuid: str
    gpu_index: int
    profile: str | None
    start: int | None
    profile_id: int | None
    gi_id: int | None
    ci_id: int | None
    nvidia_smi: str


class MigChanged(Answer):
    gpu: str
    result: Literal["changed", "unchanged", "planned"]  # planned: a dry run's actions
    pinned: bool
    actions: list[MigActionJson]
    displaced: list[DisplacedJson] = Field(default_factory=list)


class MigReleased(Answer):
    released: str
    placed: list[str]


# -- the agent -----------------------------------------------------------------------------------


class WhoAmI(Answer):
    tenant: str | None = Field(description="the token's tenant; null for the admin")
    admin: bool


class HealthAnswer(Answer):
    status: Literal["ok", "degraded"]
    version: str
    problems: list[str]
    role: Literal["agent", "control-plane"] = Field(
        "agent", description="one machine's agent, or a cluster's control plane"
    )
    nodes: int = Field(1, description="the nodes known (one machine's agent is its own)")
    nodes_alive: int = Field(1, description="of them, those holding their lease")


class NodeJson(Answer):
    """A node of the cluster; one machine's agent is its own node, always alive."""

    name: str
    state: Literal["alive", "lost", "pending", "denied"] = Field(
        description="alive or lost; pending until an admin approves it (docs/cluster.md), denied"
    )
    labels: dict[str, str]
    gpus: int = Field(description="the GPUs it joined with (a pending node: it declares)")
    address: str | None = Field(
        description="where its agent serves the control plane (the admin's to see), else null"
    )
    last_heartbeat_s: Number | None = Field(
        description="seconds since its last heartbeat; null for one machine's agent"
    )
    version: str | None = Field(description="its gpufrac's version, where it said")
    gpu_cap: int | None = Field(
        None, description="the most of its GPUs an admin approved it for; null: as it declared"
    )


class NodeList(Answer):
    nodes: list[NodeJson]


class NodeDetail(NodeJson):
    workloads: list[str] = Field(description="TENANT/NAME of those placed on it the caller sees")
    events: list[EventJson] = Field(
        description="its own events (joined, lost, fenced, a GPU's): the admin's to see"
    )


class NodeJudged(Answer):
    """An admin's verdict on a node: what it is now (null once revoked: forgotten)."""

    node: str
    verdict: Literal["approve", "deny", "revoke"]
    now: NodeJson | None


class KeptAlive(Answer):
    kept: str


class OutcomeCleared(Answer):
    cleared: str  # TENANT/NAME: its unknown outcome now counts as a failed attempt


class UnsupportedAnswer(Answer):
    """501, as ``application/problem+json`` (RFC 9457): what this server lacks (a cluster's
    control plane sets no MIG layout, one machine keeps no Ray lease nor admits nodes)."""

    type: str
    title: str
    status: Literal[501]
    detail: str
    capability: Capability  # the one closed set (planning.views): a new one is described too


class BusyAnswer(Answer):
    """429, as ``application/problem+json`` (RFC 9457), with ``Retry-After``: too many calls of
    one kind are under way at once (a tenant's log reads, or those from one node); this one was
    not started."""

    type: str
    title: str
    status: Literal[429]
    detail: str
    retry_after_s: int


class TimedOutAnswer(Answer):
    """504, as ``application/problem+json`` (RFC 9457): what the call waited for did not come
    within its deadline (a node that did not send a workload's logs in time)."""

    type: str
    title: str
    status: Literal[504]
    detail: str


class HistoryTrack(Answer):
    """One GPU's, instance's, workload's or deployment's series, one value (or null) per time."""

    key: str
    series: dict[str, list[Number | None]]


class HistoryAnswer(Answer):
    interval_s: Number
    window_s: Number
    error: str | None
    times: list[Number]
    gpus: list[HistoryTrack]
    instances: list[HistoryTrack]
    workloads: list[HistoryTrack]
    deployments: list[HistoryTrack]
    mig_geometry: dict[str, Any]
