"""The scheduler's output as values: decisions, and the closed set of actions the node agent carries
out.

A ``Decision`` says where one workload runs (or why it waits, or why it is refused) and lists the
``SchedAction`` values that make it so, in order: evictions first, then MIG instances destroyed,
then the instance created, then the start. The agent carries each kind out in one ``match`` with
``assert_never`` (``runtime/carry_out.py``), so a kind added here and left out there fails mypy.
Decisions are stored as JSON with the placement; docs/json.md has the shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, assert_never, get_args

from gpufrac.model.mig import MigPlacement
from gpufrac.model.workload import MODES, Mode, WorkloadSpec

T = TypeVar("T", bound=str)

ActionKind = Literal[
    "evict",  # stop a placed workload that lost its place (preempted, drained); it waits again
    "destroy_mig_instance",  # an idle MIG instance goes, to make room (a re-cut)
    "create_mig_instance",  # the MIG instance a workload was given is created
    "start",  # the workload's process is started on its GPU (or instance)
    "stop",  # the workload's process is stopped (deleted, deadline passed, over its memory)
]
ACTION_KINDS: tuple[ActionKind, ...] = get_args(ActionKind)
Outcome = Literal["placed", "pending", "refused"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
MIG_ACTIONS: frozenset[ActionKind] = frozenset({"destroy_mig_instance", "create_mig_instance"})
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

    def mig_actions(self) -> tuple[SchedAction, ...]:
        """The MIG changes (destroys, then the create) this placement needs before its start."""
        return tuple(a for a in self.actions if a.kind in MIG_ACTIONS)


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
    }


def _placement(x: Any) -> MigPlacement | None:
    return None if x is None else MigPlacement(int(x["start"]), str(x["profile"]))


def _choice(value: Any, choices: tuple[T, ...], what: str) -> T:
    for c in choices:
        if value == c:
            return c
    raise ValueError(f"unknown {what} {value!r} in a stored decision")


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
        why = {a.workload: a.reason for a in d.actions if a.kind == "evict"}
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
