"""One machine's deployments: ``Deployments`` over the agent (``AgentServing``), kept in step after
each of the agent service's reconcile passes, and sampled with it for the dashboard. What the user
API serves for ``/api/v1/deployments`` on one machine (``api.deployments_api.DeploymentsService``),
as ``cluster.serving.ClusterServing`` is on a cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufrac.config import DEFAULT_GATEWAY_PORT
from gpufrac.model.event import Event
from gpufrac.runtime.agent import WorkloadState
from gpufrac.runtime.history import Reading
from gpufrac.runtime.service import AgentService
from gpufrac.serving.deployments import AgentServing, Deployments


class AgentDeployments:
    def __init__(
        self,
        service: AgentService,
        *,
        gateway_port: int = DEFAULT_GATEWAY_PORT,
        gateway_host: str = "127.0.0.1",
        tokens: dict[str, str | None] | None = None,
    ) -> None:
        """``tokens``: the API tokens' tenants (None for the admin's), for the request gateway."""
        self.service = service
        self.deployments = Deployments(
            AgentServing(service.agent), gateway_port=gateway_port, host=gateway_host, tokens=tokens
        )
        self.lock = service.lock
        service.follow(self)

    @property
    def states(self) -> Mapping[str, WorkloadState]:
        return self.service.states

    def reconcile(self, states: Mapping[str, WorkloadState]) -> None:
        self.deployments.reconcile(states)

    def samples(self, states: Mapping[str, WorkloadState]) -> list[Reading]:
        return self.deployments.samples(states)

    def wake(self) -> None:
        self.service.wake()

    def events(self, subject: str, limit: int) -> list[Event]:
        return self.service.events(subject, limit=limit)

    def last_error(self, tenant: str, name: str, st: Any) -> str | None:
        """The last line a replica that failed wrote (its traceback's last line, say), so a
        deployment whose replicas never get ready says why."""
        if st is None or (st.phase not in ("backoff", "failed") and st.exit_code in (None, 0)):
            return None
        return self.service.last_line(tenant, name)

    def close(self) -> None:
        self.deployments.close()
