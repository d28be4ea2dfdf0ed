"""``/api/v1/deployments``: list, read, scale and delete deployments (applying one goes through the
same manifest endpoint as workloads, ``POST /api/v1/deployments`` or ``/api/v1/workloads``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import APIRouter, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from gpufrac.api.bodies import read_body
from gpufrac.api.openapi import errors, json_body
from gpufrac.api.schemas import (
    Deleted,
    DeploymentDetail,
    DeploymentList,
    ScaleAnswer,
    ScaleBody,
)
from gpufrac.api.seen_by import event_seen_by
from gpufrac.errors import InputError, Unsupported
from gpufrac.model.deployment import DeploymentSpec, deployment_to_json
from gpufrac.model.event import Event
from gpufrac.planning.sched_decision import reason_for_tenant
from gpufrac.serving.deployments import Deployments, gateway_path, route_name

if TYPE_CHECKING:
    from gpufrac.api.tokens import Caller


NO_DEPLOYMENTS = (
    "this server runs no deployments: apply them to one started by gpufrac agent or gpufrac "
    "control (docs/serving.md)"
)


class DeploymentsService(Protocol):
    """What these routes read: one machine's deployments (``serving.agent_deployments``), or a
    cluster's (``cluster.serving.ClusterServing``)."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    @property
    def deployments(self) -> Deployments: ...

    @property
    def states(self) -> Mapping[str, Any]: ...

    def wake(self) -> None: ...

    def events(self, subject: str, limit: int) -> list[Event]: ...

    def last_error(self, tenant: str, name: str, st: Any) -> str | None:
        """The last line a replica that failed wrote, where it can be read."""


def deployment_view(
    service: DeploymentsService,
    d: DeploymentSpec,
    scaled: int | None,
    states: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``states``: the replicas' states, read once for many deployments (else read here)."""
    deps = service.deployments
    states = service.states if states is None else states
    traffic = deps.traffic.get(route_name(d), {})
    per_replica = traffic.get("replicas", {})
    replicas = []
    for r in deps.views(d, states):
        st = states.get(f"{d.tenant}/{r.name}")
        where = st.decision.gpus if st and st.decision else []
        replicas.append(
            {
                **asdict(r),
                "current": r.template == d.template_hash,
                "gpus": list(where),
                "mode": st.decision.mode if st and st.decision else None,
                "outstanding": per_replica.get(r.name, {}).get("outstanding", 0),
                "served": per_replica.get(r.name, {}).get("served", 0),
                # a replica paused by another tenant's workload: not named to the deployment's
                "reason": reason_for_tenant(st.reason, getattr(st, "cause", None), d.tenant)
                if st
                else "",
                "last_error": service.last_error(d.tenant, r.name, st),
            }
        )
    wanted = scaled if scaled is not None else d.replicas
    return {
        "tenant": d.tenant,
        "name": d.name,
        "url": deps.gateway_url + gateway_path(d),
        "template": d.template_hash,
        "replicas_wanted": wanted,
        "replicas_ready": sum(1 for r in replicas if r["ready"] and not r["draining"]),
        "replicas": replicas,
        "traffic": {k: v for k, v in traffic.items() if k != "replicas"},
        "spec": deployment_to_json(d),
    }


def add_deployment_routes(
    app: APIRouter,
    served: DeploymentsService | None,
    caller: Callable[[Request], Caller],
    own: Callable[[Request, str, str, str], object],
) -> None:
    """The routes, on a server with deployments (``served``) or without (each answers 501)."""
    lacking = errors(501)

    def present() -> DeploymentsService:
        if served is None:
            raise Unsupported("deployments", NO_DEPLOYMENTS)
        return served

    def find(tenant: str, name: str) -> tuple[DeploymentSpec, int | None]:
        service = present()
        for d, scaled in service.deployments.specs():
            if (d.tenant, d.name) == (tenant, name):
                return d, scaled
        raise HTTPException(404, f"no deployment {tenant}/{name}")

    @app.get(
        "/api/v1/deployments",
        response_model=DeploymentList,
        responses={**errors(401, 503), **lacking},
    )
    def list_deployments(request: Request) -> dict[str, Any]:
        who = caller(request)
        service = present()
        with service.lock, service.deployments.batch():
            states = service.states
            return {
                "deployments": [
                    deployment_view(service, d, scaled, states)
                    for d, scaled in service.deployments.specs()
                    if who.may_see(d.tenant)
                ]
            }

    @app.get(
        "/api/v1/deployments/{tenant}/{name}",
        response_model=DeploymentDetail,
        responses={**errors(401, 404, 422, 503), **lacking},
    )
    def get_deployment(request: Request, tenant: str, name: str) -> dict[str, Any]:
        who = caller(request)
        service = present()
        own(request, tenant, name, "deployment")
        with service.lock:
            out = deployment_view(service, *find(tenant, name))
            out["events"] = [event_seen_by(who, e) for e in service.events(f"{tenant}/{name}", 100)]
            return out

    @app.post(
        "/api/v1/deployments/{tenant}/{name}/scale",
        response_model=ScaleAnswer,
        response_model_exclude_unset=True,  # warnings only when it autoscales
        responses={**errors(400, 401, 404, 413, 422, 503), **lacking},
        openapi_extra=json_body(ScaleBody),
    )
    async def scale(request: Request, tenant: str, name: str) -> dict[str, Any]:
        present()
        own(request, tenant, name, "deployment")
        try:
            body = await read_body(request, ScaleBody, example='{"replicas": 2}')
        except InputError as e:
            if all(err.field == "replicas" for err in e.errors):
                raise HTTPException(422, "replicas: give a whole number from 0 to 1000") from None
            raise
        return await run_in_threadpool(scale_to, tenant, name, body.replicas)

    def scale_to(tenant: str, name: str, replicas: int) -> dict[str, Any]:
        service = present()
        with service.lock:
            d, _ = find(tenant, name)
            service.deployments.scale(tenant, name, replicas)
        service.wake()
        out: dict[str, Any] = {"deployment": f"{tenant}/{name}", "replicas": replicas}
        if d.autoscale is not None:
            a = d.autoscale
            out["warnings"] = [
                f"it autoscales ({a.min_replicas}-{a.max_replicas} replicas): the autoscaler goes "
                "on from this count with the next load it sees, so it may soon change it; for a "
                "count that stays, apply the deployment with replicas: N instead of autoscale"
            ]
        return out

    @app.delete(
        "/api/v1/deployments/{tenant}/{name}",
        response_model=Deleted,
        responses={**errors(401, 404, 422, 503), **lacking},
    )
    def delete_deployment(request: Request, tenant: str, name: str) -> dict[str, Any]:
        service = present()
        own(request, tenant, name, "deployment")
        with service.lock:
            if not service.deployments.delete(tenant, name):
                raise HTTPException(404, f"no deployment {tenant}/{name}")
        service.wake()
        return {"deleted": f"{tenant}/{name}"}
