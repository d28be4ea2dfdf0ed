"""Moves that make room: running work moved off a fragmented MIG GPU so a waiting request fits.

Pure.

A MIG request can wait although the GPUs hold enough free memory slots in all, because no one GPU
has them where its profile can go: small busy instances sit in the way. Re-cuts destroy idle
instances only (``mig_recut``), preemption (``drain``) evicts lower-priority work; neither moves
running work. The scheduler (``Scheduler.plan_moves``) may move what is movable instead:

* a deployment's replica (label ``gpufrac.io/deployment``), **replaced**: the caller starts a
  replacement replica first (the GPU being emptied is kept for the waiting request, so it lands
  elsewhere), lets it take traffic, then drains and deletes the old one; its going lets the
  request in by a re-cut. Nothing is lost, and the move costs a replica's cold start.
* a service with ``spec.movable: true``, **restarted**: released and placed elsewhere at once, as
  a preempted workload is (its port stays; it is down between); the request is placed by the same
  decision.
* a job never (a save-and-resume hook would be needed first).

Moves are bounded by a budget (``MoveBudget``): moves begun for one tenant's requests in any
minute, and of one workload (a deployment counts as one) in any hour, so nothing thrashes. What
this module holds: the move records, which workloads may move and how, and the budget; the
search is the scheduler's (it needs its candidates and filters).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from gpufrac.model.deployment import LABEL as DEPLOYMENT_LABEL
from gpufrac.model.mig import MigPlacement
from gpufrac.model.workload import WorkloadSpec

MoveHow = Literal["replace", "restart"]
MOVE_HOWS: tuple[MoveHow, ...] = get_args(MoveHow)

# a plan whose moves have not let its request in after this long is given up: its GPU is no longer
# kept, and the replicas still in place stay where they are (a replacement that never became ready)
MOVE_TIMEOUT_S = 600.0
MOVE_SUFFIX = "~move"  # the name of a trial request standing for a mover's replacement


@dataclass(frozen=True, slots=True)
class Move:
    """``workload`` leaves instance ``placement`` of GPU ``gpu`` (a UUID) so that ``cause`` (a
    waiting request) can have a profile there."""

    workload: str
    gpu: str
    placement: MigPlacement
    how: MoveHow
    cause: str

    def to_json(self) -> dict[str, object]:
        return {
            "workload": self.workload,
            "gpu": self.gpu,
            "mig": self.placement.to_json(),
            "how": self.how,
            "cause": self.cause,
        }


@dataclass(slots=True)
class MovePlan:
    """The moves begun for one waiting request, and the GPU kept for it meanwhile."""

    request: str
    gpu: int  # the GPU's index in the scheduler's state
    moves: tuple[Move, ...]
    begun: float
    reason: str  # the request's reason while it waits for them
    left: set[str] = field(default_factory=set)  # replicas still in place (replacements pending)
    restarted: bool = (
        False  # its movable services were restarted elsewhere (once no replica is left)
    )

    @property
    def restarts(self) -> bool:
        return any(m.how == "restart" for m in self.moves)


def move_how(spec: WorkloadSpec) -> MoveHow | None:
    """How ``spec`` may be moved, or None if it may not be."""
    if DEPLOYMENT_LABEL in spec.labels and spec.type == "service":  # the label is gpufrac's own
        return "replace"
    if spec.movable and spec.type == "service":
        return "restart"
    return None


def budget_key(spec: WorkloadSpec) -> str:
    """Whose moves count together against the per-workload budget: a deployment's (its replicas
    are replaced by new ones of other names), else the workload's own."""
    group = spec.labels.get(DEPLOYMENT_LABEL)
    return f"{spec.tenant}/{group}" if group is not None else f"{spec.tenant}/{spec.name}"


class MoveBudget:
    """Moves begun for one tenant's requests in any minute (``per_minute``) and, for one tenant's
    requests, of one key in any hour (``per_workload_hour``: a deployment's replicas are one key):
    no tenant spends another's budget (nor makes a deployment's owner unable to move it), and no
    tenant makes another's deployment pay cold starts more often. By the times the clock gave
    when each began."""

    def __init__(self, per_minute: int, per_workload_hour: int, clock: Callable[[], float]) -> None:
        self.per_minute, self.per_workload_hour = per_minute, per_workload_hour
        self.clock = clock
        self._recent: dict[str, deque[float]] = {}  # per requesting tenant, the last minute's
        # per (requesting tenant, key): its moves of the last hour, so no tenant spends another's
        self._by_key: dict[tuple[str, str], deque[float]] = {}
        self.begun = 0  # in all, since start

    def _trim(self, now: float) -> None:
        for key in list(self._recent):
            _drop_older(self._recent, key, now - 60.0)
        for pair in list(self._by_key):
            _drop_older(self._by_key, pair, now - 3600.0)

    def refusal(self, tenant: str, keys: Iterable[str]) -> str | None:
        """Why moves of ``keys`` (one per move) for a request of ``tenant`` may not begin now, or
        None if they may. Names no workload: it becomes the request's reason, which its tenant
        reads, and the movers may be another tenant's."""
        now = self.clock()
        self._trim(now)
        keys = list(keys)
        recent = len(self._recent.get(tenant, ()))
        if recent + len(keys) > self.per_minute:
            return (
                f"{recent} move(s) begun for tenant {tenant}'s requests in the last minute, at "
                f"most {self.per_minute} (max_moves_per_minute in gpufrac.yaml)"
            )
        for key in set(keys):
            moved = len(self._by_key.get((tenant, key), ()))
            if moved + keys.count(key) > self.per_workload_hour:
                return (
                    f"work in the way was moved {moved} time(s) in the last hour, at most "
                    f"{self.per_workload_hour} (max_moves_per_workload_per_hour in gpufrac.yaml)"
                )
        return None

    def spend(self, tenant: str, keys: Iterable[str]) -> None:
        now = self.clock()
        for key in keys:
            self._recent.setdefault(tenant, deque()).append(now)
            self._by_key.setdefault((tenant, key), deque()).append(now)
            self.begun += 1


def _drop_older(windows: dict[Any, deque[float]], key: object, before: float) -> None:
    """Drop the times up to ``before`` from ``windows[key]``, and the key with its last."""
    q = windows[key]
    while q and q[0] <= before:
        q.popleft()
    if not q:
        del windows[key]
