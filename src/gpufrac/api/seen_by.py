"""What a caller may see of the workloads a decision, an event or a displacement names.

Decisions and events are stored with every workload named in full (the decision log and the admin
read them so); each is rendered for its reader when it is read: a workload of a tenant the caller
may not see is written "another tenant's workload", in the structured fields and in the text that
names it (a reason, an event's message). The admin sees every name; a tenant its own tenant's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from gpufrac.api.tokens import Caller
from gpufrac.model.event import Event
from gpufrac.planning.sched_decision import ANOTHER_TENANTS, Displacement


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


def as_seen_by(who: Caller, decision: dict[str, Any]) -> dict[str, Any]:
    """A decision (or a completed workload's record) as its caller may see it: another tenant's
    workloads it evicted, or that took its place (its ``cause``), are not named."""
    if who.admin:
        return decision
    out = dict(decision)
    cause = decision.get("cause")
    if isinstance(cause, str):
        out["cause"] = named(who, cause)
        out["reason"] = shown_text(who, str(decision.get("reason") or ""), [cause])
    if "evicted" in decision:  # a stored record of a finished run has neither
        out["evicted"] = [named(who, str(k)) for k in decision["evicted"]]
    if "actions" in decision:
        out["actions"] = [
            {**a, "workload": named(who, str(a["workload"]))} for a in decision["actions"]
        ]
    return out


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
