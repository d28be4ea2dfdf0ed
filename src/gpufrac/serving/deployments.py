"""Deployments under the agent: replicas as workloads, the gateway kept in step, the autoscaler run.

Every reconcile pass, for each deployment: the replica count wanted (fixed ``replicas``, a
``scale``, or the autoscaler's), replica workloads of the current template created up to it (each a
service with its own ``$PORT`` and a readiness check, placed by the scheduler like any workload),
ready replicas given to the gateway, and replicas that should go (surplus, or of an old template
once enough new ones are ready) taken out of the gateway first and deleted only once the gateway has
no request left on them. So a rolling update starts new replicas before old ones drain, and scaling
down loses no request.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import secrets
import socket
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpufrac.config import DEFAULT_GATEWAY_PORT
from gpufrac.errors import InputError
from gpufrac.model.deployment import (
    LABEL,
    REPLICA_KEY_ENV,
    TEMPLATE_LABEL,
    DeploymentSpec,
    deployment_from_json,
    deployment_to_json,
)
from gpufrac.model.numbers import digits_or_none
from gpufrac.model.workload import WorkloadSpec, spec_from_json
from gpufrac.runtime.child_link import ChildLink, ChildRefused
from gpufrac.runtime.history import Reading, deployment_readings
from gpufrac.serving.autoscaler import (
    BOOST,
    SCALE_DIRECTIONS,
    ScaleDirection,
    ScaleState,
    decide,
    directions,
)

if TYPE_CHECKING:
    from gpufrac.model.settings import OperatorSettings
    from gpufrac.planning.moves import Move
    from gpufrac.planning.sched_decision import Decision
    from gpufrac.runtime.agent import Agent
    from gpufrac.runtime.failures import Failures
    from gpufrac.runtime.store import Store

REPLICA_PORTS = (20000, 32768)  # below the ephemeral range


@dataclass(frozen=True, slots=True)
class ReplicaView:
    name: str
    template: str
    port: int
    phase: str
    ready: bool
    draining: bool
    host: str = "127.0.0.1"  # where the replica listens (its node's address on a cluster)
    node: str | None = None  # the node it is placed on (on a cluster)


class ReplicaState(Protocol):
    """What a replica is doing, as its host sees it (a ``WorkloadState`` on one machine)."""

    @property
    def phase(self) -> str: ...

    @property
    def decision(self) -> Decision | None: ...


REPLICA_PORT_CHECKED = REPLICA_PORTS[0]  # a port of the range replicas get, for apply's checks


class ServingHost(Protocol):
    """Whoever runs a deployment's replicas, seen narrowly: one machine's agent
    (``AgentServing``), or a cluster's control plane, which places them over its nodes."""

    @property
    def settings(self) -> OperatorSettings: ...

    @property
    def store(self) -> Store: ...

    @property
    def data_dir(self) -> Path: ...

    @property
    def failures(self) -> Failures: ...

    def check_workload(self, spec: WorkloadSpec) -> None:
        """``InputError`` where a replica would break an operator's bound or cannot run as
        written (its priority, user, mounts, image): before anything is stored."""

    def apply_workload(self, spec: WorkloadSpec) -> object: ...

    def apply_replicas(self, specs: Sequence[WorkloadSpec]) -> object:
        """Apply new replicas that start together (placed together where the host can)."""

    def delete(self, tenant: str, name: str) -> object: ...

    def note_busy(self, key: str) -> None:
        """Requests are in flight on the workload ``key``: it is busy on its GPU."""

    def shares_a_gpu(self, keys: Collection[str]) -> bool:
        """Does any of these workloads share its GPU (or MIG instance) with a workload not among
        them?"""

    def gpu_busy(self, key: str, st: ReplicaState) -> float | None:
        """The workload's SM use (0..1) where it is known per process, else None."""

    def where(self, key: str) -> tuple[str, str | None]:
        """The address the workload listens at for the gateway, and its node (None on one
        machine)."""

    def moving(self) -> Mapping[str, Move]:
        """The replicas the scheduler moves to make room (``Scheduler.moving``): each is
        replaced by a new replica first, and drained once that one serves."""


class AgentServing:
    """One machine's agent as a ``ServingHost``."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.settings = agent.settings
        self.store = agent.store
        self.data_dir = agent.data_dir
        self.failures = agent.failures

    def check_workload(self, spec: WorkloadSpec) -> None:
        self.agent.check_workload(spec)

    def apply_workload(self, spec: WorkloadSpec) -> object:
        return self.agent.apply_workload(spec)

    def apply_replicas(self, specs: Sequence[WorkloadSpec]) -> object:
        """New replicas are scheduled together (``Agent.apply_new_workloads``: small ones may share
        a new MIG instance); one whose name is stored already (an old template's) is replaced as
        ``apply_workload`` replaces it."""
        stored = [s for s in specs if self.agent.store.workload(s.tenant, s.name) is not None]
        for spec in stored:
            self.agent.apply_workload(spec)
        return self.agent.apply_new_workloads([s for s in specs if s not in stored])

    def delete(self, tenant: str, name: str) -> object:
        return self.agent.delete(tenant, name)

    def note_busy(self, key: str) -> None:
        self.agent.note_busy(key)

    def shares_a_gpu(self, keys: Collection[str]) -> bool:
        members = self.agent.arbiter.latest  # read by this pass's agent reconcile
        domains = {m["domain"] for key, m in members.items() if key in keys}
        return any(m["domain"] in domains and key not in keys for key, m in members.items())

    def gpu_busy(self, key: str, st: ReplicaState) -> float | None:
        dec = st.decision
        if dec is None or dec.mode != "timeslice" or not dec.gpus or dec.mig:
            return None
        tenant, name = key.split("/", 1)
        use = self.agent.memory_use(tenant, name)
        by_pid = self.agent.health.process_utilization(dec.gpus[0])
        if use is None or not by_pid:
            return None
        return min(1.0, sum(by_pid.get(p, 0) for p in use.pids) / 100)

    def where(self, key: str) -> tuple[str, str | None]:
        return "127.0.0.1", None

    def moving(self) -> Mapping[str, Move]:
        with self.agent.lock:
            return self.agent.scheduler.moving


class Deployments:
    def __init__(
        self,
        runner: ServingHost,
        *,
        gateway_port: int = DEFAULT_GATEWAY_PORT,
        host: str = "127.0.0.1",
        tokens: dict[str, str | None] | None = None,
        url_host: str | None = None,
    ) -> None:
        """``tokens``: each API token's tenant (None for the admin's), or None without tokens;
        ``url_host``: the name clients reach the gateway by, where ``host`` is every address."""
        self.runner = runner
        self.url_host = url_host
        self.gateway_port, self.host = gateway_port, host
        self.tokens = (
            None
            if tokens is None
            else {
                hashlib.sha256(t.encode()).hexdigest(): tenant or "" for t, tenant in tokens.items()
            }
        )
        self.gateway = ChildLink(
            "request gateway", "gpufrac.serving.gateway", runner.data_dir / "gateway.log"
        )
        self.scaling: dict[str, ScaleState] = {}
        self.draining: dict[str, float] = {}  # replica key -> since
        self.traffic: dict[str, Any] = {}  # the gateway's last reading, per deployment
        # the gateway's refusals of requests that named none of its deployments, by status code
        self.refused: dict[str, int] = {}
        # per deployment key, for /metrics: the autoscaler's decisions so far (up, down, boost,
        # unboost), and the replicas wanted, ready (serving) and draining after the last pass
        self.scale_counts: dict[str, dict[ScaleDirection, int]] = {}
        self.replica_counts: dict[str, tuple[int, int, int]] = {}
        self.moves_done: dict[str, int] = {}  # per deployment key: replicas moved (drained)
        self._sent: dict[str, str] = {}
        self._settled = False  # the running gateway was told "G" (every deployment was sent)
        # replicas being moved, as last told (events once): key -> (its deployment's key, move)
        self._moving: dict[str, tuple[str, Move]] = {}
        # during a reconcile pass: every deployment's replicas and the ports taken, read once
        self._index: dict[tuple[str, str], list[WorkloadSpec]] | None = None
        self._ports: set[int] | None = None

    # -- desired state --------------------------------------------------------------------------

    def check(self, spec: DeploymentSpec) -> None:
        """Its replicas will be workloads of its tenant: the same bounds (``InputError``), checked
        before anything of a manifest is stored."""
        try:
            # a replica's port is the gateway's to give (from REPLICA_PORTS)
            self.runner.check_workload(spec.replica_spec(0, REPLICA_PORT_CHECKED))
        except InputError as e:
            raise InputError(
                e.message, field=(e.field or "").replace("spec.", "spec.template.", 1), fix=e.fix
            ) from None

    def apply_deployment(self, spec: DeploymentSpec) -> str:
        self.check(spec)
        before = self.runner.store.deployment(spec.tenant, spec.name)
        changed = self.runner.store.put_deployment(
            spec.tenant,
            spec.name,
            deployment_to_json(spec),
            reset_replicas=before is not None
            and spec.autoscale is None
            and before.get("replicas") != spec.replicas,
        )
        if not changed:
            return "unchanged"
        return "created" if before is None else "updated"

    def delete(self, tenant: str, name: str) -> bool:
        if not self.runner.store.delete_deployment(tenant, name):
            return False
        for w in self._replicas(tenant, name):
            self.runner.delete(w.tenant, w.name)
        self._configure_gone(f"{tenant}/{name}")
        return True

    def scale(self, tenant: str, name: str, replicas: int) -> bool:
        if not any((t, n) == (tenant, name) for t, n, _, _ in self.runner.store.deployments()):
            return False
        self.runner.store.set_deployment_replicas(tenant, name, replicas, "set by gpufrac scale")
        return True

    def specs(self) -> list[tuple[DeploymentSpec, int | None]]:
        return [(deployment_from_json(s), r) for _, _, s, r in self.runner.store.deployments()]

    def samples(self, states: Mapping[str, ReplicaState]) -> list[Reading]:
        """Per deployment, for the dashboard's plots: the gateway's traffic, the replicas wanted
        and ready (call it under the host's lock)."""
        out = []
        with self.batch():
            specs = [(d, scaled, self.views(d, states)) for d, scaled in self.specs()]
        for d, scaled, views in specs:
            ready = sum(1 for r in views if r.ready and not r.draining)
            traffic = self.traffic.get(route_name_of(d.tenant, d.name), {})
            wanted = next(
                n
                for n in (scaled, d.replicas, sum(1 for r in views if not r.draining))
                if n is not None
            )  # the autoscaler's choice is the replicas it keeps (not draining)
            out.append((d.tenant, d.name, wanted, dict(traffic), ready))
        return deployment_readings(out)

    @property
    def gateway_url(self) -> str:
        """Where clients reach the gateway: its address, or, listening on every address, the one
        it was told it is known by (``url_host``), else this machine's loopback."""
        host = self.url_host or ("127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host)
        return f"http://{host}:{self.gateway_port}"

    # -- reconcile ------------------------------------------------------------------------------

    def reconcile(self, states: Mapping[str, ReplicaState]) -> None:
        deployments = self.specs()
        if not deployments and not self.gateway.running:
            return
        with self.batch():
            self._reconcile_all(deployments, states)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Within it, the store is read once for every deployment's replicas (a reconcile pass,
        a list of every deployment): it costs the deployments plus the workloads, not their
        product."""
        if self._index is not None:
            yield
            return
        self._index, self._ports = self._replica_index()
        try:
            yield
        finally:
            self._index = self._ports = None

    def _reconcile_all(
        self,
        deployments: list[tuple[DeploymentSpec, int | None]],
        states: Mapping[str, ReplicaState],
    ) -> None:
        self._ensure_gateway()
        self.traffic = self._stats()
        self.refused = dict(self.traffic.pop("", {}).get("codes", {}))
        for spec, scaled in deployments:
            # one deployment that fails (a bound lowered since it was stored, say) is its own
            # failure, recorded once and retried with backoff; the others go on
            if self.runner.failures.waiting(spec.key, "serving") is not None:
                continue
            try:
                self._reconcile_one(spec, scaled, states)
            except Exception as e:
                self.runner.failures.failed(spec.key, "serving", e)
            else:
                self.runner.failures.succeeded(spec.key, "serving")
        known = {d.key for d, _ in deployments}
        for key in [k for k in self._sent if k not in known]:
            self._configure_gone(key)
        if self.gateway.running and not self._settled:
            try:  # tokens and every deployment sent: it may answer requests now
                self.gateway.call("G")
                self._settled = True
            except OSError:
                self.gateway.close()
        for counts in (self.scale_counts, self.replica_counts):
            for key in [k for k in counts if k not in known]:
                del counts[key]

    def _reconcile_one(
        self, d: DeploymentSpec, scaled: int | None, states: Mapping[str, ReplicaState]
    ) -> None:
        now = time.monotonic()
        traffic = self.traffic.get(route_name(d), {})
        for name, seen in traffic.get("replicas", {}).items():
            if int(seen.get("outstanding", 0)) > 0:  # requests in flight: busy on its GPU
                self.runner.note_busy(f"{d.tenant}/{name}")
        replicas = self.views(d, states)
        moving = self._moves_of(d, replicas)
        # a replica being moved counts as one of an old template: a replacement is made for it,
        # and it goes (drained) only once enough others are ready (make-before-break)
        current = [
            r
            for r in replicas
            if r.template == d.template_hash and not r.draining and r.name not in moving
        ]
        want = self._wanted(d, scaled, current, traffic, now)
        # a new replica's index is none of the current ones' nor a moved one's (its name stays
        # its own until it is deleted)
        have = {int(r.name.rsplit("-", 1)[1]) for r in current} | {
            int(name.rsplit("-", 1)[1]) for name in moving
        }
        missing = max(0, want - len(current))
        # replicas are the tenant's workloads: no more of them than its bound on stored workloads
        cap, setting = self.runner.settings.workload_cap(d.tenant)
        store = self.runner.store  # as an apply counts them: workloads and deployments
        stored = store.workload_count(d.tenant) + store.deployment_count(d.tenant)
        # a moved replica's replacement may pass the bound for as long as the move lasts (the
        # two are one replica of the deployment, and the move is the scheduler's, not the tenant's)
        over = max(0, missing - max(0, cap - stored + len(moving)))
        indexes = [i for i in range(want * 2 + 1) if i not in have][: missing - over]
        if indexes:  # started together: small replicas may share a MIG instance (docs/mig.md)
            self.runner.apply_replicas(
                [
                    d.replica_spec(index, self._free_port(), secrets.token_urlsafe(24))
                    for index in indexes
                ]
            )
        # surplus replicas of this template: those not ready first, then the highest indexes
        surplus = sorted(current, key=lambda r: (r.ready, -int(r.name.rsplit("-", 1)[1])))
        retire = [r.name for r in surplus[: max(0, len(current) - want)]]
        # replicas of an old template: one not ready serves nothing and goes at once; a ready one
        # goes only while the ready replicas left still number at least ``want`` (new before old)
        old = [
            r
            for r in replicas
            if (r.template != d.template_hash or r.name in moving) and not r.draining
        ]
        retire += [r.name for r in old if not r.ready]
        ready_old = [r for r in old if r.ready]
        ready_new = sum(1 for r in current if r.ready and r.name not in retire)
        spare = len(ready_old) if want == 0 else max(0, ready_new + len(ready_old) - want)
        retire += [r.name for r in ready_old[:spare]]
        for name in retire:
            key = f"{d.tenant}/{name}"
            if key not in self.draining and name in moving:
                m = moving[name]
                ready = ", ".join(r.name for r in current if r.ready)
                beside = f"{ready} ready beside it" if ready else "it was not ready"
                self.runner.store.record_event(
                    "moved",
                    key,
                    f"moved to make room for {m.cause}: {beside}; it drains and is deleted",
                    {"deployment": d.key, "gpu": m.gpu, "mig": m.placement.to_json()},
                    cause=m.cause,
                )
                self.moves_done[d.key] = self.moves_done.get(d.key, 0) + 1
            self.draining.setdefault(key, now)
        serving = [r for r in replicas if r.ready and f"{d.tenant}/{r.name}" not in self.draining]
        self.replica_counts[d.key] = (
            want,
            len(serving),
            sum(1 for r in replicas if f"{d.tenant}/{r.name}" in self.draining),
        )
        self._configure(d, serving, states)
        self._finish_draining(d, traffic, now)
        if over:  # the rest of the pass done: said once (an event), tried again with backoff
            raise InputError(
                f"{over} replica(s) of {d.key} not created: tenant {d.tenant} is at its maximum "
                f"of {cap} workloads ({setting})",
                field="spec.replicas",
                fix=f"scale it down, delete other workloads, or have the operator raise {setting}",
            )

    def _moves_of(self, d: DeploymentSpec, replicas: list[ReplicaView]) -> dict[str, Move]:
        """The replicas of ``d`` being moved (by name), each told when its move begins, and when
        it ends without the replica going (its request placed otherwise or deleted, or the move
        given up: it stays, and the replacement is the surplus)."""
        all_moving = self.runner.moving()
        out = {}
        for r in replicas:
            key = f"{d.tenant}/{r.name}"
            m = all_moving.get(key)
            told = self._moving.get(key, ("", None))[1]
            if m is None or key in self.draining:
                if told is not None and key not in self.draining:
                    self.runner.store.record_event(
                        "move_ended",
                        key,
                        f"no longer moved: {told.cause} was placed or deleted, or the move was "
                        "given up; it stays where it is (a replacement not needed now goes)",
                        {"deployment": d.key},
                        cause=told.cause,
                    )
                self._moving.pop(key, None)
                continue
            out[r.name] = m
            if told != m:
                self._moving[key] = (d.key, m)
                self.runner.store.record_event(
                    "moving",
                    key,
                    f"moving to make room for {m.cause} (it leaves its {m.placement.profile} "
                    f"on {m.gpu}): a replacement replica starts first; this one serves until "
                    "that one is ready",
                    {"deployment": d.key},
                    cause=m.cause,
                )
        names = {f"{d.tenant}/{r.name}" for r in replicas}
        for key in [k for k, (dk, _) in self._moving.items() if dk == d.key and k not in names]:
            del self._moving[key]  # gone (drained and deleted)
        return out

    def _wanted(
        self,
        d: DeploymentSpec,
        scaled: int | None,
        current: list[ReplicaView],
        traffic: dict[str, Any],
        now: float,
    ) -> int:
        if d.autoscale is None:
            return scaled if scaled is not None else (d.replicas or 0)
        state = self.scaling.setdefault(d.key, ScaleState())
        count = scaled if scaled is not None else len(current)
        was_boosted = state.boosted
        decision = decide(
            d.autoscale,
            state,
            now,
            count,
            int(traffic.get("in_flight", 0)),
            int(traffic.get("queued", 0)),
            traffic.get("p99_ms"),
            can_boost=self._shares_a_gpu(d, current),
        )
        counts = self.scale_counts.setdefault(d.key, dict.fromkeys(SCALE_DIRECTIONS, 0))
        for direction in directions(count, was_boosted, decision):
            counts[direction] += 1
        if decision.why:
            self.runner.store.record_event("autoscaler", d.key, decision.why, {"deployment": d.key})
        if decision.boosted != self._boosted(d, current):
            weight = d.template.weight * (BOOST if decision.boosted else 1)
            for r in current:
                stored = self.runner.store.workload(d.tenant, r.name)
                if stored is not None:  # a QoS change: applied live, no restart
                    self.runner.apply_workload(replace(spec_from_json(stored.spec), weight=weight))
        if decision.replicas != scaled:
            self.runner.store.set_deployment_replicas(
                d.tenant, d.name, decision.replicas, decision.why or "autoscaler"
            )
        return decision.replicas

    def _shares_a_gpu(self, d: DeploymentSpec, current: list[ReplicaView]) -> bool:
        """Does a replica share its GPU (or MIG instance) with another workload? Only then can a
        higher QoS weight give the deployment more of it; alone on a GPU, it has it all already."""
        return self.runner.shares_a_gpu({f"{d.tenant}/{r.name}" for r in current})

    def _boosted(self, d: DeploymentSpec, current: list[ReplicaView]) -> bool:
        for r in current:
            stored = self.runner.store.workload(d.tenant, r.name)
            if stored is not None:
                return int(stored.spec.get("weight", 1)) > d.template.weight
        return False

    def _finish_draining(self, d: DeploymentSpec, traffic: dict[str, Any], now: float) -> None:
        """Delete a retired replica once the gateway holds no request on it (or after the
        timeout)."""
        busy = {**traffic.get("retiring", {}), **traffic.get("replicas", {})}
        for key in [k for k in self.draining if k.split("/", 1)[0] == d.tenant]:
            name = key.split("/", 1)[1]
            if not name.startswith(f"{d.name}-") or self.draining[key] >= now:
                continue  # taken out of the gateway this pass: judged on the next pass's reading
            outstanding = int(busy.get(name, {}).get("outstanding", 0))
            if outstanding and now - self.draining[key] < d.timeout_seconds:
                continue
            self.runner.delete(d.tenant, name)
            self.runner.store.record_event("replica_removed", d.key, f"{name} drained and deleted")
            del self.draining[key]

    # -- replicas -------------------------------------------------------------------------------

    def _replica_index(self) -> tuple[dict[tuple[str, str], list[WorkloadSpec]], set[int]]:
        """Every deployment's replicas, by (tenant, deployment), and the ports workloads have."""
        index: dict[tuple[str, str], list[WorkloadSpec]] = {}
        ports: set[int] = set()
        for w in self.runner.store.workloads():
            port = digits_or_none((w.spec.get("env") or {}).get("PORT"))  # a user's: '²' too
            if port is not None:
                ports.add(port)
            group = (w.spec.get("labels") or {}).get(LABEL)
            if group is not None:
                index.setdefault((w.tenant, group), []).append(spec_from_json(w.spec))
        return index, ports

    def _replicas(self, tenant: str, name: str) -> list[WorkloadSpec]:
        if self._index is not None:  # during a pass
            return list(self._index.get((tenant, name), []))
        out = []
        for w in self.runner.store.workloads(tenant):
            if (w.spec.get("labels") or {}).get(LABEL) == name:
                out.append(spec_from_json(w.spec))
        return out

    def views(self, d: DeploymentSpec, states: Mapping[str, ReplicaState]) -> list[ReplicaView]:
        out = []
        for w in self._replicas(d.tenant, d.name):
            key = f"{w.tenant}/{w.name}"
            st = states.get(key)
            phase = st.phase if st else "pending"
            address, node = self.runner.where(key)
            out.append(
                ReplicaView(
                    name=w.name,
                    template=w.labels.get(TEMPLATE_LABEL, ""),
                    port=int(w.env.get("PORT", "0")),
                    phase=phase,
                    ready=phase in ("running", "paused"),
                    draining=key in self.draining,
                    host=address,
                    node=node,
                )
            )
        return sorted(out, key=lambda r: r.name)

    def _free_port(self) -> int:
        """A port no replica has and nothing listens on, below Linux's ephemeral range (32768 and
        up), so no outgoing connection (the gateway's own, say) takes it before the replica
        binds."""
        used = self._ports if self._ports is not None else self._replica_index()[1]
        for port in random.sample(range(REPLICA_PORTS[0], REPLICA_PORTS[1]), 200):
            if port in used or port == self.gateway_port:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            used.add(port)  # taken by the replica made now (the pass's set)
            return port
        raise RuntimeError("no free port for a replica")

    # -- the gateway ----------------------------------------------------------------------------

    def _ensure_gateway(self) -> None:
        if self.gateway.running:
            return
        try:
            self.gateway.start(["--host", self.host, "--port", str(self.gateway_port)])
            self.gateway.call("A " + _json({"tokens": self.tokens}))
        except (RuntimeError, OSError) as e:
            self.gateway.close()
            self.runner.store.record_event("gateway_error", "gateway", str(e))
            return
        self._sent = {}
        self._settled = False
        self.runner.store.record_event("gateway_started", "gateway", self.gateway_url)

    def _stats(self) -> dict[str, Any]:
        if not self.gateway.running:
            return {}
        try:
            return self.gateway.call("T")
        except OSError:
            self.gateway.close()
            return {}

    def _configure(
        self, d: DeploymentSpec, serving: list[ReplicaView], states: Mapping[str, ReplicaState]
    ) -> None:
        busy = self._gpu_busy(d, serving, states)
        keys = {w.name: w.env.get(REPLICA_KEY_ENV) for w in self._replicas(d.tenant, d.name)}
        msg = {
            "name": route_name(d),
            "tenant": d.tenant,
            "public": d.public,
            "replicas": [
                {
                    "id": r.name,
                    "host": r.host,
                    "port": r.port,
                    "busy": busy.get(r.name, 0.0),
                    "key": keys.get(r.name),
                }
                for r in serving
            ],
            "max_concurrency": d.max_concurrency,
            "queue_limit": d.queue_limit,
            "timeout_s": d.timeout_seconds,
            # no ready replica: a request waits for one no longer than any request waits
            "cold_start_timeout_s": d.timeout_seconds,
        }
        line = "C " + _json(msg)
        if self._sent.get(d.key) == line or not self.gateway.running:
            return
        try:
            self.gateway.call(line)
            self._sent[d.key] = line
        except ChildRefused as e:  # alive, and serving the rest: record it, keep it running
            self.runner.store.record_event("gateway_error", d.key, str(e))
            self._sent[d.key] = line
        except OSError:
            self.gateway.close()

    def _configure_gone(self, key: str) -> None:
        tenant, name = key.split("/", 1)
        self._sent.pop(key, None)
        if self.gateway.running:
            try:
                self.gateway.call(f"X {route_name_of(tenant, name)}")
            except OSError:
                self.gateway.close()

    def _gpu_busy(
        self, d: DeploymentSpec, serving: list[ReplicaView], states: Mapping[str, ReplicaState]
    ) -> dict[str, float]:
        """Each replica's SM utilization (0..1) where it is known per process (time-sliced
        GPUs)."""
        out: dict[str, float] = {}
        for r in serving:
            key = f"{d.tenant}/{r.name}"
            st = states.get(key)
            busy = None if st is None else self.runner.gpu_busy(key, st)
            if busy is not None:
                out[r.name] = busy
        return out

    def close(self) -> None:
        self.gateway.close()


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def route_name_of(tenant: str, name: str) -> str:
    """The gateway's name for a deployment: ``NAME``, or ``TENANT.NAME`` outside the default tenant
    (a DNS label has no dot, so the two cannot clash)."""
    return name if tenant == "default" else f"{tenant}.{name}"


def route_name(d: DeploymentSpec) -> str:
    return route_name_of(d.tenant, d.name)


def gateway_path(d: DeploymentSpec) -> str:
    """Where the deployment is served: ``/serve/NAME`` (``/serve/TENANT.NAME`` outside default)."""
    return f"/serve/{route_name(d)}"
