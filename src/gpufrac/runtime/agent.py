"""The node agent's core: desired state in, running supervised workloads out. No HTTP here.

``apply`` and ``delete`` store the desired state first (SQLite, all or nothing) and let the scheduler
decide; ``reconcile`` makes the machine match: it creates MIG instances the decisions ask for, starts each
placed workload under a shim with its GPU handed over in the environment, restarts by policy with
exponential backoff, enforces job deadlines, and stops what should not run.

Every step is idempotent and reads the truth from disk: a workload's attempts are run directories
``runs/<tenant>/<name>/g<generation>-<attempt>``, each with the shim's record of how it ended. So a
restarted agent (even after ``kill -9``) re-attaches to the shims still running, counts the attempts
already made, never starts a workload twice, and still applies ``on-failure`` to a workload that failed
while it was down.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufrac.devices.health import DeviceHealth
from gpufrac.devices.nvml import NvmlDevices
from gpufrac.errors import InputError
from gpufrac.model.qos import mps_client_priority, qos_params
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import WorkloadSpec, spec_diff, spec_from_json, spec_to_json
from gpufrac.planning.sched_state import sched_gpus_from_states
from gpufrac.planning.scheduler import (
    Decision,
    Scheduler,
    decision_from_json,
    decision_to_json,
    workload_key,
)
from gpufrac.runtime.arbiter_link import ArbiterLink
from gpufrac.runtime.gpu_care import GpuCare
from gpufrac.runtime.memory_watch import MemoryWatch
from gpufrac.runtime.mps import MpsDaemons
from gpufrac.runtime.qos_care import QosCare, qos_domain
from gpufrac.runtime.runs import handed_env, probe, read_json, write_json
from gpufrac.runtime.shim import ShimStatus, launch, read_status, stop
from gpufrac.runtime.store import Store

BACKOFF_BASE_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
# Fields whose change applies to a running workload at once, without a restart (the QoS arbiter's).
LIVE_FIELDS = frozenset({"priority", "qos", "weight", "min_share_milli"})


@dataclass(frozen=True, slots=True)
class WorkloadState:
    """What a workload is doing, as the agent sees it."""

    key: str
    generation: int
    phase: str  # pending | starting | running | backoff | succeeded | failed
    reason: str
    decision: Decision | None
    attempts: int
    exit_code: int | None
    env: dict[str, str]


class Agent(GpuCare, QosCare, MemoryWatch):
    def __init__(
        self,
        data_dir: Path,
        dev: NvmlDevices,
        settings: OperatorSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        stop_grace: float = 10.0,
    ) -> None:
        self.data_dir = data_dir
        self.dev = dev
        self.clock = clock
        self.stop_grace = stop_grace
        data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(data_dir / "agent.lock", "a+")  # noqa: SIM115 - held for the agent's life
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise InputError(
                f"another gpufrac agent already uses {data_dir}",
                field="--data-dir",
                fix="talk to it (gpufrac apply, get, ...), or give another --data-dir",
            ) from None
        self.store = Store(data_dir / "state.db")
        self.runs = data_dir / "runs"
        settings = settings or OperatorSettings()
        self.arbiter = ArbiterLink(
            data_dir / "arbiter", quantum_ms=settings.qos_quantum_ms, preempt=settings.qos_preempt
        )
        self._qos_written = {}
        self._resume_all()  # whatever a crashed agent's arbiter paused runs again
        states = dev.gpus()
        models = {g.uuid: dev.model(g.uuid) for g in states if g.health == "ok" and g.model}
        self.scheduler = Scheduler(sched_gpus_from_states(states, models), settings)
        self.health = DeviceHealth(dev)
        self.mps = MpsDaemons(
            data_dir / "mps", enabled=not dev.simulated
        )  # no daemon for a simulated GPU
        for uuid in self.store.cordons():
            g = self.scheduler.state.by_uuid.get(uuid)
            if g is not None:
                self.scheduler.state.set_schedulable(g, False)
        for w in self.store.workloads():  # take back what was decided before a restart
            spec = spec_from_json(w.spec)
            placed = self.store.placement(w.tenant, w.name)
            if placed is not None and placed[1].get("outcome") == "completed":
                continue
            if placed is not None and placed[0] == w.generation:
                self.scheduler.restore(spec, decision_from_json(placed[1]))
            else:
                self._record(self.scheduler.submit(spec))

    def close(self) -> None:
        self.arbiter.close()
        self.store.close()
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()

    # -- desired state --------------------------------------------------------------------------

    def apply(self, spec: WorkloadSpec) -> tuple[str, Decision | None]:
        """Store ``spec`` and schedule it. Returns (what happened, the decision):
        ``unchanged`` (nothing done), ``created``, ``replaced`` (the old one is stopped), or ``refused``
        (nothing stored: no GPU here could ever run it)."""
        key = workload_key(spec)
        stored = self.store.workload(spec.tenant, spec.name)
        raw = spec_to_json(spec)
        if stored is not None and stored.spec == raw:
            return "unchanged", None
        if stored is not None and _changed(stored.spec, raw) <= LIVE_FIELDS:
            self.store.update_spec_live(
                spec.tenant, spec.name, raw, "; ".join(spec_diff(stored.spec, raw))
            )
            decisions = self.scheduler.update_live(spec)
            self._record(decisions)
            return "updated", decisions[0] if decisions else None
        refusal = self.scheduler.refusal(spec)
        if refusal is not None:
            return "refused", Decision(key, "refused", refusal)
        if stored is not None:
            self._stop_runs(spec.tenant, spec.name)
            if key in self.scheduler.specs:
                self._record(self.scheduler.delete(spec.tenant, spec.name))
        self.store.put_workload(spec.tenant, spec.name, raw)
        decisions = self.scheduler.submit(spec)
        self._record(decisions)
        return ("replaced" if stored is not None else "created"), decisions[0]

    def delete(self, tenant: str, name: str) -> bool:
        if self.store.workload(tenant, name) is None:
            return False
        self._stop_runs(tenant, name)
        self.store.delete_workload(tenant, name)
        if f"{tenant}/{name}" in self.scheduler.specs:
            self._record(self.scheduler.delete(tenant, name))
        return True

    def _record(self, decisions: list[Decision]) -> None:
        """Persist decisions; stop workloads that were evicted."""
        for d in decisions:
            tenant, name = d.workload.split("/", 1)
            stored = self.store.workload(tenant, name)
            if stored is None:
                continue
            if d.outcome == "pending" and self._latest(tenant, name, stored.generation) is not None:
                self._stop_runs(tenant, name)
                self.store.record_event("evicted", d.workload, d.reason)
            self.store.set_placement(tenant, name, stored.generation, decision_to_json(d))
            self.store.record_event(d.outcome, d.workload, d.reason or _where(d))

    # -- reconcile ------------------------------------------------------------------------------

    def reconcile(self) -> list[WorkloadState]:
        """One pass: make the machine match the desired state. Safe to run any number of times."""
        self._watch_health()
        self._stop_idle_mps()
        states = [self._reconcile_one(w.tenant, w.name) for w in self.store.workloads()]
        self._sync_arbiter(states)
        return states

    def _reconcile_one(self, tenant: str, name: str) -> WorkloadState:
        key = f"{tenant}/{name}"
        stored = self.store.workload(tenant, name)
        assert stored is not None
        spec = spec_from_json(stored.spec)
        placed = self.store.placement(tenant, name)
        decision = (
            decision_from_json(placed[1])
            if placed and placed[1].get("outcome") != "completed"
            else None
        )
        attempts = self._attempts(tenant, name, stored.generation)
        latest = attempts[-1] if attempts else None
        status = read_status(latest) if latest else None
        if placed is not None and placed[1].get("outcome") == "completed":
            phase = str(placed[1].get("phase", "failed"))
            code = status.exit_code if status else None
            why = str(placed[1].get("reason", ""))
            return WorkloadState(
                key, stored.generation, phase, why, None, len(attempts), code, handed_env(latest)
            )
        if decision is None or decision.outcome != "placed":
            why = decision.reason if decision else "not scheduled yet"
            return WorkloadState(
                key, stored.generation, "pending", why, decision, len(attempts), None, {}
            )
        env = self._environment(spec, decision)
        if status is not None and not status.done:
            if status.shim_alive:
                assert latest is not None
                over = self._memory_watchdog(spec, decision, latest)
                if over:
                    return WorkloadState(
                        key, stored.generation, "running", over, decision, len(attempts), None, env
                    )
                if not self._ready(spec, latest, status):
                    why = "waiting for its health check"
                    return WorkloadState(
                        key, stored.generation, "starting", why, decision, len(attempts), None, env
                    )
                return self._check_deadline(
                    spec, stored.generation, decision, attempts, status, env
                )
            # the shim vanished without a record (the machine rebooted): count it as a failure
            status = ShimStatus(
                status.shim_pid, status.child_pid, status.started, None, None, self.clock(), False
            )
        if status is None:
            self._start(spec, stored.generation, decision, 1, env)
            return WorkloadState(key, stored.generation, "starting", "", decision, 1, None, env)
        ok = status.exit_code == 0
        if spec.type == "job" and ok:
            return self._complete(spec, stored.generation, "succeeded", len(attempts), 0)
        restart = spec.restart == "always" or (spec.restart == "on-failure" and not ok)
        limit = spec.backoff_limit if spec.type == "job" else None
        killed = read_json(latest / "killed.json") if latest else {}
        if not restart or (limit is not None and len(attempts) > limit):
            why = (
                str(killed.get("reason") or "")
                or f"exited with {status.exit_code if status.exit_code is not None else f'signal {status.signal}'}"
            )
            return self._complete(
                spec, stored.generation, "failed", len(attempts), status.exit_code, why
            )
        delay = min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (len(attempts) - 1))
        if self.clock() < (status.finished or 0) + delay:
            return WorkloadState(
                key,
                stored.generation,
                "backoff",
                f"restart {len(attempts)} in {delay:.0f}s",
                decision,
                len(attempts),
                status.exit_code,
                env,
            )
        self.store.record_event(
            "restarted", key, f"attempt {len(attempts) + 1} after exit {status.exit_code}"
        )
        self._start(spec, stored.generation, decision, len(attempts) + 1, env)
        return WorkloadState(
            key, stored.generation, "starting", "", decision, len(attempts) + 1, None, env
        )

    def _check_deadline(
        self,
        spec: WorkloadSpec,
        generation: int,
        decision: Decision,
        attempts: list[Path],
        status: ShimStatus,
        env: dict[str, str],
    ) -> WorkloadState:
        key = workload_key(spec)
        first = read_status(attempts[0]).started or status.started or self.clock()
        if (
            spec.type == "job"
            and spec.deadline_seconds is not None
            and self.clock() > first + spec.deadline_seconds
        ):
            stop(attempts[-1], grace=self.stop_grace)
            return self._complete(
                spec,
                generation,
                "failed",
                len(attempts),
                None,
                f"deadline of {spec.deadline_seconds}s passed",
            )
        return WorkloadState(key, generation, "running", "", decision, len(attempts), None, env)

    def _complete(
        self,
        spec: WorkloadSpec,
        generation: int,
        phase: str,
        attempts: int,
        code: int | None,
        why: str = "",
    ) -> WorkloadState:
        """A job that is done (or a workload that will not be restarted) gives its GPU back."""
        key = workload_key(spec)
        if key in self.scheduler.specs:
            self._record(self.scheduler.delete(spec.tenant, spec.name))
        self.store.set_placement(
            spec.tenant,
            spec.name,
            generation,
            {"outcome": "completed", "phase": phase, "reason": why},
        )
        self.store.record_event(phase, key, why or "exited with 0")
        return WorkloadState(
            key,
            generation,
            phase,
            why,
            None,
            attempts,
            code,
            handed_env(self._latest(spec.tenant, spec.name, generation)),
        )

    # -- readiness ------------------------------------------------------------------------------

    def _ready(self, spec: WorkloadSpec, run_dir: Path, status: ShimStatus) -> bool:
        """A service with a health check is ready once the check passed (remembered in the run)."""
        check = spec.health
        if check is None or (run_dir / "ready.json").exists():
            return True
        if status.started is None or self.clock() < status.started + check.initial_delay_seconds:
            return False
        last = float(str(read_json(run_dir / "probe.json").get("at", 0)))
        if self.clock() < last + check.period_seconds:
            return False
        write_json(run_dir / "probe.json", {"at": self.clock()})
        if not probe(check.kind, check.port, check.path):
            return False
        write_json(run_dir / "ready.json", {"at": self.clock()})
        self.store.record_event(
            "ready", workload_key(spec), f"{check.kind} check on port {check.port} passed"
        )
        return True

    # -- processes ------------------------------------------------------------------------------

    def _run_root(self, tenant: str, name: str) -> Path:
        return self.runs / tenant / name

    def _attempts(self, tenant: str, name: str, generation: int) -> list[Path]:
        root = self._run_root(tenant, name)
        found = (
            [p for p in root.glob(f"g{generation}-*") if p.name.split("-")[-1].isdigit()]
            if root.exists()
            else []
        )
        return sorted(found, key=lambda p: int(p.name.split("-")[-1]))

    def latest_run(self, tenant: str, name: str, generation: int) -> Path | None:
        """The run directory of the newest attempt (its output.log is the workload's log)."""
        return self._latest(tenant, name, generation)

    def _latest(self, tenant: str, name: str, generation: int) -> Path | None:
        attempts = self._attempts(tenant, name, generation)
        return attempts[-1] if attempts else None

    def _start(
        self,
        spec: WorkloadSpec,
        generation: int,
        decision: Decision,
        attempt: int,
        env: dict[str, str],
    ) -> None:
        self._create_instances(decision)
        if decision.mode == "mps" and decision.gpus and self.mps.ensure(decision.gpus[0]):
            self.store.record_event("mps_started", decision.gpus[0], "MPS control daemon started")
        env = {**env, **self._environment(spec, decision)}  # MIG UUIDs exist only once created
        env["GPUFRAC_ATTEMPT"] = str(attempt)
        run_dir = self._run_root(spec.tenant, spec.name) / f"g{generation}-{attempt}"
        launch(
            run_dir,
            spec.command,
            env={**os.environ, **spec.env, **env},
            workdir=spec.workdir,
            user=spec.user,
        )
        self.store.record_event(
            "started", workload_key(spec), f"attempt {attempt} on {_where(decision)}"
        )

    def _stop_runs(self, tenant: str, name: str) -> None:
        root = self._run_root(tenant, name)
        if not root.exists():
            return
        for run_dir in root.iterdir():
            if run_dir.is_dir() and not read_status(run_dir).done:
                stop(run_dir, grace=self.stop_grace)
        shutil.rmtree(root, ignore_errors=True)

    def _create_instances(self, decision: Decision) -> None:
        for action in decision.actions:
            if (
                action.kind != "create_mig_instance"
                or action.mig is None
                or action.gpu_uuid is None
            ):
                continue
            existing = {i.placement for i in self.dev.gpu(action.gpu_uuid).instances}
            if action.mig not in existing:
                self.dev.create_instance(action.gpu_uuid, action.mig.profile, action.mig.start)
                self.store.record_event("mig_created", action.gpu_uuid, f"{action.mig}")

    def _environment(self, spec: WorkloadSpec, decision: Decision) -> dict[str, str]:
        devices = list(decision.gpus)
        if decision.mig is not None and decision.gpus:
            inst = next(
                (
                    i
                    for i in self.dev.gpu(decision.gpus[0]).instances
                    if i.placement == decision.mig
                ),
                None,
            )
            devices = [inst.uuid] if inst is not None and inst.uuid else []
        alloc = self.scheduler.allocations(workload_key(spec))
        visible = ",".join(devices)
        env = {
            "CUDA_VISIBLE_DEVICES": visible,
            "NVIDIA_VISIBLE_DEVICES": visible,
            "GPUFRAC_WORKLOAD": spec.name,
            "GPUFRAC_TENANT": spec.tenant,
            "GPUFRAC_SHARING": decision.mode or "",
            "GPUFRAC_GPU_MEMORY_LIMIT_MIB": str(alloc[0].memory_mib) if alloc else "",
            "GPUFRAC_GPU_UUID": decision.gpus[0] if decision.gpus else "",
            **self.dev.sdk_env,
        }
        qos = qos_params(spec)
        env.update(
            {
                "GPUFRAC_ARBITER": self.arbiter.address,
                "GPUFRAC_QOS_DOMAIN": qos_domain(decision, env),
                "GPUFRAC_QOS_RANK": str(qos.rank),
                "GPUFRAC_QOS_WEIGHT": str(qos.weight),
                "GPUFRAC_QOS_MIN_SHARE_MILLI": str(qos.min_share_milli),
            }
        )
        if decision.mig is not None and decision.gpus:
            inst = next(
                (
                    i
                    for i in self.dev.gpu(decision.gpus[0]).instances
                    if i.placement == decision.mig
                ),
                None,
            )
            if inst is not None:
                env["GPUFRAC_GI_ID"] = str(inst.gi_id)
        if decision.mode == "mps" and decision.gpus and alloc:
            env.update(
                self.mps.client_env(decision.gpus[0], alloc[0].memory_mib, alloc[0].compute_pct)
            )
            env["CUDA_MPS_CLIENT_PRIORITY"] = str(mps_client_priority(spec.qos))
        return env


def _changed(old: dict[str, object], new: dict[str, object]) -> set[str]:
    """Top-level fields that differ between two stored specs."""
    return {k for k in set(old) | set(new) if old.get(k) != new.get(k)}


def _where(d: Decision) -> str:
    if not d.gpus:
        return ""
    return f"{d.mode} on {', '.join(d.gpus)}" + (f" ({d.mig})" if d.mig else "")
