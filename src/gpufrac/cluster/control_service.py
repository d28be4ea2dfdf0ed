"""A cluster's control plane as the user API serves it (``api.control_service.ControlService``):
the views and calls of the API answered from the control plane (its store, its core, what each node
last showed), the same routes and shapes as one machine's agent. What a control plane does not do
(set a GPU's MIG layout) is said so (501); a workload's output is relayed from the node it runs,
or ran, on (``cluster.log_relay``, bounded)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, assert_never

from gpufrac.cluster.control import ControlPlane, lease_ttl, static_qos
from gpufrac.cluster.history import ClusterSampler
from gpufrac.cluster.log_relay import LogRelay
from gpufrac.cluster.metrics import ControlCollector
from gpufrac.cluster.metrics_relay import NodeMetricsRelay
from gpufrac.cluster.serving import ClusterServing
from gpufrac.errors import Unsupported
from gpufrac.model.caller import Caller
from gpufrac.model.deployment import DeploymentSpec
from gpufrac.model.event import Event
from gpufrac.model.mig import MigPlacement
from gpufrac.model.migplan import MigAction
from gpufrac.model.workload import WorkloadSpec, spec_from_json
from gpufrac.planning.sched_decision import Decision, Displacement, StoredPlacement
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
from gpufrac.runtime.caps import check_workload_caps
from gpufrac.runtime.history import History
from gpufrac.runtime.store import StoredWorkload

NO_MIG = (
    "a cluster's control plane sets no MIG layout: the scheduler cuts MIG instances on any node "
    "as workloads need them (docs/cluster.md)"
)


class ControlPlaneService:
    role: Role = "control-plane"

    def __init__(
        self,
        control: ControlPlane,
        serving: ClusterServing | None = None,
        history: History | None = None,
    ) -> None:
        """``serving``: the cluster's deployments (None: none are served); ``history``: the
        dashboard's samples (its sampler started by the caller; by default one that is never
        started, so the plots stay empty)."""
        self.control = control
        self.serving = serving
        self.lock = control.lock
        self.settings = control.settings
        self.history = history or History(ClusterSampler(control, serving).read)
        self.capabilities: frozenset[Capability] = frozenset(
            {"ray-leases", "node-admission", *(("deployments",) if serving is not None else ())}
        )
        self.logs = LogRelay(control)  # workloads' logs, from their nodes

    def health(self) -> ServiceHealth:
        nodes = self.control.nodes()
        return ServiceHealth(
            status="ok",
            problems=[],
            nodes=len(nodes),
            nodes_alive=sum(1 for n in nodes if n.state == "alive"),
        )

    def collector(self) -> ControlCollector:
        return ControlCollector(self.control)

    def relayed(self) -> NodeMetricsRelay:
        return NodeMetricsRelay(self.control)

    def wake(self) -> None:
        """A node carries out what was decided at its next heartbeat; nothing to hurry here."""

    # -- desired state ---------------------------------------------------------------------------

    def check_room(
        self, specs: Sequence[WorkloadSpec], deployments: Sequence[DeploymentSpec]
    ) -> None:
        check_workload_caps(self.control.store, self.control.settings, specs, deployments)
        for spec in specs:  # every lease's time to live before anything of the manifest is stored
            lease_ttl(spec.labels)

    def check_workload(self, spec: WorkloadSpec) -> None:
        self.control.check_workload(spec)

    def stored_spec(self, tenant: str, name: str) -> dict[str, Any] | None:
        stored = self.control.store.workload(tenant, name)
        return None if stored is None else stored.spec

    def apply_workload(self, spec: WorkloadSpec) -> tuple[ApplyResult, Decision | None]:
        return self.control.apply_workload(spec)

    def apply_new_workloads(
        self, specs: Sequence[WorkloadSpec]
    ) -> list[tuple[ApplyResult, Decision | None]]:
        return list(self.control.apply_new_workloads(specs))

    def warnings(self, spec: WorkloadSpec, decision: Decision | None) -> list[str]:
        return self.control.core.scheduler.warnings(spec, decision)

    def refusal(self, spec: WorkloadSpec) -> str | None:
        if not self.control.core.nodes:  # no node yet: what fits nowhere now may fit later
            return None
        return self.control.core.scheduler.refusal(spec)

    def displacements(self) -> AbstractContextManager[list[Displacement]]:
        return self.control.displacements()

    def delete_workload(self, tenant: str, name: str) -> bool:
        return self.control.delete(tenant, name)

    def clear_unknown(self, tenant: str, name: str) -> bool | None:
        raise Unsupported(
            "clear-unknown",
            "the control plane does not hold runs' outcomes: clear it on the node's agent",
        )

    def keep_alive(self, tenant: str, name: str) -> bool:
        return self.control.keep_alive(tenant, name)

    # -- views -----------------------------------------------------------------------------------

    def workloads(self) -> list[WorkloadView]:
        with self.lock:
            return [self._view(w) for w in self.control.store.workloads()]

    def workload(self, tenant: str, name: str) -> WorkloadView | None:
        with self.lock:
            stored = self.control.store.workload(tenant, name)
            return None if stored is None else self._view(stored)

    def _view(self, stored: StoredWorkload) -> WorkloadView:
        control = self.control
        key = stored.key
        a = control.core.assigned.get(key)
        phase, reason, node_view = control.status(key)
        restarts, evictions = control.counts(key, node_view)
        cause = control.core.scheduler.pending.causes.get(key) if phase == "pending" else None
        return WorkloadView(
            tenant=stored.tenant,
            name=stored.name,
            generation=stored.generation,
            spec=stored.spec,
            phase=phase,
            reason=reason,
            cause=cause,
            attempts=node_view.get("attempts", 0),
            restarts=restarts,
            evictions=evictions,
            exit_code=node_view.get("exit_code"),
            env=node_view.get("env", {}),
            node=a.node if a is not None else control.core.ended_on.get(key),
            placement=self._placement(stored),
            qos=node_view.get("qos") or static_qos(spec_from_json(stored.spec), control.settings),
        )

    def _placement(self, stored: StoredWorkload) -> StoredPlacement | None:
        """The stored record of where it is placed (with its node and epoch), or how it completed
        and where it ran."""
        return self.control.store.placement(stored.tenant, stored.name)

    def events(
        self,
        subject: str | None = None,
        *,
        limit: int = 100,
        tenant: str | None = None,
        after: int | None = None,
    ) -> list[Event]:
        # newest first: any one node's passed-on events fill at most half the view (a node that
        # floods its workloads' events buries no one's own); following (after) misses none, and a
        # node's own view (describe node) is all its own
        own = subject is not None and "/" not in subject
        share = None if after is not None or own else max(1, limit // 2)
        return self.control.store.events(
            subject, limit=limit, tenant=tenant, after=after, per_relayer=share
        )

    async def log_tail(self, tenant: str, name: str, tail: int) -> LogTail | None:
        """Relayed from the node it runs (or ran) on, with that node's own credential, bounded
        (``cluster.log_relay``)."""
        return await self.logs.read(tenant, name, tail)

    def gpus(self, who: Caller) -> list[dict[str, Any]]:
        """Every node's GPUs as their node agents showed them, known here (as in decisions) by
        ``NODE/UUID``."""
        control = self.control
        with control.lock:
            out = []
            for node, shown in sorted(control.gpu_views.items()):
                for g in shown:
                    uuid = f"{node}/{g['uuid']}"
                    cordon = control.core.cordoned.get(uuid) or g.get("cordoned")
                    out.append(
                        _gpu_seen_by(who, {**g, "node": node, "uuid": uuid, "cordoned": cordon})
                    )
            return out

    def nodes(self) -> list[NodeInfo]:
        return self.control.nodes()

    def judge_node(self, name: str, verdict: Verdict, gpus: int | None) -> NodeInfo | None:
        match verdict:
            case "approve":
                self.control.approve(name, gpus)
            case "deny":
                self.control.deny(name)
            case "revoke":
                self.control.revoke(name)
                return None
            case _:
                assert_never(verdict)
        return next(n for n in self.control.nodes() if n.name == name)

    # -- GPUs ------------------------------------------------------------------------------------

    def gpu_named(self, gpu: str) -> str | None:
        """``NODE/UUID`` or ``NODE/INDEX`` (the index its node shows, as ``get gpus`` does)."""
        node, _, rest = gpu.partition("/")
        with self.lock:
            known = self.control.core.scheduler.state.by_uuid
            if gpu in known:
                return gpu
            if rest.isascii() and rest.isdigit() and len(rest) <= 4:
                for g in self.control.gpu_views.get(node, []):
                    # among the GPUs its node joined with (a heartbeat may show others)
                    if g.get("index") == int(rest) and f"{node}/{g.get('uuid')}" in known:
                        return f"{node}/{g['uuid']}"
        return None

    def cordon(self, uuid: str) -> None:
        self.control.cordon(uuid)

    def uncordon(self, uuid: str) -> list[Decision]:
        return self.control.uncordon(uuid)

    def drain(self, uuid: str) -> list[Decision]:
        return self.control.drain(uuid)

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
        raise Unsupported("mig-layouts", NO_MIG)

    def release_mig_pin(self, uuid: str) -> list[Decision]:
        raise Unsupported("mig-layouts", NO_MIG)


def _gpu_seen_by(who: Caller, gpu: dict[str, Any]) -> dict[str, Any]:
    """A node's GPU as ``who`` may see it: another tenant's shares without names or processes."""
    if who.admin:
        return gpu
    allocations = []
    for a in gpu.get("allocations", []):
        if a.get("tenant") is not None and not who.may_see(str(a["tenant"])):
            a = {**a, "tenant": None, "name": None, "used_memory_mib": None, "sm_percent": None}
        allocations.append(a)
    # a node's processes are not tied to workloads in what it shows: a tenant sees none
    return {**gpu, "allocations": allocations, "processes": []}
