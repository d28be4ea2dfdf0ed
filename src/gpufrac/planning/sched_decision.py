"""The scheduler's output as values: decisions, the closed set of actions the node agent carries
out, and how a finished run ended.

A ``Decision`` says where one workload runs (or why it waits, or why it is refused) and lists the
``SchedAction`` values that make it so, in order: evictions first, then MIG instances destroyed,
then the instance created, then the start. The agent carries each kind out in one ``match`` with
``assert_never`` (``Executor.carry_out`` in ``runtime/executor.py``); every other place that tells
kinds apart does too, or asks the action (``evicts``, ``mig_change``, ``renamed``, ``describe``),
so a kind added to ``ActionKind`` and left out anywhere fails mypy.

A ``Completion`` is what is kept of a finished run once its GPU is given back: how it ended and
where it ran. The store keeps one of the two per workload (``StoredPlacement``), as JSON
(``stored_to_json``, read back once by ``stored_from_json``); docs/json.md has the shapes, and the
API's models (``api/schemas.py``: ``DecisionJson``, ``CompletedJson``) read them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar, assert_never, get_args

from gpufrac.model.mig import MigPlacement
from gpufrac.model.workload import MODES, Mode, WorkloadSpec
from gpufrac.planning.moves import MOVE_HOWS, Move

T = TypeVar("T", bound=str)

ActionKind = Literal[
    "evict",  # stop a placed workload that lost its place (preempted, drained); it waits again
    "destroy_mig_instance",  # an idle MIG instance goes, to make room (a re-cut)
    "create_mig_instance",  # the MIG instance a workload was given is created
    "start",  # the workload's process is started on its GPU (or instance)
    "stop",  # the workload's process is stopped (deleted, deadline passed, over its memory)
]
ACTION_KINDS: tuple[ActionKind, ...] = get_args(ActionKind)
MigChange = Literal["destroy", "create"]  # what a MIG action does to its instance
Outcome = Literal["placed", "pending", "refused"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
EndPhase = Literal["succeeded", "failed"]  # how a finished run ended
END_PHASES: tuple[EndPhase, ...] = get_args(EndPhase)
# what became of a workload that lost its place: placed again elsewhere at once (moved), stopped
# and waiting (evicted), or waiting again before it ran (requeued: placed, but not started yet)
DisplaceAction = Literal["evicted", "moved", "requeued"]
DISPLACE_ACTIONS: tuple[DisplaceAction, ...] = get_args(DisplaceAction)
ANOTHER_TENANTS = "another tenant's workload"  # a workload a viewer may not see, as it is named


def reason_for_tenant(reason: str, cause: str | None, tenant: str) -> str:
    """A reason that names ``cause`` (a workload key), as ``tenant`` may read it: the cause named
    only if it is that tenant's (the API renders for each caller: ``api.seen_by``)."""
    if cause is None or cause.split("/", 1)[0] == tenant:
        return reason
    return reason.replace(cause, ANOTHER_TENANTS)


def _same(name: str) -> str:
    return name


@dataclass(frozen=True, slots=True)
class SchedAction:
    kind: ActionKind
    workload: str  # tenant/name: the workload the action is for (an eviction: the one evicted)
    gpu_uuid: str | None = None
    mig: MigPlacement | None = None
    reason: str = ""

    def describe(self) -> str:
        where = f" {self.mig}" if self.mig is not None else ""
        on = f" on {self.gpu_uuid}" if self.gpu_uuid else ""
        match self.kind:
            case "evict":
                return f"evict {self.workload}" + (f": {self.reason}" if self.reason else "")
            case "destroy_mig_instance":
                return f"destroy MIG instance{where}{on}"
            case "create_mig_instance":
                return f"create MIG instance{where}{on}"
            case "start":
                return f"start {self.workload}{on}"
            case "stop":
                return f"stop {self.workload}" + (f": {self.reason}" if self.reason else "")
            case _:
                assert_never(self.kind)

    @property
    def evicts(self) -> bool:
        """Whether it stops a placed workload (``workload``) to make room: that one is displaced."""
        match self.kind:
            case "evict":
                return True
            case "destroy_mig_instance" | "create_mig_instance" | "start" | "stop":
                return False
            case _:
                assert_never(self.kind)

    @property
    def mig_change(self) -> MigChange | None:
        """What it does to the MIG instance at ``mig`` on ``gpu_uuid``, if it is a MIG change (one
        the GPU's MIG worker carries out, before the start that needs it)."""
        match self.kind:
            case "destroy_mig_instance":
                return "destroy"
            case "create_mig_instance":
                return "create"
            case "evict" | "start" | "stop":
                return None
            case _:
                assert_never(self.kind)

    def renamed(
        self,
        *,
        workload: Callable[[str], str] = _same,
        gpu: Callable[[str], str] = _same,
    ) -> SchedAction:
        """The same action with each workload and each GPU it names passed through ``workload``
        and ``gpu`` (a cluster node's local GPU ids, the names a tenant may see). A kind that
        names another workload or GPU in a field of its own must rename it here too."""
        match self.kind:
            case "evict" | "destroy_mig_instance" | "create_mig_instance" | "start" | "stop":
                return replace(
                    self,
                    workload=workload(self.workload),
                    gpu_uuid=None if self.gpu_uuid is None else gpu(self.gpu_uuid),
                )
            case _:
                assert_never(self.kind)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "workload": self.workload,
            "gpu_uuid": self.gpu_uuid,
            "mig": None if self.mig is None else self.mig.to_json(),
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class Decision:
    workload: str
    outcome: Outcome
    reason: str = ""
    mode: Mode | None = None
    gpus: tuple[str, ...] = ()
    mig: MigPlacement | None = None
    evicted: tuple[str, ...] = ()
    actions: tuple[SchedAction, ...] = ()
    # the workload whose placement took this one's place (a preemption): its reason names it
    cause: str | None = None
    # running work moved to make room for this waiting request (``planning/moves.py``)
    moves: tuple[Move, ...] = ()

    def mig_actions(self) -> tuple[SchedAction, ...]:
        """The MIG changes (destroys, then the create) this placement needs before its start."""
        return tuple(a for a in self.actions if a.mig_change is not None)


def decision_to_json(d: Decision) -> dict[str, object]:
    return {
        "workload": d.workload,
        "outcome": d.outcome,
        "reason": d.reason,
        "mode": d.mode,
        "gpus": list(d.gpus),
        "mig": None if d.mig is None else d.mig.to_json(),
        "evicted": list(d.evicted),
        "actions": [a.to_json() for a in d.actions],
        "cause": d.cause,
        "moves": [m.to_json() for m in d.moves],
    }


@dataclass(frozen=True, slots=True)
class Where:
    """Where a run ran: its sharing mode, GPUs and MIG instance."""

    mode: Mode | None
    gpus: tuple[str, ...]
    mig: MigPlacement | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """How a finished run ended, kept after its GPU is given back: ``where`` it ran (None: it
    never ran), and the counts and environment its last attempt had (None: not known; a run
    completed under an older gpufrac, or on a cluster's control plane, whose node knows them)."""

    phase: EndPhase
    reason: str = ""
    where: Where | None = None
    attempts: int | None = None
    restarts: int | None = None
    evictions: int | None = None
    exit_code: int | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StoredPlacement:
    """What the store keeps of one workload's placement, for its spec's ``generation``: the
    decision, or how its finished run ended; on a cluster's control plane also the ``node`` it is
    given to (or a finished one ran on) and the ``epoch`` of the lease it runs under."""

    generation: int
    record: Decision | Completion
    node: str | None = None
    epoch: int | None = None


def gpus_of(record: Decision | Completion) -> tuple[str, ...]:
    """The GPUs a workload is placed on, or its finished run ran on."""
    match record:
        case Decision():
            return record.gpus
        case Completion():
            return () if record.where is None else record.where.gpus
        case _:
            assert_never(record)


def _placement(x: Any) -> MigPlacement | None:
    return None if x is None else MigPlacement(int(x["start"]), str(x["profile"]))


def _choice(value: Any, choices: tuple[T, ...], what: str) -> T:
    for c in choices:
        if value == c:
            return c
    raise ValueError(f"unknown {what} {value!r} in a stored record")


def action_from_json(raw: dict[str, Any]) -> SchedAction:
    return SchedAction(
        _choice(raw["kind"], ACTION_KINDS, "action"),
        raw["workload"],
        raw.get("gpu_uuid"),
        _placement(raw.get("mig")),
        str(raw.get("reason", "")),
    )


def decision_from_json(raw: dict[str, Any]) -> Decision:
    mode = raw.get("mode")
    return Decision(
        workload=raw["workload"],
        outcome=_choice(raw["outcome"], OUTCOMES, "outcome"),
        reason=raw.get("reason", ""),
        mode=None if mode is None else _choice(mode, MODES, "mode"),
        gpus=tuple(raw.get("gpus", ())),
        mig=_placement(raw.get("mig")),
        evicted=tuple(raw.get("evicted", ())),
        actions=tuple(action_from_json(a) for a in raw.get("actions", ())),
        cause=raw.get("cause"),
        moves=tuple(move_from_json(m) for m in raw.get("moves", ())),
    )


def move_from_json(raw: dict[str, Any]) -> Move:
    placement = _placement(raw.get("mig"))
    assert placement is not None, "a move leaves an instance"
    return Move(
        workload=raw["workload"],
        gpu=raw["gpu"],
        placement=placement,
        how=_choice(raw["how"], MOVE_HOWS, "how"),
        cause=raw["cause"],
    )


def where_to_json(w: Where) -> dict[str, object]:
    return {
        "mode": w.mode,
        "gpus": list(w.gpus),
        "mig": None if w.mig is None else w.mig.to_json(),
    }


def where_from_json(raw: dict[str, Any]) -> Where:
    mode = raw.get("mode")
    return Where(
        mode=None if mode is None else _choice(mode, MODES, "mode"),
        gpus=tuple(str(u) for u in raw.get("gpus", ())),
        mig=_placement(raw.get("mig")),
    )


def completion_to_json(c: Completion) -> dict[str, object]:
    return {
        "outcome": "completed",
        "phase": c.phase,
        "reason": c.reason,
        "where": None if c.where is None else where_to_json(c.where),
        "attempts": c.attempts,
        "restarts": c.restarts,
        "evictions": c.evictions,
        "exit_code": c.exit_code,
        "env": dict(c.env),
    }


def _count(x: Any) -> int | None:
    return None if x is None else int(x)


def completion_from_json(raw: dict[str, Any]) -> Completion:
    """A stored completion; one written by an older gpufrac lacks some fields: without
    ``restarts`` every attempt after the first was one, without ``evictions`` there were none
    (and without ``attempts``, none of the three is known)."""
    attempts = _count(raw.get("attempts"))
    known = attempts is not None
    before = None if attempts is None else max(0, attempts - 1)
    restarts = _count(raw.get("restarts", before))
    where = raw.get("where")
    code = raw.get("exit_code")
    env = raw.get("env")
    return Completion(
        phase=_choice(raw["phase"], END_PHASES, "phase"),
        reason=str(raw.get("reason") or ""),
        where=where_from_json(where) if isinstance(where, dict) else None,
        attempts=attempts,
        restarts=restarts,
        evictions=_count(raw.get("evictions", 0 if known else None)),
        exit_code=code if isinstance(code, int) else None,
        env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
    )


def record_to_json(record: Decision | Completion) -> dict[str, object]:
    match record:
        case Decision():
            return decision_to_json(record)
        case Completion():
            return completion_to_json(record)
        case _:
            assert_never(record)


def stored_to_json(p: StoredPlacement) -> dict[str, object]:
    """The record as stored (and as the API answers it): the decision's or the completion's
    fields, with ``node`` and ``epoch`` where a control plane set them."""
    out = record_to_json(p.record)
    if p.node is not None:
        out["node"] = p.node
    if p.epoch is not None:
        out["epoch"] = p.epoch
    return out


def stored_from_json(generation: int, raw: dict[str, Any]) -> StoredPlacement:
    """A stored record read back, once: a completion (``outcome`` ``completed``) or a decision."""
    record: Decision | Completion = (
        completion_from_json(raw) if raw.get("outcome") == "completed" else decision_from_json(raw)
    )
    node = raw.get("node")
    return StoredPlacement(
        generation,
        record,
        node=node if isinstance(node, str) else None,
        epoch=_count(raw.get("epoch")),
    )


@dataclass(frozen=True, slots=True)
class Displacement:
    """A workload that lost its place, what became of it, and why; ``cause``: the workload whose
    placement took it (None: the operator's or a GPU's doing, which ``reason`` says)."""

    workload: str
    action: DisplaceAction
    reason: str
    cause: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"workload": self.workload, "action": self.action, "reason": self.reason}


def displacement_of(
    workload: str, after: Decision | None, was_running: bool, reason: str, cause: str | None
) -> Displacement:
    """What became of ``workload``, displaced: ``after`` is its decision once it lost its place."""
    action: DisplaceAction = (
        "moved"
        if after is not None and after.outcome == "placed"
        else "evicted"
        if was_running
        else "requeued"
    )
    return Displacement(workload, action, reason, cause)


def displacements(
    decisions: Sequence[Decision], was_running: Callable[[str], bool]
) -> list[Displacement]:
    """Every workload the ``decisions`` (one operation's, in order) took the place of, once each:
    moved where its own later decision placed it, else evicted (``was_running``: it had a process
    or a node) or requeued."""
    final = {d.workload: d for d in decisions}  # each workload's last decision
    out: list[Displacement] = []
    told: set[str] = set()
    for d in decisions:
        why = {a.workload: a.reason for a in d.actions if a.evicts}
        for v in d.evicted:
            if v in told:
                continue
            told.add(v)
            reason = why.get(v) or f"preempted by {d.workload}"
            out.append(displacement_of(v, final.get(v), was_running(v), reason, d.workload))
    return out


class Displaced(Protocol):
    """A displacement as a summary reads it (``Displacement``, or the API's answer of one)."""

    @property
    def workload(self) -> str: ...

    @property
    def action(self) -> DisplaceAction: ...


def displaced_summary(told: Sequence[Displaced]) -> str:
    """``evicted 2: alpha/a, alpha/b; moved 1: alpha/c``: what one placement displaced."""
    parts = []
    for action in DISPLACE_ACTIONS:
        names = [x.workload for x in told if x.action == action]
        if names:
            parts.append(f"{action} {len(names)}: {', '.join(names)}")
    return "; ".join(parts)


def workload_key(spec: WorkloadSpec) -> str:
    return f"{spec.tenant}/{spec.name}"


class DisplacementListeners:
    """The calls that want to hear of the displacements told while they run (the answer of the
    call that caused them: apply, drain, a MIG change): each open ``collecting`` block gets every
    displacement ``heard`` meanwhile. The caller holds the lock that orders such calls."""

    def __init__(self) -> None:
        self._open: list[list[Displacement]] = []

    @contextlib.contextmanager
    def collecting(self) -> Iterator[list[Displacement]]:
        collected: list[Displacement] = []
        self._open.append(collected)
        try:
            yield collected
        finally:
            self._open.remove(collected)

    def heard(self, told: Sequence[Displacement]) -> None:
        for collected in self._open:
            collected.extend(told)
