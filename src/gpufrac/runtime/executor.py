"""The part of the agent that carries decisions out: one ``match`` over the closed set of actions.

The scheduler decides (``planning``); the agent's reconcile pass decides when
(``runtime/agent.py``);
this part does it, reading the truth first so that every action is idempotent:

* ``evict`` stops a workload that lost its place; it is marked evicted in its run, so it starts
  again (a new attempt of the same generation) wherever it is placed next, and is not counted as a
  failure (nor as a restart: ``evictions`` counts it);
* ``destroy_mig_instance`` is refused for an instance that a placed workload owns; otherwise it,
  like ``create_mig_instance``, is queued for the GPU's MIG worker (``runtime/mig_worker.py``),
  which carries it out in the background, outside the agent's lock (the driver refuses to destroy an
  instance in use, and an instance already gone, or already there, is left as it is);
* ``start`` starts the next attempt of the workload's current generation, if it is still placed as
  the action says and nothing of it runs;
* ``stop`` stops what runs of a workload, keeping why in its run.

What the MIG worker did is recorded by ``record_mig``: an event per change, and a failed action once
per condition, retried with backoff (``Failures``).

Every displacement is told (``tell``), whoever caused it: an event per workload that lost its place
(``evicted``, ``moved`` or ``requeued``, naming the cause), and one ``displaced`` event on the cause
(and on its deployment, for a replica) listing them. The calls that cause some collect them too
(``displacements``), for their answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import assert_never

from gpufrac.devices.nvml import NvmlDevices
from gpufrac.model.deployment import LABEL
from gpufrac.model.engines import ENGINE_ARGS_ENV
from gpufrac.model.mig import MigPlacement
from gpufrac.model.workload import VolumeMount, WorkloadSpec, spec_from_json
from gpufrac.planning.sched_decision import (
    Completion,
    Decision,
    Displacement,
    DisplacementListeners,
    SchedAction,
    displaced_summary,
    displacements,
)
from gpufrac.planning.scheduler import Scheduler
from gpufrac.runtime.cdi import machine_spec
from gpufrac.runtime.cgroups import HostLimits
from gpufrac.runtime.failures import Failures
from gpufrac.runtime.handover import Handover, base_env, mps_domain
from gpufrac.runtime.mig_worker import MigWorker
from gpufrac.runtime.mps import MpsDaemons, MpsDomain
from gpufrac.runtime.runner import BindMount, ContainerLaunch
from gpufrac.runtime.runs import Runs, read_note, write_note
from gpufrac.runtime.sandbox import Sandbox
from gpufrac.runtime.store import Store

EVICTED = "evicted"  # the key in a run's ``killed`` note that says it was stopped to make room


class ActionRefused(Exception):
    """An action whose precondition does not hold (it would destroy a busy instance, say)."""


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
        mig: MigWorker,
        sandbox: Sandbox,
        mounts: Callable[[tuple[VolumeMount, ...]], tuple[str, ...]] | None = None,
    ) -> None:
        """``mounts``: a container's mounts checked against the operator's allowed paths where
        they lead now (``InputError`` otherwise), their sources as checked: at each start, since a
        path's links can change after apply, and a cluster node's work never went through its
        own apply."""
        self.store = store
        self.dev = dev
        self.scheduler = scheduler
        self.runs = runs
        self.handover = handover
        self.mps = mps
        self.failures = failures
        self.mig = mig
        self.sandbox = sandbox
        self.mounts = mounts or _as_written
        self._listeners = DisplacementListeners()  # the open ``displacements`` blocks

    # -- decisions ------------------------------------------------------------------------------

    def bound_mps(self, domain: MpsDomain, gpu_uuid: str, mig: MigPlacement | None) -> None:
        """The MPS servers of ``domain``'s daemon bounded to the largest limits among its MPS
        workloads, so none lifts its limits (handed in its environment) past them
        (runtime/mps.py). Its workloads are those under MPS on its first GPU ``gpu_uuid`` (in the
        MIG instance ``mig`` shared inside, if any): every MPS workload of a GPU is on the same
        GPUs (the scheduler's ``mps_domain`` rule), so on a domain of several GPUs they are all
        of them."""
        g = self.scheduler.state.by_uuid.get(gpu_uuid)
        allocs = (
            [a for a in g.allocs.values() if a.mode == "mps" and a.mig == mig]
            if g is not None
            else []
        )
        if not allocs:
            return
        pct = (
            None
            if any(a.compute_pct is None for a in allocs)
            else max(a.compute_pct or 0 for a in allocs)
        )
        self.mps.bound(domain, max(a.memory_mib for a in allocs), pct)

    def mps_domains(self) -> dict[str, MpsDomain]:
        """Per GPU UUID, the MPS domain its MPS workloads (outside MIG) are in (read with the
        agent's lock held; their servers, ``MpsDaemons.server_pids``, may be asked after)."""
        st = self.scheduler.state
        return {
            g.uuid: MpsDomain(tuple(st.gpus[i].uuid for i in g.mps_domain))
            for g in st.gpus
            if g.mps_domain
        }

    def mps_servers(self, gpu_uuid: str) -> frozenset[int]:
        """The MPS servers the daemon of the GPU's MPS domain lists (outside MIG): the only ones
        whose NVML reading is taken as their clients' (``GpuState.mps_sm_of``)."""
        domain = self.mps_domains().get(gpu_uuid)
        return frozenset() if domain is None else self.mps.server_pids(domain)

    def _mps_users(self, domain: MpsDomain) -> list[str]:
        """The workloads placed under MPS on exactly ``domain``'s GPUs (none for a MIG device's
        domain, whose workloads are in an instance: its GPU is never under MPS outside MIG)."""
        st = self.scheduler.state
        g = st.by_uuid.get(domain.devices[0])
        if g is None or {st.gpus[i].uuid for i in g.mps_domain} != set(domain.devices):
            return []
        return sorted(a.workload for a in g.allocs.values() if a.mode == "mps" and a.mig is None)

    def _clear_mps(self, domain: MpsDomain) -> None:
        """Stop our other daemons that serve one of ``domain``'s devices (a device is served by
        one daemon at most): idle ones, which the idle pass has not stopped yet. One still in use
        is a conflict the scheduler's rule rules out: refused, naming it."""
        for other in self.mps.serving(domain):
            users = self._mps_users(other)
            if users:
                raise ActionRefused(
                    f"the MPS daemon of {other.describe()} serves a device of "
                    f"{domain.describe()} and is in use by {', '.join(users)}"
                )
            self.mps.stop(other)
            self.store.record_event(
                "mps_stopped",
                other.devices[0],
                f"MPS control daemon of {other.describe()} stopped: its devices go to the "
                f"daemon of {domain.describe()}",
            )

    def record(self, decisions: Sequence[Decision]) -> list[Displacement]:
        """Store each decision with its workload's generation, carry out its evictions now and
        queue its MIG changes at once: the scheduler counts on them from this moment, so they are
        made even if the workload goes before it starts (its instance is then simply free). Every
        workload the decisions displaced is told (``tell``); returns them."""
        running: dict[str, bool] = {}  # evicted -> whether a process of it was stopped
        for d in decisions:
            for action in d.actions:
                match action.kind:
                    case "evict":
                        running[action.workload] = self.evict(action.workload, action.reason)
                    case "destroy_mig_instance" | "create_mig_instance":
                        self.carry_out(action)
                    case "start" | "stop":
                        pass  # the reconcile pass's, when it gets to the workload
                    case _:
                        assert_never(action.kind)
            tenant, name = d.workload.split("/", 1)
            stored = self.store.workload(tenant, name)
            if stored is None:
                continue
            self.store.set_placement(tenant, name, stored.generation, d)
            self.store.record_event(
                d.outcome,
                d.workload,
                d.reason or where(d),
                self.details(d.workload, d),
                cause=d.cause,
            )
        told = displacements(decisions, lambda v: running.get(v, False))
        self.tell(told)
        return told

    def tell(self, told: Sequence[Displacement]) -> None:
        """Record the displacements' events (``record_displaced``); each open ``displacements``
        block gets them too."""
        record_displaced(self.store, told, self.scheduler.spec)
        self._listeners.heard(told)

    def displacements(self) -> contextlib.AbstractContextManager[list[Displacement]]:
        """The displacements told while the block runs (for the answer of the call that caused
        them); call with the agent's lock held, so another thread's are not among them."""
        return self._listeners.collecting()

    # -- one action -----------------------------------------------------------------------------

    def carry_out(self, action: SchedAction) -> None:
        """Carry out one action; raises ``DeviceError`` or ``ActionRefused`` if it cannot be."""
        match action.kind:
            case "evict":
                self.evict(action.workload, action.reason)
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

    def evict(self, workload: str, reason: str) -> bool:
        """Stop what runs of ``workload``, marked evicted (its next attempt is no restart); whether
        a process of it was stopped. The caller tells of it (``tell``)."""
        tenant, name = workload.split("/", 1)
        stored = self.store.workload(tenant, name)
        if stored is None:
            return False
        for run in self.runs.attempts(tenant, name, stored.generation):
            if not self.runs.status(run).done:
                write_note(run, "killed", {"reason": reason, EVICTED: True})
        return self.runs.stop_live(tenant, name)

    def _stop(self, a: SchedAction) -> None:
        tenant, name = a.workload.split("/", 1)
        if self.runs.stop_live(tenant, name, a.reason):
            self.store.record_event("stopped", a.workload, a.reason or "stopped")

    def _destroy(self, a: SchedAction) -> None:
        assert a.gpu_uuid is not None and a.mig is not None
        g = self.scheduler.state.by_uuid.get(a.gpu_uuid)
        owner = None if g is None else g.instances.get(a.mig)
        if g is not None and g.holders(a.mig):  # its owner, or every share of it
            owner = ", ".join(sorted(g.holders(a.mig)))
        if owner is not None:
            raise ActionRefused(f"{a.mig} belongs to {owner}; it is not destroyed")
        self.mig.submit(a)

    def _create(self, a: SchedAction) -> None:
        assert a.gpu_uuid is not None and a.mig is not None
        self.mig.submit(a)

    def _start(self, a: SchedAction) -> None:
        tenant, name = a.workload.split("/", 1)
        stored = self.store.workload(tenant, name)
        placed = self.store.placement(tenant, name)
        if stored is None or placed is None or placed.generation != stored.generation:
            return  # deleted or changed since the pass decided: the next pass decides again
        decision = placed.record
        match decision:
            case Decision(outcome="placed"):
                pass
            case Decision() | Completion():
                return  # it waits, or is done, since the pass decided
            case _:
                assert_never(decision)
        if decision.gpus[:1] != (a.gpu_uuid,) or decision.mig != a.mig:
            return  # placed elsewhere since
        attempts = self.runs.attempts(tenant, name, stored.generation)
        if attempts and self.runs.live(attempts[-1]):
            return  # one runs already (or is on its way): never twice
        devices = list(decision.gpus)
        if decision.mig is not None:
            inst = self.dev.gpu(decision.gpus[0]).instance_at(decision.mig)
            # a GPU instance gets its device (and UUID) with its compute instance, a step later:
            # started before that, the workload would be handed no device at all
            if inst is None or not inst.uuid:
                raise ActionRefused(f"its MIG instance {decision.mig} is not there (yet)")
            devices = [inst.uuid]  # MPS inside a MIG instance: the instance's own daemon
        domain = mps_domain(decision, devices)  # whose MPS daemon, under MPS
        spec = spec_from_json(stored.spec)
        if decision.mode == "mps" and domain is not None:
            if self.mps.enabled:
                self._clear_mps(domain)
            if self.mps.ensure(domain) == "started":  # not for each workload that joins it
                serving = "" if len(domain.devices) == 1 else f", serving {domain.describe()}"
                self.store.record_event(
                    "mps_started", domain.devices[0], f"MPS control daemon started{serving}"
                )
            self.bound_mps(domain, decision.gpus[0], decision.mig)
        attempt = len(attempts) + 1
        allocs = self.scheduler.allocations(a.workload)
        handed = self.handover.grant(spec, decision, allocs)
        grant = replace(handed, env={**handed.env, "GPUFRAC_ATTEMPT": str(attempt)})
        told = self.handover.engine(spec, decision, allocs)
        command = spec.command if told is None else told.command
        # the engine's environment where the manifest does not say otherwise; its flags always
        engine_env = {} if told is None else dict(told.env)
        engine_flags = {k: engine_env.pop(k) for k in [ENGINE_ARGS_ENV] if k in engine_env}
        env = {**engine_env, **spec.env, **grant.env, **engine_flags}
        who = self.sandbox.identity(tenant, spec.user)
        limits = HostLimits(
            memory_bytes=None if spec.host_memory_mib is None else spec.host_memory_mib * 2**20,
            milli_cpus=spec.cpus_milli,
            pids=spec.pids,
        )
        if spec.image is None:
            self.runs.launch(
                tenant,
                name,
                stored.generation,
                attempt,
                command,
                env={**base_env(), **who.env, **env},
                workdir=spec.workdir or who.workdir,
                user=who.user,
                group=who.group,
                view=who.view,
                limits=limits,
                grant=grant,
            )
        else:
            # the container's own environment (none of the agent's), listening on every address
            # of its own network namespace: its ports are published at the agent's
            inside = {**env, "GPUFRAC_HOST": "0.0.0.0"}
            sources = self.mounts(spec.mounts)  # where they lead now, within the allowed paths
            self.refresh_cdi()  # its device by the name the device layer gives it now
            self.runs.launch(
                tenant,
                name,
                stored.generation,
                attempt,
                command,
                env=inside,
                workdir=spec.workdir,
                user=who.user,
                group=who.group,
                limits=limits,
                grant=replace(grant, env=inside),
                container=ContainerLaunch(
                    spec.image,
                    inside,
                    tuple(
                        BindMount(Path(source), m.target, m.read_only)
                        for source, m in zip(sources, spec.mounts, strict=True)
                    ),
                    published_ports(spec),
                    self.handover.listen_host,
                ),
            )
        for warning in () if told is None or attempt > 1 else told.warnings:
            self.store.record_event("engine_warning", a.workload, warning)  # once a generation
        if attempt == 1:
            self.store.record_event(
                "started",
                a.workload,
                f"attempt 1 on {where(decision)}",
                self.details(a.workload, decision),
            )
        else:
            last = self.runs.status(attempts[-1])
            killed = read_note(attempts[-1], "killed")
            after = "eviction" if killed.get(EVICTED) else last.ended_by()
            self.store.record_event(
                "restarted",
                a.workload,
                f"attempt {attempt} on {where(decision)} after {after}",
                self.details(a.workload, decision),
            )

    # -- MIG changes ------------------------------------------------------------------------------

    def mig_needed(self, decision: Decision) -> tuple[SchedAction, ...]:
        """The MIG actions of a placement that the device does not show done yet; and the instance
        the workload was given, whatever the decision says, if the device does not have it."""
        todo = []
        gpu = self.dev.gpu(decision.gpus[0]) if decision.gpus else None
        for a in decision.mig_actions():
            assert a.gpu_uuid is not None and a.mig is not None
            present = self.dev.gpu(a.gpu_uuid).instance_at(a.mig) is not None
            if (a.mig_change == "destroy") == present:
                todo.append(a)
        if (
            gpu is not None
            and decision.mig is not None
            and gpu.instance_at(decision.mig) is None
            and not any(a.mig_change == "create" for a in todo)
        ):
            todo.append(
                SchedAction("create_mig_instance", decision.workload, gpu.uuid, decision.mig)
            )
        return tuple(todo)

    def refresh_cdi(self, *, create: bool = True) -> bool:
        """gpufrac's CDI spec rewritten from the devices as they are now, where it changed
        (``create=False``: only where containers use it already); True if it was written."""
        return self.runs.refresh_cdi(
            machine_spec(self.dev, self.runs.containers.cdi_kind), create=create
        )

    def record_mig(self) -> None:
        """Record what the MIG worker did since the last pass; after a change, gpufrac's CDI spec
        names the instances as they are now (before any start)."""
        changed = False
        for o in self.mig.take():
            a, what = o.action, o.action.describe()
            if o.error is not None:
                self.failures.failed(o.workload, what, o.error)
                continue
            self.failures.succeeded(o.workload, what)
            if o.changed and a.gpu_uuid is not None:
                match a.mig_change:
                    case "destroy":
                        verb, why = "mig_destroyed", "re-cut for"
                    case "create":
                        verb, why = "mig_created", "for"
                    case None:
                        continue  # no MIG change: the worker is handed none
                    case _:
                        assert_never(a.mig_change)
                changed = True
                self.store.record_event(
                    verb,
                    a.gpu_uuid,
                    f"{a.mig} ({why} {o.workload})",
                    {**self.details(o.workload, None, a.gpu_uuid), "mig": str(a.mig)},
                )
        if changed:
            self.refresh_cdi(create=False)

    def details(
        self, workload: str, d: Decision | None, gpu_uuid: str | None = None
    ) -> dict[str, object]:
        """What the decision log adds to an event about ``workload``: where it is (GPU indexes
        and UUIDs, mode, MIG placement) and whom it evicted."""
        uuids = d.gpus if d is not None else (gpu_uuid,) if gpu_uuid else ()
        index = {g.uuid: g.index for g in self.scheduler.state.gpus}
        out: dict[str, object] = {"workload": workload}
        if uuids:
            out["gpu"] = ",".join(str(index.get(u, "")) for u in uuids)
            out["UUID"] = ",".join(uuids)
        if d is not None:
            out.update(mode=d.mode, mig=str(d.mig) if d.mig else None)
            if d.evicted:
                out["evicted"] = list(d.evicted)
        return out


def record_displaced(
    store: Store, told: Sequence[Displacement], spec_of: Callable[[str], WorkloadSpec | None]
) -> None:
    """An event per displaced workload (its kind the displacement's action, its message the reason,
    its cause the workload that took its place), then, per cause, one ``displaced`` event on the
    cause listing them, and on its deployment too for a replica (``describe deployment`` shows
    it). Every workload is named in full: readers are shown what they may see (``api.seen_by``)."""
    by_cause: dict[str, list[Displacement]] = {}
    for x in told:
        said = {"workload": x.workload, "cause": x.cause}
        store.record_event(x.action, x.workload, x.reason, said, cause=x.cause)
        if x.cause is not None:
            by_cause.setdefault(x.cause, []).append(x)
    for cause, theirs in by_cause.items():
        victims = tuple(x.workload for x in theirs)
        summary = displaced_summary(theirs)
        details = {"workload": cause, "displaced": list(victims)}
        store.record_event("displaced", cause, summary, details, mentions=victims)
        spec = spec_of(cause)
        deployment = spec.labels.get(LABEL) if spec is not None else None
        if spec is not None and deployment:
            store.record_event(
                "displaced",
                f"{spec.tenant}/{deployment}",
                f"its replica {cause}: {summary}",
                details,
                cause=cause,
                mentions=victims,
            )


def published_ports(spec: WorkloadSpec) -> tuple[int, ...]:
    """The ports a container workload is reached at: its health check's, and a replica's
    ``PORT`` (where the gateway sends its requests)."""
    ports = [spec.health.port] if spec.health is not None else []
    port = spec.env.get("PORT", "")
    if port.isascii() and port.isdigit() and 0 < int(port) < 65536:
        ports.append(int(port))
    return tuple(dict.fromkeys(ports))


def where(d: Decision) -> str:
    if not d.gpus:
        return ""
    return f"{d.mode} on {', '.join(d.gpus)}" + (f" ({d.mig})" if d.mig else "")


def _as_written(mounts: tuple[VolumeMount, ...]) -> tuple[str, ...]:
    return tuple(m.source for m in mounts)
