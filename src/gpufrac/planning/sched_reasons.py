"""Why a workload waits: one reason per cause, in the order a person would fix them.

A request that fits nowhere may be held back by several things at once: its tenant's quota, its
``spec.node_selector``, GPUs that would hold it but are cordoned or on a lost node, and the room
left under each sharing mode it may use. ``Reasons`` collects what the scheduler found, one clause
per cause (a later finding of a cause already said is dropped), and joins them in that order, so
the first clause is the first thing to fix. Each clause names only GPUs and modes the fleet has,
with the numbers that make it checkable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, get_args

from gpufrac.model.units import format_gib
from gpufrac.model.workload import Mode

# the causes, in the order their clauses are shown: ``mig_queue`` is a MIG request held behind
# an earlier one of its tenant (docs/scheduler.md), ``capacity`` the room under each mode tried,
# ``mig_nesting`` why an ``mps`` or ``timeslice`` request shares no MIG instance (docs/mig.md),
# ``moves`` why moving running work makes no room (docs/scheduler.md, "Moves that make room")
Cause = Literal[
    "quota",
    "tenant_nodes",
    "node_selector",
    "cordon",
    "node_lost",
    "mig_queue",
    "capacity",
    "mig_nesting",
    "moves",
    "preemption",
]
CAUSES: tuple[Cause, ...] = get_args(Cause)
OneClause = Literal[
    "quota",
    "tenant_nodes",
    "node_selector",
    "cordon",
    "node_lost",
    "mig_queue",
    "mig_nesting",
    "moves",
    "preemption",
]
MAX_NAMED = 4  # GPUs or nodes named in one clause; the rest are counted


class Reasons:
    """The clauses of one waiting reason, by cause; capacity has one clause per mode, in the order
    the modes were tried."""

    __slots__ = ("_capacity", "_said")

    def __init__(self) -> None:
        self._said: dict[Cause, str] = {}
        self._capacity: dict[Mode, Callable[[], str | None]] = {}

    def add(self, cause: OneClause, text: str) -> None:
        """The clause for ``cause`` (the first one said stays)."""
        self._said.setdefault(cause, text)

    def set_capacity(self, mode: Mode, clause: Callable[[], str | None]) -> None:
        """``mode``'s capacity clause (a later look at the same mode, going further, replaces
        it). It is worked out only if the reason is shown (a request placed under a later mode
        needs none), and may add clauses of other causes then (the quota it finds)."""
        self._capacity[mode] = clause

    def text(self) -> str:
        capacity = [c for clause in self._capacity.values() if (c := clause()) is not None]
        out: list[str] = []
        for cause in CAUSES:
            if cause == "capacity":
                out += capacity
            elif cause in self._said:
                out.append(self._said[cause])
        return "; ".join(out)


def named(names: Sequence[str]) -> str:
    """``a, b, c`` with at most ``MAX_NAMED`` named and the rest counted."""
    shown = ", ".join(names[:MAX_NAMED])
    more = len(names) - MAX_NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def cordoned(gpus: Sequence[tuple[str, int]]) -> str:
    """The clause for cordoned GPUs that would hold the request: (name, free MiB) each."""
    if len(gpus) == 1:
        name, free = gpus[0]
        return f"GPU {name} is cordoned ({format_gib(free)} free)"
    frees = named([format_gib(free) for _, free in gpus])
    return f"GPUs {named([n for n, _ in gpus])} are cordoned ({frees} free)"


def lost_nodes(nodes: Sequence[tuple[str, str]]) -> str:
    """The clause for lost nodes with GPUs that would hold the request: (name, detail) each."""
    said = [f"{name} ({detail})" if detail else name for name, detail in nodes]
    if len(said) == 1:
        name, detail = nodes[0]
        return f"node {name} is lost" + (f" ({detail})" if detail else "")
    return f"nodes {named(said)} are lost"
