"""The placement scheduler: where each workload runs, under which sharing mode, and what waits.
Pure.

For each submission: refuse at once what no GPU could ever hold; work out once what the request
needs (``SchedRequest``); choose the sharing modes to try (``auto``: MIG where a fitting instance is
free, can be created, or can be made by re-cutting idle instances on a GPU in MIG mode; then MPS
where a compute cap is asked, else time-slicing); for each mode take a few candidates from the
state's indexes, run the pre-filter and filter plugins, score the survivors with the score plugins,
and reserve the best. If nothing fits, preempt the fewest, lowest-priority workloads that make room
(never one of equal or higher priority); else the workload waits in the pending queue with a reason
a person can read.

Plugins see the fleet through a narrow read-only ``PluginContext`` (``SchedContext`` here). Every
change of the state goes through a ``Statement`` that is rolled back if the change does not go
through whole.

Decisions are values (``Decision`` with its ``SchedAction`` list) that the node agent carries out.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import assert_never

from gpufrac.errors import InputError
from gpufrac.model.advice import request_warnings
from gpufrac.model.catalog import GpuModel
from gpufrac.model.deployment import LABEL as DEPLOYMENT_LABEL
from gpufrac.model.mig import MigPlacement, check_layout
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.units import format_mib
from gpufrac.model.workload import Mode, WorkloadSpec
from gpufrac.planning.mig_recut import Recut, best_recut
from gpufrac.planning.moves import (
    MOVE_HOWS,
    MOVE_SUFFIX,
    MOVE_TIMEOUT_S,
    Move,
    MoveBudget,
    MoveHow,
    MovePlan,
    budget_key,
    move_how,
)
from gpufrac.planning.sched_candidates import (
    CANDIDATES_PER_MODEL,
    RecutScope,
    candidates,
    candidates_on,
    mig_candidates_on,
    nest_candidates,
    recut_scope,
)
from gpufrac.planning.sched_decision import (
    Decision,
    SchedAction,
    decision_from_json,
    decision_to_json,
    workload_key,
)
from gpufrac.planning.sched_plugins import (
    PREFILTERS,
    Candidate,
    GpuInfo,
    Policy,
    Status,
    first_refusal,
    kept_to_reason,
    over_gpus_quota,
    over_memory_quota,
    refusal_if_open,
    score,
)
from gpufrac.planning.sched_preempt import preemption
from gpufrac.planning.sched_reasons import MAX_NAMED, Reasons, cordoned, lost_nodes
from gpufrac.planning.sched_request import Need, SchedRequest
from gpufrac.planning.sched_state import (
    SHARED_MODES,
    Allocation,
    ClusterState,
    SchedGpu,
    Statement,
)

RECUT_BYPASS = 8
"""How many later MIG requests of its tenant may have a GPU re-cut for them while a MIG request
waits (backfill), before re-cuts serve it first: it is passed over a bounded number of times, never
for ever."""

__all__ = [
    "Decision",
    "SchedAction",
    "Scheduler",
    "decision_from_json",
    "decision_to_json",
    "workload_key",
]


class SchedContext:
    """The read-only view of the scheduler that plugins get (``sched_plugins.PluginContext``)."""

    __slots__ = ("_policy", "_requests", "_settings", "_state")

    def __init__(
        self,
        state: ClusterState,
        requests: Mapping[str, SchedRequest],
        settings: OperatorSettings,
        policy: Policy,
    ) -> None:
        self._state, self._requests = state, requests
        self._settings, self._policy = settings, policy

    @property
    def gpus(self) -> Sequence[GpuInfo]:
        return self._state.gpus

    @property
    def settings(self) -> OperatorSettings:
        return self._settings

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def largest_gpu_mib(self) -> int:
        return self._state.largest_gpu_mib

    def tenant_use(self, tenant: str) -> tuple[int, int]:
        return self._state.tenant_mem[tenant], self._state.tenant_milli[tenant]

    def labels_of(self, workload: str) -> Mapping[str, str]:
        req = self._requests.get(workload)
        return {} if req is None else req.spec.labels


class PendingQueue(dict[str, str]):
    """Waiting workloads and why (a dict), keeping aside those that want MIG: the queue a re-cut
    serves in order."""

    def __init__(self, requests: Mapping[str, SchedRequest]) -> None:
        super().__init__()
        self._requests = requests
        self.mig: set[str] = set()
        # a waiting workload whose reason names the workload that took its place -> that workload
        self.causes: dict[str, str] = {}

    def __setitem__(self, key: str, reason: str) -> None:
        super().__setitem__(key, reason)
        self.causes.pop(key, None)
        if "mig" in self._requests[key].kinds:
            self.mig.add(key)

    def displace(self, key: str, reason: str, cause: str | None) -> None:
        """``key`` waits because ``cause`` took its place (``reason`` names it)."""
        self[key] = reason
        if cause is not None:
            self.causes[key] = cause

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self.mig.discard(key)
        self.causes.pop(key, None)

    def pop(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        self.mig.discard(key)
        self.causes.pop(key, None)
        return super().pop(key, default)

    def decision(self, key: str, default: str = "not placed") -> Decision:
        """Why ``key`` waits, as a decision (with the workload that took its place, if one did)."""
        return Decision(key, "pending", self.get(key, default), cause=self.causes.get(key))


def preempted_by(req: SchedRequest, _victim: str) -> str:
    """A victim's reason: who preempted it. It names the preemptor, whoever's the victim is: the
    decision carries it as its ``cause``, and what a viewer may not see is hidden when it is shown
    (the API: another tenant's workload is not named, not even by name)."""
    return f"preempted by {req.key} (priority {req.priority})"


MAX_REFUSALS = 3  # GPUs passed over that one capacity clause names


def note(refused: list[str], why: str) -> None:
    """Keep ``why`` a GPU was passed over, once, up to ``MAX_REFUSALS`` of them."""
    if len(refused) < MAX_REFUSALS and why not in refused:
        refused.append(why)


def not_counting(closed: int) -> str:
    """What a capacity clause adds about GPUs that would count but take no new work."""
    if not closed:
        return ""
    return f", not counting {closed} that take{'s' if closed == 1 else ''} no new work"


def gpu_name(g: SchedGpu) -> str:
    """How a reason names a GPU: by its index on one machine; a cluster's as ``NODE/UUID``, the
    name its cordon and uncordon take (the core's own indexes mean nothing to a user)."""
    return g.uuid if g.node and g.uuid.startswith(f"{g.node}/") else str(g.index)


# moves: the waiting requests a pass plans for at most, and the GPUs looked at for one
MOVE_REQUESTS_PER_PASS = 8
MOVE_SCAN_PER_PASS = 64
MOVE_OPTIONS = 8
MOVE_SAID: dict[MoveHow, str] = {
    "replace": "replica(s) replaced first, then drained",
    "restart": "movable service(s) restarted elsewhere",
}


class Scheduler:
    def __init__(
        self,
        gpus: list[SchedGpu],
        settings: OperatorSettings | None = None,
        *,
        policy: Policy | None = None,
        recut: RecutScope | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: the time moves are counted by (``planning/moves.py``), in seconds."""
        self.state = ClusterState(gpus)
        self.settings = settings or OperatorSettings()
        self.policy: Policy = policy or self.settings.placement_policy
        self.recut: RecutScope = recut or recut_scope(self.settings.mig_reconfigure)
        self.requests: dict[str, SchedRequest] = {}
        self.pending = PendingQueue(self.requests)  # workload -> why it waits
        self._seq = itertools.count()
        self._passed: dict[str, int] = {}  # waiting MIG request -> later re-cuts that went first
        # a held MIG request (see _holds) -> the GPU kept for it: requests it outranks take nothing
        # there, so the GPU's busy instances end and it can be re-cut for the one that waits
        self._reserved: dict[str, int] = {}
        # a waiting MIG request -> the moves begun to make room for it, and the GPU kept for it
        self._plans: dict[str, MovePlan] = {}
        # (tenant, GPU) where moves for the tenant's request timed out -> when: no new ones there
        # for as long (a request of another name would keep the GPU again)
        self._gave_up: dict[tuple[str, int], float] = {}
        self._unkept: set[int] = set()  # GPUs a dropped plan kept: what waits is tried there
        self._replan: set[str] = set()  # requests whose plan a higher one outran: tried afresh
        self._avoid: set[int] = set()  # GPUs a mover's room is looked for off (``_elsewhere``)
        self._scan = 0  # where the next pass's look for moves begins in the queue (round robin)
        self.clock = clock
        self.move_budget = MoveBudget(
            self.settings.max_moves_per_minute, self.settings.max_moves_per_workload_per_hour, clock
        )
        self.ctx = SchedContext(self.state, self.requests, self.settings, self.policy)

    # -- what it knows ---------------------------------------------------------------------------

    def knows(self, key: str) -> bool:
        return key in self.requests

    def spec(self, key: str) -> WorkloadSpec | None:
        req = self.requests.get(key)
        return None if req is None else req.spec

    def allocations(self, key: str) -> list[Allocation]:
        return self.state.allocs.get(key, [])

    @property
    def moving(self) -> dict[str, Move]:
        """The deployment replicas being moved (``how == "replace"``) whose move is still wanted:
        the caller starts a replacement of each, and deletes the replica once its replacement
        serves. A replica missing here is no longer to be moved (its request was placed, deleted,
        or its moves timed out)."""
        return {
            m.workload: m
            for plan in self._plans.values()
            for m in plan.moves
            if m.workload in plan.left
        }

    def moves_of(self, key: str) -> tuple[Move, ...]:
        """The moves begun for ``key`` while it waits for them; none without a plan (never begun,
        given up, or its request placed or deleted)."""
        plan = self._plans.get(key)
        return () if plan is None else plan.moves

    # -- the public operations -----------------------------------------------------------------

    def submit(self, spec: WorkloadSpec) -> list[Decision]:
        """Place ``spec`` (possibly preempting); returns its decision, then those of evicted
        workloads."""
        key = workload_key(spec)
        if key in self.requests:
            raise InputError(
                f"workload {key} is already submitted",
                field="metadata.name",
                fix="delete it first, or use another name",
            )
        req = SchedRequest(spec, next(self._seq), self.settings.kept_to(spec.tenant))
        refusal = self._never_fits(req)
        if refusal:
            return [Decision(key, "refused", refusal)]
        self.requests[key] = req
        return self._try(req, preempt=True)

    def submit_all(self, specs: Sequence[WorkloadSpec]) -> list[Decision]:
        """Place workloads that arrive together (a deployment's new replicas): each is known as
        waiting before the first is tried, so the nesting rule counts them among the needs a new
        shared MIG instance would serve; then each is tried as ``submit`` tries one, in the order
        they came. Returns every decision (a refusal for what no GPU could ever hold)."""
        keys = [workload_key(spec) for spec in specs]
        twice = next((k for k in keys if k in self.requests or keys.count(k) > 1), None)
        if twice is not None:
            raise InputError(
                f"workload {twice} is already submitted",
                field="metadata.name",
                fix="delete it first, or use another name",
            )
        out: list[Decision] = []
        batch: list[SchedRequest] = []
        for spec, key in zip(specs, keys, strict=True):
            req = SchedRequest(spec, next(self._seq), self.settings.kept_to(spec.tenant))
            refusal = self._never_fits(req)
            if refusal:
                out.append(Decision(key, "refused", refusal))
                continue
            self.requests[key] = req
            self.pending[key] = "waiting for the workloads submitted with it to be tried"
            batch.append(req)
        for req in batch:  # in the order they came (a manifest's documents), as one at a time
            if req.key in self.pending and req.key not in self.state.allocs:
                del self.pending[req.key]  # tried now (a shared instance may have taken it)
                out += self._try(req, preempt=True)
        return out

    def refusal(self, spec: WorkloadSpec) -> str | None:
        """Why no GPU here could ever run ``spec`` (None if one could)."""
        return self._never_fits(SchedRequest(spec, 0, self.settings.kept_to(spec.tenant)))

    def warnings(self, spec: WorkloadSpec, decision: Decision | None) -> list[str]:
        """What ``apply`` says about a request that was probably not meant as written (the MIG
        profile it was placed on, where it was)."""
        profile = None  # a share nested in an instance takes its memory, not the instance
        if (
            decision is not None
            and decision.mig is not None
            and decision.gpus
            and (decision.mode == "mig")
        ):
            g = self.state.by_uuid.get(decision.gpus[0])
            if g is not None and g.model.has_profile(decision.mig.profile):
                profile = g.model.profile(decision.mig.profile)
        return request_warnings(spec, profile)

    def relayout(
        self, uuid: str, mig: bool, placements: list[MigPlacement], *, pinned: bool = True
    ) -> None:
        """A GPU's MIG mode or instances were changed outside the scheduler (by an operator): take
        the new picture. Instances that stay keep their owners; ``pinned`` keeps the layout as it
        is."""
        self.state.relayout(self.state.by_uuid[uuid], mig, placements, pinned=pinned)

    def set_pinned(self, uuid: str, pinned: bool) -> list[Decision]:
        """Pin a GPU's MIG layout, or release it (then pending workloads may get a re-cut there)."""
        g = self.state.by_uuid[uuid]
        self.state.set_pinned(g, pinned)
        return [] if pinned else self.retry_pending(gpus={g.index}, tenant=None)

    def update_live(self, spec: WorkloadSpec) -> list[Decision]:
        """Take a spec whose change needs no new placement (priority, QoS): a placed workload stays
        where it is, with its allocations carrying the new priority (so preemption sees it); a
        pending one whose priority rose is tried again, with preemption, as a new submission would
        be."""
        key = workload_key(spec)
        old = self.requests.get(key)
        if old is None:
            return []
        req = self.requests[key] = old.with_spec(spec)
        placed = self.state.allocs.get(key)
        if placed and old.priority != spec.priority:
            self.state.release(key)
            self.state.allocate([replace(a, priority=spec.priority) for a in placed])
        if key in self.pending and spec.priority > old.priority:
            del self.pending[key]
            return self._try(req, preempt=True)
        return []

    def restore(self, spec: WorkloadSpec, decision: Decision) -> None:
        """Take back a placement recorded earlier (after an agent restart), exactly where it was.

        A recorded placement that no longer fits (its GPU is gone, or the GPUs changed underneath)
        puts the workload in the pending queue, to be placed again like any other; nothing of the
        trial stays.
        """
        key = workload_key(spec)
        req = self.requests[key] = SchedRequest(
            spec, next(self._seq), self.settings.kept_to(spec.tenant)
        )
        if decision.outcome != "placed" or decision.mode is None:
            self.pending.displace(key, decision.reason or "waiting", decision.cause)
            return
        with self.state.statement() as trial:
            why = self._restore_trial(trial, req, decision)
            if why is not None:
                trial.rollback()
                self.pending[key] = why
                return
            trial.commit()

    def _restore_trial(self, trial: Statement, req: SchedRequest, decision: Decision) -> str | None:
        assert decision.mode is not None
        chosen = []
        for uuid in decision.gpus:
            g = self.state.by_uuid.get(uuid)
            if g is None:
                return f"its GPU {uuid} is gone"
            if (decision.mig is not None) != g.mig:
                return f"GPU {g.index}'s MIG mode changed"
            profile = decision.mig.profile if decision.mig is not None else None
            if decision.mig is not None and decision.mode in SHARED_MODES:
                shared = req.nest_need(g.model)  # a share of a MIG instance shared inside
                if shared is None:
                    return "it no longer shares a MIG instance"
                need = shared
            else:
                need = req.need(g.model, decision.mode, profile)
            create = decision.mig is not None and decision.mig not in g.instances
            # a re-cut not yet made (decided before a restart, or by a cluster's control plane):
            # the idle instances it destroys go in the same trial
            destroy = tuple(
                a.mig
                for a in decision.actions
                if a.mig_change == "destroy"
                and a.gpu_uuid == uuid
                and a.mig is not None
                and g.instances.get(a.mig, "") is None
            )
            if decision.mig is not None:
                kept = {*g.instances} - set(destroy)
                if create and check_layout(g.model, tuple(sorted({*kept, decision.mig}))):
                    return f"its MIG instance {decision.mig} no longer fits on GPU {g.index}"
                trial.claim_external(g, decision.mig)
            chosen.append(Candidate(g.index, decision.mode, need, decision.mig, create, destroy))
        if len(chosen) > 1:  # its GPUs together: an MPS domain is checked whole
            together = tuple(sorted(c.gpu for c in chosen))
            chosen = [replace(c, together=together) for c in chosen]
        if any(first_refusal(self.ctx, req, c) is not None for c in chosen):
            return "its recorded placement no longer fits"
        self._commit(trial, req, chosen, ())
        return None

    def add_gpus(self, gpus: list[SchedGpu], *, retry: bool = True) -> list[Decision]:
        """GPUs that joined the fleet (a cluster's node); what waits is tried on them (unless
        ``retry`` is False: the caller restores placements there first)."""
        self.state.add_gpus(gpus)
        return self.retry_pending(gpus={g.index for g in gpus}) if retry else []

    def delete(self, tenant: str, name: str) -> list[Decision]:
        """Remove a workload; returns the decisions of pending workloads that now fit."""
        key = f"{tenant}/{name}"
        if key not in self.requests:
            raise InputError(f"no workload {key}", field="metadata.name")
        del self.requests[key]
        self.pending.pop(key, None)
        self._passed.pop(key, None)
        self._reserved.pop(key, None)
        dropped = self._plans.pop(key, None)
        if dropped is not None:
            self._unkept.add(dropped.gpu)
        self._replan.discard(key)
        for plan in self._plans.values():  # a replica moved: its replacement serves, it went
            plan.left.discard(key)
        freed = self.state.release(key)
        if not freed:
            return []
        return self.retry_pending(gpus={a.gpu for a in freed}, tenant=tenant)

    def retry_pending(
        self, gpus: set[int] | None = None, tenant: str | None = None
    ) -> list[Decision]:
        """Try the pending workloads again, most important first.

        After a delete only two things can have changed: room on the GPUs it freed, and its tenant's
        quota. So a pending workload of another tenant is tried on those GPUs alone (unless it wants
        whole GPUs and one became empty), which keeps a delete cheap however long the queue is.
        """
        out = []
        kinds = (
            None if gpus is None else {"mig" if self.state.gpus[i].mig else "plain" for i in gpus}
        )
        todo = []
        for key in self.pending:
            req = self.requests[key]
            usable = req.kinds | ({"mig"} if self._may_nest(req) else set())
            if kinds is not None and req.tenant != tenant and not usable & kinds:
                continue  # the freed GPUs are of a kind this workload cannot use
            todo.append(req)
        todo.sort(key=lambda r: (-r.priority, r.order))
        if self.recut != "none":
            # first, MIG instances that are free as they are, to whoever waits for their very
            # profile (no MIG change at all); only then may the first in line have a GPU re-cut for
            # it
            unfit: set[int] = set()
            for req in [r for r in todo if "mig" in r.kinds]:
                if req.shape in unfit:
                    continue
                decisions = self._try(req, preempt=False, only=gpus, scope="none")
                if decisions[0].outcome == "placed":
                    out.extend(decisions)
                    todo.remove(req)
                else:
                    unfit.add(req.shape)
        failed: set[int] = set()  # shapes that did not fit: their twins will not
        behind: set[str] = set()  # tenants with a MIG request waiting ahead: no re-cut after it
        for req in todo:
            if req.shape in failed:
                if "mig" in req.kinds and self._holds(req):
                    behind.add(req.tenant)
                continue
            spec = req.spec
            several = spec.gpu.count or spec.gpu.devices > 1  # GPUs taken together: anywhere
            only = None if gpus is None or spec.tenant == tenant or several else gpus
            decisions = self._try(req, preempt=False, only=only, behind=req.tenant in behind)
            if decisions[0].outcome == "placed":
                out.extend(decisions)
            else:
                failed.add(req.shape)
                if "mig" in req.kinds and self._holds(req):
                    behind.add(req.tenant)

        return out

    # -- one attempt -----------------------------------------------------------------------------

    def _try(
        self,
        req: SchedRequest,
        *,
        preempt: bool,
        only: set[int] | None = None,
        scope: RecutScope | None = None,
        behind: bool | None = None,
    ) -> list[Decision]:
        """Place ``req`` if it fits (``only`` on those GPUs; MIG re-cut no further than ``scope``);
        ``behind``: whether an earlier MIG request waits (None: look)."""
        key = req.key
        reasons = Reasons()
        if req.kept_to and not any(not req.missing_kept(n) for n in self.state.nodes.values()):
            reason = kept_to_reason(req) + ": no node has those labels"
            self.pending[key] = reason
            return [Decision(key, "pending", reason)]
        if req.selector and not any(req.admits(lab) for lab in self.state.nodes.values()):
            reason = "no node has its spec.node_selector labels: " + "; ".join(
                f"node {node or '(unnamed)'} lacks {', '.join(req.missing_labels(lab))}"
                for node, lab in sorted(self.state.nodes.items())
            )
            self.pending[key] = reason
            return [Decision(key, "pending", reason)]
        steps: list[tuple[Mode, bool, bool]] = [(m, False, False) for m in req.modes]
        if req.nest_mode is not None and self._may_nest(req):
            # sharing a MIG instance inside comes first, where the nesting rule lets it
            steps.insert(0, (req.nest_mode, True, False))
            if req.spec.sharing in ("mps", "timeslice"):
                # at last, for a request that asked for that mode (no whole instance is one of
                # it): a new instance run under its mode, opened for it alone, which later small
                # requests of that mode may join
                steps.append((req.nest_mode, True, True))
        for mode, nest, alone in steps:
            if scope == "none" and mode != "mig" and not nest:
                continue
            allowed = scope or self.recut
            if nest:
                chosen = self._choose(req, mode, reasons, only, allowed, nest=True, alone=alone)
            elif mode == "mig" and allowed in ("idle", "drain"):
                # a free instance or free space first, anywhere; a re-cut only if none, and only
                # when no earlier MIG request of at least this priority waits that later ones
                # have already gone ahead of RECUT_BYPASS times (it then serves the queue in order,
                # so a later one cannot cut away the room the one before it waits for for ever)
                chosen = self._choose(req, mode, reasons, only, "create")
                waits = self._waits_behind(req) if behind is None else behind
                if not chosen and not waits:
                    chosen = self._choose(req, mode, reasons, only, allowed)
                    if chosen and chosen[0].destroy:
                        for other in self._earlier(req):
                            self._passed[other.key] = self._passed.get(other.key, 0) + 1
                elif not chosen:
                    reasons.add(
                        "mig_queue",
                        f"an earlier MIG request of tenant {req.tenant} waits: re-cuts serve a "
                        "tenant's requests in order once one has been passed over "
                        f"{RECUT_BYPASS} times, so this one takes only free instances and free "
                        "space for now",
                    )
            else:
                chosen = self._choose(req, mode, reasons, only, allowed)
            if chosen:
                with self.state.statement() as st:
                    placed = self._commit(st, req, chosen, ())
                    st.commit()
                self._reserved.pop(key, None)
                made_room = self._plans.pop(key, None)
                if made_room is not None:  # the moves that made room for it stay on its record
                    placed = replace(placed, moves=made_room.moves)
                    if made_room.gpu not in {c.gpu for c in chosen}:
                        self._unkept.add(made_room.gpu)
                taken = {c.gpu for c in chosen}
                for outrun in [k for k, p in self._plans.items() if p.gpu in taken]:
                    # a request of higher priority took the GPU a plan kept: that plan is over;
                    # what waited for the GPU, and its request, are tried afresh next pass
                    self._unkept.add(self._plans.pop(outrun).gpu)
                    self._replan.add(outrun)
                if nest and preempt and self._opened_nest(chosen[0]):
                    # a new shared instance was made for two waiting needs: the other (and any
                    # more that fit) take their shares of it now (not from within a retry, whose
                    # own pass goes on to them)
                    return [placed, *self.retry_pending(gpus={chosen[0].gpu}, tenant=None)]
                return [placed]
            if mode == "mig" and not nest and allowed in ("idle", "drain") and self._holds(req):
                self._reserve(req)
        if key in self._plans:  # moves under way make room for it: its reason says so
            self.pending[key] = self._plans[key].reason
            return [self.pending.decision(key)]
        if only is not None or scope is not None:  # a cheap retry found nothing: the reason stays
            return [self.pending.decision(key)]
        no_move = None  # why no move makes room (a clause of its reason)
        if preempt:  # moves lose nothing: tried before anyone is evicted
            self.pending[key] = reasons.text() or "no GPU has room"
            moved = self._plan_moves(req)
            if isinstance(moved, list):
                return moved
            no_move = moved
        policy = self.settings.preemption(req.tenant, req.spec.preemption)
        several = req.spec.gpu.devices > 1  # a share of several GPUs waits: no one is evicted
        if preempt and several and self.state.min_priority() < req.priority:
            reasons.add(
                "preemption",
                f"a share of each of {req.spec.gpu.devices} GPUs evicts no one: it waits for "
                "room on each",
            )
        elif preempt and policy != "never":
            plan = preemption(self.state, req, self.settings, self.recut)
            if plan is not None:
                return self._preempt(req, *plan)
            if policy == "own-tenant" and self.state.min_priority() < req.priority:
                reasons.add(
                    "preemption",
                    "it may evict only its own tenant's work (its tenant's preemption)",
                )
        elif preempt and self.state.min_priority() < req.priority:
            if req.spec.preemption != "never":
                why = "its tenant's preemption: never"
            elif DEPLOYMENT_LABEL in req.spec.labels:  # the autoscaler's extra replicas wait
                why = "preemption: never, as a deployment's replicas beyond autoscale.min_replicas"
            else:
                why = "preemption: never"
            reasons.add("preemption", f"it evicts no one ({why})")
        if req.kept_to:
            reasons.add("tenant_nodes", kept_to_reason(req))
        if req.selector:
            reasons.add("node_selector", self._selected_nodes(req))
        self._closed_reasons(req, reasons)
        if no_move is not None:
            reasons.add("moves", no_move)
        reason = reasons.text() or "no GPU has room"
        self.pending[key] = reason
        return [Decision(key, "pending", reason)]

    def _selected_nodes(self, req: SchedRequest) -> str:
        """Which nodes have its ``spec.node_selector`` labels, and those that take no new work
        (every GPU cordoned, or its node lost): a reason that names them all."""
        admitted = sorted(n for n, lab in self.state.nodes.items() if req.admits(lab))
        closed = {
            n for n in admitted if not any(g.schedulable for g in self.state.gpus if g.node == n)
        }
        said = ", ".join(
            f"{n or '(unnamed)'}" + (" (takes no new work)" if n in closed else "")
            for n in admitted
        )
        lacking = [
            f"node {n or '(unnamed)'} lacks label{'s' if len(miss) > 1 else ''} {', '.join(miss)}"
            for n, lab in sorted(self.state.nodes.items())
            if (miss := req.missing_labels(lab))
        ]
        more = len(lacking) - MAX_NAMED
        others = (
            ", while "
            + " and ".join(lacking[:MAX_NAMED])
            + (f" (and {more} more)" if more > 0 else "")
            if lacking
            else ""
        )
        return f"nodes with its spec.node_selector labels: {said}{others}"

    def _closed_reasons(self, req: SchedRequest, reasons: Reasons) -> None:
        """The cordoned GPUs and lost nodes that would hold ``req`` were they open: a clause for
        each cause (a GPU closed for a reason that would not hold it anyway is not named)."""
        shut: list[tuple[str, int]] = []
        lost: dict[str, str] = {}
        for gi in sorted(self.state.closed):
            g = self.state.gpus[gi]
            if g.closed is None or not req.admits(g.node_labels) or not self._fits_if_open(req, g):
                continue
            match g.closed.cause:
                case "cordoned":
                    shut.append((gpu_name(g), g.free_mib))
                case "node_lost":
                    lost.setdefault(g.node or "(unnamed)", g.closed.detail)
                case _ as never:
                    assert_never(never)
        if shut:
            reasons.add("cordon", cordoned(shut))
        if lost:
            reasons.add("node_lost", lost_nodes(sorted(lost.items())))

    def _fits_if_open(self, req: SchedRequest, g: SchedGpu) -> bool:
        """Whether closed GPU ``g`` would take ``req`` (or one of its whole GPUs) were it open."""
        for mode in req.modes:
            if mode == "mig":
                found = mig_candidates_on(self.state, req, g, self.recut)
            elif g.mig or req.need(g.model, mode).memory_mib > g.total_mib:
                continue
            else:
                found = iter([Candidate(g.index, mode, req.need(g.model, mode))])
            if any(refusal_if_open(self.ctx, req, c) is None for c in found):
                return True
        return False

    def _earlier(self, req: SchedRequest) -> list[SchedRequest]:
        """The waiting MIG requests of ``req``'s tenant that came before it, of at least its
        priority (one tenant's waiting request never holds another tenant's back)."""
        out = []
        for key in self.pending.mig:
            other = self.requests[key]
            if (
                other.tenant == req.tenant
                and other.order < req.order
                and other.priority >= req.priority
            ):
                out.append(other)
        return out

    def _holds(self, req: SchedRequest) -> bool:
        """Whether waiting ``req`` holds back the re-cuts of later requests of its tenant: once
        later ones have gone ahead of it by a re-cut ``RECUT_BYPASS`` times."""
        return self._passed.get(req.key, 0) >= RECUT_BYPASS

    def _offers(self, req: SchedRequest, g: SchedGpu) -> bool:
        """Whether MIG GPU ``g`` has a free instance of ``req``'s profile, or room for one."""
        profile = req.mig_profile(g.model)
        if profile is None:
            return False
        key = (g.model.key, profile)
        return any(gi == g.index for gi, _ in self.state.free_instances.get(key, ())) or (
            g.index in self.state.addable.get(key, ())
        )

    def _kept_from(self, req: SchedRequest) -> set[int]:
        """The GPUs kept for held MIG requests of ``req``'s tenant that come before it (higher
        priority, or equal and earlier), and those being emptied by moves for another request."""
        kept = set(self._avoid) | {
            plan.gpu
            for key, plan in self._plans.items()
            if key != req.key
            and (self.requests[key].priority >= req.priority or self._replaces(req, plan))
        }
        for key, gi in self._reserved.items():
            other = self.requests.get(key)
            if (
                other is not None
                and key != req.key
                and other.tenant == req.tenant
                and (
                    other.priority > req.priority
                    or (other.priority == req.priority and other.order < req.order)
                )
            ):
                kept.add(gi)
        return kept

    def _replaces(self, req: SchedRequest, plan: MovePlan) -> bool:
        """Whether ``req`` is a replica of a deployment one of whose replicas ``plan`` moves (its
        replacement, whatever its priority, goes elsewhere)."""
        group = req.spec.labels.get(DEPLOYMENT_LABEL)
        if group is None:
            return False
        for key in plan.left:
            mover = self.requests.get(key)
            if (
                mover is not None
                and mover.tenant == req.tenant
                and mover.spec.labels.get(DEPLOYMENT_LABEL) == group
            ):
                return True
        return False

    def _reserve(self, req: SchedRequest) -> None:
        """Keep a GPU for held ``req``: the MIG GPU where its profile would destroy the fewest busy
        instances (were all idle), then the fewest busy memory slots. Kept until it is placed."""
        if req.key in self._reserved:
            return
        taken = set(self._reserved.values())
        best: tuple[tuple[int, int, int], int] | None = None
        for g in self.state.gpus:
            if not g.mig or g.pinned or not g.schedulable or g.index in taken:
                continue
            if not req.admits(g.node_labels):
                continue
            profile = req.mig_profile(g.model)
            if profile is None:
                continue
            found = best_recut(g.model, dict.fromkeys(g.instances), profile)
            if found is None:
                continue
            busy = [pl for pl in found.destroy if g.instances.get(pl) is not None]
            slots = sum(g.model.profile(pl.profile).memory_slots for pl in busy)
            cost = (len(busy), slots, g.index)
            if best is None or cost < best[0]:
                best = (cost, g.index)
        if best is not None:
            self._reserved[req.key] = best[1]

    def _waits_behind(self, req: SchedRequest) -> bool:
        """Whether an earlier MIG request of the same tenant, of at least ``req``'s priority, waits
        and holds the re-cuts behind it (``_holds``)."""
        return any(self._holds(other) for other in self._earlier(req))

    # -- moves that make room (planning/moves.py) --------------------------------------------------

    def plan_moves(self) -> list[Decision]:
        """Called now and then (each reconcile pass): give up move plans that did not let their
        request in within ``MOVE_TIMEOUT_S`` (the request's new reason in a decision), forget those
        whose request was placed or deleted, and begin moves for waiting MIG requests that have
        none (most important first, as the budget allows: a request refused for the budget now is
        tried again later). Returns the decisions: the waiting requests' (with their ``moves``),
        and those of the services restarted elsewhere."""
        out: list[Decision] = []
        now = self.clock()
        for key, plan in list(self._plans.items()):
            if key not in self.pending:
                del self._plans[key]
                self._unkept.add(plan.gpu)
            elif now - plan.begun > MOVE_TIMEOUT_S:
                del self._plans[key]
                self._unkept.add(plan.gpu)
                self._gave_up[(self.requests[key].tenant, plan.gpu)] = now
                reason = (
                    f"{self.pending[key]}; the moves begun for it {now - plan.begun:.0f} s ago "
                    f"did not let it in within {MOVE_TIMEOUT_S:.0f} s (a replacement never "
                    "became ready, or its GPU changed): given up, the replicas stay where they are"
                )
                self.pending[key] = reason
                out.append(Decision(key, "pending", reason))
            elif not plan.left and not plan.restarted and plan.restarts:
                # the replicas went: the movable services' turn (if they still may), then the
                # request's
                req = self.requests[key]
                if all(self._may_move(m.workload, req) for m in plan.moves if m.how == "restart"):
                    out += self._restart_movers(req, plan)
                else:  # a service's priority, or its tenant's setting, changed since
                    del self._plans[key]
                    self._unkept.add(plan.gpu)
                    self._replan.add(key)
        if self._unkept:  # what waited for a GPU a plan kept may have it now
            unkept, self._unkept = self._unkept, set()
            out += self.retry_pending(gpus=unkept, tenant=None)
        for where in [w for w, t in self._gave_up.items() if now - t > MOVE_TIMEOUT_S]:
            del self._gave_up[where]
        for key in sorted(self._replan):  # a plan another outran: its reason and moves afresh
            self._replan.discard(key)
            if key not in self.pending or key in self._plans:
                continue
            fresh = self._try(self.requests[key], preempt=False)
            if fresh[0].outcome != "placed":
                moved = self._plan_moves(self.requests[key])
                if isinstance(moved, list):
                    fresh = moved
                elif moved is not None:
                    self.pending[key] = f"{self.pending[key]}; {moved}"
                    fresh = [self.pending.decision(key)]
            out += fresh
        if not self.settings.mig_moves:
            return out
        todo = sorted(
            (self.requests[k] for k in self.pending.mig if k not in self._plans),
            key=lambda r: (-r.priority, r.order),
        )
        # one request of each shape (its twins fare the same), at most MOVE_SCAN_PER_PASS of them
        # a pass, taken in turn from where the last pass stopped: requests no move can help do
        # not keep the rest from ever being looked at
        shapes: dict[int, SchedRequest] = {}
        for req in todo:
            shapes.setdefault(req.shape, req)
        firsts = list(shapes.values())
        if not firsts:
            return out
        start = self._scan % len(firsts)
        turn = (firsts[start:] + firsts[:start])[:MOVE_SCAN_PER_PASS]
        self._scan = start + len(turn)
        begun = 0
        for req in turn:
            if req.key not in self.pending or req.key in self._plans:
                continue  # placed, or given moves, by this pass already
            moved = self._plan_moves(req)
            if isinstance(moved, list):
                out += moved
                begun += 1
                if begun >= MOVE_REQUESTS_PER_PASS:
                    break
        return out

    def _plan_moves(self, req: SchedRequest) -> list[Decision] | str | None:
        """Begin the fewest moves of movable work off one MIG GPU that let ``req`` (waiting) in by
        a re-cut there, each mover having room elsewhere now: the decisions. Else why no move
        makes room, for its reason (counted, never naming another's work), or None where moves
        have nothing to say (not a MIG request, moves under way, nothing in the way)."""
        if self.recut == "none" or "mig" not in req.kinds or req.key in self._plans:
            return None
        if any(self._replaces(req, plan) for plan in self._plans.values()):
            return None  # a mover's replacement moves nothing in turn: no chains of moves
        options = self._move_options(req)
        if not options:
            given_up = sorted(gi for t, gi in self._gave_up if t == req.tenant)
            if given_up:
                return (
                    f"moves begun for tenant {req.tenant}'s request on GPU "
                    f"{gpu_name(self.state.gpus[given_up[0]])} did not let it in within "
                    f"{MOVE_TIMEOUT_S:.0f} s: none are begun there again for as long"
                )
            return self._unmovable(req)
        first = f"GPU {gpu_name(options[0][0])}"
        if not self.settings.mig_moves:
            return (
                f"moving running work would make room on {first}, but moves are off "
                "(mig_moves: false in gpufrac.yaml)"
            )
        held = None
        for g, recut in options:
            keys = [budget_key(self.requests[v].spec) for v in recut.evict]
            refusal = self.move_budget.refusal(req.tenant, keys)
            if refusal is not None:
                held = held or refusal
                continue
            if self._movers_fit(req, g, recut.evict):
                return self._begin_moves(req, g, recut)
        if held is not None:
            return f"a move would make room on {first}, held back for now: {held}"
        return (
            f"moving running work would make room on {first}, but what would move has no room "
            "elsewhere now"
        )

    def _unmovable(self, req: SchedRequest) -> str | None:
        """Where moving what is in the way would make room for ``req`` were it movable: said, for
        its reason (what may move, not whose work is there)."""
        for g in self.state.mig_gpus:
            if g.pinned or not g.schedulable or not req.admits(g.node_labels):
                continue
            profile = req.mig_profile(g.model)
            owners = frozenset(o for o in g.instances.values() if o is not None)
            if profile is None or not owners:
                continue
            recut = best_recut(g.model, g.instances, profile, owners)
            if recut is not None and recut.evict:
                return (
                    f"moving what is in the way on GPU {gpu_name(g)} would make room, but it may "
                    "not move now (a job never moves; a service only with spec.movable: true, of "
                    "no higher priority; another tenant's replica only for a request of at least "
                    "its priority; nothing already being moved; no share inside an instance)"
                )
        return None

    def _move_options(self, req: SchedRequest) -> list[tuple[SchedGpu, Recut]]:
        """The MIG GPUs where moving movable work (and destroying idle instances) makes room for
        ``req``'s profile, cheapest first: fewest moves, then the fewest busy memory slots."""
        kept = self._kept_from(req)
        moving = {w for plan in self._plans.values() for w in plan.left}
        options: list[tuple[tuple[int, int, int], SchedGpu, Recut]] = []
        for g in self.state.mig_gpus:
            if g.index in kept or g.pinned or not g.schedulable or not req.admits(g.node_labels):
                continue
            if (req.tenant, g.index) in self._gave_up:
                continue
            profile = req.mig_profile(g.model)
            if profile is None:
                continue
            if self._prefilter(req, req.need(g.model, "mig", profile), 1) is not None:
                continue  # its quota keeps it out there, moves or not
            movable = frozenset(
                o
                for o in g.instances.values()
                if o is not None and o not in moving and self._may_move(o, req)
            )
            if not movable:
                continue
            recut = best_recut(g.model, g.instances, profile, movable)
            if recut is None or not recut.evict:
                continue
            slots = sum(
                g.model.profile(pl.profile).memory_slots
                for pl in recut.destroy
                if g.instances.get(pl) is not None
            )
            options.append(((len(recut.evict), slots, g.index), g, recut))
        options.sort(key=lambda o: o[0])
        return [(g, recut) for _, g, recut in options[:MOVE_OPTIONS]]

    def _may_move(self, key: str, req: SchedRequest) -> bool:
        """Whether workload ``key`` may be moved for ``req``: a deployment's replica (replaced
        first, nothing lost), or a movable service of no higher priority (restarted)."""
        other = self.requests.get(key)
        if other is None:
            return False  # an instance taken outside gpufrac, or shared inside (NESTED)
        theirs = other.tenant != req.tenant
        match move_how(other.spec):
            case "replace":  # nothing lost, but a cold start: another tenant's for no lower need
                return not theirs or other.priority <= req.priority
            case "restart":  # down while it restarts: only where its tenant may evict others'
                # work at all, and of no higher priority (equal too: unlike an eviction, it runs
                # on elsewhere)
                if theirs and self.settings.preemption(req.tenant, req.spec.preemption) != (
                    "lower-priority"
                ):
                    return False
                return other.priority <= req.priority
            case None:
                return False
            case _ as never:
                assert_never(never)

    def _movers_fit(self, req: SchedRequest, g: SchedGpu, movers: Sequence[str]) -> bool:
        """Whether each of ``movers`` has room off GPU ``g`` now, together (a trial, rolled back):
        a replica's replacement starts while the replica still runs, so its room is extra."""
        self._plans[req.key] = MovePlan(req.key, g.index, (), self.clock(), "")  # g kept
        trial = self.state.statement()
        stand_ins: list[str] = []
        try:
            for v in movers:
                spec = self.requests[v].spec
                tmp = SchedRequest(
                    replace(spec, name=spec.name + MOVE_SUFFIX),
                    0,
                    self.settings.kept_to(spec.tenant),
                )
                self.requests[tmp.key] = tmp
                stand_ins.append(tmp.key)
                chosen = self._elsewhere(tmp, g.index)
                if chosen is None:
                    return False
                self._commit(trial, tmp, chosen, ())
            return True
        finally:
            trial.rollback()
            for k in stand_ins:
                del self.requests[k]
                self.pending.pop(k, None)
            del self._plans[req.key]

    def _elsewhere(self, req: SchedRequest, off: int) -> list[Candidate] | None:
        """Where ``req`` fits now without preempting anyone, off GPU ``off`` (the one being
        emptied, whatever the priorities) and the GPUs kept for others (a re-cut of idle
        instances at most)."""
        scope: RecutScope = "idle" if self.recut == "drain" else self.recut
        self._avoid = {off}
        try:
            for mode in req.modes:
                reasons = Reasons()
                if mode == "exclusive":
                    chosen = self._whole_gpus(req, reasons)
                else:
                    chosen = self._choose(req, mode, reasons, None, scope)
                if chosen:
                    return chosen
            return None
        finally:
            self._avoid = set()

    def _begin_moves(self, req: SchedRequest, g: SchedGpu, recut: Recut) -> list[Decision]:
        """Spend the budget, keep ``g`` for ``req``, and leave the replicas' replacements to the
        caller (``moving``); the movable services are restarted elsewhere once no replica is left
        to go (``_restart_movers``: at once where only services are in the way, so ``req`` is
        placed by the same decision; else by ``plan_moves`` after the replicas went, so a plan
        given up or a request deleted meanwhile restarts no service for nothing)."""
        at = {o: pl for pl, o in g.instances.items() if o is not None}
        moves = []
        for v in recut.evict:
            how = move_how(self.requests[v].spec)
            assert how is not None
            moves.append(Move(v, g.uuid, at[v], how, req.key))
        self.move_budget.spend(
            req.tenant, (budget_key(self.requests[m.workload].spec) for m in moves)
        )
        profile = recut.create.profile
        # counted, not named: the reason reaches the request's tenant as it is, and the movers
        # may be another tenant's (the decision's ``moves`` name them, rendered per reader)
        hows = [m.how for m in moves]
        said = "; ".join(f"{hows.count(h)} {MOVE_SAID[h]}" for h in MOVE_HOWS if h in hows)
        replaced = {m.workload for m in moves if m.how == "replace"}
        if replaced and "restart" in hows:
            said += " once the replicas are gone"
        reason = (
            f"waiting for {len(moves)} move(s) that make room for a {profile} on GPU "
            f"{gpu_name(g)}: {said}"
        )
        plan = MovePlan(req.key, g.index, tuple(moves), self.clock(), reason, replaced)
        self._plans[req.key] = plan
        self.pending[req.key] = reason
        if replaced:
            return [Decision(req.key, "pending", reason, moves=plan.moves)]
        return self._restart_movers(req, plan)

    def _restart_movers(self, req: SchedRequest, plan: MovePlan) -> list[Decision]:
        """Restart ``plan``'s movable services elsewhere (as preemption moves its victims), then
        try ``req`` again: its decision (placed, with the services' evictions, or waiting), then
        the services'."""
        plan.restarted = True
        g = self.state.gpus[plan.gpu]
        why = (
            f"moved to make room for {req.key} (a {req.mig_profile(g.model)} on GPU {gpu_name(g)})"
        )
        restarted: list[Decision] = []
        evicts: list[SchedAction] = []
        for m in plan.moves:
            if m.how != "restart" or m.workload not in self.requests:
                continue
            if all(a.gpu != plan.gpu for a in self.state.allocs.get(m.workload, [])):
                continue  # it is no longer there
            mover = self.requests[m.workload]
            with self.state.statement() as st:
                st.release(m.workload)
                chosen = self._elsewhere(mover, plan.gpu)
                if chosen is None:  # its room went meanwhile: it stays, the plan runs out
                    st.rollback()
                    continue
                placed = self._commit(st, mover, chosen, ())
                st.commit()
            evicts.append(SchedAction("evict", m.workload, reason=why))
            restarted.append(replace(placed, cause=req.key))
        evicted = tuple(a.workload for a in evicts)
        self.pending.pop(req.key, None)
        now = self._try(req, preempt=False)
        first = now[0]
        return [
            replace(first, evicted=evicted, actions=(*evicts, *first.actions), moves=plan.moves),
            *restarted,
            *now[1:],
        ]

    def _preempt(
        self, req: SchedRequest, victims: list[str], chosen: list[Candidate]
    ) -> list[Decision]:
        """Evict ``victims`` and place ``req`` where they were, all or nothing; then let each victim
        find room elsewhere at once (never by preempting in turn)."""
        # a victim on several GPUs (whole, or a share of each) leaves room on the others too
        held = {a.gpu for v in victims for a in self.state.allocs.get(v, [])}
        with self.state.statement() as st:
            for v in victims:
                st.release(v)
                st.on_rollback(self._restorer(v))
                self.pending.displace(v, preempted_by(req, v), req.key)
            placed = self._commit(st, req, chosen, tuple(victims), preempted_by)
            st.commit()
        moved = []
        for v in victims:
            again = self._try(self.requests[v], preempt=False)
            if again[0].outcome != "placed":
                self.pending.displace(v, preempted_by(req, v), req.key)
                again = [self.pending.decision(v)]
            moved.append(replace(again[0], cause=req.key))
        if placed.mode == "mig":  # the victims' instances became the newcomer's: none is left over
            return [placed, *moved]
        # what the eviction freed beyond the newcomer's need goes to whoever waits for it
        freed = held | {a.gpu for a in self.state.allocs.get(req.key, [])}
        return [placed, *moved, *self.retry_pending(gpus=freed)]

    def _restorer(self, key: str) -> Callable[[], None]:
        """What puts ``key``'s place in the pending queue back as it is now (for a rollback)."""
        had = self.pending.get(key)
        cause = self.pending.causes.get(key)

        def undo() -> None:
            if had is None:
                self.pending.pop(key, None)
            else:
                self.pending.displace(key, had, cause)

        return undo

    def _commit(
        self,
        st: Statement,
        req: SchedRequest,
        chosen: list[Candidate],
        victims: tuple[str, ...],
        why: Callable[[SchedRequest, str], str] = lambda _r, _v: "",
    ) -> Decision:
        key = req.key
        actions = [SchedAction("evict", v, reason=why(req, v)) for v in victims]
        allocs, create, destroy = [], [], []
        for c in chosen:
            g = self.state.gpus[c.gpu]
            for pl in c.destroy:
                destroy.append((c.gpu, pl))
                actions.append(SchedAction("destroy_mig_instance", key, g.uuid, pl))
            if c.create:
                assert c.mig is not None
                create.append((c.gpu, c.mig))
                actions.append(SchedAction("create_mig_instance", key, g.uuid, c.mig))
            allocs.append(
                Allocation(
                    key,
                    req.tenant,
                    req.priority,
                    c.gpu,
                    c.mode,
                    c.need.memory_mib,
                    c.need.milli,
                    c.need.compute_pct,
                    c.mig,
                )
            )
        st.allocate(allocs, tuple(create), tuple(destroy))
        st.on_rollback(self._restorer(key))
        self.pending.pop(key, None)
        uuids = tuple(self.state.gpus[c.gpu].uuid for c in chosen)
        actions += [SchedAction("start", key, u, chosen[0].mig) for u in uuids[:1]]
        return Decision(
            key,
            "placed",
            mode=chosen[0].mode,
            gpus=uuids,
            mig=chosen[0].mig,
            evicted=victims,
            actions=tuple(actions),
        )

    # -- candidates, filters, scores -------------------------------------------------------------

    def _choose(
        self,
        req: SchedRequest,
        mode: Mode,
        reasons: Reasons,
        only: set[int] | None,
        scope: RecutScope,
        *,
        nest: bool = False,
        alone: bool = False,
    ) -> list[Candidate] | None:
        """The best candidate under ``mode`` (``nest``: a share of a MIG instance shared inside
        under it; ``alone``: a new such instance may be opened for it alone), or None with why in
        ``reasons``."""
        if mode == "exclusive":
            return self._whole_gpus(req, reasons)
        if req.spec.gpu.devices > 1 and not nest:
            return self._share_gpus(req, mode, reasons)
        best: tuple[int, Candidate] | None = None
        passed: dict[str, int] = {}  # per GPU model, candidates that got through the filters
        barred: dict[str, Status | None] = {}  # per GPU model, the pre-filters' answer
        refused: list[str] = []  # why GPUs with room for it were passed over
        kept = self._kept_from(req)
        if mode == "mig" and not nest:
            for gi in sorted(kept):  # offered nothing (candidates), yet had room: said
                if self._offers(req, self.state.gpus[gi]):
                    note(refused, f"GPU {gi} is kept for a MIG request waiting before it")
        if nest:
            cands = nest_candidates(
                self.state,
                self.ctx,
                req,
                mode,
                scope,
                lambda m, p: 2 if alone else self._waiting_to_nest(req, m, p),
                only,
            )
        elif only is None:
            cands = candidates(self.state, self.ctx, req, mode, self.policy, scope, passed, kept)
        else:
            cands = candidates_on(self.state, req, mode, only, scope)
        for cand in cands:
            if cand.gpu in kept:
                note(refused, f"GPU {cand.gpu} is kept for a MIG request waiting before it")
                continue
            model = self.state.gpus[cand.gpu].model.key
            if passed.get(model, 0) >= CANDIDATES_PER_MODEL:
                continue
            if model not in barred:
                barred[model] = self._prefilter(req, cand.need, 1)
            status = barred[model] or first_refusal(self.ctx, req, cand)
            if status is not None:
                self._heed(status, reasons, refused)
                continue
            passed[model] = passed.get(model, 0) + 1
            value = score(self.ctx, req, cand)
            if best is None or value > best[0]:
                best = (value, cand)
        if best is None:
            if nest:
                if req.spec.sharing != "auto":  # for auto, the MIG clause says it
                    reasons.add("mig_nesting", self._why_no_nest(req, refused))
            elif only is None:
                reasons.set_capacity(mode, lambda: self._capacity(req, mode, reasons, refused))
            return None
        return [best[1]]

    # -- sharing inside a MIG instance -------------------------------------------------------------

    def _may_nest(self, req: SchedRequest) -> bool:
        """Whether ``req`` may share a MIG instance inside at all: the operator allows it
        (``mig_nesting``), it asks for nothing else (``nest_mode``), and on some MIG GPU model of
        the fleet it needs at most half the smallest profile that fits it."""
        if not self.settings.mig_nesting or req.nest_mode is None:
            return False
        return any((f := req.nest(m)) is not None and f.half for m in self.state.mig_models)

    def _nest_refusal(self, req: SchedRequest) -> str:
        """What a refusal adds for a request that could have shared a MIG instance, were it
        allowed or small enough ("" where that is not why)."""
        if req.nest_mode is None or not self.state.mig_gpus:
            return ""
        if not self.settings.mig_nesting:
            return (
                f", and {req.nest_mode} inside a MIG instance is off (mig_nesting: false in "
                "gpufrac.yaml; sharing: mig asks for an instance of its own)"
            )
        return (
            f", and it needs more than half of the smallest MIG profile that holds it, so it "
            f"shares no MIG instance under {req.nest_mode} (sharing: mig or auto takes a whole one)"
        )

    def _opened_nest(self, c: Candidate) -> bool:
        """Whether placing ``c`` made its MIG instance shared (it holds one workload now)."""
        nest = self.state.gpus[c.gpu].nests.get(c.mig) if c.mig is not None else None
        return nest is not None and len(nest.workloads) == 1

    def _waiting_to_nest(self, req: SchedRequest, model: GpuModel, profile: str) -> int:
        """The needs a new shared instance of ``profile`` on ``model`` would serve now: ``req``
        and, if one does, another waiting request that would share it (under the same mode); the
        rule asks for two, so the count stops there."""
        apart = req.nest_mode == "mps" and not self.settings.mps_share_tenants
        for key in self.pending:
            other = self.requests[key]
            if other is req or other.nest_mode != req.nest_mode:
                continue
            if apart and other.tenant != req.tenant:
                continue  # it could not share an MPS instance with this one
            fit = other.nest(model)
            if fit is not None and fit.half and fit.profile == profile:
                return 2
        return 1

    def _why_no_nest(self, req: SchedRequest, refused: list[str]) -> str:
        """Why ``req`` (an ``mps`` or ``timeslice`` request) shares no MIG instance."""
        mode = req.nest_mode
        fits = [(m, f) for m in self.state.mig_models if (f := req.nest(m)) is not None]
        if not fits:
            return f"{mode} inside MIG: no MIG profile of the fleet holds it"
        if not any(f.half for _, f in fits):
            m, f = fits[0]
            return (
                f"{mode} inside MIG: it needs more than half of {f.profile}, the smallest MIG "
                f"profile of the {m.key} that holds it, so it takes no share of one"
            )
        if refused:
            return f"{mode} inside MIG: {', '.join(refused)}"
        return (
            f"{mode} inside MIG: no shared MIG instance has room for it, and no other request "
            "waits to share a new one with it (a new shared instance needs two)"
        )

    def _heed(self, status: Status, reasons: Reasons, refused: list[str]) -> None:
        """A pre-filter's or filter's refusal, under its cause: the node selector and closed GPUs
        have clauses of their own (``_selected_nodes``, ``_closed_reasons``)."""
        match status.plugin:
            case "quota":
                reasons.add("quota", status.reason)
            case "capacity" | "mps_tenants" | "mps_domain":
                note(refused, status.reason)
            case "tenant_nodes":
                reasons.add("tenant_nodes", status.reason)
            case "node_selector" | "schedulable":
                pass
            case _ as never:
                assert_never(never)

    def _prefilter(self, req: SchedRequest, need: Need, count: int) -> Status | None:
        for f in PREFILTERS:
            status = f(self.ctx, req, need, count)
            if status is not None:
                return status
        return None

    def _open_to(
        self,
        req: SchedRequest,
        gpus: Sequence[SchedGpu],
        models: Sequence[GpuModel],
        need: Callable[[GpuModel], Need | None],
    ) -> tuple[list[SchedGpu], int, Status | None]:
        """Of ``gpus`` (of ``models``), those ``req`` could use now as far as its labels, closed
        GPUs and its tenant's quota go (``need``: what it takes on a GPU of a model, None where it
        cannot go); with how many more would do but take no new work, and the quota's refusal if
        it ruled a model out."""
        fits: set[str] = set()  # models it could go on, its quota allowing
        quota = None
        for m in models:
            n = need(m)
            if n is None:
                continue
            status = self._prefilter(req, n, req.spec.gpu.gpus)
            if status is None:
                fits.add(m.key)
            else:
                quota = quota or status
        usable: list[SchedGpu] = []
        closed = 0
        for g in gpus:
            if g.model.key not in fits or not req.admits(g.node_labels):
                continue
            if g.schedulable:
                usable.append(g)
            else:
                closed += 1
        return usable, closed, quota

    def _capacity(
        self, req: SchedRequest, mode: Mode, reasons: Reasons, refused: list[str]
    ) -> str | None:
        """Mode ``mode``'s capacity clause: why no GPU of that mode that is open to ``req`` holds
        it, with the numbers; None when there is no such GPU (its quota, labels or closed GPUs
        say why, in their own clauses) or the fleet has none of that mode."""
        st = self.state
        if mode == "mig":
            usable, closed, quota = self._open_to(req, st.mig_gpus, st.mig_models, req.mig_need)
        else:

            def need(m: GpuModel) -> Need | None:
                n = req.need(m, mode)
                return n if n.memory_mib <= m.memory_total_mib else None

            usable, closed, quota = self._open_to(req, st.plain_gpus, st.plain_models, need)
        if quota is not None:
            reasons.add("quota", quota.reason)
        if not usable:
            if mode == "mig" and st.mig_gpus and not any(req.mig_profile(m) for m in st.mig_models):
                models = ", ".join(m.key for m in st.mig_models)
                return f"mig: no MIG profile of the fleet's MIG GPUs ({models}) holds it"
            return None
        if refused:  # GPUs with room for it, passed over for these reasons
            return f"{mode}: {', '.join(refused)}"
        besides = not_counting(closed)
        if mode == "mig":
            return self._why_no_mig(req, len(usable), besides)
        fitting = [g for g in usable if g.mode in (None, mode)]
        others = Counter(g.mode for g in usable if g.mode not in (None, mode))
        taken = ", ".join(f"{n} {m}" for m, n in sorted(others.items(), key=lambda x: str(x[0])))
        if not fitting:
            return (
                f"{mode}: every GPU open to it is in use under another sharing mode "
                f"({taken}{besides})"
            )
        mem = format_mib(min(req.need(g.model, mode).memory_mib for g in fitting))
        largest = max(g.headroom for g in fitting)
        such = f"{len(fitting)} such GPU{'s' if len(fitting) > 1 else ''}"
        in_others = f"; {taken} in use under another sharing mode" if others else ""
        return (
            f"{mode}: no {mode} or empty GPU has {mem} and the share asked for free ({such}, the "
            f"most left on one: {largest / 10:.1f}% of a GPU{in_others}{besides})"
        )

    def _share_gpus(
        self, req: SchedRequest, mode: Mode, reasons: Reasons
    ) -> list[Candidate] | None:
        """A share on each of ``devices`` different GPUs of one model on one node (HAMi's
        ``nvidia.com/gpu: N`` with ``gpumem``): of each node's GPUs of a model that pass the
        pre-filters (its quota counts N shares) and the filters (each GPU's memory and shares
        checked on its own), the N best scored; the node and model whose N score best in all.
        In GPU index order (the order its ``CUDA_VISIBLE_DEVICES`` lists them).

        Under MPS one daemon serves its N GPUs together (an MPS domain): GPUs under MPS already
        are taken only as the whole domain their daemon serves (the ``mps_domain`` filter passes
        those of N GPUs; here they are grouped by domain, so a domain is taken whole or not at
        all), empty GPUs as a new one; never the two mixed."""
        n = req.spec.gpu.devices
        st = self.state
        kept = self._kept_from(req)
        barred: dict[str, Status | None] = {}
        refused: list[str] = []
        domains: list[str] = []  # GPUs passed over for their MPS domain, named
        # per node, model and MPS domain (() for GPUs that would start a new one, and outside MPS)
        groups: dict[tuple[str, str, tuple[int, ...]], list[tuple[int, Candidate]]] = {}
        open_gpus: Counter[tuple[str, str]] = Counter()  # open to it, room or not
        closed = 0
        for g in st.plain_gpus:
            need = req.need(g.model, mode)
            if need.memory_mib > g.total_mib or g.index in kept:
                continue
            if g.model.key not in barred:
                barred[g.model.key] = self._prefilter(req, need, n)
            cand = Candidate(g.index, mode, need)
            status = barred[g.model.key] or first_refusal(self.ctx, req, cand)
            if status is None:
                domain = g.mps_domain if mode == "mps" else ()
                group = groups.setdefault((g.node, g.model.key, domain), [])
                group.append((score(self.ctx, req, cand), cand))
                open_gpus[g.node, g.model.key] += 1
                continue
            if status.plugin == "schedulable" and req.admits(g.node_labels):
                closed += 1
            elif status.plugin in ("capacity", "mps_tenants"):
                open_gpus[g.node, g.model.key] += 1
                continue  # full GPUs: counted in the clause below, not named one by one
            elif status.plugin == "mps_domain":
                open_gpus[g.node, g.model.key] += 1
                note(domains, status.reason)
                continue
            self._heed(status, reasons, refused)
        best: tuple[int, list[Candidate]] | None = None
        for group in groups.values():
            # a domain's group holds at most its own N GPUs: taken when all of them have room
            if len(group) < n:
                continue
            group.sort(key=lambda x: (-x[0], x[1].gpu))
            value = sum(v for v, _ in group[:n])
            if best is None or value > best[0]:
                best = (value, [c for _, c in group[:n]])
        if best is not None:
            together = tuple(sorted(c.gpu for c in best[1]))
            return [replace(c, together=together) for c in sorted(best[1], key=lambda c: c.gpu)]
        if not open_gpus:
            return None  # its quota, labels or closed GPUs say why, in their own clauses
        most = max((len(v) for v in groups.values()), default=0)
        mem = format_mib(min(req.need(m, mode).memory_mib for m in st.plain_models))
        nodes = len({g.node for g in st.plain_gpus}) > 1
        where = " of one node" if nodes else ""
        kinds = " of one model" if len(st.plain_models) > 1 else ""
        on = " on one node" if nodes else ""
        gpus = (
            f"{n} empty GPUs{kinds}{where}, or the {n} GPUs of one MPS domain,"
            if mode == "mps"
            else f"{n} {mode} or empty GPUs{kinds}{where}"
        )
        clause = (
            f"{mode}: a share of each of {n} GPUs needs {gpus} with {mem} and the share asked "
            f"for free on each; the most such{on} now: {most}{not_counting(closed)}"
        )
        clause += "".join(f"; {d}" for d in domains)
        reasons.set_capacity(mode, lambda: clause)
        return None

    def _whole_gpus(self, req: SchedRequest, reasons: Reasons) -> list[Candidate] | None:
        count = req.spec.gpu.gpus
        empty_of = self.state.empty
        for model in sorted(self.state.models, key=lambda m: -len(empty_of.get(m.key, []))):
            need = req.need(model, "exclusive")
            barred = self._prefilter(req, need, count)
            if barred is not None:
                reasons.add("quota", barred.reason)
                return None
            picks: dict[str, list[Candidate]] = {}  # per node: a request's GPUs share one
            for gi in empty_of.get(model.key, []):
                c = Candidate(gi, "exclusive", need)
                if first_refusal(self.ctx, req, c) is None:
                    on_node = picks.setdefault(self.state.gpus[gi].node, [])
                    on_node.append(c)
                    if len(on_node) == count:
                        return on_node
        gpus = self.state.gpus
        free = sum(1 for v in empty_of.values() for gi in v if req.admits(gpus[gi].node_labels))
        nodes = len({g.node for g in self.state.plain_gpus})
        one = " on one node" if nodes > 1 and count > 1 else ""
        there = " on nodes with its labels" if req.selector or req.kept_to else ""
        plain = " without MIG" if self.state.mig_gpus else ""  # the fleet's modes only
        closed = sum(
            1
            for g in self.state.plain_gpus
            if not g.schedulable and not g.allocs and req.admits(g.node_labels)
        )
        besides = not_counting(closed)
        clause = f"needs {count} whole GPU(s){plain}{one}; {free} free{there} now{besides}"
        reasons.set_capacity("exclusive", lambda: clause)
        return None

    def _why_no_mig(self, req: SchedRequest, usable: int, besides: str) -> str:
        """The MIG capacity clause, over the ``usable`` MIG GPUs open to ``req``."""
        pinned = [
            g.index
            for g in self.state.mig_gpus
            if g.pinned and g.schedulable and req.mig_profile(g.model) is not None
        ]
        held = (
            f"; the MIG layout of GPU {', '.join(map(str, pinned))} is pinned by the operator "
            f"(gpufrac mig release --gpu {pinned[0]} lets the agent cut it)"
            if pinned
            else ""
        )
        on = f" on its {usable} MIG GPU(s){besides}"
        match self.recut:
            case "none":
                return (
                    f"no free MIG instance fits{on} (mig_reconfigure is never: only existing "
                    "instances are used)"
                )
            case "create" | "whole_gpu" | "idle" | "drain":
                return (
                    f"no free MIG instance fits{on}, none can be created beside the current "
                    "ones, and no re-cut of idle instances makes room" + held
                )

    # -- refusals ------------------------------------------------------------------------------

    def _several_refusal(self, req: SchedRequest) -> str | None:
        """Why a share of each of several GPUs could never be placed here: no node with that many
        GPUs of one model without MIG that each could hold the share."""
        n = req.spec.gpu.devices
        if n <= 1:
            return None
        per_node: Counter[tuple[str, str]] = Counter()
        for g in self.state.plain_gpus:
            if all(req.need(g.model, m).memory_mib <= g.total_mib for m in req.modes):
                per_node[g.node, g.model.key] += 1
        most = max(per_node.values(), default=0)
        if most < n:
            where = " on one node" if len({g.node for g in self.state.plain_gpus}) > 1 else ""
            return (
                f"asks for a share of each of {n} GPUs of one model{where}; the fleet has at "
                f"most {most} such GPU(s) without MIG that could hold the share{where}"
            )
        return None

    def _never_fits(self, req: SchedRequest) -> str | None:
        st = self.state
        gpu = req.spec.gpu
        if gpu.devices > 1 and "mig" in req.modes:  # a MIG instance is one GPU's
            return (
                f"a share of each of {gpu.devices} GPUs is time-sliced or under MPS: sharing: "
                "mig gives a workload one GPU (set sharing: timeslice, mps or auto, or ask for "
                "count: 1)"
            )
        if gpu.count is not None:
            if gpu.count > st.plain_count:
                return (
                    f"asks for {gpu.count} whole GPUs; the fleet has {st.plain_count} without MIG"
                )
            per_node = Counter(g.node for g in st.plain_gpus)
            if len(per_node) > 1 and gpu.count > max(per_node.values()):
                return (
                    f"asks for {gpu.count} whole GPUs on one node; no node has more than "
                    f"{max(per_node.values())} without MIG"
                )
        else:
            ok = False
            for mode in req.modes:
                if mode == "mig":
                    ok = ok or any(req.mig_profile(m) for m in st.mig_models)
                else:
                    ok = ok or any(
                        req.need(m, mode).memory_mib <= m.memory_total_mib for m in st.plain_models
                    )
            if self._may_nest(req):
                ok = ok or any((f := req.nest(m)) is not None and f.half for m in st.mig_models)
            if not ok:
                what = gpu.mig_profile or (
                    format_mib(gpu.memory_mib)
                    if gpu.memory_mib
                    else f"{gpu.memory_pct}% of a GPU's memory"
                    if gpu.memory_pct
                    else f"{(gpu.fraction_milli or 0) / 10:.1f}% of a GPU"
                    if gpu.fraction_milli
                    else f"{gpu.compute_pct}% of a GPU's compute with its whole memory"
                )
                # only the modes the fleet has GPUs for
                had = [m for m in req.modes if (st.mig_gpus if m == "mig" else st.plain_gpus)]
                if not had:
                    kind = "in MIG mode" if req.modes == ("mig",) else "without MIG"
                    return (
                        f"no GPU in the fleet could ever hold {what} under "
                        f"{' or '.join(req.modes)} sharing: it has no GPU {kind}"
                        + self._nest_refusal(req)
                    )
                modes = " or ".join(had)
                return f"no GPU in the fleet could ever hold {what} under {modes} sharing"
        several = self._several_refusal(req)
        if several is not None:
            return several
        quota = self.settings.tenants.get(req.tenant)
        if quota is not None:
            options = []  # what the request takes on each model and mode it could run under
            for mode in req.modes:
                for m in st.mig_models if mode == "mig" else st.plain_models:
                    if mode == "mig":
                        need = req.mig_need(m)
                        if need is not None:
                            options.append(need)
                    else:
                        options.append(req.need(m, mode))
            count = gpu.gpus
            limit = quota.gpu_memory_mib
            if options and limit is not None and all(n.memory_mib * count > limit for n in options):
                least = min(n.memory_mib for n in options) * count
                return "even alone, " + over_memory_quota(req.tenant, 0, least, limit)
            share = quota.gpus_milli
            if options and share is not None and all(n.milli * count > share for n in options):
                least = min(n.milli for n in options) * count
                return "even alone, " + over_gpus_quota(req.tenant, 0, least, share)
        return None
