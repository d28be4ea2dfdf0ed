"""The part of the agent that carries decisions out: one ``match`` over the closed set of actions.

The scheduler decides (``planning``); the agent's reconcile pass decides when (``runtime/agent.py``);
this part does it, reading the truth first so that every action is idempotent:

* ``evict`` stops a workload that lost its place; it is marked evicted in its run, so it starts again
  (a new attempt of the same generation) wherever it is placed next, and is not counted as a failure;
* ``destroy_mig_instance`` destroys an instance only if it exists, nothing placed owns it, and the
  driver finds no process on it (NVML refuses one in use);
* ``create_mig_instance`` creates an instance only if it is not there yet;
* ``start`` starts the next attempt of the workload's current generation, if it is still placed as the
  action says and nothing of it runs;
* ``stop`` stops what runs of a workload, keeping why in its run.

A MIG action that fails is recorded once per condition and retried with backoff (``Failures``); MIG
changes are carried out in batches (destroys, then creates, per GPU) under the device lock alone, never
the agent's lock, so the API answers while a GPU is re-cut.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import assert_never

from gpufrac.devices.errors import DeviceError
from gpufrac.devices.nvml import NvmlDevices
from gpufrac.model.workload import spec_from_json
from gpufrac.planning.sched_decision import (
    Decision,
    SchedAction,
    decision_from_json,
    decision_to_json,
)
from gpufrac.planning.scheduler import Scheduler
from gpufrac.runtime.failures import Failures
from gpufrac.runtime.handover import Handover
from gpufrac.runtime.mps import MpsDaemons
from gpufrac.runtime.runs import Runs, read_json, write_json
from gpufrac.runtime.shim import read_status
from gpufrac.runtime.store import Store

EVICTED = "evicted"  # the key in a run's killed.json that says it was stopped to make room


class ActionRefused(Exception):
    """An action whose precondition does not hold (it would destroy a busy instance, say)."""


@dataclass(frozen=True, slots=True)
class MigWork:
    """The MIG actions one workload's start waits for."""

    workload: str
    actions: tuple[SchedAction, ...]


class Executor:
    def __init__(
        self,
        store: Store,
        dev: NvmlDevices,
        scheduler: Scheduler,
        runs: Runs,
        handover: Handover,
        mps: MpsDaemons,
        failures: Failures,
    ) -> None:
        self.store = store
        self.dev = dev
        self.scheduler = scheduler
        self.runs = runs
        self.handover = handover
        self.mps = mps
        self.failures = failures
        self.device_lock = threading.Lock()  # one MIG change at a time on this machine

    # -- decisions ------------------------------------------------------------------------------

    def record(self, decisions: Sequence[Decision]) -> None:
        """Store each decision with its workload's generation and carry out its evictions now."""
        for d in decisions:
            tenant, name = d.workload.split("/", 1)
            stored = self.store.workload(tenant, name)
            if stored is None:
                continue
            for action in d.actions:
                if action.kind == "evict":
                    self.carry_out(action)
            self.store.set_placement(tenant, name, stored.generation, decision_to_json(d))
            self.store.record_event(d.outcome, d.workload, d.reason or where(d))

    # -- one action -----------------------------------------------------------------------------

    def carry_out(self, action: SchedAction) -> None:
        """Carry out one action; raises ``DeviceError`` or ``ActionRefused`` if it cannot be."""
        match action.kind:
            case "evict":
                self._evict(action)
            case "destroy_mig_instance":
                self._destroy(action)
            case "create_mig_instance":
                self._create(action)
            case "start":
                self._start(action)
            case "stop":
                self._stop(action)
            case _:
                assert_never(action.kind)

    def _evict(self, a: SchedAction) -> None:
        tenant, name = a.workload.split("/", 1)
        stored = self.store.workload(tenant, name)
        if stored is None:
            return
        for run in self.runs.attempts(tenant, name, stored.generation):
            if not read_status(run).done:
                write_json(run / "killed.json", {"reason": a.reason, EVICTED: True})
        if self.runs.stop_live(tenant, name):
            self.store.record_event("evicted", a.workload, a.reason or "lost its place")

    def _stop(self, a: SchedAction) -> None:
        tenant, name = a.workload.split("/", 1)
        if self.runs.stop_live(tenant, name, a.reason):
            self.store.record_event("stopped", a.workload, a.reason or "stopped")

    def _destroy(self, a: SchedAction) -> None:
        assert a.gpu_uuid is not None and a.mig is not None
        inst = self.dev.gpu(a.gpu_uuid).instance_at(a.mig)
        if inst is None:
            return  # already gone: nothing to do
        g = self.scheduler.state.by_uuid.get(a.gpu_uuid)
        owner = None if g is None else g.instances.get(a.mig)
        if owner is not None:
            raise ActionRefused(f"{a.mig} belongs to {owner}; it is not destroyed")
        if inst.busy:
            raise ActionRefused(f"{a.mig} has processes on it; it is not destroyed")
        self.dev.destroy_instance(a.gpu_uuid, inst.gi_id)
        self.store.record_event("mig_destroyed", a.gpu_uuid, f"{a.mig} (re-cut for {a.workload})")

    def _create(self, a: SchedAction) -> None:
        assert a.gpu_uuid is not None and a.mig is not None
        if self.dev.gpu(a.gpu_uuid).instance_at(a.mig) is not None:
            return  # already there
        self.dev.create_instance(a.gpu_uuid, a.mig.profile, a.mig.start)
        self.store.record_event("mig_created", a.gpu_uuid, f"{a.mig} for {a.workload}")

    def _start(self, a: SchedAction) -> None:
        tenant, name = a.workload.split("/", 1)
        stored = self.store.workload(tenant, name)
        placed = self.store.placement(tenant, name)
        if stored is None or placed is None or placed[0] != stored.generation:
            return  # deleted or changed since the pass decided: the next pass decides again
        decision = decision_from_json(placed[1]) if placed[1].get("outcome") == "placed" else None
        if decision is None or decision.gpus[:1] != (a.gpu_uuid,) or decision.mig != a.mig:
            return  # placed elsewhere since
        attempts = self.runs.attempts(tenant, name, stored.generation)
        if attempts and not read_status(attempts[-1]).done:
            return  # one runs already: never twice
        spec = spec_from_json(stored.spec)
        if decision.mode == "mps" and decision.gpus and self.mps.ensure(decision.gpus[0]):
            self.store.record_event("mps_started", decision.gpus[0], "MPS control daemon started")
        attempt = len(attempts) + 1
        env = self.handover.env(spec, decision, self.scheduler.allocations(a.workload))
        env["GPUFRAC_ATTEMPT"] = str(attempt)
        self.runs.launch(
            tenant,
            name,
            stored.generation,
            attempt,
            spec.command,
            env={**os.environ, **spec.env, **env},
            workdir=spec.workdir,
            user=spec.user,
        )
        if attempt == 1:
            self.store.record_event("started", a.workload, f"attempt 1 on {where(decision)}")
        else:
            last = read_status(attempts[-1])
            killed = read_json(attempts[-1] / "killed.json")
            after = (
                "eviction"
                if killed.get(EVICTED)
                else f"exit {last.exit_code}"
                if last.exit_code is not None
                else f"signal {last.signal}"
            )
            self.store.record_event(
                "restarted", a.workload, f"attempt {attempt} on {where(decision)} after {after}"
            )

    # -- MIG changes, in batches ------------------------------------------------------------------

    def mig_needed(self, decision: Decision) -> tuple[SchedAction, ...]:
        """The MIG actions of a placement that the device does not show done yet."""
        todo = []
        for a in decision.mig_actions():
            assert a.gpu_uuid is not None and a.mig is not None
            present = self.dev.gpu(a.gpu_uuid).instance_at(a.mig) is not None
            if (a.kind == "destroy_mig_instance") == present:
                todo.append(a)
        return tuple(todo)

    def run_mig(self, work: Sequence[MigWork]) -> set[str]:
        """Carry out the MIG actions of several workloads, per GPU destroys first, then creates; under
        the device lock only. Returns the workloads all of whose actions succeeded."""
        done = {w.workload for w in work}
        with self.device_lock:
            for phase in ("destroy_mig_instance", "create_mig_instance"):
                for w in work:
                    for a in w.actions:
                        if a.kind != phase or w.workload not in done:
                            continue
                        what = a.describe()
                        try:
                            self.carry_out(a)
                        except (DeviceError, ActionRefused) as e:
                            self.failures.failed(w.workload, what, e)
                            done.discard(w.workload)
                        else:
                            self.failures.succeeded(w.workload, what)
        return done


def where(d: Decision) -> str:
    if not d.gpus:
        return ""
    return f"{d.mode} on {', '.join(d.gpus)}" + (f" ({d.mig})" if d.mig else "")
