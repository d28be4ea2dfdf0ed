"""Keeping the QoS arbiter told which workloads share which GPU.

Each reconcile pass sends the arbiter (``runtime/arbiter_link.py``) the workloads running on each
domain (a GPU, or a MIG instance) with their class, weight, min share and process group, and keeps
what the arbiter gave each one with its run (its ``qos`` note, for summaries after the run). How the
arbiter pauses a workload (its cgroup, its process group) is its runner's word (``Runs.pausable``).
A starting agent resumes every workload (through its runner), so nothing a crashed agent's arbiter
paused stays paused.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufrac.devices.errors import DeviceError
from gpufrac.devices.health import DeviceHealth
from gpufrac.model.qos import qos_params
from gpufrac.model.workload import spec_from_json
from gpufrac.planning.sched_decision import Decision
from gpufrac.runtime.arbiter_link import ArbiterLink, MemberSpec
from gpufrac.runtime.failures import Failures
from gpufrac.runtime.handover import qos_domain
from gpufrac.runtime.pauses import PauseBook, PauseEvent
from gpufrac.runtime.runs import Runs, write_note
from gpufrac.runtime.store import Store

ACTIVE_SM_PERCENT = 1  # a workload whose processes use at least this much of the SMs is busy


@dataclass(frozen=True, slots=True)
class Running:
    """A workload the arbiter may need to know about: its key, generation, placement and env."""

    key: str
    generation: int
    decision: Decision
    env: dict[str, str]


class QosCare:
    def __init__(
        self,
        store: Store,
        arbiter: ArbiterLink,
        runs: Runs,
        failures: Failures,
        health: DeviceHealth,
        busy_until: Mapping[str, float],
        job_min_share_milli: int,
    ) -> None:
        self.store = store
        self.arbiter = arbiter
        self.runs = runs
        self.failures = failures
        self.health = health
        self.busy_until = busy_until  # workload -> until when it is busy (requests in flight)
        self.job_min_share_milli = job_min_share_milli
        self._written: dict[str, Any] = {}  # what each run's qos.json holds: written on change only
        self.pauses = PauseBook()  # every pause the arbiter counted, per workload

    def sync(self, running: Sequence[Running]) -> None:
        """Tell the arbiter which workloads share which GPU (or MIG instance), with their class."""
        members: dict[str, MemberSpec] = {}
        runs: dict[str, Path] = {}
        readings: dict[str, dict[int, int] | None] = {}  # per GPU, NVML's SM use per pid
        for st in running:
            d = st.decision
            tenant, name = st.key.split("/", 1)
            stored = self.store.workload(tenant, name)
            run = self.runs.latest(tenant, name, st.generation)
            if stored is None or run is None:
                continue
            pausable = self.runs.pausable(run)  # how the arbiter pauses it (its runner says)
            if pausable is None:
                continue  # nothing of it runs
            spec = spec_from_json(stored.spec)
            members[st.key] = MemberSpec(
                qos_domain(d, st.env),
                qos_params(spec, self.job_min_share_milli),
                pausable.group,
                self._active(st.key, d, run, readings),
                pausable.cgroup,
            )
            runs[st.key] = run
        try:
            self.arbiter.sync(members)
        except (RuntimeError, OSError) as e:
            self.failures.failed("arbiter", "keeping the QoS arbiter in step", e)
        else:
            self.failures.succeeded("arbiter", "keeping the QoS arbiter in step")
        written = self._written
        stats = self.arbiter.stats()
        for event in self.pauses.observe(
            stats,
            self.arbiter.ended,
            self.arbiter.clock,
            lambda: {f"{w.tenant}/{w.name}" for w in self.store.workloads()},
        ):
            self._record(event)
        for key, got in stats.items():  # kept with the run, for summaries after it
            if key in runs and written.get(key) != got:
                write_note(runs[key], "qos", got)
                written[key] = got
        for key in [k for k in written if k not in runs]:
            del written[key]

    def _record(self, event: PauseEvent) -> None:
        """A pause of a second or more: one ``paused`` event when it has lasted a second, one
        ``resumed`` with its own length when it ends. The workload that caused it is named in
        full, as the event's ``cause`` (the API names it to those who may see it)."""
        by = event.by or "another workload"
        if event.kind == "paused":
            text = f"while {by} (a higher class) uses the GPU (QoS)"
        else:
            text = f"after {event.seconds:.1f}s paused"
        self.store.record_event(
            event.kind, event.workload, text, {"workload": event.workload}, cause=event.by
        )

    def _active(
        self, key: str, d: Decision, run: Path, readings: dict[str, dict[int, int] | None]
    ) -> bool:
        """Busy on the GPU now: requests in flight to it (the gateway says), or its processes use
        SMs (NVML's per-process reading, where the driver gives one). Without either, it is taken as
        idle: a transparent workload then holds nothing, and stops no one (only an SDK workload's
        turns, or a reading, show that it uses the GPU)."""
        if self.busy_until.get(key, 0.0) > time.monotonic():
            return True
        if not d.gpus or d.mig is not None:
            # alone on its MIG instance: nothing to arbitrate against; sharing one inside, NVML
            # gives no per-process reading there: its SDK turns and the gateway tell
            return False
        gpu = d.gpus[0]
        if gpu not in readings:
            try:
                readings[gpu] = self.health.process_utilization(gpu)
            except DeviceError:
                readings[gpu] = None
        by_pid = readings[gpu] or {}
        busy = [pid for pid, sm in by_pid.items() if sm >= ACTIVE_SM_PERCENT]
        return bool(busy) and bool(self.runs.members(run, busy))

    def resume_all(self) -> None:
        """Resume every workload (its cgroup thawed, its process group SIGCONT: harmless for one
        that runs)."""
        for w in self.store.workloads():
            for run in self.runs.attempts(w.tenant, w.name, w.generation):
                self.runs.resume(run)
