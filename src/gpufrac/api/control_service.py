"""What the user API (``api.user_api``) needs of whoever serves it: one machine's agent
(``runtime.service.AgentService``) or a cluster's control plane
(``cluster.control_service.ControlPlaneService``). Narrow and typed: what a route asks, in values
(``planning.views``, decisions, events), never the agent's parts. Deployments are the other half
(``api.deployments_api.DeploymentsService``), served where the server has them.

A server lacking a capability (``capabilities``) still has the route; the API answers 501 naming it
before calling the method, and the method raises ``errors.Unsupported`` if it is called anyway.
Methods that change state are called with ``lock`` held where the route needs several calls to be
one step (an apply: its checks, then what it stores); each one takes the lock itself too.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from prometheus_client.registry import Collector

from gpufrac.model.caller import Caller
from gpufrac.model.deployment import DeploymentSpec
from gpufrac.model.event import Event
from gpufrac.model.mig import MigPlacement
from gpufrac.model.migplan import MigAction
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import WorkloadSpec
from gpufrac.planning.sched_decision import Decision, Displacement
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
from gpufrac.runtime.history import History


class ControlService(Protocol):
    @property
    def role(self) -> Role: ...

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What this server can do of what the API offers (the rest answers 501)."""
        ...

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    @property
    def settings(self) -> OperatorSettings:
        """The operator's settings (``gpufrac.yaml``), as read at start."""
        ...

    @property
    def history(self) -> History:
        """The dashboard's plots (``GET /api/v1/history``)."""
        ...

    def health(self) -> ServiceHealth:
        """Answered without waiting for ``lock`` (a stuck server still says so)."""
        ...

    def collector(self) -> Collector:
        """``/metrics``: read at scrape time, with ``lock`` held."""
        ...

    def relayed(self) -> Collector | None:
        """``/metrics``: what is read from elsewhere at scrape time (a cluster's nodes' series),
        without ``lock`` (it takes it only for what it reads of this server); None: nothing."""
        ...

    def wake(self) -> None:
        """Carry out what was just decided now, not at the next tick."""

    # -- desired state ---------------------------------------------------------------------------

    def check_room(
        self, specs: Sequence[WorkloadSpec], deployments: Sequence[DeploymentSpec]
    ) -> None:
        """``errors.Refused`` where storing these would take a tenant over its bound."""

    def check_workload(self, spec: WorkloadSpec) -> None:
        """``InputError`` where ``spec`` breaks an operator's bound or this server cannot run it as
        written (priority, user, mounts, image): every document of a manifest is checked so before
        anything of it is stored."""

    def stored_spec(self, tenant: str, name: str) -> dict[str, Any] | None:
        """The workload as stored (JSON), or None."""

    def apply_workload(self, spec: WorkloadSpec) -> tuple[ApplyResult, Decision | None]:
        """Store ``spec`` and have it scheduled: what happened, and the decision (None where
        nothing was decided)."""
        ...

    def apply_new_workloads(
        self, specs: Sequence[WorkloadSpec]
    ) -> list[tuple[ApplyResult, Decision | None]]:
        """Store and schedule workloads of one manifest none of which is stored yet, together:
        all known as waiting before the first is tried (so small ones may share a new MIG
        instance, docs/mig.md), each answered as ``apply_workload`` answers, in order."""
        ...

    def warnings(self, spec: WorkloadSpec, decision: Decision | None) -> list[str]:
        """What ``apply`` says of a request that was probably not meant as written."""
        ...

    def refusal(self, spec: WorkloadSpec) -> str | None:
        """Why no GPU (of any node) could ever hold ``spec``; None where one could, or where it
        cannot be told yet (no node has joined)."""

    def displacements(self) -> AbstractContextManager[list[Displacement]]:
        """The workloads displaced while the block runs, for the call's answer (``lock`` held)."""
        ...

    def delete_workload(self, tenant: str, name: str) -> bool: ...

    def clear_unknown(self, tenant: str, name: str) -> bool | None:
        """An admin's word on a workload whose last attempt's outcome is unknown
        (``clear-unknown``): it counts as failed, and its restart policy applies. None: no such
        workload; False: its outcome is not unknown."""
        ...

    def keep_alive(self, tenant: str, name: str) -> bool:
        """A Ray lease's holder still uses it (``ray-leases``); False: no such lease."""
        ...

    # -- views -----------------------------------------------------------------------------------

    def workloads(self) -> list[WorkloadView]:
        """Every workload (with ``lock`` held)."""
        ...

    def workload(self, tenant: str, name: str) -> WorkloadView | None: ...

    def events(
        self,
        subject: str | None = None,
        *,
        limit: int = 100,
        tenant: str | None = None,
        after: int | None = None,
    ) -> list[Event]: ...

    async def log_tail(self, tenant: str, name: str, tail: int) -> LogTail | None:
        """Its newest run's last ``tail`` lines (0: all) that fit the operator's cap
        (``log_relay_max``), or None for no such workload. Awaited on the event loop: it blocks
        no thread of the API's pool. ``errors.Busy`` at once where too many reads of its tenant
        or from its node are under way; ``errors.TimedOut`` where its node did not send them
        within ``log_relay_deadline``; ``errors.Unavailable`` where its node does not answer, or
        sends more than asked for."""
        ...

    def gpus(self, who: Caller) -> list[dict[str, Any]]:
        """Every GPU with what is placed on it, as ``who`` may see it (``GpuJson``)."""
        ...

    def nodes(self) -> list[NodeInfo]: ...

    def judge_node(self, name: str, verdict: Verdict, gpus: int | None) -> NodeInfo | None:
        """An admin's verdict on a node (``node-admission``): approve it (with at most ``gpus``),
        deny it, or revoke it (forgotten: None). ``InputError`` naming the field for a node that
        is not there or a verdict it cannot take."""
        ...

    # -- GPUs ------------------------------------------------------------------------------------

    def gpu_named(self, gpu: str) -> str | None:
        """The GPU ``gpu`` names (an index or UUID, on a cluster NODE/INDEX or NODE/UUID) as
        decisions name it; None for none."""

    def cordon(self, uuid: str) -> None: ...

    def uncordon(self, uuid: str) -> list[Decision]: ...

    def drain(self, uuid: str) -> list[Decision]: ...

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
        """Set a GPU's MIG layout (``mig-layouts``): the actions (planned, with ``dry_run``), and
        whether the layout is pinned now; ``errors.Refused`` where it may not be set now."""
        ...

    def release_mig_pin(self, uuid: str) -> list[Decision]:
        """Let the scheduler re-cut the GPU again (``mig-layouts``): what was placed then."""
        ...
