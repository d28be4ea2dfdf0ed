"""The node agent's core: desired state in, running supervised workloads out. No HTTP here.

``apply_workload`` and ``delete`` store the desired state first (SQLite, all or nothing) and let the
scheduler decide; ``reconcile`` makes the machine match. The agent is built from parts, each owning
its state and
given what it needs when it is made:

* ``Runs``: the run directories, one per attempt, and the runners that run them: whatever the
  agent asks of a run (how it goes, which processes are its, how it ended) its runner answers
  (``runtime/runner.py``);
* ``Executor``: carries out the closed set of actions (evict, destroy and create MIG instances,
  start, stop), and ``Failures``: a failed action recorded once per condition and retried with
  backoff;
* ``GpuCare`` (cordon, drain, health, MIG layouts an operator sets), ``MemoryWatch`` (memory limits
  where nothing else enforces them), ``QosCare`` (the QoS arbiter kept in step), ``Handover`` (the
  environment a workload gets).

A reconcile pass takes each workload through three phases: observe (its placement, its attempts, its
process), decide its next step (wait, keep running, stop, complete, or start), and carry the step's
actions out. A start whose placement still needs MIG changes first queues them for the GPU's MIG
worker (``MigWorker``, a thread per GPU that talks to the driver outside the agent's lock, so the
API answers while a GPU is re-cut); a later pass records what the worker did and starts the workload
once its instance is there. A step that raises is one workload's failure, shown as its reason and
retried with backoff; the rest of the pass goes on.

Every step reads the truth from disk: a workload's attempts are run directories
``runs/<tenant>/<name>/g<generation>-<attempt>``, each with its runner's record of how it ended. So
a restarted agent (even after ``kill -9``) re-attaches to the runs still going, counts the attempts
already made, never starts a workload twice, and still applies ``on-failure`` to a workload that
failed while it was down.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, assert_never, get_args

from gpufrac.config import shared_dir
from gpufrac.devices.health import DeviceHealth
from gpufrac.devices.nvml import NvmlDevices
from gpufrac.errors import InputError
from gpufrac.model.gpu import GpuState
from gpufrac.model.mig import MigPlacement
from gpufrac.model.migplan import MigAction
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import (
    VolumeMount,
    WorkloadSpec,
    spec_diff,
    spec_from_json,
    spec_to_json,
)
from gpufrac.planning.sched_candidates import RecutScope
from gpufrac.planning.sched_decision import (
    Completion,
    Decision,
    Displacement,
    EndPhase,
    SchedAction,
    Where,
    reason_for_tenant,
)
from gpufrac.planning.sched_state import CORDONED, sched_gpus_from_states
from gpufrac.planning.scheduler import Scheduler, workload_key
from gpufrac.planning.views import ApplyResult
from gpufrac.runtime.arbiter_link import ArbiterLink
from gpufrac.runtime.cgroups import Layout
from gpufrac.runtime.executor import EVICTED, Executor, published_ports
from gpufrac.runtime.failures import BACKOFF_BASE_SECONDS, BACKOFF_MAX_SECONDS, Failures
from gpufrac.runtime.gpu_care import GpuCare
from gpufrac.runtime.handover import Handover
from gpufrac.runtime.memory_watch import MemoryUse, MemoryWatch
from gpufrac.runtime.mig_worker import MigWorker
from gpufrac.runtime.mps import MpsDaemons
from gpufrac.runtime.native_memory import NativeMemory
from gpufrac.runtime.qos_care import QosCare, Running
from gpufrac.runtime.runner import RunStatus
from gpufrac.runtime.runs import (
    Runs,
    has_note,
    port_owners,
    probe,
    read_note,
    write_note,
)
from gpufrac.runtime.sandbox import Sandbox, separation
from gpufrac.runtime.store import Store, StoredWorkload

__all__ = [
    "BACKOFF_BASE_SECONDS",
    "BACKOFF_MAX_SECONDS",
    "PHASES",
    "Agent",
    "Phase",
    "WorkloadState",
]

# Fields whose change applies to a running workload at once, without a restart (the QoS arbiter's).
LIVE_FIELDS = frozenset({"priority", "qos", "weight", "min_share_milli", "preemption"})
# ``unknown``: how its last attempt ended is not known (its shim cannot record it yet, or died
# without a record); the restart policy waits where the outcome decides (``Agent.clear_unknown``)
Phase = Literal[
    "pending", "starting", "running", "paused", "backoff", "unknown", "succeeded", "failed"
]
PHASES: tuple[Phase, ...] = get_args(Phase)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadState:
    """What a workload is doing, as the agent sees it."""

    key: str
    generation: int
    phase: Phase
    reason: str = ""
    decision: Decision | None = None
    attempts: int = 0
    # of the attempts after the first, those that followed a failure or an exit (the restart
    # policy's), and the attempts stopped to make room (preempted, moved, drained): never failures
    restarts: int = 0
    evictions: int = 0
    exit_code: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    running: bool = False  # a process of its newest attempt runs, as the pass saw it
    cause: str | None = None  # the workload ``reason`` names (pending: it took its place; paused)

    def reason_for(self, tenant: str) -> str:
        """``reason`` as ``tenant`` (the workload's own, say) may read it: its cause named only if
        it is that tenant's (the API renders per caller: ``api.seen_by``)."""
        return reason_for_tenant(self.reason, self.cause, tenant)


@dataclass(frozen=True, slots=True)
class Seen:
    """What one pass observed of one workload."""

    stored: StoredWorkload
    spec: WorkloadSpec
    decision: Decision | None  # its placement (None: not scheduled yet, or completed)
    completed: Completion | None  # how it ended, once it has
    attempts: list[Path]
    status: RunStatus | None  # of the newest attempt
    env: dict[str, str] = field(default_factory=dict)  # what its newest attempt was handed
    evicted: tuple[bool, ...] = ()  # per attempt: stopped to make room

    @property
    def key(self) -> str:
        return self.stored.key

    @property
    def latest(self) -> Path | None:
        return self.attempts[-1] if self.attempts else None

    def state(
        self,
        phase: Phase,
        reason: str = "",
        *,
        exit_code: int | None = None,
        attempts: int | None = None,
        placed: bool = True,
    ) -> WorkloadState:
        made = len(self.attempts) if attempts is None else attempts
        restarts, evictions = attempt_counts(self.evicted, made)
        return WorkloadState(
            key=self.key,
            generation=self.stored.generation,
            phase=phase,
            reason=reason,
            decision=self.decision if placed else None,
            attempts=made,
            restarts=restarts,
            evictions=evictions,
            cause=self.decision.cause if self.decision is not None and phase == "pending" else None,
            exit_code=exit_code,
            env=self.env if placed or phase != "pending" else {},
            running=self.status is not None
            and not self.status.done
            and placed
            and self.status.child_pid is not None,
        )


@dataclass(frozen=True, slots=True)
class Step:
    """The pass's decision for one workload: its state, and the actions to carry out now."""

    state: WorkloadState
    actions: tuple[SchedAction, ...] = ()


class Agent:
    def __init__(
        self,
        data_dir: Path,
        dev: NvmlDevices,
        settings: OperatorSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        stop_grace: float = 10.0,
        recut: RecutScope | None = None,
        tokens_in_use: bool = False,
        cgroups: Layout | None = None,
    ) -> None:
        """``recut`` overrides how far the scheduler may re-cut MIG GPUs (default: the settings'
        ``mig_reconfigure``); ``bench/mig_demand.py`` uses it for its baselines. ``tokens_in_use``:
        the API has tokens (several tenants), which ``workload_users: auto`` separates. ``cgroups``:
        where workloads' cgroups live (default: what the machine offers; ``bench/runner.py``
        compares with none)."""
        self.data_dir = data_dir
        self.dev = dev
        self.clock = clock
        self.stop_grace = stop_grace
        self.lock = threading.RLock()  # the agent's state: held by the API and the reconcile pass
        data_dir.mkdir(parents=True, exist_ok=True)
        self._flock = open(data_dir / "agent.lock", "a+")  # noqa: SIM115 - held for the agent's life
        try:
            fcntl.flock(self._flock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._flock.close()
            raise InputError(
                f"another gpufrac agent already uses {data_dir}",
                field="--data-dir",
                fix="talk to it (gpufrac apply, get, ...), or give another --data-dir",
            ) from None
        settings = settings or OperatorSettings()
        self.settings = settings
        self.store = Store(data_dir / "state.db")
        self.runs = Runs(
            data_dir / "runs",
            stop_grace=stop_grace,
            cgroups=cgroups,
            containers=settings.containers,
        )
        self.sandbox = Sandbox(
            separation(settings, tokens_in_use=tokens_in_use),
            settings,
            self.store,
            data_dir,
            shared_dir(data_dir) / "homes",
        )
        self.failures = Failures(self.store, clock)
        self.native_memory = NativeMemory()
        self.arbiter = ArbiterLink(
            shared_dir(data_dir) / "arbiter",
            quantum_ms=settings.qos_quantum_ms,
            preempt=settings.qos_preempt,
            # the arbiter's own log of what it did (docs/qos.md), for an operator looking closer
            trace=Path(os.environ["GPUFRAC_ARBITER_TRACE"])
            if os.environ.get("GPUFRAC_ARBITER_TRACE")
            else None,
        )
        self.health = DeviceHealth(dev)
        self.busy_until: dict[str, float] = {}  # workload -> until when it is busy (note_busy)
        self._evicted_runs: dict[Path, bool] = {}  # a done attempt -> it was stopped to make room
        self.qos = QosCare(
            self.store,
            self.arbiter,
            self.runs,
            self.failures,
            self.health,
            self.busy_until,
            settings.job_min_share_milli,
        )
        self.qos.resume_all()  # whatever a crashed agent's arbiter paused runs again
        states = dev.gpus()
        models = {g.uuid: dev.model(g.uuid) for g in states if g.health == "ok" and g.model}
        # this machine as a node: named in gpufrac.yaml (node.name), else by its host name
        self.node = settings.node_name or socket.gethostname()
        gpus = sched_gpus_from_states(
            states,
            models,
            self.store.mig_pins(),
            node=self.node,
            node_labels=settings.node_labels,
        )
        self.scheduler = Scheduler(gpus, settings, recut=recut, clock=clock)
        self.mps = MpsDaemons(
            shared_dir(data_dir) / "mps",
            log_root=data_dir / "mps",
            enabled=True,
            tool_path=dev.tool_path,
        )
        self.memory = MemoryWatch(dev)
        self.handover = Handover(dev, self.mps, self.arbiter.address, settings.job_min_share_milli)
        self.mig = MigWorker(dev)
        self.executor = Executor(
            self.store,
            dev,
            self.scheduler,
            self.runs,
            self.handover,
            self.mps,
            self.failures,
            self.mig,
            self.sandbox,
            self._checked_mounts,
        )
        self.gpu_care = GpuCare(
            self.store, self.scheduler, dev, self.health, self.mps, self.executor
        )
        for uuid in self.store.cordons():
            g = self.scheduler.state.by_uuid.get(uuid)
            if g is not None:
                self.scheduler.state.set_closed(g, CORDONED)
        for w in self.store.workloads():  # take back what was decided before a restart
            spec = spec_from_json(w.spec)
            placed = self.store.placement(w.tenant, w.name)
            before: Decision | None = None
            if placed is not None:
                match placed.record:
                    case Completion():
                        continue  # it finished: there is nothing to take back
                    case Decision() as d:
                        before = d if placed.generation == w.generation else None
                    case _:
                        assert_never(placed.record)
            if before is not None:
                self.scheduler.restore(spec, before)
                why = self.scheduler.pending.get(w.key)
                if before.outcome == "placed" and why is not None:
                    # its placement no longer fits: it waits, and what was decided for it (a MIG
                    # change not yet made, say) is not carried out
                    self.runs.stop_live(w.tenant, w.name, f"its placement no longer fits: {why}")
                    self.executor.record([Decision(w.key, "pending", why)])
            else:
                self.executor.record(self.scheduler.submit(spec))
        # what waits is tried again: the settings (mig_reconfigure, say) may have changed
        self.executor.record(self.scheduler.retry_pending())

    def run_under_lease(self, lease_file: Path) -> None:
        """Each workload started from now on stops itself once the lease in ``lease_file`` has run
        out (a cluster node's, renewed by each answer of its control plane: cluster/node.py)."""
        self.runs.lease_file = lease_file

    def displacements(self) -> AbstractContextManager[list[Displacement]]:
        """The workloads displaced while the block runs (by an apply, a drain, a MIG change, the
        autoscaler's replicas): for the answer of the call; with the lock held."""
        return self.executor.displacements()

    def close(self) -> None:
        self.mig.close()
        self.arbiter.close()
        self.store.close()
        fcntl.flock(self._flock, fcntl.LOCK_UN)
        self._flock.close()

    # -- desired state --------------------------------------------------------------------------

    def check_workload(self, spec: WorkloadSpec) -> None:
        """``InputError`` where ``spec`` breaks an operator's bound or cannot run here as written:
        its priority and user, its mounts (where each path leads), its image (on this machine:
        nothing is pulled)."""
        self.settings.check_priority(spec.tenant, spec.priority)
        self.settings.check_user(spec.tenant, spec.user)
        self._checked_mounts(spec.mounts)
        if spec.image is not None:
            self.runs.check_image(spec.image)
            self._check_ports(spec)

    @staticmethod
    def _check_ports(spec: WorkloadSpec) -> None:
        """A container's ports are published on the host by the engine, which runs as root: a
        port below 1024 there is one its tenant could never listen on itself."""
        for port in published_ports(spec):
            if port < 1024:
                health = spec.health is not None and spec.health.port == port
                raise InputError(
                    f"port {port} would be published on this machine by the container engine "
                    "(root): a workload's ports are 1024 and above",
                    field="spec.health" if health else "spec.env.PORT",
                    fix="listen on a port from 1024 up (8000, say)",
                )

    def _checked_mounts(self, mounts: tuple[VolumeMount, ...]) -> tuple[str, ...]:
        """Where each container mount leads: within the operator's allowed paths, there, and a
        path only root can change (checked at apply and again at every start)."""
        sources = self.settings.check_mounts(mounts, os.path.realpath)
        self.runs.check_mount_sources(mounts, sources)
        return sources

    def apply_workload(self, spec: WorkloadSpec) -> tuple[ApplyResult, Decision | None]:
        """Store ``spec`` and schedule it. Returns (what happened, the decision):
        ``unchanged`` (nothing done), ``created``, ``replaced`` (the old one is stopped),
        ``updated`` (a live change), or ``refused`` (nothing stored: no GPU here could ever run
        it)."""
        key = workload_key(spec)
        self.check_workload(spec)  # nothing stored that breaks a bound or cannot run here
        stored = self.store.workload(spec.tenant, spec.name)
        raw = spec_to_json(spec)
        if stored is not None and stored.spec == raw:
            return "unchanged", None
        if stored is not None and _changed(stored.spec, raw) <= LIVE_FIELDS:
            self.store.update_spec_live(
                spec.tenant, spec.name, raw, "; ".join(spec_diff(stored.spec, raw))
            )
            decisions = self.scheduler.update_live(spec)
            self.executor.record(decisions)
            return "updated", decisions[0] if decisions else None
        refusal = self.scheduler.refusal(spec)
        if refusal is not None:
            return "refused", Decision(key, "refused", refusal)
        if stored is not None:
            self._remove_runs(spec.tenant, spec.name)
            self.failures.forget(key)
            if self.scheduler.knows(key):
                self.executor.record(self.scheduler.delete(spec.tenant, spec.name))
        self.store.put_workload(spec.tenant, spec.name, raw)
        decisions = self.scheduler.submit(spec)
        self.executor.record(decisions)
        return ("replaced" if stored is not None else "created"), decisions[0]

    def apply_new_workloads(self, specs: Sequence[WorkloadSpec]) -> list[Decision]:
        """Store and schedule workloads that arrive together and none of which is stored yet (a
        deployment's new replicas), through ``Scheduler.submit_all``: all are known as waiting
        before the first is tried, so small ones may share a new MIG instance (docs/mig.md). Each
        is checked first; one that no GPU here could ever hold is refused and not stored. Returns
        every decision."""
        for spec in specs:
            self.check_workload(spec)
            if self.store.workload(spec.tenant, spec.name) is not None:
                raise InputError(
                    f"workload {workload_key(spec)} is stored already",
                    field="metadata.name",
                    fix="apply it alone (apply_workload replaces it)",
                )
        out: list[Decision] = []
        kept = []
        for spec in specs:
            refusal = self.scheduler.refusal(spec)
            if refusal is not None:
                out.append(Decision(workload_key(spec), "refused", refusal))
                continue
            self.store.put_workload(spec.tenant, spec.name, spec_to_json(spec))
            kept.append(spec)
        decisions = self.scheduler.submit_all(kept)
        self.executor.record(decisions)
        return out + decisions

    def place(self, spec: WorkloadSpec, decision: Decision) -> Decision:
        """Carry out a placement decided elsewhere (a cluster's control plane, docs/cluster.md):
        store ``spec`` and take ``decision`` exactly as it was made; the reconcile pass starts it.
        The same spec again changes nothing; a changed one replaces the old. A placement that does
        not fit here (the GPUs differ from what the decider saw) is not kept: the answer is pending
        with the reason, and nothing is stored."""
        key = workload_key(spec)
        raw = spec_to_json(spec)
        stored = self.store.workload(spec.tenant, spec.name)
        if stored is not None and stored.spec == raw:
            placed = self.store.placement(spec.tenant, spec.name)
            if placed is not None:
                match placed.record:
                    case Decision(outcome="placed" | "pending") as kept:
                        return kept
                    case Decision() | Completion():
                        pass  # refused here, or it ran and finished: the decision as made
                    case _:
                        assert_never(placed.record)
            return decision
        if stored is not None:
            self.delete(spec.tenant, spec.name)
        self.scheduler.restore(spec, decision)
        why = self.scheduler.pending.get(key)
        if why is not None:
            self.executor.record(self.scheduler.delete(spec.tenant, spec.name))
            return Decision(key, "pending", why)
        self.store.put_workload(spec.tenant, spec.name, raw)
        self.executor.record([decision])
        return decision

    def delete(self, tenant: str, name: str) -> bool:
        if self.store.workload(tenant, name) is None:
            return False
        key = f"{tenant}/{name}"
        self._remove_runs(tenant, name)
        self.store.delete_workload(tenant, name)
        self.failures.forget(key)
        self.busy_until.pop(key, None)
        if self.scheduler.knows(key):
            self.executor.record(self.scheduler.delete(tenant, name))
        return True

    def clear_unknown(self, tenant: str, name: str, by: str = "cleared by an admin") -> bool | None:
        """An admin's word on a workload whose last attempt's outcome is unknown: it counts as a
        failed attempt from now on, and the restart policy applies. None if there is no such
        workload; False if its outcome is not unknown."""
        with self.lock:
            stored = self.store.workload(tenant, name)
            if stored is None:
                return None
            run = self.runs.latest(tenant, name, stored.generation)
            if run is None or not self.runs.clear_unknown(run, by):
                return False
            self.store.record_event(
                "outcome_cleared",
                f"{tenant}/{name}",
                f"its unknown outcome counts as failed ({by})",
            )
            return True

    def _remove_runs(self, tenant: str, name: str) -> None:
        root = self.runs.of(tenant, name)
        self.runs.remove(tenant, name)
        for run in [r for r in self._evicted_runs if r.parent == root]:
            del self._evicted_runs[run]

    # -- views ----------------------------------------------------------------------------------

    def note_busy(self, key: str, seconds: float = 2.0) -> None:
        """The workload is busy on its GPU for a while (the gateway has requests in flight to it):
        as a transparent workload it may take its GPU from lower classes meanwhile."""
        self.busy_until[key] = time.monotonic() + seconds

    def warnings(self, spec: WorkloadSpec, decision: Decision | None) -> list[str]:
        """What ``apply`` says about a request that was probably not meant as written."""
        return self.scheduler.warnings(spec, decision)

    def latest_log(self, tenant: str, name: str, generation: int) -> Path | None:
        """The newest attempt's output log (its runner says where it is), None before one."""
        run = self.runs.latest(tenant, name, generation)
        return None if run is None else self.runs.log(run)

    def newest_log(self, tenant: str, name: str) -> tuple[str | None, Path | None] | None:
        """(the newest attempt's run name, its output log), (None, None) before a first attempt,
        or None for a workload this agent does not have. Call with the lock held; read the file
        after (``runtime.log_tail.read_tail``, bounded), without it."""
        stored = self.store.workload(tenant, name)
        if stored is None:
            return None
        run = self.runs.latest(tenant, name, stored.generation)
        if run is None:
            return None, None
        return run.name, self.runs.log(run)

    def memory_use(
        self,
        tenant: str,
        name: str,
        gpus: Mapping[str, GpuState] | None = None,
        state: WorkloadState | None = None,
    ) -> MemoryUse | None:
        """GPU memory held now by a running workload's processes, as NVML reports it (``gpus``:
        the GPUs as just read, where the caller read them all once; ``state``: the workload as
        the last pass saw it, which spares reading its run directory)."""
        if state is not None:
            d = state.decision
            if not state.running or d is None or not d.gpus:
                return None
            uuid = d.gpus[0]
            run = self.runs.latest(tenant, name, state.generation)
            if run is None:
                return None
            return self.memory.use(uuid, self._owner(run), None if gpus is None else gpus.get(uuid))
        stored = self.store.workload(tenant, name)
        placed = self.store.placement(tenant, name)
        if stored is None or placed is None:
            return None
        match placed.record:
            case Decision() as d if d.gpus:
                uuid = d.gpus[0]
            case Decision() | Completion():
                return None  # it waits, or it finished and gave its GPU back
            case _:
                assert_never(placed.record)
        run = self.runs.latest(tenant, name, stored.generation)
        if run is None or self.runs.status(run).child_pid is None:
            return None
        return self.memory.use(uuid, self._owner(run), None if gpus is None else gpus.get(uuid))

    def _owner(self, run: Path) -> Callable[[Iterable[int]], frozenset[int]]:
        """Which of some processes are the run's workload's (its runner tells)."""
        return lambda pids: self.runs.members(run, pids)

    # -- GPUs (GpuCare does the work) -------------------------------------------------------------

    def cordon(self, uuid: str, reason: str = "cordoned by hand") -> None:
        self.gpu_care.cordon(uuid, reason)

    def uncordon(self, uuid: str) -> list[Decision]:
        return self.gpu_care.uncordon(uuid)

    def drain(self, uuid: str, reason: str = "drained by hand") -> list[Decision]:
        return self.gpu_care.drain(uuid, reason)

    def set_mig_layout(
        self,
        uuid: str,
        mig_enabled: bool,
        layout: list[MigPlacement],
        *,
        drain: bool = False,
        allow_mode_change: bool = False,
        pin: bool = True,
        dry_run: bool = False,
    ) -> list[MigAction]:
        return self.gpu_care.set_mig_layout(
            uuid,
            mig_enabled,
            layout,
            drain=drain,
            allow_mode_change=allow_mode_change,
            pin=pin,
            dry_run=dry_run,
        )

    def release_mig(self, uuid: str) -> list[Decision]:
        return self.gpu_care.release_mig(uuid)

    # -- reconcile ------------------------------------------------------------------------------

    def reconcile(self) -> list[WorkloadState]:
        """One pass: make the machine match the desired state. Safe to run any number of times."""
        with self.lock:
            self.executor.record_mig()
            self._upkeep()
            # moves that make room (docs/scheduler.md): plans given up or begun, services restarted
            self.executor.record(self.scheduler.plan_moves())
            self.runs.sweep()
            self.memory.new_pass()
            states = [self._step(w) for w in self.store.workloads()]
            self.memory.new_pass()  # views between passes read afresh
            self.qos.sync(
                [
                    Running(s.key, s.generation, s.decision, s.env)
                    for s in states
                    if s.decision is not None
                    and s.decision.outcome == "placed"
                    and s.phase in ("starting", "running")
                ]
            )
            states = [self._pause_shown(s) for s in states]
        return states

    def _pause_shown(self, st: WorkloadState) -> WorkloadState:
        """A running workload the QoS arbiter holds stopped shows ``paused``, with who has its GPU
        (named in full, as its ``cause``: the API names it to those who may see it; its pauses
        are counted, and told as events, by ``QosCare``)."""
        member = self.arbiter.latest.get(st.key) or {}
        if st.phase != "running" or not member.get("paused"):
            return st
        by = member.get("paused_by")
        why = f"paused while {by or 'another workload'} (a higher class) uses the GPU"
        resumes = (
            "when it is idle"
            if not member["qos"]["min_share_milli"]
            else "when it is idle, or beside it for its min share"
        )
        return replace(st, phase="paused", reason=f"{why}; resumes {resumes}", cause=by)

    def _upkeep(self) -> None:
        for what, fn in (
            ("writing the store", self.store.heartbeat),
            ("watching GPU health", self.gpu_care.watch_health),
            ("stopping idle MPS daemons", self.gpu_care.stop_idle_mps),
            ("giving free memory back", self.native_memory.upkeep),
        ):
            # writing the store is tried every pass (a small write): /health is ok again within
            # one pass of the space coming back, not after the backoff
            if what != "writing the store" and self.failures.waiting("agent", what) is not None:
                continue
            try:
                fn()
            except Exception as e:
                self.failures.failed("agent", what, e)
            else:
                self.failures.succeeded("agent", what)

    def _step(self, w: StoredWorkload) -> WorkloadState:
        """Observe one workload, decide its next step and carry it out; a step that raises is its
        failure alone."""
        waiting = self.failures.waiting(w.key, "reconcile")
        if waiting is not None:
            return self._trouble(w, waiting.reason(self.clock()))
        try:
            step = self._decide(self._observe(w))
        except Exception as e:
            failure = self.failures.failed(w.key, "reconcile", e)
            return self._trouble(w, failure.reason(self.clock()))
        self.failures.succeeded(w.key, "reconcile")
        return self._carry_out(step)

    def _carry_out(self, step: Step) -> WorkloadState:
        st = step.state
        for action in step.actions:
            match action.kind:
                case "start":  # one condition wherever it starts: a start that failed, retried
                    what, starts = "start", True
                case "evict" | "destroy_mig_instance" | "create_mig_instance" | "stop":
                    what, starts = action.describe(), False
                case _:
                    assert_never(action.kind)
            try:
                self.executor.carry_out(action)
            except Exception as e:
                failure = self.failures.failed(st.key, what, e)
                return replace(st, phase="backoff", reason=failure.reason(self.clock()))
            if starts:  # it runs: what it was handed is its state's, and the step is done
                self.failures.succeeded(st.key, what)
                tenant, name = st.key.split("/", 1)
                run = self.runs.latest(tenant, name, st.generation)
                return replace(st, reason="", env=self.runs.handed_env(run))
        return st

    def _trouble(self, w: StoredWorkload, reason: str) -> WorkloadState:
        return WorkloadState(key=w.key, generation=w.generation, phase="backoff", reason=reason)

    def _observe(self, w: StoredWorkload) -> Seen:
        placed = self.store.placement(w.tenant, w.name)
        record = None if placed is None else placed.record
        decision: Decision | None = None
        completed: Completion | None = None
        match record:
            case Decision():
                decision = record
            case Completion():
                completed = record
            case None:
                pass  # not scheduled yet
            case _:
                assert_never(record)
        if completed is not None and completed.attempts is not None:  # all of it kept when done
            return Seen(w, spec_from_json(w.spec), None, completed, [], None)
        attempts = self.runs.attempts(w.tenant, w.name, w.generation)
        status = self.runs.status(attempts[-1]) if attempts else None
        env = self.runs.handed_env(attempts[-1]) if attempts else {}
        evicted = self._evicted(attempts)
        return Seen(w, spec_from_json(w.spec), decision, completed, attempts, status, env, evicted)

    def _evicted(self, attempts: list[Path]) -> tuple[bool, ...]:
        """Per attempt, whether it was stopped to make room; an attempt before the newest is done,
        so what it says is read once."""
        flags = []
        for i, run in enumerate(attempts):
            known = self._evicted_runs.get(run)
            if known is None:
                known = bool(read_note(run, "killed").get(EVICTED))
                if i < len(attempts) - 1:
                    self._evicted_runs[run] = known
            flags.append(known)
        return tuple(flags)

    def _decide(self, s: Seen) -> Step:
        if s.completed is not None:
            done = s.completed
            if done.attempts is None:  # completed by an older gpufrac: read from its runs
                code = s.status.exit_code if s.status else None
                return Step(s.state(done.phase, done.reason, exit_code=code))
            return Step(
                WorkloadState(
                    key=s.key,
                    generation=s.stored.generation,
                    phase=done.phase,
                    reason=done.reason,
                    attempts=done.attempts,
                    restarts=done.restarts or 0,
                    evictions=done.evictions or 0,
                    exit_code=done.exit_code,
                    env=dict(done.env),
                )
            )
        if s.decision is None or s.decision.outcome != "placed":
            why = s.decision.reason if s.decision else "not scheduled yet"
            return Step(s.state("pending", why, placed=False))
        failure = self.failures.waiting(s.key)
        if failure is not None:  # an action of its start failed: wait for the retry
            return Step(s.state("backoff", failure.reason(self.clock())))
        status = s.status
        if status is not None and not status.done:
            if status.shim_alive and status.child_pid is None:  # the shim is starting it
                return Step(s.state("starting", "starting its process"))
            assert s.latest is not None
            pending = self.runs.pending_outcome(s.latest, status)
            if pending is not None:  # it ended; its supervisor cannot record how yet
                return Step(s.state("unknown", pending))
            if status.shim_alive:
                return self._running(s, status)
            if self.runs.launching(s.latest, status):
                return Step(s.state("starting", "starting its process"))  # on its way
            # its supervisor never reported, or died (killed, the machine rebooted): its workload
            # is stopped, and the run recorded as ended (how, unknown where it had started)
            status = self.runs.abandon(s.latest, status)
        if status is None:
            return self._start_step(s)
        assert s.latest is not None
        killed = read_note(s.latest, "killed")
        if killed.get(EVICTED):  # it was stopped to make room: it starts again where it is now
            return self._start_step(s)
        hit = self.runs.limit_hit(s.latest)  # its runner stopped it for a host limit
        if hit is not None:
            if not has_note(s.latest, "limit-told"):  # said once, like a GPU memory limit
                self.store.record_event("memory_limit", s.key, hit)
                write_note(s.latest, "limit-told", {"at": self.clock()})
            killed = {"reason": hit, **killed}
        return self._after_exit(s, status, killed)

    def _running(self, s: Seen, status: RunStatus) -> Step:
        assert s.decision is not None and s.latest is not None and status.child_pid is not None
        alloc = self.scheduler.allocations(s.key)
        limit = alloc[0].memory_mib if alloc else None
        over = self.memory.over_limit(s.decision, limit, s.latest, self._owner(s.latest))
        if over:
            self.store.record_event("memory_limit", s.key, over)
            return Step(s.state("running", over), (SchedAction("stop", s.key, reason=over),))
        if not self._ready(s.spec, s.latest, status):
            return Step(s.state("starting", "waiting for its health check"))
        first = self.runs.status(s.attempts[0]).started or status.started or self.clock()
        deadline = s.spec.deadline_seconds
        if s.spec.type == "job" and deadline is not None and self.clock() > first + deadline:
            why = f"deadline of {deadline}s passed"
            stopping = SchedAction("stop", s.key, reason=why)
            return Step(self._complete(s, "failed", None, why), (stopping,))
        return Step(s.state("running"))

    def _after_exit(self, s: Seen, status: RunStatus, killed: dict[str, object]) -> Step:
        spec, attempts = s.spec, len(s.attempts)
        if status.unknown and (spec.type == "job" or spec.restart == "on-failure"):
            # it may have exited 0: running it again could do its work twice
            why = (
                f"{status.error or 'how it ended is not known'}; how it ended is not known, so "
                f"it is not run again until an admin clears it (gpufrac clear-unknown {s.key})"
            )
            return Step(s.state("unknown", why))
        ok = status.exit_code == 0
        if spec.type == "job" and ok:
            return Step(self._complete(s, "succeeded", 0))
        restart = spec.restart == "always" or (spec.restart == "on-failure" and not ok)
        limit = spec.backoff_limit if spec.type == "job" else None
        code = status.exit_code
        ended = (
            str(killed.get("reason") or "")
            or status.error
            or (f"exited with {code}" if code is not None else f"ended by {status.ended_by()}")
        )
        if not restart or (limit is not None and attempts > limit):
            return Step(self._complete(s, "failed", code, ended))
        delay = min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (attempts - 1))
        if self.clock() < (status.finished or 0) + delay:
            why = f"{ended}; restart {attempts} in {delay:.0f}s"
            return Step(s.state("backoff", why, exit_code=status.exit_code))
        return self._start_step(s)

    def _start_step(self, s: Seen) -> Step:
        """Start the next attempt; first, the MIG changes its placement still needs."""
        d = s.decision
        assert d is not None and d.gpus
        mig = self.executor.mig_needed(d)
        state = s.state(
            "starting", "; ".join(a.describe() for a in mig), attempts=len(s.attempts) + 1
        )
        failing = self.failures.latest(s.key)
        if failing is not None:  # retrying an action that failed: it says so until it goes through
            state = replace(state, phase="backoff", reason=failing.reason(self.clock()))
        if self.mig.busy(s.key):
            return Step(state)  # under way: a later pass starts it
        if d.mig is not None and self.mig.destroying(d.gpus[0], d.mig):
            # the instance there now is an old one an earlier re-cut destroys: wait for it to go
            return Step(s.state("starting", f"waiting for the old {d.mig} to be destroyed first"))
        if not mig:
            return Step(state, (SchedAction("start", s.key, d.gpus[0], d.mig),))
        return Step(state, mig)

    def _complete(self, s: Seen, phase: EndPhase, code: int | None, why: str = "") -> WorkloadState:
        """A job that is done (or a workload that will not be restarted) gives its GPU back."""
        spec = s.spec
        if self.scheduler.knows(s.key):
            self.executor.record(self.scheduler.delete(spec.tenant, spec.name))
        state = s.state(phase, why, exit_code=code, placed=False)
        self.store.set_placement(
            spec.tenant,
            spec.name,
            s.stored.generation,
            Completion(
                phase=phase,
                reason=why,
                where=_where(s),
                attempts=state.attempts,
                restarts=state.restarts,
                evictions=state.evictions,
                exit_code=code,
                env=state.env,
            ),
        )
        self.store.record_event(phase, s.key, why or "exited with 0")
        return state

    # -- readiness ------------------------------------------------------------------------------

    def _owns_port(self, spec: WorkloadSpec, run_dir: Path, status: RunStatus, port: int) -> bool:
        """Is what answered on ``port`` this workload (its runner tells: its cgroup or process
        group), not another process that took the port (another tenant's, say, before this one
        could bind it)? Where the owner cannot be told, it is taken as the workload's."""
        owners = port_owners(port)
        if not owners or status.child_pid is None:
            return True
        if self.runs.owns(run_dir, port=port):
            return True
        if not has_note(run_dir, "port-taken"):
            write_note(run_dir, "port-taken", {"owners": sorted(owners)})
            self.store.record_event(
                "not_ready",
                workload_key(spec),
                f"port {port} is held by another process (pid {min(owners)}), not this "
                "workload: it does not get traffic",
            )
        return False

    def _ready(self, spec: WorkloadSpec, run_dir: Path, status: RunStatus) -> bool:
        """A service with a health check is ready once the check passed (remembered in the run)."""
        check = spec.health
        if check is None or has_note(run_dir, "ready"):
            return True
        if status.started is None or self.clock() < status.started + check.initial_delay_seconds:
            return False
        last = float(str(read_note(run_dir, "probe").get("at", 0)))
        if self.clock() < last + check.period_seconds:
            return False
        write_note(run_dir, "probe", {"at": self.clock()})
        if not probe(check.kind, check.port, check.path, self.handover.listen_host):
            return False
        if not self._owns_port(spec, run_dir, status, check.port):
            return False
        write_note(run_dir, "ready", {"at": self.clock()})
        self.store.record_event(
            "ready", workload_key(spec), f"{check.kind} check on port {check.port} passed"
        )
        return True


def attempt_counts(evicted: tuple[bool, ...], attempts: int) -> tuple[int, int]:
    """(restarts, evictions) of a workload with ``attempts`` attempts (the newest may be one being
    started now) whose attempts so far were stopped to make room where ``evicted`` says: an
    attempt after an evicted one is no restart."""
    restarts = sum(1 for flag in evicted[: max(0, attempts - 1)] if not flag)
    return restarts, sum(evicted)


def _where(s: Seen) -> Where | None:
    """Where a finished workload ran (kept after its placement is given back)."""
    d = s.decision
    if d is None or not d.gpus:
        return None
    return Where(d.mode, d.gpus, d.mig)


def _changed(old: dict[str, object], new: dict[str, object]) -> set[str]:
    """Top-level fields that differ between two stored specs."""
    return {k for k in set(old) | set(new) if old.get(k) != new.get(k)}
