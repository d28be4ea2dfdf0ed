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

import bisect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpufrac.errors import InputError
from gpufrac.model.catalog import GpuModel
from gpufrac.model.mig import MigPlacement, check_layout
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.units import format_mib
from gpufrac.model.workload import MILLI, WorkloadSpec
from gpufrac.planning.demand import smallest_fitting
from gpufrac.planning.sched_plugins import (
    FILTERS,
    SCORES,
    Candidate,
    Need,
    need_on,
)
from gpufrac.planning.sched_state import Allocation, ClusterState, SchedGpu, additions

CANDIDATES_PER_MODEL = 4  # candidates that pass the filters, scored per model
SCAN_LIMIT = 64  # GPUs looked at per model and pool before giving up on it


@dataclass(frozen=True, slots=True)
class SchedAction:
    kind: str  # create_mig_instance | evict | start
    workload: str
    gpu_uuid: str | None = None
    mig: MigPlacement | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    workload: str
    outcome: str  # placed | pending | refused
    reason: str = ""
    mode: str | None = None
    gpus: tuple[str, ...] = ()
    mig: MigPlacement | None = None
    evicted: tuple[str, ...] = ()
    actions: tuple[SchedAction, ...] = ()


def decision_to_json(d: Decision) -> dict[str, object]:
    return {
        "workload": d.workload,
        "outcome": d.outcome,
        "reason": d.reason,
        "mode": d.mode,
        "gpus": list(d.gpus),
        "mig": None if d.mig is None else d.mig.to_json(),
        "evicted": list(d.evicted),
        "actions": [
            {
                "kind": a.kind,
                "workload": a.workload,
                "gpu_uuid": a.gpu_uuid,
                "mig": None if a.mig is None else a.mig.to_json(),
            }
            for a in d.actions
        ],
    }


def decision_from_json(raw: dict[str, Any]) -> Decision:
    def pl(x: Any) -> MigPlacement | None:
        return None if x is None else MigPlacement(int(x["start"]), str(x["profile"]))

    return Decision(
        workload=raw["workload"],
        outcome=raw["outcome"],
        reason=raw.get("reason", ""),
        mode=raw.get("mode"),
        gpus=tuple(raw.get("gpus", ())),
        mig=pl(raw.get("mig")),
        evicted=tuple(raw.get("evicted", ())),
        actions=tuple(
            SchedAction(a["kind"], a["workload"], a.get("gpu_uuid"), pl(a.get("mig")))
            for a in raw.get("actions", ())
        ),
    )


def workload_key(spec: WorkloadSpec) -> str:
    return f"{spec.tenant}/{spec.name}"


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
            plan = self._preemption(spec)
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
            self._candidates(spec, mode, passed)
            if only is None
            else self._candidates_on(spec, mode, only)
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

    def _candidates_on(self, spec: WorkloadSpec, mode: str, only: set[int]) -> Iterator[Candidate]:
        """Candidates on the given GPUs only (the filters still decide)."""
        for gi in sorted(only):
            g = self.state.gpus[gi]
            if mode == "mig":
                if not g.mig:
                    continue
                profile = self._mig_profile(spec, g.model)
                if profile is None:
                    continue
                need = need_on(spec, g.model, "mig", profile)
                free = [
                    pl
                    for pl, owner in g.instances.items()
                    if owner is None and pl.profile == profile
                ]
                if free:
                    yield Candidate(gi, mode, need, min(free), False)
                elif (new := self.state.addition(g, profile)) is not None:
                    yield Candidate(gi, mode, need, new, True)
            elif not g.mig:
                yield Candidate(gi, mode, need_on(spec, g.model, mode))

    def _candidates(
        self, spec: WorkloadSpec, mode: str, passed: dict[str, int] | None = None
    ) -> Iterator[Candidate]:
        """Candidates per GPU model, best first by the state's indexes; a model is left as soon as
        ``passed`` says enough of its candidates got through the filters."""
        done = passed if passed is not None else {}
        st = self.state
        spread = self.policy == "spread"
        first_fit = self.policy == "first-fit"
        for model in self.models:
            key = model.key
            n = 0
            if mode == "mig":
                profile = self._mig_profile(spec, model)
                if profile is None:
                    continue
                need = need_on(spec, model, "mig", profile)
                free = st.free_instances.get((key, profile), set())
                order = (
                    (lambda x: x[0])
                    if first_fit
                    else (lambda x: (len(st.gpus[x[0]].allocs) * (1 if spread else -1), x[0]))
                )
                for gi, pl in sorted(free, key=order)[:CANDIDATES_PER_MODEL]:
                    yield Candidate(gi, mode, need, pl, False)
                    n += 1
                if n:
                    continue
                addable = st.addable.get((key, profile), set())
                order2 = (
                    (lambda i: i)
                    if first_fit
                    else (lambda i: (len(st.gpus[i].instances) * (1 if spread else -1), i))
                )
                for gi in sorted(addable, key=order2)[:CANDIDATES_PER_MODEL]:
                    new = st.addition(st.gpus[gi], profile)
                    if new is not None:
                        n += 1
                        yield Candidate(gi, mode, need, new, True)
                if n:
                    continue
                # a MIG GPU whose instances are all idle can be cut again from scratch
                fresh = additions(model, ()).get(profile)
                for gi in sorted(st.idle_mig.get(key, ()))[:1] if fresh is not None else ():
                    g = st.gpus[gi]
                    yield Candidate(gi, mode, need, fresh, True, tuple(sorted(g.instances)))
                continue
            need = need_on(spec, model, mode)
            if need.memory_mib > model.memory_total_mib:
                continue
            shared = st.shared.get((key, mode), [])
            empty = st.empty.get(key, [])
            if (
                first_fit
            ):  # the baseline: GPUs in index order, the first that passes every filter wins
                pool = sorted([i for _, i in shared] + empty)
                for gi in pool:
                    cand = Candidate(gi, mode, need)
                    if not any(f(self, spec, cand) for f in FILTERS):
                        yield cand
                        n += 1
                        if n >= CANDIDATES_PER_MODEL:
                            break
                continue
            need_h = max(-(-need.memory_mib * MILLI // model.memory_total_mib), need.milli)
            start = bisect.bisect_left(shared, (need_h - 1, -1))  # headroom rounds down: 1 of slack
            fitting = (
                shared[start:]
                if not spread
                else shared[: start - 1 : -1]
                if start
                else shared[::-1]
            )
            ordered = [gi for _, gi in fitting[:SCAN_LIMIT]]
            pools = (empty, ordered) if spread else (ordered, empty)
            for pool in pools:
                for gi in pool[:SCAN_LIMIT]:
                    if done.get(key, 0) >= CANDIDATES_PER_MODEL:
                        break
                    yield Candidate(gi, mode, need)

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

    def _preemption(self, spec: WorkloadSpec) -> tuple[list[str], list[Candidate]] | None:
        """The cheapest set of lower-priority workloads whose eviction makes room, and where it goes."""
        best: tuple[tuple[int, int, int], list[str], list[Candidate]] | None = None
        lowest = self.state.min_priority()
        floor = (1, lowest, lowest)  # one victim of the lowest priority there is: nothing beats it
        for mode in self._modes(spec):
            for victims, cands in self._preemption_options(spec, mode):
                prios = [self.specs[v].priority for v in victims]
                cost = (len(victims), max(prios, default=-(10**9)), sum(prios))
                if best is None or cost < best[0]:
                    best = (cost, victims, cands)
                    if cost <= floor:
                        return victims, cands
        return None if best is None else (best[1], best[2])

    def _quota_after(self, spec: WorkloadSpec, victims: list[str], total: Need) -> bool:
        """Would ``spec``, taking ``total`` in all, fit its tenant's quota once ``victims`` are gone?"""
        q = self.settings.tenants.get(spec.tenant)
        if q is None:
            return True
        freed = [
            a for v in victims for a in self.state.allocs.get(v, []) if a.tenant == spec.tenant
        ]
        mem = self.state.tenant_mem[spec.tenant] - sum(a.memory_mib for a in freed)
        milli = self.state.tenant_milli[spec.tenant] - sum(a.milli for a in freed)
        if q.gpu_memory_mib is not None and mem + total.memory_mib > q.gpu_memory_mib:
            return False
        return q.gpus_milli is None or milli + total.milli <= q.gpus_milli

    def _preemption_options(
        self, spec: WorkloadSpec, mode: str
    ) -> Iterator[tuple[list[str], list[Candidate]]]:
        st = self.state
        prio = spec.priority
        if st.min_priority() >= prio:
            return

        class _Lower:  # membership by the allocation's own priority: no scan of every workload
            def __contains__(self, key: object) -> bool:
                allocs = st.allocs.get(key) if isinstance(key, str) else None
                return allocs is not None and bool(allocs) and allocs[0].priority < prio

        lower = _Lower()
        if mode == "exclusive":
            count = spec.gpu.count or 1
            options = []
            for g in self._plain_gpus:
                if not g.schedulable or not all(a.priority < prio for a in g.allocs.values()):
                    continue
                options.append((len(g.allocs), g.index, sorted(g.allocs)))
            if len(options) >= count:
                options.sort()
                chosen = options[:count]
                gone = sorted({v for _, _, vs in chosen for v in vs})
                cands = [
                    Candidate(gi, "exclusive", need_on(spec, st.gpus[gi].model, "exclusive"))
                    for _, gi, _ in chosen
                ]
                total = Need(
                    sum(c.need.memory_mib for c in cands), sum(c.need.milli for c in cands)
                )
                if gone and self._quota_after(spec, gone, total):
                    yield gone, cands
            return
        for g in self._mig_gpus if mode == "mig" else self._plain_gpus:
            if not g.schedulable or not any(a.priority < prio for a in g.allocs.values()):
                continue
            if mode == "mig":
                profile = self._mig_profile(spec, g.model)
                for pl, owner in g.instances.items():
                    if owner is not None and owner in lower and pl.profile == profile:
                        need = need_on(spec, g.model, mode, profile)
                        if self._quota_after(spec, [owner], need):
                            yield [owner], [Candidate(g.index, mode, need, pl, False)]
                continue
            need = need_on(spec, g.model, mode)
            victims: list[str] = []
            keep = [a for a in g.allocs.values() if a.workload not in lower]
            if any(a.mode != mode for a in keep):
                continue
            evictable = sorted(
                (a for a in g.allocs.values() if a.workload in lower),
                key=lambda a: (self.specs[a.workload].priority, -a.memory_mib),
            )
            remaining = list(g.allocs.values())
            for a in [None, *evictable]:
                if a is not None:
                    victims.append(a.workload)
                    remaining = [r for r in remaining if r.workload != a.workload]
                if _room(g, remaining, need, mode, spec, self.settings.mps_share_tenants):
                    if victims and self._quota_after(spec, victims, need):
                        yield list(victims), [Candidate(g.index, mode, need)]
                    break


def _room(
    g: SchedGpu,
    remaining: list[Allocation],
    need: Need,
    mode: str,
    spec: WorkloadSpec,
    mps_share: bool,
) -> bool:
    if any(a.mode != mode for a in remaining):
        return False
    if sum(a.memory_mib for a in remaining) + need.memory_mib > g.total_mib:
        return False
    if sum(a.milli for a in remaining) + need.milli > MILLI:
        return False
    if mode == "mps":
        if sum(a.compute_pct or 0 for a in remaining) + (need.compute_pct or 0) > 100:
            return False
        if not mps_share and any(a.tenant != spec.tenant for a in remaining):
            return False
    return True
