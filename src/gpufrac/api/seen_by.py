"""What a caller may see of the workloads a decision, an event or a displacement names.

Decisions and events are stored with every workload named in full (the decision log and the admin
read them so); each is rendered for its reader when it is read: a workload of a tenant the caller
may not see is written "another tenant's workload", in the structured fields and in the text that
names it (a reason, an event's message). The admin sees every name; a tenant its own tenant's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, assert_never

from gpufrac.api.tokens import Caller
from gpufrac.model.event import Event
from gpufrac.planning.sched_decision import (
    ANOTHER_TENANTS,
    Completion,
    Decision,
    Displacement,
    StoredPlacement,
    stored_to_json,
)


def named(who: Caller, key: str) -> str:
    """``key`` (TENANT/NAME) as ``who`` may see it."""
    return key if who.may_see(key.split("/", 1)[0]) else ANOTHER_TENANTS


def shown_text(who: Caller, text: str, names: Iterable[str | None]) -> str:
    """``text`` with each of ``names`` (the workloads it names) that ``who`` may not see written
    as another tenant's workload; a name is matched whole (``a/b`` is not part of ``a/bc``)."""
    for key in {k for k in names if k}:
        if named(who, key) != key:
            text = re.sub(rf"(?<![\w/-]){re.escape(key)}(?![\w/-])", ANOTHER_TENANTS, text)
    return text


def decision_seen_by(who: Caller, d: Decision) -> Decision:
    """A decision as its caller may see it: another tenant's workloads it evicted, or that took
    its place (its ``cause``), are not named."""
    if who.admin:
        return d
    return replace(
        d,
        cause=None if d.cause is None else named(who, d.cause),
        reason=shown_text(who, d.reason, [d.cause, *d.evicted, *(m.workload for m in d.moves)]),
        evicted=tuple(named(who, k) for k in d.evicted),
        actions=tuple(a.renamed(workload=lambda k: named(who, k)) for a in d.actions),
        moves=tuple(
            replace(m, workload=named(who, m.workload), cause=named(who, m.cause)) for m in d.moves
        ),
    )


def placement_seen_by(who: Caller, p: StoredPlacement) -> dict[str, object]:
    """A workload's stored placement (its decision, or how its finished run ended) as its caller
    may see it, in the API's shape (``DecisionJson`` or ``CompletedJson``)."""
    match p.record:
        case Decision():
            return stored_to_json(replace(p, record=decision_seen_by(who, p.record)))
        case Completion():
            return stored_to_json(p)  # it names no other workload
        case _:
            assert_never(p.record)


def event_seen_by(who: Caller, e: Event) -> dict[str, Any]:
    """An event as ``who`` may read it: its cause and the other workloads its message names,
    each named only where ``who`` may see it."""
    return {
        "id": e.id,
        "at": e.at,
        "kind": e.kind,
        "subject": e.subject,
        "message": shown_text(who, e.message, e.named()),
        "cause": None if e.cause is None else named(who, e.cause),
    }


def displaced_seen_by(who: Caller, told: Sequence[Displacement]) -> list[dict[str, Any]]:
    """The workloads a call displaced, as its caller may see them (``apply``'s ``displaced``)."""
    return [
        {
            "workload": named(who, x.workload),
            "action": x.action,
            "reason": shown_text(who, x.reason, [x.cause, x.workload]),
        }
        for x in told
    ]
