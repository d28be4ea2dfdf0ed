"""What the user API shows, as values both servers of it build: one machine's agent
(``runtime.service.AgentService``) and a cluster's control plane (``cluster.control_service``).
The API (``api.user_api``) renders each for its reader (another tenant's workloads unnamed) and
writes it in the shapes of ``api.schemas``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gpufrac.planning.sched_decision import StoredPlacement

Role = Literal["agent", "control-plane"]
# what one side of the API may lack: the route is there on both, and answers 501 where it is
Capability = Literal["mig-layouts", "ray-leases", "deployments", "node-admission", "clear-unknown"]
CAPABILITIES: tuple[Capability, ...] = (
    "mig-layouts",
    "ray-leases",
    "deployments",
    "node-admission",
    "clear-unknown",
)
# an admin's word on a node that joined with the cluster token (docs/cluster.md, Admission)
Verdict = Literal["approve", "deny", "revoke"]
HealthStatus = Literal["ok", "degraded"]
ApplyResult = Literal["created", "replaced", "updated", "unchanged", "refused"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadView:
    """A workload as its server knows it, before it is rendered for a reader: ``reason`` names
    ``cause`` (the workload that took its place) in full; ``placement`` is its stored record (a
    decision, or how it completed and where it ran)."""

    tenant: str
    name: str
    generation: int
    spec: dict[str, Any]  # as stored (every default filled in)
    phase: str
    reason: str = ""
    cause: str | None = None
    attempts: int = 0
    restarts: int = 0
    evictions: int = 0
    exit_code: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    node: str | None = None  # where it runs, or a finished one ran; None while it waits
    placement: StoredPlacement | None = None
    qos: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class LogTail:
    """A workload's newest output, as much as one read answers: ``run`` is its newest attempt's
    run (None before its first); ``truncated``, that older lines asked for were left out to keep
    the answer within its byte cap (the operator's ``log_relay_max``)."""

    run: str | None
    lines: list[str] = field(default_factory=list)
    truncated: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """A node of the cluster (one machine's agent is its own, always alive)."""

    name: str
    state: str  # alive | lost; or, until an admin approves it, pending | denied
    labels: dict[str, str]
    gpus: int
    address: str | None = None  # where its agent serves the control plane (the admin's to see)
    last_heartbeat_s: float | None = None  # None: the agent itself
    version: str | None = None  # its gpufrac's, where it said
    gpu_cap: int | None = None  # the most GPUs an admin approved it for (None: as it declared)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceHealth:
    status: HealthStatus
    problems: list[str]
    nodes: int
    nodes_alive: int
