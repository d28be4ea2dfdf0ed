"""One machine's agent as the user API serves it: the agent behind its lock, with a background
thread running its reconcile passes (and, after each, whatever follows them: the deployments); its
health; and the views and calls of the API's ``ControlService`` (``api.control_service``), answered
from the agent's parts so that the API never reaches into them."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import anyio

from gpufrac import __version__
from gpufrac.errors import Refused, Unsupported
from gpufrac.model.caller import Caller
from gpufrac.model.deployment import DeploymentSpec
from gpufrac.model.event import Event
from gpufrac.model.mig import MigPlacement
from gpufrac.model.migplan import MigAction
from gpufrac.model.workload import WorkloadSpec, spec_from_json
from gpufrac.planning.sched_decision import (
    Decision,
    Displacement,
    StoredPlacement,
    gpus_of,
    workload_key,
)
from gpufrac.planning.views import (
    ApplyResult,
    Capability,
    LogTail,
    NodeInfo,
    Role,
    ServiceHealth,
    Verdict,
    WorkloadView,
)
from gpufrac.runtime.agent import Agent, WorkloadState
from gpufrac.runtime.caps import check_workload_caps
from gpufrac.runtime.fleet_view import read_fleet
from gpufrac.runtime.history import AgentSampler, History, Reading
from gpufrac.runtime.log_tail import LogReads, read_tail
from gpufrac.runtime.metrics import AgentCollector
from gpufrac.runtime.mig_apply import ApplyRefused
from gpufrac.runtime.qos_view import Readings, workload_qos
from gpufrac.runtime.store import StoredWorkload

RECONCILE_SECONDS = 0.5
STALLED_SECONDS = 30.0  # no pass finished for this long: the agent says it is degraded
MIN_GAP_SECONDS = 0.1  # a burst of API calls wakes one pass, not one per call
LAST_LINE_BYTES = 64 * 1024  # how much of a log's end is read for its last line


class PassFollower(Protocol):
    """What follows each reconcile pass, under the agent's lock (one machine's deployments:
    ``serving.agent_deployments.AgentDeployments``)."""

    def reconcile(self, states: Mapping[str, WorkloadState]) -> None: ...

    def samples(self, states: Mapping[str, WorkloadState]) -> list[Reading]:
        """Its tracks of the dashboard's plots."""
        ...

    def close(self) -> None: ...


class AgentService:
    """The agent behind a lock, with a background thread reconciling it."""

    role: Role = "agent"
    # Ray leases are a cluster's (gpufrac.ray talks to a control plane)
    capabilities: frozenset[Capability] = frozenset({"mig-layouts", "deployments", "clear-unknown"})

    def __init__(self, agent: Agent, *, interval: float = RECONCILE_SECONDS) -> None:
        self.agent = agent
        self.lock = agent.lock  # the agent's own: its reconcile pass releases it for device calls
        self.settings = agent.settings
        self.interval = interval
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.states: dict[str, WorkloadState] = {}
        self.followers: list[PassFollower] = []
        self.last_pass = time.monotonic()  # when a reconcile pass last finished
        agent.mig.notify = self.wake  # a MIG instance made: the workload waiting for it starts now
        self.log_reads = LogReads(agent.settings)  # the bounds on reading workloads' logs
        self._log_threads = anyio.CapacityLimiter(agent.settings.log_relay_per_node)
        # the last 15 minutes for the dashboard's plots (GET /api/v1/history)
        self.history = History(AgentSampler(agent, lambda: self.states, self._samples).read)

    def follow(self, follower: PassFollower) -> None:
        """Run ``follower`` after each pass from now on (and close it with the service)."""
        self.followers.append(follower)

    def _samples(self, states: Mapping[str, WorkloadState]) -> list[Reading]:
        return [r for f in self.followers for r in f.samples(states)]

    # -- the loop --------------------------------------------------------------------------------

    def reconcile(self) -> None:
        states = {s.key: s for s in self.agent.reconcile()}
        with self.lock:
            self.states = states
            for follower in self.followers:
                follower.reconcile(self.states)
        self.last_pass = time.monotonic()

    def health(self) -> ServiceHealth:
        """Whether the agent is doing its work, and if not, why: the agent's own steps that keep
        failing (a reconcile pass, writing the store, watching GPUs) and a loop that stopped making
        passes. Read without the agent's lock, so it answers even when the agent is stuck."""
        problems = [
            f"{f.what} failed: {f.error} ({f.count} {'tries' if f.count > 1 else 'try'})"
            for f in self.agent.failures.of("agent")
        ]
        age = time.monotonic() - self.last_pass
        if self._thread is not None and age > STALLED_SECONDS:
            problems.append(f"no reconcile pass has finished for {age:.0f}s")
        return ServiceHealth(
            status="degraded" if problems else "ok", problems=problems, nodes=1, nodes_alive=1
        )

    def start(self) -> None:
        self.reconcile()
        self._thread = threading.Thread(target=self._loop, name="gpufrac-reconcile", daemon=True)
        self._thread.start()
        self.history.start()

    def wake(self) -> None:
        """Run the next reconcile pass now rather than at the next tick."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            if self._stop.wait(MIN_GAP_SECONDS):
                return
            self._wake.clear()
            try:
                self.reconcile()
            except Exception as e:  # one bad pass must not stop the loop; it is recorded once
                with contextlib.suppress(Exception), self.lock:
                    self.agent.failures.failed("agent", "reconcile pass", e)
            else:
                with contextlib.suppress(Exception), self.lock:
                    self.agent.failures.succeeded("agent", "reconcile pass")

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.history.stop()
        for follower in self.followers:
            follower.close()

    def collector(self) -> AgentCollector:
        return AgentCollector(self.agent, lambda: self.states)

    def relayed(self) -> None:
        return None  # one machine: its own series only

    # -- desired state ---------------------------------------------------------------------------

    def check_room(
        self, specs: Sequence[WorkloadSpec], deployments: Sequence[DeploymentSpec]
    ) -> None:
        check_workload_caps(self.agent.store, self.agent.settings, specs, deployments)

    def check_workload(self, spec: WorkloadSpec) -> None:
        self.agent.check_workload(spec)

    def stored_spec(self, tenant: str, name: str) -> dict[str, Any] | None:
        stored = self.agent.store.workload(tenant, name)
        return None if stored is None else stored.spec

    def apply_workload(self, spec: WorkloadSpec) -> tuple[ApplyResult, Decision | None]:
        return self.agent.apply_workload(spec)

    def apply_new_workloads(
        self, specs: Sequence[WorkloadSpec]
    ) -> list[tuple[ApplyResult, Decision | None]]:
        decided: dict[str, Decision] = {}
        for d in self.agent.apply_new_workloads(specs):
            decided.setdefault(d.workload, d)  # its own first, as apply_workload answers
        out: list[tuple[ApplyResult, Decision | None]] = []
        for spec in specs:
            got = decided.get(workload_key(spec))
            refused = got is not None and got.outcome == "refused"
            out.append(("refused" if refused else "created", got))
        return out

    def warnings(self, spec: WorkloadSpec, decision: Decision | None) -> list[str]:
        return self.agent.warnings(spec, decision)

    def refusal(self, spec: WorkloadSpec) -> str | None:
        return self.agent.scheduler.refusal(spec)

    def displacements(self) -> AbstractContextManager[list[Displacement]]:
        return self.agent.displacements()

    def delete_workload(self, tenant: str, name: str) -> bool:
        with self.lock:
            return self.agent.delete(tenant, name)

    def clear_unknown(self, tenant: str, name: str) -> bool | None:
        return self.agent.clear_unknown(tenant, name)

    def keep_alive(self, tenant: str, name: str) -> bool:
        raise Unsupported("ray-leases", "one machine's agent keeps no Ray lease")

    # -- views -----------------------------------------------------------------------------------

    def workloads(self) -> list[WorkloadView]:
        with self.lock:
            readings = Readings(self.agent)  # each GPU read once for the whole list
            return [self._view(w, readings) for w in self.agent.store.workloads()]

    def workload(self, tenant: str, name: str) -> WorkloadView | None:
        with self.lock:
            stored = self.agent.store.workload(tenant, name)
            return None if stored is None else self._view(stored, None)

    def _view(self, stored: StoredWorkload, readings: Readings | None) -> WorkloadView:
        state = self.states.get(stored.key)
        record = self._placement(stored)
        # where it runs, or where a finished one ran: this machine, the agent's node
        ran_here = record is not None and bool(gpus_of(record.record))
        return WorkloadView(
            tenant=stored.tenant,
            name=stored.name,
            generation=stored.generation,
            spec=stored.spec,
            phase=state.phase if state else "pending",
            reason=state.reason if state else "",
            cause=state.cause if state else None,
            attempts=state.attempts if state else 0,
            restarts=state.restarts if state else 0,
            evictions=state.evictions if state else 0,
            exit_code=state.exit_code if state else None,
            env=state.env if state else {},
            node=self.agent.node if ran_here else None,
            placement=record,
            qos=workload_qos(
                self.agent,
                spec_from_json(stored.spec),
                state.decision if state else None,
                self.agent.arbiter.latest,  # read by the last reconcile pass
                readings,
                state,
            ),
        )

    def _placement(self, stored: StoredWorkload) -> StoredPlacement | None:
        """The stored record of where it is placed, or how it completed and where it ran."""
        return self.agent.store.placement(stored.tenant, stored.name)

    def events(
        self,
        subject: str | None = None,
        *,
        limit: int = 100,
        tenant: str | None = None,
        after: int | None = None,
    ) -> list[Event]:
        with self.lock:
            return self.agent.store.events(subject, limit=limit, tenant=tenant, after=after)

    async def log_tail(self, tenant: str, name: str, tail: int) -> LogTail | None:
        """Read in a thread of its own (at most ``log_relay_per_node`` of them, never the API's
        pool): the lock to find the newest run, then its log from the end, at most
        ``log_relay_max`` of it. Over ``log_relay_per_tenant`` or ``log_relay_per_node`` reads
        under way: ``Busy``, at once."""
        bounds = self.log_reads
        with bounds.per_tenant.taken(tenant), bounds.per_node.taken(self.agent.node):
            return await anyio.to_thread.run_sync(
                self._read_log, tenant, name, tail, limiter=self._log_threads
            )

    def _read_log(self, tenant: str, name: str, tail: int) -> LogTail | None:
        with self.lock:
            found = self.agent.newest_log(tenant, name)
        if found is None:
            return None
        run, path = found
        if path is None:
            return LogTail(run=None)
        lines, truncated = read_tail(path, tail=tail, max_bytes=self.log_reads.max_bytes)
        return LogTail(run=run, lines=lines, truncated=truncated)

    def last_line(self, tenant: str, name: str) -> str | None:
        """The last line a workload's newest run wrote (its traceback's last line, say)."""
        stored = self.agent.store.workload(tenant, name)
        log = self.agent.latest_log(tenant, name, stored.generation) if stored else None
        return _last_line(log)

    def gpus(self, who: Caller) -> list[dict[str, Any]]:
        with self.lock:
            return read_fleet(self.agent, self.states, who)

    def judge_node(self, name: str, verdict: Verdict, gpus: int | None) -> NodeInfo | None:
        raise Unsupported("node-admission", "one machine's agent admits no nodes")

    def nodes(self) -> list[NodeInfo]:
        """This machine: the agent is its own node, alive while it answers."""
        agent = self.agent
        return [
            NodeInfo(
                name=agent.node,
                state="alive",
                labels=dict(agent.settings.node_labels),
                gpus=len(agent.scheduler.state.gpus),
                version=__version__,
            )
        ]

    # -- GPUs ------------------------------------------------------------------------------------

    def gpu_named(self, gpu: str) -> str | None:
        """An index or UUID, or (as a cluster names them) this node's ``NODE/INDEX`` or
        ``NODE/UUID``."""
        node, sep, rest = gpu.partition("/")
        if sep:
            if node != self.agent.node:
                return None
            gpu = rest
        for g in self.agent.scheduler.state.gpus:
            if gpu in (g.uuid, str(g.index)):
                return g.uuid
        return None

    def cordon(self, uuid: str) -> None:
        with self.lock:
            self.agent.cordon(uuid)

    def uncordon(self, uuid: str) -> list[Decision]:
        with self.lock:
            return self.agent.uncordon(uuid)

    def drain(self, uuid: str) -> list[Decision]:
        with self.lock:
            return self.agent.drain(uuid)

    def set_mig_layout(
        self,
        uuid: str,
        mig_enabled: bool,
        layout: list[MigPlacement],
        *,
        drain: bool,
        allow_mode_change: bool,
        pin: bool,
        dry_run: bool,
    ) -> tuple[list[MigAction], bool]:
        with self.lock:
            try:
                done = self.agent.set_mig_layout(
                    uuid,
                    mig_enabled,
                    layout,
                    drain=drain,
                    allow_mode_change=allow_mode_change,
                    pin=pin,
                    dry_run=dry_run,
                )
            except ApplyRefused as e:
                raise Refused(str(e)) from None
            return done, uuid in self.agent.store.mig_pins()

    def release_mig_pin(self, uuid: str) -> list[Decision]:
        with self.lock:
            return self.agent.release_mig(uuid)


def _last_line(log: Path | None) -> str | None:
    lines = read_tail(log, tail=0, max_bytes=LAST_LINE_BYTES)[0] if log else []
    last = next((line.strip() for line in reversed(lines) if line.strip()), None)
    return None if last is None else last[-300:]
