"""The users' API under ``/api/v1`` (and ``/metrics``, ``/ui``), written once over a
``ControlService``: one machine's agent and a cluster's control plane serve these same routes, with
the same bodies and answers (``api.schemas``), so ``/openapi.json`` has the same paths and shapes on
both. What one side lacks (MIG layouts on a control plane, Ray leases on one machine, deployments
where none are served) is still there, and answers 501 (``application/problem+json``) naming it.

Manifests are sent as their text (YAML or JSON, several documents), so the API and ``gpufrac apply
-f`` read them with the very same strict parser: a body is accepted whole or not at all, and bad
input is a 422 whose ``detail`` names the field path and the fix. Parsing, and every call that
takes the server's lock, run off the event loop.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry
from starlette.concurrency import run_in_threadpool

from gpufrac import __version__
from gpufrac.api.bodies import read_body
from gpufrac.api.control_service import ControlService
from gpufrac.api.dashboard import add_dashboard_routes
from gpufrac.api.deployments_api import NO_DEPLOYMENTS, DeploymentsService, add_deployment_routes
from gpufrac.api.limits import ApplyLimits, TenantOrder
from gpufrac.api.metrics_serving import LockedCollectors, ServingCollector
from gpufrac.api.openapi import describe_bodies, errors, json_body, json_errors, manifest_body
from gpufrac.api.schemas import (
    ApplyAnswer,
    Cordoned,
    Deleted,
    Drained,
    EventList,
    GpuList,
    HealthAnswer,
    KeptAlive,
    LogsAnswer,
    MigBody,
    MigChanged,
    MigReleased,
    NodeDetail,
    NodeJudged,
    NodeList,
    OutcomeCleared,
    ScaleBody,
    Uncordoned,
    WhoAmI,
    WorkloadDetail,
    WorkloadList,
)
from gpufrac.api.seen_by import (
    decision_seen_by,
    displaced_seen_by,
    event_seen_by,
    placement_seen_by,
    shown_text,
)
from gpufrac.api.tokens import Caller, authenticate
from gpufrac.errors import (
    Busy,
    InputError,
    Problems,
    Refused,
    TimedOut,
    TooLarge,
    Unavailable,
    Unsupported,
)
from gpufrac.model.caller import ADMIN
from gpufrac.model.deployment import DeploymentSpec, shown_spec
from gpufrac.model.manifest import read_objects
from gpufrac.model.manifest_errors import field_parts
from gpufrac.model.mig import layout_from_json
from gpufrac.model.workload import WorkloadSpec, spec_diff, spec_to_json
from gpufrac.planning.sched_decision import Decision, Displacement, decision_to_json
from gpufrac.planning.views import (
    ApplyResult,
    Capability,
    LogTail,
    NodeInfo,
    Verdict,
    WorkloadView,
)
from gpufrac.serving.deployments import gateway_path

# what an operation may answer besides its own answer: every one but the health check needs a token,
# and may find the store unwritable; one with a path or query parameter may be given a bad one
AUTH = errors(401, 503)
ANY = errors(401, 422, 503)
ADMIN_GPU = errors(401, 403, 404, 422, 503)  # the admin's operations on one GPU
BODY = errors(400, 413)  # a body: bounded, its length a number
LACKING = errors(501)  # a capability one side of the API lacks

# why a capability is missing, said in the 501's detail
MISSING: dict[Capability, str] = {
    "mig-layouts": "MIG layouts are not set through a cluster's control plane: the scheduler cuts "
    "MIG instances on any node as workloads need them (docs/cluster.md)",
    "ray-leases": "Ray leases (gpufrac.ray) are kept by a cluster's control plane: this is one "
    "machine's agent (docs/cluster.md)",
    "deployments": NO_DEPLOYMENTS,
    "node-admission": "one machine's agent admits no nodes: nodes join a cluster's control plane "
    "(docs/cluster.md, Admission)",
    "clear-unknown": "a cluster's control plane does not hold the outcomes of runs: clear it on "
    "the node's agent (gpufrac clear-unknown --server NODE_AGENT; docs/agent.md)",
}


# how many new workloads of a manifest are placed together under the server's lock at once: enough
# for the nesting rule (two waiting needs), few enough that nobody waits long for the lock
NEW_AT_ONCE = 32


def utf8_text(body: bytes) -> str:
    """A manifest body as text; bytes that are not UTF-8 are an ``InputError`` naming the first
    one's offset (never replaced: a name or a secret would change without a word)."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        line = body.count(b"\n", 0, e.start) + 1
        raise InputError(
            f"the manifest is not UTF-8: byte 0x{body[e.start]:02x} at offset {e.start} "
            f"(line {line}) {e.reason}",
            field="body",
            fix="send the manifest encoded as UTF-8 (iconv -t UTF-8 FILE)",
        ) from None


def problem_answer(e: InputError) -> JSONResponse:
    """A 422 with one entry per problem (a manifest's are reported all at once)."""
    detail = []
    for err in e.errors:
        detail.append(
            {
                "loc": field_parts(err.field or "body"),
                "msg": err.message,
                "fix": err.fix,
                "type": "value_error",
            }
        )
    return JSONResponse(status_code=422, content={"detail": detail})


def unsupported_answer(e: Unsupported) -> JSONResponse:
    """A 501 in RFC 9457's shape, naming the capability."""
    return JSONResponse(
        status_code=501,
        media_type="application/problem+json",
        content={
            "type": f"urn:gpufrac:unsupported:{e.capability}",
            "title": f"{e.capability} is not supported by this server",
            "status": 501,
            "detail": e.detail,
            "capability": e.capability,
        },
    )


def busy_answer(e: Busy) -> JSONResponse:
    """A 429 in RFC 9457's shape, with ``Retry-After``."""
    return JSONResponse(
        status_code=429,
        media_type="application/problem+json",
        headers={"retry-after": str(e.retry_after_s)},
        content={
            "type": "urn:gpufrac:busy",
            "title": "too many such calls at once or a second",
            "status": 429,
            "detail": e.detail,
            "retry_after_s": e.retry_after_s,
        },
    )


def timed_out_answer(e: TimedOut) -> JSONResponse:
    """A 504 in RFC 9457's shape."""
    return JSONResponse(
        status_code=504,
        media_type="application/problem+json",
        content={
            "type": "urn:gpufrac:timed-out",
            "title": "what the call waited for did not come in time",
            "status": 504,
            "detail": e.detail,
        },
    )


# coroutines, answered on the event loop: Starlette runs a plain function's handler in the thread
# pool, which a flood of refused log reads would then fill
async def _busy(_request: Request, e: Exception) -> Response:
    assert isinstance(e, Busy)
    return busy_answer(e)


async def _timed_out(_request: Request, e: Exception) -> Response:
    assert isinstance(e, TimedOut)
    return timed_out_answer(e)


def logs_answer(found: LogTail) -> Response:
    """``LogsAnswer``'s JSON, written at once: a log answer can hold megabytes of lines, which are
    not copied again to be validated against the model they were made to."""
    body = {"run": found.run, "lines": found.lines, "truncated": found.truncated}
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return Response(text.encode(), media_type="application/json")


def _unavailable(what: str, e: Exception) -> JSONResponse:
    """The store or data directory refused a write (disk full, I/O error), or a node did not
    answer: nothing was changed; try again later."""
    return JSONResponse(
        status_code=503,
        content={"detail": f"{what} ({e}); nothing was changed, try again"},
        headers={"retry-after": "5"},
    )


def add_user_api(
    app: FastAPI,
    service: ControlService,
    serving: DeploymentsService | None,
    *,
    tokens: dict[str, Caller] | None,
) -> None:
    """The user API on ``app``: its routes (``user_api``) and how its refusals are answered."""
    app.add_exception_handler(InputError, lambda _r, e: problem_answer(e))
    app.add_exception_handler(  # as the guard answers a body over its bound
        TooLarge, lambda _r, e: JSONResponse(status_code=413, content={"detail": str(e)})
    )
    app.add_exception_handler(Unsupported, lambda _r, e: unsupported_answer(e))
    app.add_exception_handler(Busy, _busy)
    app.add_exception_handler(TimedOut, _timed_out)
    app.add_exception_handler(
        Refused, lambda _r, e: JSONResponse(status_code=409, content={"detail": str(e)})
    )
    app.add_exception_handler(
        Unavailable,
        lambda _r, e: JSONResponse(
            status_code=503, content={"detail": str(e)}, headers={"retry-after": "5"}
        ),
    )
    app.add_exception_handler(
        sqlite3.Error, lambda _r, e: _unavailable("the server cannot use its store now", e)
    )
    # the data directory refused a write (full, read-only, I/O error) while carrying out a call
    app.add_exception_handler(
        OSError, lambda _r, e: _unavailable("the server cannot write its data directory now", e)
    )
    describe_bodies(app, (MigBody, ScaleBody))  # read by read_body, described in /openapi.json
    app.include_router(user_api(service, serving, tokens=tokens))


def user_api(
    service: ControlService,
    serving: DeploymentsService | None,
    *,
    tokens: dict[str, Caller] | None,
) -> APIRouter:
    """``serving``: the server's deployments (None: it has none, and their routes answer 501)."""
    api = APIRouter()
    settings = service.settings
    tenant_order = TenantOrder()  # each tenant's applies one after the other
    limits = ApplyLimits(  # each tenant's applies: at once, and a second
        concurrent=settings.max_concurrent_applies,
        rate=settings.apply_rate,
        burst=settings.apply_burst,
    )

    def caller(request: Request) -> Caller:
        """Who calls: the token's tenant (or the admin); without tokens configured, the admin."""
        found = authenticate(tokens, request.headers.get("authorization", ""))
        if found is None:
            raise HTTPException(401, "a valid API token is needed (Authorization: Bearer TOKEN)")
        return found

    def own(request: Request, tenant: str, name: str, what: str = "workload") -> Caller:
        """A tenant sees only its own: another's look like they do not exist."""
        who = caller(request)
        if not who.may_see(tenant):
            raise HTTPException(404, f"no {what} {tenant}/{name}")
        return who

    def admin_only(request: Request) -> None:
        if not caller(request).admin:
            raise HTTPException(403, "only the admin token may change GPUs")

    def need(capability: Capability) -> None:
        if capability not in service.capabilities:
            raise Unsupported(capability, MISSING[capability])

    def gpu_named(gpu: str) -> str:
        found = service.gpu_named(gpu)
        if found is None:
            raise HTTPException(
                404, f"no GPU {gpu}: name one by its index or UUID, as get gpus shows it"
            )
        return found

    def shown(who: Caller, v: WorkloadView) -> dict[str, Any]:
        return {
            "tenant": v.tenant,
            "name": v.name,
            "generation": v.generation,
            "spec": shown_spec(v.spec),
            "phase": v.phase,
            "reason": shown_text(who, v.reason, [v.cause]),
            "attempts": v.attempts,
            "restarts": v.restarts,
            "evictions": v.evictions,
            "exit_code": v.exit_code,
            "env": v.env,
            "node": v.node,
            "placement": None if v.placement is None else placement_seen_by(who, v.placement),
            "qos": v.qos,
        }

    def node_shown(who: Caller, n: NodeInfo) -> dict[str, Any]:
        return {
            "name": n.name,
            "state": n.state,
            "labels": n.labels,
            "gpus": n.gpus,
            "address": n.address if who.admin else None,
            "last_heartbeat_s": None
            if n.last_heartbeat_s is None
            else round(n.last_heartbeat_s, 3),
            "version": n.version,
            "gpu_cap": n.gpu_cap,
        }

    # -- the server ------------------------------------------------------------------------------

    # this app's own, read at scrape time: the server's series under its lock, then what it
    # relays (a cluster's nodes'), read without it
    registry = CollectorRegistry(auto_describe=False)
    local: list[Collector] = [service.collector()]
    if serving is not None:
        local.append(ServingCollector(serving.deployments))
    registry.register(LockedCollectors(service.lock, local))
    relayed = service.relayed()
    if relayed is not None:
        registry.register(relayed)

    @api.get("/metrics", response_class=PlainTextResponse, responses=json_errors(401, 403))
    def metrics(request: Request) -> Response:
        if not caller(request).admin:
            raise HTTPException(403, "only the admin token may read the metrics")
        try:
            encode, content_type = choose_encoder(request.headers.get("accept", ""))
        except (TypeError, ValueError):  # an Accept header prometheus_client cannot read
            encode, content_type = choose_encoder("")  # Prometheus's text format
        return Response(encode(registry), media_type=content_type)

    @api.get("/api/v1/whoami", response_model=WhoAmI, responses=errors(401))
    def whoami(request: Request) -> dict[str, Any]:
        """Whom the token is for: a tenant, or the admin (every caller, without tokens)."""
        who = caller(request)
        return {"tenant": who.tenant, "admin": who.admin}

    @api.get("/api/v1/health", response_model=HealthAnswer)
    def health() -> dict[str, Any]:
        """``ok``, or ``degraded`` with the problems (the server's own steps that keep failing, or
        no reconcile pass for a while); answered without waiting for the server's lock."""
        h = service.health()
        return {
            "status": h.status,
            "version": __version__,
            "problems": h.problems,
            "role": service.role,
            "nodes": h.nodes,
            "nodes_alive": h.nodes_alive,
        }

    # -- desired state ---------------------------------------------------------------------------

    applied = {**ANY, **BODY, **errors(403, 409, 429), **LACKING}

    @api.post(
        "/api/v1/workloads",
        response_model=ApplyAnswer,
        responses=applied,
        openapi_extra=manifest_body(),
        operation_id="apply_api_v1_workloads_post",  # as before the handler was renamed
    )
    @api.post(
        "/api/v1/deployments",
        response_model=ApplyAnswer,
        responses=applied,
        openapi_extra=manifest_body(),
        operation_id="apply_api_v1_deployments_post",
    )
    async def apply_manifest(request: Request) -> Any:
        who = caller(request)
        body = await request.body()  # already read and bounded by the guard
        settings = service.settings
        if len(body) > settings.max_manifest_bytes:
            raise TooLarge(
                f"the manifest is {len(body):,} bytes, over the limit of "
                f"{settings.max_manifest_bytes:,} (the operator's max_manifest_bytes in "
                "gpufrac.yaml)",
                field="body",
                fix="split it into several manifests",
            )
        if who.admin:  # the operator's own applies are not limited
            return await run_in_threadpool(apply_manifest_text, who, utf8_text(body))
        tenant = who.tenant or ""
        refused = limits.take(tenant)
        if refused is not None:
            raise Busy(
                f"not applied: {refused.reason}; try again",
                retry_after_s=refused.retry_after_s,
            )
        try:
            return await run_in_threadpool(apply_manifest_text, who, utf8_text(body))
        finally:
            limits.done(tenant)

    def apply_manifest_text(who: Caller, text: str) -> dict[str, Any]:
        """Parse (off the event loop: a manifest can be slow to read) and apply, all or nothing:
        every check of every document before anything is stored."""
        # nothing stored on an error; a document naming no tenant is the caller's tenant's
        read = read_objects(
            text,
            source="body",
            default_tenant=who.tenant or "default",
            max_values=service.settings.max_manifest_nodes,
            bound="max_manifest_nodes",
        )
        noted = {id(r.obj): list(r.warnings) for r in read}  # how each document is written
        objects = [r.obj for r in read]
        for o in objects:
            if not who.may_see(o.tenant):
                raise HTTPException(
                    403, f"the manifest names tenant {o.tenant!r}; your token is for {who.tenant!r}"
                )
        specs = [o for o in objects if isinstance(o, WorkloadSpec)]
        deployments = [o for o in objects if isinstance(o, DeploymentSpec)]
        if deployments:
            need("deployments")
        results = []
        # the tenants' own order first (no two applies of one tenant between its bound and its
        # workloads), then the server's lock for the checks, and again for each document: a big
        # manifest never holds the lock for long, so heartbeats, passes and other calls get it
        # in between (780 workloads took 2-3 s, longer than a node waits to fence)
        with tenant_order.held({o.tenant for o in objects}):
            with service.lock:
                # every document's bounds and what this server can run (images, mounts) before
                # anything is stored, each problem located in its document
                problems = Problems()
                for r in read:
                    match r.obj:
                        case WorkloadSpec() as w:
                            check = functools.partial(service.check_workload, w)
                        case DeploymentSpec() as d:
                            assert serving is not None
                            check = functools.partial(serving.deployments.check, d)
                    try:
                        check()
                    except InputError as e:
                        problems.found.extend((e.at(r.where) if r.where else e).errors)
                problems.raise_any()
                service.check_room(specs, deployments)
            # the new workloads of a manifest, a batch at a time, together: all known as waiting
            # before the first is tried, so small ones may share a new MIG instance
            together: dict[int, tuple[ApplyResult, Decision | None, list[Displacement]]] = {}
            with service.lock:
                fresh = [s for s in specs if service.stored_spec(s.tenant, s.name) is None]
            for start in range(0, len(fresh), NEW_AT_ONCE) if len(fresh) > 1 else ():
                batch = fresh[start : start + NEW_AT_ONCE]
                time.sleep(0)
                with service.lock:
                    if all(service.stored_spec(s.tenant, s.name) is None for s in batch):
                        with service.displacements() as told:
                            answers = service.apply_new_workloads(batch)
                        for i, (s, (what, decision)) in enumerate(zip(batch, answers, strict=True)):
                            together[id(s)] = (what, decision, told if i == 0 else [])
            for spec in specs:
                time.sleep(0)  # hand the lock to whoever waits for it
                if id(spec) in together:
                    what, decision, told = together[id(spec)]
                    before = None
                else:
                    with service.lock:
                        before = service.stored_spec(spec.tenant, spec.name)
                        with service.displacements() as told:
                            what, decision = service.apply_workload(spec)
                diff = (
                    spec_diff(before, spec_to_json(spec))
                    if before is not None and what in ("replaced", "updated")
                    else []
                )
                results.append(
                    {
                        "kind": "Workload",
                        "workload": f"{spec.tenant}/{spec.name}",
                        "result": what,
                        "decision": None
                        if decision is None
                        else decision_to_json(decision_seen_by(who, decision)),
                        "spec": spec_to_json(spec),
                        "diff": diff,
                        "warnings": noted[id(spec)] + service.warnings(spec, decision),
                        "displaced": displaced_seen_by(who, told),
                    }
                )
            for d in deployments:
                assert serving is not None
                with service.lock:
                    # a replica no GPU could ever hold: said now, not only later as an event
                    refusal = service.refusal(d.replica_spec(0, 0))
                    result = serving.deployments.apply_deployment(d)
                results.append(
                    {
                        "kind": "Deployment",
                        "deployment": d.key,
                        "result": result,
                        "decision": None,
                        "diff": [],
                        "url": serving.deployments.gateway_url + gateway_path(d),
                        "warnings": noted[id(d)]
                        + (
                            []
                            if refusal is None
                            else [f"its replicas fit on no node now: {refusal}"]
                        ),
                    }
                )
        service.wake()  # processes start on the next pass, right away
        if serving is not None and deployments:
            serving.wake()
        return {"results": results}

    add_deployment_routes(api, serving, caller, own)
    # /ui, and the history behind its plots
    add_dashboard_routes(api, service.history, caller, tokens_required=tokens is not None)

    @api.get("/api/v1/workloads", response_model=WorkloadList, responses=AUTH)
    def list_workloads(request: Request) -> dict[str, Any]:
        who = caller(request)
        with service.lock:
            return {
                "workloads": [shown(who, v) for v in service.workloads() if who.may_see(v.tenant)]
            }

    @api.get(
        "/api/v1/workloads/{tenant}/{name}",
        response_model=WorkloadDetail,
        responses={**ANY, **errors(404)},
    )
    def get_workload(request: Request, tenant: str, name: str) -> dict[str, Any]:
        who = own(request, tenant, name)
        with service.lock:
            v = service.workload(tenant, name)
            if v is None:
                raise HTTPException(404, f"no workload {tenant}/{name}")
            found = service.events(f"{tenant}/{name}", limit=50)
        return {**shown(who, v), "events": [event_seen_by(who, e) for e in found]}

    @api.delete(
        "/api/v1/workloads/{tenant}/{name}",
        response_model=Deleted,
        responses={**ANY, **errors(404)},
    )
    def delete_workload(request: Request, tenant: str, name: str) -> dict[str, Any]:
        own(request, tenant, name)
        with service.lock:
            if not service.delete_workload(tenant, name):
                raise HTTPException(404, f"no workload {tenant}/{name}")
        service.wake()
        return {"deleted": f"{tenant}/{name}"}

    @api.get(
        "/api/v1/workloads/{tenant}/{name}/logs",
        response_model=LogsAnswer,
        responses={**ANY, **errors(404, 429, 504)},
    )
    async def logs(
        request: Request, tenant: str, name: str, tail: int = Query(200, ge=0, le=10**7)
    ) -> Response:
        """The workload's output (on a cluster, relayed from the node it runs or ran on): its
        last ``tail`` lines (0: all) that fit the operator's ``log_relay_max``, ``truncated``
        where older ones were left out. Awaited on the event loop, never in the pool the other
        routes use; 429 (with Retry-After) over the reads under way per tenant or per node, 504
        where its node did not send them within ``log_relay_deadline`` (docs/cluster.md)."""
        own(request, tenant, name)
        found = await service.log_tail(tenant, name, tail)
        if found is None:
            raise HTTPException(404, f"no workload {tenant}/{name}")
        return logs_answer(found)

    @api.post(
        "/api/v1/workloads/{tenant}/{name}/clear-unknown",
        response_model=OutcomeCleared,
        responses={**ANY, **errors(403, 404, 409), **LACKING},
    )
    def clear_unknown(request: Request, tenant: str, name: str) -> dict[str, Any]:
        """An admin's word on a workload whose last attempt's outcome is unknown (its shim died
        without a record): it counts as a failed attempt, and its restart policy applies (until
        then, a job or an ``on-failure`` workload is not run again: it may have exited 0)."""
        if not caller(request).admin:
            raise HTTPException(403, "only the admin token may clear an unknown outcome")
        need("clear-unknown")
        found = service.clear_unknown(tenant, name)
        if found is None:
            raise HTTPException(404, f"no workload {tenant}/{name}")
        if not found:
            raise HTTPException(
                409, f"the outcome of {tenant}/{name}'s last attempt is not unknown"
            )
        service.wake()
        return {"cleared": f"{tenant}/{name}"}

    @api.post(
        "/api/v1/workloads/{tenant}/{name}/keepalive",
        response_model=KeptAlive,
        responses={**ANY, **errors(404), **LACKING},
    )
    def keepalive(request: Request, tenant: str, name: str) -> dict[str, Any]:
        """A Ray driver still uses its lease (gpufrac.ray); a lease not kept alive within its time
        to live is given back."""
        need("ray-leases")
        own(request, tenant, name, "lease")
        if not service.keep_alive(tenant, name):
            raise HTTPException(404, f"no lease {tenant}/{name}")
        return {"kept": f"{tenant}/{name}"}

    @api.get("/api/v1/events", response_model=EventList, responses={**ANY, **errors(403)})
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
            found = service.events(
                limit=limit, tenant=tenant if who.admin else who.tenant, after=after
            )
        return {"events": [event_seen_by(who, e) for e in found]}

    # -- nodes -----------------------------------------------------------------------------------

    @api.get("/api/v1/nodes", response_model=NodeList, responses=AUTH)
    def nodes(request: Request) -> dict[str, Any]:
        """The nodes (one machine's agent is its own), their state, labels and GPUs."""
        who = caller(request)
        return {"nodes": [node_shown(who, n) for n in service.nodes()]}

    @api.post(
        "/api/v1/nodes/{name}/{verdict}",
        response_model=NodeJudged,
        responses={**ADMIN_GPU, **errors(501)},
    )
    def judge_node(
        request: Request,
        name: str,
        verdict: Verdict,
        gpus: int | None = Query(None, ge=0, le=4096),
    ) -> dict[str, Any]:
        """An admin's word on a node that joined with the cluster token: ``approve`` it (with at
        most ``gpus`` of the GPUs it declares), ``deny`` it, or ``revoke`` it (forgotten: it may
        ask again). A pending node gets no work, secret or traffic until approved."""
        who = caller(request)
        if not who.admin:
            raise HTTPException(403, "only the admin token may admit nodes")
        need("node-admission")
        if gpus is not None and verdict != "approve":
            raise InputError(
                f"gpus goes with approve, not {verdict}", field="gpus", fix="leave it out"
            )
        now = service.judge_node(name, verdict, gpus)
        return {
            "node": name,
            "verdict": verdict,
            "now": None if now is None else node_shown(who, now),
        }

    @api.get("/api/v1/nodes/{name}", response_model=NodeDetail, responses={**ANY, **errors(404)})
    def get_node(request: Request, name: str) -> dict[str, Any]:
        """One node, with the workloads on it (those the caller may see) and its own events
        (joined, lost, fenced, a GPU's)."""
        who = caller(request)
        found = next((n for n in service.nodes() if n.name == name), None)
        if found is None:
            raise HTTPException(404, f"no node {name}")
        with service.lock:
            placed = sorted(
                v.key for v in service.workloads() if v.node == name and who.may_see(v.tenant)
            )
            said = service.events(name, limit=50) if who.admin else []
        return {
            **node_shown(who, found),
            "workloads": placed,
            "events": [event_seen_by(who, e) for e in said],
        }

    # -- GPUs ------------------------------------------------------------------------------------

    @api.get("/api/v1/gpus", response_model=GpuList, responses=AUTH)
    def gpus(request: Request) -> dict[str, Any]:
        """Each GPU (on a cluster, of every node) with the workloads placed on it (per MIG
        instance), what they reserved and use, and its cordon; another tenant's workloads are
        anonymous reserved shares."""
        who = caller(request)
        with service.lock:
            return {"gpus": service.gpus(who)}

    @api.post("/api/v1/gpus/{gpu:path}/cordon", response_model=Cordoned, responses=ADMIN_GPU)
    def cordon(request: Request, gpu: str) -> dict[str, Any]:
        admin_only(request)
        with service.lock:
            uuid = gpu_named(gpu)
            service.cordon(uuid)
        return {"cordoned": uuid}

    @api.post("/api/v1/gpus/{gpu:path}/uncordon", response_model=Uncordoned, responses=ADMIN_GPU)
    def uncordon(request: Request, gpu: str) -> dict[str, Any]:
        admin_only(request)
        with service.lock:
            uuid = gpu_named(gpu)
            placed = service.uncordon(uuid)
        service.wake()
        return {"uncordoned": uuid, "placed": [d.workload for d in placed if d.outcome == "placed"]}

    @api.post("/api/v1/gpus/{gpu:path}/drain", response_model=Drained, responses=ADMIN_GPU)
    def drain(request: Request, gpu: str) -> dict[str, Any]:
        admin_only(request)
        with service.lock:
            uuid = gpu_named(gpu)
            with service.displacements() as told:
                moved = service.drain(uuid)
        service.wake()
        return {
            "drained": uuid,
            "decisions": [decision_to_json(d) for d in moved],
            "displaced": displaced_seen_by(ADMIN, told),
        }

    @api.post(
        "/api/v1/gpus/{gpu:path}/mig",
        response_model=MigChanged,
        responses={**ADMIN_GPU, **BODY, **errors(409), **LACKING},
        openapi_extra=json_body(MigBody),
    )
    async def mig(request: Request, gpu: str) -> dict[str, Any]:
        """Body: {"mig_enabled": bool, "instances": [{"profile", "start"}], "drain": bool,
        "allow_mode_change": bool, "pin": bool, "dry_run": bool}. A GPU already as asked is left
        alone ("unchanged"); with ``pin`` (the default) the layout is kept as set until released.
        Refused with a 409 (nothing changed) when not allowed. With ``dry_run`` every check is
        made, refusals included, and the actions are listed ("planned"); nothing changes."""
        need("mig-layouts")
        admin_only(request)
        body = await read_body(
            request, MigBody, example='{"mig_enabled": true, "instances": [...]}'
        )
        # each profile name read as a GPU instance profile (the layout's rules: when it is applied)
        layout = layout_from_json([i.model_dump() for i in body.instances], field="instances")
        return await run_in_threadpool(set_layout, gpu, body, list(layout))

    def set_layout(gpu: str, body: MigBody, layout: Any) -> dict[str, Any]:
        with service.lock, service.displacements() as told:
            uuid = gpu_named(gpu)
            done, pinned = service.set_mig_layout(
                uuid,
                body.mig_enabled,
                layout,
                drain=body.drain,
                allow_mode_change=body.allow_mode_change,
                pin=body.pin,
                dry_run=body.dry_run,
            )
        if body.dry_run:
            result = "planned" if done else "unchanged"
        else:
            service.wake()
            result = "changed" if done else "unchanged"
        return {
            "gpu": uuid,
            "result": result,
            "pinned": pinned,
            "actions": [a.to_json() for a in done],
            "displaced": displaced_seen_by(ADMIN, told),
        }

    @api.delete(
        "/api/v1/gpus/{gpu:path}/mig/pin",
        response_model=MigReleased,
        responses={**ADMIN_GPU, **LACKING},
    )
    def release_mig(request: Request, gpu: str) -> dict[str, Any]:
        """Let the scheduler re-cut this GPU's MIG layout for waiting workloads again."""
        need("mig-layouts")
        admin_only(request)
        with service.lock:
            uuid = gpu_named(gpu)
            placed = service.release_mig_pin(uuid)
        service.wake()
        return {"released": uuid, "placed": [d.workload for d in placed if d.outcome == "placed"]}

    return api
