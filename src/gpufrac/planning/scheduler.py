"""The placement scheduler: where each workload runs, under which sharing mode, and what waits. Pure.

For each submission: refuse at once what no GPU could ever hold; choose the sharing modes to try
(``auto``: MIG where a fitting instance is free or can be created on a GPU in MIG mode, then MPS where a
compute cap is asked, else time-slicing); for each mode take a few candidates from the state's indexes,
run the filter plugins, score the survivors with the score plugins, and reserve the best. If nothing
fits, preempt the fewest, lowest-priority workloads that make room (never one of equal or higher
priority); else the workload waits in the pending queue with a reason a person can read.

Decisions are values (``Decision`` with its ``SchedAction`` list) that the node agent carries out.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from gpufrac.errors import InputError
from gpufrac.model.catalog import GpuModel
from gpufrac.model.mig import MigPlacement, check_layout
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.units import format_mib
from gpufrac.model.workload import MILLI, WorkloadSpec
from gpufrac.planning.demand import smallest_fitting
from gpufrac.planning.sched_candidates import CANDIDATES_PER_MODEL, candidates, candidates_on
from gpufrac.planning.sched_decision import (
    Decision,
    SchedAction,
    decision_from_json,
    decision_to_json,
    workload_key,
)
from gpufrac.planning.sched_plugins import (
    FILTERS,
    SCORES,
    Candidate,
    need_on,
)
from gpufrac.planning.sched_preempt import preemption
from gpufrac.planning.sched_state import Allocation, ClusterState, SchedGpu

__all__ = [
    "Decision",
    "SchedAction",
    "Scheduler",
    "decision_from_json",
    "decision_to_json",
    "workload_key",
]


class Scheduler:
    def __init__(
        self,
        gpus: list[SchedGpu],
        settings: OperatorSettings | None = None,
        *,
        policy: str | None = None,
    ) -> None:
        self.state = ClusterState(gpus)
        self.settings = settings or OperatorSettings()
        self.policy = policy or self.settings.placement_policy
        self.specs: dict[str, WorkloadSpec] = {}
        self.pending: dict[str, tuple[WorkloadSpec, str]] = {}
        self._seq = itertools.count()
        self._order: dict[str, int] = {}
        self._fleet_views()

    def _fleet_views(self) -> None:
        """What the fleet offers by mode (recomputed when a GPU's MIG mode changes)."""
        gpus = self.state.gpus
        self.models = sorted({g.model.key: g.model for g in gpus}.values(), key=lambda m: m.key)
        self._plain_models = sorted(
            {g.model.key: g.model for g in gpus if not g.mig}.values(), key=lambda m: m.key
        )
        self._mig_models = sorted(
            {g.model.key: g.model for g in gpus if g.mig}.values(), key=lambda m: m.key
        )
        self._plain_count = sum(1 for g in gpus if not g.mig)
        self.largest_gpu_mib = max((g.total_mib for g in gpus), default=1)
        self._mig_gpus = [g for g in gpus if g.mig]
        self._plain_gpus = [g for g in gpus if not g.mig]

    # -- the public operations -----------------------------------------------------------------

    def submit(self, spec: WorkloadSpec) -> list[Decision]:
        """Place ``spec`` (possibly preempting); returns its decision, then those of evicted workloads."""
        key = workload_key(spec)
        if key in self.specs:
            raise InputError(
                f"workload {key} is already submitted",
                field="metadata.name",
                fix="delete it first, or use another name",
            )
        refusal = self._never_fits(spec)
        if refusal:
            return [Decision(key, "refused", refusal)]
        self.specs[key] = spec
        self._order[key] = next(self._seq)
        return self._try(spec, preempt=True)

    def relayout(self, uuid: str, mig: bool, placements: list[MigPlacement]) -> None:
        """A GPU's MIG mode or instances were changed outside the scheduler: take the new picture.
        Instances that stay keep their owners; the GPU must hold no other allocation."""
        g = self.state.by_uuid[uuid]
        self.state.relayout(g, mig, placements)
        self._fleet_views()

    def update_live(self, spec: WorkloadSpec) -> list[Decision]:
        """Take a spec whose change needs no new placement (priority, QoS): a placed workload stays
        where it is, with its allocations carrying the new priority (so preemption sees it); a pending
        one whose priority rose is tried again, with preemption, as a new submission would be."""
        key = workload_key(spec)
        old = self.specs.get(key)
        if old is None:
            return []
        self.specs[key] = spec
        placed = self.state.allocs.get(key)
        if placed and old.priority != spec.priority:
            self.state.release(key)
            self.state.allocate([replace(a, priority=spec.priority) for a in placed])
        if key in self.pending:
            self.pending[key] = (spec, self.pending[key][1])
            if spec.priority > old.priority:
                del self.pending[key]
                return self._try(spec, preempt=True)
        return []

    def refusal(self, spec: WorkloadSpec) -> str | None:
        """Why no GPU here could ever run ``spec`` (None if one could)."""
        return self._never_fits(spec)

    def restore(self, spec: WorkloadSpec, decision: Decision) -> None:
        """Take back a placement recorded earlier (after an agent restart), exactly where it was.

        A recorded placement that no longer fits (its GPU is gone, or the GPUs changed underneath) puts
        the workload in the pending queue, to be placed again like any other.
        """
        key = workload_key(spec)
        self.specs[key] = spec
        self._order[key] = next(self._seq)
        if decision.outcome != "placed":
            self.pending[key] = (spec, decision.reason or "waiting")
            return
        chosen = []
        for uuid in decision.gpus:
            g = self.state.by_uuid.get(uuid)
            if g is None:
                self.pending[key] = (spec, f"its GPU {uuid} is gone")
                return
            assert decision.mode is not None
            if (decision.mig is not None) != g.mig:
                self.pending[key] = (spec, f"GPU {g.index}'s MIG mode changed")
                return
            profile = decision.mig.profile if decision.mig is not None else None
            need = need_on(spec, g.model, decision.mode, profile)
            create = decision.mig is not None and decision.mig not in g.instances
            if decision.mig is not None:
                if create and check_layout(g.model, tuple(sorted({*g.instances, decision.mig}))):
                    self.pending[key] = (
                        spec,
                        f"its MIG instance {decision.mig} no longer fits on GPU {g.index}",
                    )
                    return
                self.state.claim_external(g, decision.mig)
            chosen.append(Candidate(g.index, decision.mode, need, decision.mig, create))
        if any(next((r for f in FILTERS if (r := f(self, spec, c))), None) for c in chosen):
            self.pending[key] = (spec, "its recorded placement no longer fits")
            return
        self._commit(spec, chosen, ())

    def delete(self, tenant: str, name: str) -> list[Decision]:
        """Remove a workload; returns the decisions of pending workloads that now fit."""
        key = f"{tenant}/{name}"
        if key not in self.specs:
            raise InputError(f"no workload {key}", field="metadata.name")
        del self.specs[key]
        self.pending.pop(key, None)
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
        for key, (spec, _) in self.pending.items():
            if kinds is not None and spec.tenant != tenant:
                wants = {"mig" if m == "mig" else "plain" for m in self._modes(spec)}
                if not wants & kinds:
                    continue  # the freed GPUs are of a kind this workload cannot use
            todo.append(key)
        failed: set[tuple[object, ...]] = (
            set()
        )  # shapes that did not fit: their twins will not either
        for key in sorted(todo, key=lambda k: (-self.specs[k].priority, self._order[k])):
            spec = self.pending[key][0]
            shape = (spec.gpu, spec.sharing, spec.tenant)
            if shape in failed:
                continue
            only = None if gpus is None or spec.tenant == tenant or spec.gpu.count else gpus
            decisions = self._try(spec, preempt=False, only=only)
            if decisions[0].outcome == "placed":
                out.extend(decisions)
            else:
                failed.add(shape)
        return out

    def allocations(self, key: str) -> list[Allocation]:
        return self.state.allocs.get(key, [])

    # -- one attempt -----------------------------------------------------------------------------

    def _try(
        self, spec: WorkloadSpec, *, preempt: bool, only: set[int] | None = None
    ) -> list[Decision]:
        key = workload_key(spec)
        reasons: list[str] = []
        for mode in self._modes(spec):
            chosen = self._choose(spec, mode, reasons, only)
            if chosen:
                return [self._commit(spec, chosen, ())]
        if only is not None:  # a cheap retry that found nothing: the workload keeps its reason
            return [Decision(key, "pending", self.pending[key][1])]
        if preempt:
            plan = preemption(self, spec)
            if plan is not None:
                victims, chosen = plan
                for v in victims:
                    self.state.release(v)
                    self.pending[v] = (
                        self.specs[v],
                        f"preempted by {key} (priority {spec.priority})",
                    )
                placed = self._commit(spec, chosen, tuple(victims))
                # an evicted workload may well fit elsewhere right away (never by preempting in turn)
                moved = []
                for v in victims:
                    why = self.pending[v][1]
                    again = self._try(self.specs[v], preempt=False)
                    if again[0].outcome != "placed":
                        self.pending[v] = (self.specs[v], why)
                        again = [Decision(v, "pending", why)]
                    moved.append(again[0])
                # what the eviction freed beyond the newcomer's need goes to whoever waits for it
                freed = {a.gpu for a in self.state.allocs.get(key, [])}
                return [placed, *moved, *self.retry_pending(gpus=freed)]
        reason = "; ".join(dict.fromkeys(reasons)) or "no GPU has room"
        self.pending[key] = (spec, reason)
        return [Decision(key, "pending", reason)]

    def _commit(
        self, spec: WorkloadSpec, chosen: list[Candidate], victims: tuple[str, ...]
    ) -> Decision:
        key = workload_key(spec)
        self.pending.pop(key, None)
        allocs, create, actions = [], [], [SchedAction("evict", v) for v in victims]
        destroy = []
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
                    spec.tenant,
                    spec.priority,
                    c.gpu,
                    c.mode,
                    c.need.memory_mib,
                    c.need.milli,
                    c.need.compute_pct,
                    c.mig,
                )
            )
        self.state.allocate(allocs, tuple(create), tuple(destroy))
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

    def _modes(self, spec: WorkloadSpec) -> list[str]:
        req = spec.gpu
        if req.count is not None:
            return ["exclusive"]
        if req.mig_profile is not None:
            return ["mig"]
        if spec.sharing != "auto":
            return [spec.sharing]
        return ["mig", "mps" if req.compute_pct is not None else "timeslice"]

    def _mig_profile(self, spec: WorkloadSpec, model: GpuModel) -> str | None:
        req = spec.gpu
        if req.mig_profile is not None:
            if req.mig_model not in (None, model.key) or not model.has_profile(req.mig_profile):
                return None
            return model.profile(req.mig_profile).name
        if (
            req.fraction_milli is not None
        ):  # that share of the memory slots and of the compute slices
            slots = -(-req.fraction_milli * model.memory_slots // MILLI)
            compute = -(-req.fraction_milli * model.compute_slices // MILLI)
            fits = [
                p
                for p in model.profiles
                if not p.media_extensions
                and p.memory_slots >= slots
                and p.compute_slices >= compute
            ]
            best = min(fits, key=lambda p: (p.memory_slots, p.compute_slices), default=None)
            return None if best is None else best.name
        need = need_on(spec, model, "mig")
        prof = smallest_fitting(model, need.memory_mib, None)
        while prof is not None and prof.compute_slices * MILLI < need.milli * model.compute_slices:
            bigger = [
                p
                for p in model.profiles
                if p.compute_slices > prof.compute_slices
                and not p.media_extensions
                and (p.memory_mib or 0) >= need.memory_mib
            ]
            prof = min(bigger, key=lambda p: (p.memory_slots, p.compute_slices)) if bigger else None
        return None if prof is None else prof.name

    # -- candidates, filters, scores -------------------------------------------------------------

    def _choose(
        self, spec: WorkloadSpec, mode: str, reasons: list[str], only: set[int] | None = None
    ) -> list[Candidate] | None:
        if mode == "exclusive":
            return self._whole_gpus(spec, reasons)
        best: tuple[int, Candidate] | None = None
        passed: dict[str, int] = {}  # per GPU model, candidates that got through the filters
        cands = (
            candidates(self, spec, mode, passed)
            if only is None
            else candidates_on(self, spec, mode, only)
        )
        for cand in cands:
            model = self.state.gpus[cand.gpu].model.key
            if passed.get(model, 0) >= CANDIDATES_PER_MODEL:
                continue
            why = next((r for f in FILTERS if (r := f(self, spec, cand))), None)
            if why:
                if len(reasons) < 3:
                    reasons.append(why)
                continue
            passed[model] = passed.get(model, 0) + 1
            score = sum(s(self, spec, cand) for s in SCORES)
            if best is None or score > best[0]:
                best = (score, cand)
        if best is None:
            if only is None:
                reasons.append(self._why_none(spec, mode))
            return None
        return [best[1]]

    def _whole_gpus(self, spec: WorkloadSpec, reasons: list[str]) -> list[Candidate] | None:
        count = spec.gpu.count or 1
        for model in sorted(self.models, key=lambda m: -len(self.state.empty.get(m.key, []))):
            empty = self.state.empty.get(model.key, [])
            picks = []
            for gi in empty:
                c = Candidate(gi, "exclusive", need_on(spec, model, "exclusive"))
                why = next((r for f in FILTERS if (r := f(self, spec, c))), None)
                if why is None:
                    picks.append(c)
                elif "quota" in why:
                    reasons.append(why)
                    return None
                if len(picks) == count:
                    return picks
        free = sum(len(v) for v in self.state.empty.values())
        reasons.append(f"needs {count} whole GPU(s) without MIG; {free} free now")
        return None

    def _why_none(self, spec: WorkloadSpec, mode: str) -> str:
        if mode == "mig":
            return "no free MIG instance fits and none can be created beside the current ones"
        needs = [need_on(spec, m, mode).memory_mib for m in self._plain_models] or [0]
        st = self.state
        largest = max(
            [lst[-1][0] for (_, md), lst in st.shared.items() if md == mode and lst]
            + [MILLI for m in self._plain_models if st.empty.get(m.key)]
            + [0]
        )
        return (
            f"{mode}: no GPU has {format_mib(min(needs))} and the share asked for free "
            f"(the most any {mode} GPU has left: {largest / 10:.1f}% of a GPU)"
        )

    # -- refusals ------------------------------------------------------------------------------

    def _never_fits(self, spec: WorkloadSpec) -> str | None:
        req = spec.gpu
        modes = self._modes(spec)
        if req.count is not None:
            if req.count > self._plain_count:
                return f"asks for {req.count} whole GPUs; the fleet has {self._plain_count} without MIG"
        else:
            ok = False
            for mode in modes:
                if mode == "mig":
                    ok = ok or any(self._mig_profile(spec, m) for m in self._mig_models)
                else:
                    ok = ok or any(
                        need_on(spec, m, mode).memory_mib <= m.memory_total_mib
                        for m in self._plain_models
                    )
            if not ok:
                what = req.mig_profile or (
                    format_mib(req.memory_mib)
                    if req.memory_mib
                    else f"{(req.fraction_milli or 0) / 10:.1f}% of a GPU"
                )
                return (
                    f"no GPU in the fleet could ever hold {what} under {' or '.join(modes)} sharing"
                )
        quota = self.settings.tenants.get(spec.tenant)
        if quota is not None:
            options = []  # what the request takes on each model and mode it could run under
            for mode in modes:
                for m in self._mig_models if mode == "mig" else self._plain_models:
                    profile = self._mig_profile(spec, m) if mode == "mig" else None
                    if mode == "mig" and profile is None:
                        continue
                    options.append(need_on(spec, m, mode, profile))
            count = req.count or 1
            if options and all(
                quota.gpu_memory_mib is not None and n.memory_mib * count > quota.gpu_memory_mib
                for n in options
            ):
                return f"asks for more GPU memory than tenant {spec.tenant}'s whole quota ({format_mib(quota.gpu_memory_mib or 0)})"
            if options and all(
                quota.gpus_milli is not None and n.milli * count > quota.gpus_milli for n in options
            ):
                return f"asks for more GPUs than tenant {spec.tenant}'s whole quota ({(quota.gpus_milli or 0) / MILLI:g})"
        return None

    # -- preemption ----------------------------------------------------------------------------
