"""The agent's control API (FastAPI) under ``/api/v1``, and the reconcile loop behind it.

Manifests are sent as their text (YAML or JSON, several documents), so the API and ``gpufrac apply
-f`` read them with the very same strict parser: a body is accepted whole or not at all, and bad
input is a 422 whose ``detail`` names the field path and the fix. The OpenAPI description is at
``/openapi.json``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client.exposition import choose_encoder
from starlette.concurrency import run_in_threadpool

from gpufrac import __version__
from gpufrac.api.bodies import read_body
from gpufrac.api.dashboard import add_dashboard_routes
from gpufrac.api.deployments_api import add_deployment_routes
from gpufrac.api.fleet_view import read_fleet
from gpufrac.api.guard import DEFAULT_MAX_BODY, Guard
from gpufrac.api.metrics import metrics_registry
from gpufrac.api.openapi import describe_bodies, errors, json_body, json_errors, manifest_body
from gpufrac.api.schemas import (
    ApplyAnswer,
    Cordoned,
    Deleted,
    Drained,
    EventList,
    GpuList,
    HealthAnswer,
    LogsAnswer,
    MigBody,
    MigChanged,
    MigReleased,
    ScaleBody,
    Uncordoned,
    WhoAmI,
    WorkloadDetail,
    WorkloadList,
)
from gpufrac.api.seen_by import as_seen_by, displaced_seen_by, event_seen_by, shown_text
from gpufrac.api.service import AgentService
from gpufrac.api.tokens import ADMIN as ADMIN_CALLER
from gpufrac.api.tokens import Caller, authenticate
from gpufrac.errors import InputError
from gpufrac.model.deployment import DeploymentSpec, shown_spec
from gpufrac.model.manifest import read_objects
from gpufrac.model.mig import layout_from_json
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import WorkloadSpec, spec_diff, spec_from_json, spec_to_json
from gpufrac.planning.scheduler import decision_to_json
from gpufrac.runtime.mig_apply import ApplyRefused
from gpufrac.runtime.qos_view import Readings, workload_qos
from gpufrac.runtime.store import Store
from gpufrac.serving.deployments import gateway_path

# what an operation may answer besides its own answer: every one but the health check needs a token,
# and may find the store unwritable; one with a path or query parameter may be given a bad one
AUTH = errors(401, 503)
ANY = errors(401, 422, 503)
ADMIN = errors(401, 403, 404, 422, 503)  # the admin's operations on one GPU
BODY = errors(400, 413)  # a body: bounded, its length a number


def problem_answer(e: InputError) -> JSONResponse:
    """A 422 with one entry per problem (a manifest's are reported all at once)."""
    detail = []
    for err in e.errors:
        loc = (err.field or "body").replace("]", "").replace("[", ".").split(".")
        detail.append(
            {
                "loc": [p for p in loc if p],
                "msg": err.message,
                "fix": err.fix,
                "type": "value_error",
            }
        )
    return JSONResponse(status_code=422, content={"detail": detail})


def _unavailable(e: Exception) -> JSONResponse:
    """The store refused a write (disk full, I/O error): nothing was changed; try again later."""
    return JSONResponse(
        status_code=503,
        content={"detail": f"the agent cannot use its store now ({e}); nothing was changed"},
        headers={"retry-after": "5"},
    )


def check_workload_caps(
    store: Store,
    settings: OperatorSettings,
    specs: list[WorkloadSpec],
    deployments: Sequence[DeploymentSpec] = (),
) -> None:
    """Refuse (409, nothing applied) a manifest that would take a tenant above its operator bound on
    stored workloads (``max_workloads``: replicas included, and each deployment counts as one
    too): no tenant fills the node with processes, or the store with deployments."""
    new: dict[str, set[str]] = {}
    for spec in specs:  # counted in SQL: an apply costs the same however many are stored
        if not store.has_workload(spec.tenant, spec.name):
            new.setdefault(spec.tenant, set()).add(spec.name)
    for d in deployments:
        if store.deployment(d.tenant, d.name) is None:
            new.setdefault(d.tenant, set()).add(f"deployment {d.name}")
    for tenant, names in new.items():
        cap, setting = settings.workload_cap(tenant)
        have = store.workload_count(tenant) + store.deployment_count(tenant)
        if have + len(names) > cap:
            raise HTTPException(
                409,
                f"tenant {tenant} has {have} workloads and deployments and this adds "
                f"{len(names)}: above its "
                f"maximum of {cap}; delete some first, or ask the operator to raise {setting} in "
                "gpufrac.yaml",
            )


def _unavailable_disk(e: Exception) -> JSONResponse:
    return JSONResponse(
        status_code=503,
        content={"detail": f"the agent cannot write its data directory now ({e}); try again"},
        headers={"retry-after": "5"},
    )


def create_app(
    service: AgentService,
    *,
    start_loop: bool = True,
    tokens: dict[str, Caller] | None = None,
    max_body: int = DEFAULT_MAX_BODY,
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        if start_loop:
            service.start()
        yield
        service.stop()

    app = FastAPI(title="gpufrac agent", version=__version__, lifespan=lifespan)
    app.add_exception_handler(InputError, lambda _r, e: problem_answer(e))
    app.add_exception_handler(sqlite3.Error, lambda _r, e: _unavailable(e))
    # the data directory refused a write (full, read-only, I/O error) while carrying out a call
    app.add_exception_handler(OSError, lambda _r, e: _unavailable_disk(e))
    app.add_middleware(Guard, tokens=tokens, max_body=max_body)  # the token, then a bounded body
    describe_bodies(app, (MigBody, ScaleBody))  # read by read_body, described in /openapi.json

    def caller(request: Request) -> Caller:
        """Who calls: the token's tenant (or the admin); without tokens configured, the admin."""
        found = authenticate(tokens, request.headers.get("authorization", ""))
        if found is None:
            raise HTTPException(401, "a valid API token is needed (Authorization: Bearer TOKEN)")
        return found

    def own(request: Request, tenant: str, name: str) -> Caller:
        """A tenant sees only its own workloads: another's look like they do not exist."""
        who = caller(request)
        if not who.may_see(tenant):
            raise HTTPException(404, f"no workload {tenant}/{name}")
        return who

    def admin_only(request: Request) -> None:
        if not caller(request).admin:
            raise HTTPException(403, "only the admin token may change GPUs")

    def view(who: Caller, key: str, readings: Readings | None = None) -> dict[str, Any]:
        tenant, name = key.split("/", 1)
        stored = service.agent.store.workload(tenant, name)
        if stored is None:
            raise HTTPException(404, f"no workload {key}")
        state = service.states.get(key)
        placed = service.agent.store.placement(tenant, name)
        record = placed[1] if placed else None
        # where it runs, or where a finished one ran: this machine, the agent's node
        where = (record.get("where") if record else None) or record or {}
        return {
            "tenant": tenant,
            "name": name,
            "generation": stored.generation,
            "spec": shown_spec(stored.spec),
            "phase": state.phase if state else "pending",
            "reason": shown_text(who, state.reason, [state.cause]) if state else "",
            "attempts": state.attempts if state else 0,
            "restarts": state.restarts if state else 0,
            "evictions": state.evictions if state else 0,
            "exit_code": state.exit_code if state else None,
            "env": state.env if state else {},
            "node": service.agent.node if where.get("gpus") else None,
            "placement": as_seen_by(who, record) if record else None,
            "qos": workload_qos(
                service.agent,
                spec_from_json(stored.spec),
                state.decision if state else None,
                service.agent.arbiter.latest,  # read by the last reconcile pass
                readings,
                state,
            ),
        }

    registry = metrics_registry(service)  # this app's own, read at scrape time

    @app.get("/metrics", response_class=PlainTextResponse, responses=json_errors(401, 403))
    def metrics(request: Request) -> Response:
        if not caller(request).admin:
            raise HTTPException(403, "only the admin token may read the metrics")
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        with service.lock:
            body = encode(registry)
        return Response(body, media_type=content_type)

    @app.get("/api/v1/whoami", response_model=WhoAmI, responses=errors(401))
    def whoami(request: Request) -> dict[str, Any]:
        """Whom the token is for: a tenant, or the admin (every caller, without tokens)."""
        who = caller(request)
        return {"tenant": who.tenant, "admin": who.admin}

    @app.get("/api/v1/health", response_model=HealthAnswer)
    def health() -> dict[str, Any]:
        """``ok``, or ``degraded`` with the problems (the agent's own steps that keep failing, or
        no reconcile pass for a while); answered without waiting for the agent's lock."""
        status, problems = service.health()
        return {"status": status, "version": __version__, "problems": problems}

    applied = {**ANY, **BODY, **errors(403, 409)}

    @app.post(
        "/api/v1/workloads",
        response_model=ApplyAnswer,
        responses=applied,
        openapi_extra=manifest_body(),
        operation_id="apply_api_v1_workloads_post",  # as before the handler was renamed
    )
    @app.post(
        "/api/v1/deployments",
        response_model=ApplyAnswer,
        responses=applied,
        openapi_extra=manifest_body(),
        operation_id="apply_api_v1_deployments_post",
    )
    async def apply_manifest(request: Request) -> dict[str, Any]:
        who = caller(request)
        body = await request.body()  # already read and bounded by the guard
        return await run_in_threadpool(apply_manifest_text, who, body.decode("utf-8", "replace"))

    def apply_manifest_text(who: Caller, text: str) -> dict[str, Any]:
        """Parse (off the event loop: a manifest can be slow to read) and apply, all or nothing."""
        # nothing stored on an error; a document naming no tenant is the caller's tenant's
        read = read_objects(text, source="body", default_tenant=who.tenant or "default")
        noted = {id(r.obj): list(r.warnings) for r in read}  # how each document is written
        objects = [r.obj for r in read]
        for o in objects:
            if not who.may_see(o.tenant):
                raise HTTPException(
                    403, f"the manifest names tenant {o.tenant!r}; your token is for {who.tenant!r}"
                )
        specs = [o for o in objects if isinstance(o, WorkloadSpec)]
        deployments = [o for o in objects if isinstance(o, DeploymentSpec)]
        results = []
        with service.lock:
            check_workload_caps(service.agent.store, service.agent.settings, specs, deployments)
            for d in deployments:  # every deployment's bounds before anything is stored
                service.deployments.check(d)
            for spec in specs:
                before = service.agent.store.workload(spec.tenant, spec.name)
                with service.agent.displacements() as told:
                    what, decision = service.agent.apply_workload(spec)
                diff = (
                    spec_diff(before.spec, spec_to_json(spec))
                    if before and what in ("replaced", "updated")
                    else []
                )
                results.append(
                    {
                        "kind": "Workload",
                        "workload": f"{spec.tenant}/{spec.name}",
                        "result": what,
                        "decision": None
                        if decision is None
                        else as_seen_by(who, decision_to_json(decision)),
                        "spec": spec_to_json(spec),
                        "diff": diff,
                        "warnings": noted[id(spec)] + service.agent.warnings(spec, decision),
                        "displaced": displaced_seen_by(who, told),
                    }
                )
            for d in deployments:
                results.append(
                    {
                        "kind": "Deployment",
                        "deployment": d.key,
                        "result": service.deployments.apply_deployment(d),
                        "decision": None,
                        "diff": [],
                        "url": service.deployments.gateway_url + gateway_path(d),
                        "warnings": noted[id(d)],
                    }
                )
        service.wake()  # processes start on the next reconcile pass, right away
        return {"results": results}

    add_deployment_routes(app, service, caller, own)
    # /ui, and the history behind its plots
    add_dashboard_routes(app, service.history, caller, tokens_required=tokens is not None)

    @app.get("/api/v1/workloads", response_model=WorkloadList, responses=AUTH)
    def list_workloads(request: Request) -> dict[str, Any]:
        who = caller(request)
        with service.lock:
            readings = Readings(service.agent)  # each GPU read once for the whole list
            return {
                "workloads": [
                    view(who, w.key, readings)
                    for w in service.agent.store.workloads()
                    if who.may_see(w.tenant)
                ]
            }

    @app.get(
        "/api/v1/workloads/{tenant}/{name}",
        response_model=WorkloadDetail,
        responses={**ANY, **errors(404)},
    )
    def get_workload(request: Request, tenant: str, name: str) -> dict[str, Any]:
        who = own(request, tenant, name)
        with service.lock:
            out = view(who, f"{tenant}/{name}")
            out["events"] = [
                event_seen_by(who, e)
                for e in service.agent.store.events(f"{tenant}/{name}", limit=50)
            ]
            return out

    @app.delete(
        "/api/v1/workloads/{tenant}/{name}",
        response_model=Deleted,
        responses={**ANY, **errors(404)},
    )
    def delete_workload(request: Request, tenant: str, name: str) -> dict[str, Any]:
        own(request, tenant, name)
        with service.lock:
            if not service.agent.delete(tenant, name):
                raise HTTPException(404, f"no workload {tenant}/{name}")
        service.wake()
        return {"deleted": f"{tenant}/{name}"}

    @app.get(
        "/api/v1/workloads/{tenant}/{name}/logs",
        response_model=LogsAnswer,
        responses={**ANY, **errors(404)},
    )
    def logs(
        request: Request, tenant: str, name: str, tail: int = Query(200, ge=0, le=10**7)
    ) -> dict[str, Any]:
        own(request, tenant, name)
        with service.lock:
            found = service.agent.log_tail(tenant, name, tail)
        if found is None:
            raise HTTPException(404, f"no workload {tenant}/{name}")
        return {"run": found[0], "lines": found[1]}

    @app.get("/api/v1/gpus", response_model=GpuList, responses=AUTH)
    def gpus(request: Request) -> dict[str, Any]:
        """Each GPU with the workloads placed on it (per MIG instance), what they reserved and
        use, and its cordon; another tenant's workloads are anonymous reserved shares."""
        who = caller(request)
        with service.lock:
            return {"gpus": read_fleet(service.agent, service.states, who)}

    def _gpu_uuid(gpu: str) -> str:
        for g in service.agent.scheduler.state.gpus:
            if gpu in (g.uuid, str(g.index)):
                return g.uuid
        raise HTTPException(404, f"no GPU {gpu}")

    @app.post("/api/v1/gpus/{gpu}/cordon", response_model=Cordoned, responses=ADMIN)
    def cordon(request: Request, gpu: str) -> dict[str, Any]:
        admin_only(request)
        with service.lock:
            uuid = _gpu_uuid(gpu)
            service.agent.cordon(uuid)
        return {"cordoned": uuid}

    @app.post("/api/v1/gpus/{gpu}/uncordon", response_model=Uncordoned, responses=ADMIN)
    def uncordon(request: Request, gpu: str) -> dict[str, Any]:
        admin_only(request)
        with service.lock:
            uuid = _gpu_uuid(gpu)
            placed = service.agent.uncordon(uuid)
        service.wake()
        return {"uncordoned": uuid, "placed": [d.workload for d in placed if d.outcome == "placed"]}

    @app.post("/api/v1/gpus/{gpu}/drain", response_model=Drained, responses=ADMIN)
    def drain(request: Request, gpu: str) -> dict[str, Any]:
        admin_only(request)
        with service.lock:
            uuid = _gpu_uuid(gpu)
            with service.agent.displacements() as told:
                moved = service.agent.drain(uuid)
        service.wake()
        return {
            "drained": uuid,
            "decisions": [decision_to_json(d) for d in moved],
            "displaced": displaced_seen_by(ADMIN_CALLER, told),
        }

    @app.post(
        "/api/v1/gpus/{gpu}/mig",
        response_model=MigChanged,
        responses={**ADMIN, **BODY, **errors(409)},
        openapi_extra=json_body(MigBody),
    )
    async def mig(request: Request, gpu: str) -> dict[str, Any]:
        """Body: {"mig_enabled": bool, "instances": [{"profile", "start"}], "drain": bool,
        "allow_mode_change": bool, "pin": bool, "dry_run": bool}. A GPU already as asked is left
        alone ("unchanged"); with ``pin`` (the default) the layout is kept as set until released.
        Refused with a 409 (nothing changed) when not allowed. With ``dry_run`` every check is
        made, refusals included, and the actions are listed ("planned"); nothing changes."""
        admin_only(request)
        body = await read_body(
            request, MigBody, example='{"mig_enabled": true, "instances": [...]}'
        )
        # each profile name read as a GPU instance profile (the layout's rules: when it is applied)
        layout = layout_from_json([i.model_dump() for i in body.instances], field="instances")
        flags = {
            "mig_enabled": body.mig_enabled,
            "drain": body.drain,
            "allow_mode_change": body.allow_mode_change,
            "pin": body.pin,
            "dry_run": body.dry_run,
        }
        return await run_in_threadpool(set_layout, gpu, layout, flags)

    def set_layout(gpu: str, layout: Any, flags: dict[str, bool]) -> dict[str, Any]:
        try:
            with service.lock, service.agent.displacements() as told:
                uuid = _gpu_uuid(gpu)
                done = service.agent.set_mig_layout(
                    uuid,
                    flags["mig_enabled"],
                    list(layout),
                    drain=flags["drain"],
                    allow_mode_change=flags["allow_mode_change"],
                    pin=flags["pin"],
                    dry_run=flags["dry_run"],
                )
                pinned = uuid in service.agent.store.mig_pins()
        except ApplyRefused as e:
            raise HTTPException(409, str(e)) from None
        if flags["dry_run"]:
            result = "planned" if done else "unchanged"
        else:
            service.wake()
            result = "changed" if done else "unchanged"
        return {
            "gpu": uuid,
            "result": result,
            "pinned": pinned,
            "actions": [a.to_json() for a in done],
            "displaced": displaced_seen_by(ADMIN_CALLER, told),
        }

    @app.delete("/api/v1/gpus/{gpu}/mig/pin", response_model=MigReleased, responses=ADMIN)
    def release_mig(request: Request, gpu: str) -> dict[str, Any]:
        """Let the agent re-cut this GPU's MIG layout for waiting workloads again."""
        admin_only(request)
        with service.lock:
            uuid = _gpu_uuid(gpu)
            placed = service.agent.release_mig(uuid)
        service.wake()
        return {"released": uuid, "placed": [d.workload for d in placed if d.outcome == "placed"]}

    @app.get("/api/v1/events", response_model=EventList, responses={**ANY, **errors(403)})
    def events(
        request: Request,
        limit: int = Query(100, ge=1, le=10_000),
        after: int | None = Query(None, ge=0, le=2**63 - 1),  # SQLite integers are 64-bit
        tenant: str | None = Query(None),
    ) -> dict[str, Any]:
        """The newest events the caller may see (a tenant: its own workloads'), oldest first; with
        ``after`` (an event's id), the oldest ones after it, to follow new events without repeats;
        with ``tenant``, only that tenant's workloads' events."""
        who = caller(request)
        if tenant is not None and not who.may_see(tenant):
            raise HTTPException(403, f"your token is for tenant {who.tenant!r}, not {tenant!r}")
        with service.lock:
            found = service.agent.store.events(
                limit=limit, tenant=tenant if who.admin else who.tenant, after=after
            )
        return {"events": [event_seen_by(who, e) for e in found]}

    return app
