"""Deployments across a cluster: the same ``serving.Deployments`` as on one machine, run by the
control plane, whose replicas are workloads placed over every node, and whose request gateway runs
beside the control plane and routes to each replica at its node's address and port.

``ControlServing`` is the control plane seen as a ``ServingHost``: a replica applied is placed by
the cluster's scheduler (replicas of one deployment spread over GPUs, and so over nodes); a replica
is ready once its node shows it running (its readiness check passed there); the gateway is told to
stop sending to a replica as soon as the control plane no longer holds it running (its node lost,
or the replica moved), and it retries a request that got no answer on another replica meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpufrac.cluster.control import ControlPlane
from gpufrac.config import DEFAULT_GATEWAY_PORT
from gpufrac.errors import InputError
from gpufrac.model.deployment import LABEL
from gpufrac.model.event import Event
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import WorkloadSpec
from gpufrac.planning.moves import Move
from gpufrac.planning.sched_decision import ANOTHER_TENANTS, Decision
from gpufrac.runtime.failures import Failures
from gpufrac.runtime.store import Store
from gpufrac.serving.deployments import Deployments, ReplicaState


@dataclass(frozen=True, slots=True)
class Shown:
    """A replica as the control plane holds it: its phase (as its node last showed it), where it
    was placed, why it waits."""

    phase: str
    decision: Decision | None
    reason: str = ""
    exit_code: int | None = None
    cause: str | None = None  # the workload ``reason`` names (one that took its place)

    def reason_for(self, tenant: str) -> str:
        """``reason`` as ``tenant`` may read it: its cause named only if it is that tenant's."""
        if self.cause is None or self.cause.split("/", 1)[0] == tenant:
            return self.reason
        return self.reason.replace(self.cause, ANOTHER_TENANTS)


class ControlServing:
    """The control plane as a ``ServingHost``."""

    def __init__(self, control: ControlPlane) -> None:
        self.control = control
        self.failures = Failures(control.store, control.clock)

    @property
    def settings(self) -> OperatorSettings:
        return self.control.settings

    @property
    def store(self) -> Store:
        return self.control.store

    @property
    def data_dir(self) -> Path:
        return self.control.data_dir

    def check_workload(self, spec: WorkloadSpec) -> None:
        self.control.check_workload(spec)

    def apply_workload(self, spec: WorkloadSpec) -> object:
        what, decision = self.control.apply_workload(spec)
        if what == "refused":  # fits on no node even empty: said once, retried with backoff
            raise InputError(
                f"replica {spec.name} fits on no node: {decision.reason}",
                field="spec.template.resources",
                fix="ask for less, or add a node it fits on",
            )
        return what

    def apply_replicas(self, specs: Sequence[WorkloadSpec]) -> object:
        """One by one: the control plane does not place replicas together yet."""
        return [self.apply_workload(spec) for spec in specs]

    def delete(self, tenant: str, name: str) -> object:
        return self.control.delete(tenant, name)

    def note_busy(self, key: str) -> None:
        """Each node's own agent sees its GPUs' use; the control plane has nothing to add."""

    def shares_a_gpu(self, keys: Collection[str]) -> bool:
        assigned = self.control.core.assigned

        def domain(key: str) -> tuple[str, object] | None:
            a = assigned.get(key)
            if a is None or not a.decision.gpus:
                return None
            return a.decision.gpus[0], a.decision.mig

        ours = {d for k in keys if (d := domain(k)) is not None}
        return any(domain(k) in ours for k in assigned if k not in keys)

    def gpu_busy(self, key: str, st: ReplicaState) -> float | None:
        return None  # per-process SM use stays on the node

    def moving(self) -> Mapping[str, Move]:
        return self.control.core.scheduler.moving

    def where(self, key: str) -> tuple[str, str | None]:
        a = self.control.core.assigned.get(key)
        if a is None:
            return "127.0.0.1", None
        address = self.control.addresses.get(a.node)
        host = urlsplit(address).hostname if address else None
        return host or "127.0.0.1", a.node

    def states(self) -> dict[str, Shown]:
        """Every deployment replica's state, for a reconcile pass."""
        out = {}
        for w in self.control.store.workloads():
            if LABEL not in (w.spec.get("labels") or {}):
                continue
            phase, reason, node_view = self.control.status(w.key)
            a = self.control.core.assigned.get(w.key)
            cause = (
                self.control.core.scheduler.pending.causes.get(w.key)
                if phase == "pending"
                else None
            )
            out[w.key] = Shown(
                phase, a.decision if a else None, reason, node_view.get("exit_code"), cause
            )
        return out


class ClusterServing:
    """The deployments of a cluster, their gateway, and the passes that keep them in step; what
    the control plane's API serves for ``/api/v1/deployments``."""

    def __init__(
        self,
        control: ControlPlane,
        *,
        gateway_port: int = DEFAULT_GATEWAY_PORT,
        gateway_host: str = "127.0.0.1",
        tokens: dict[str, str | None] | None = None,
        url_host: str | None = None,
    ) -> None:
        self.control = control
        self.host = ControlServing(control)
        self.deployments = Deployments(
            self.host,
            gateway_port=gateway_port,
            host=gateway_host,
            tokens=tokens,
            url_host=url_host,
        )
        self.lock = control.lock
        self._wake = threading.Event()

    @property
    def states(self) -> Mapping[str, Shown]:
        """The replicas as the control plane holds them now (read under ``lock``)."""
        return self.host.states()

    def reconcile(self) -> None:
        with self.lock:
            self.deployments.reconcile(self.host.states())

    def wake(self) -> None:
        self._wake.set()

    def wait(self, seconds: float) -> None:
        """Sleep until the next pass is due, or something asked for one sooner."""
        self._wake.wait(seconds)
        self._wake.clear()

    def events(self, subject: str, limit: int) -> list[Event]:
        return self.control.store.events(subject, limit=limit)

    def last_error(self, tenant: str, name: str, st: Any) -> str | None:
        """A replica's last line of output stays on its node (``gpufrac logs`` reads it)."""
        return None

    def close(self) -> None:
        self.deployments.close()
