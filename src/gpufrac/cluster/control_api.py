"""The control plane's HTTP API: the nodes' calls, and the users' API in the same shapes as one
machine's agent (``api/schemas.py``), so the CLI works against a cluster unchanged.

* ``/cluster/v1/nodes/NAME/join`` and ``.../heartbeat``: the node agents' calls. A join carries the
  cluster token (``Authorization: Bearer TOKEN``, compared in constant time) and, from a node that
  has one, its own credential (``X-Gpufrac-Node-Credential``); the answer gives a new node its
  credential, and a name whose lease a live node holds is refused (409) without it. Heartbeats
  carry the node's credential only: the cluster token alone speaks for no node.
* ``/api/v1/...``: apply (manifest text, workloads only), list, get and delete workloads; the GPUs
  of every node as their node agents show them (``get gpus``), with the node; the nodes; events;
  whoami; health. With ``tokens.yaml`` in the data directory a tenant's token sees its own
  workloads only, and other tenants' shares of a GPU without their names, as on one machine.
"""

from __future__ import annotations

import hmac
import re
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, Response
from prometheus_client.exposition import choose_encoder
from pydantic import ValidationError

from gpufrac.api.app import check_workload_caps, problem_answer
from gpufrac.api.dashboard import add_dashboard_routes
from gpufrac.api.deployments_api import add_deployment_routes
from gpufrac.api.guard import Guard
from gpufrac.api.history import History
from gpufrac.api.seen_by import (
    decision_seen_by,
    displaced_seen_by,
    event_seen_by,
    placement_seen_by,
    shown_text,
)
from gpufrac.api.tokens import Caller, authenticate
from gpufrac.cluster.control import ControlPlane, NodeDenied, NodeRefused, static_qos
from gpufrac.cluster.history import ClusterSampler
from gpufrac.cluster.metrics import control_registry
from gpufrac.cluster.serving import ClusterServing
from gpufrac.cluster.wire import (
    CREDENTIAL_HEADER,
    AnswerBody,
    HeartbeatBody,
    JoinBody,
    answer_to_wire,
    events_from_wire,
    gpu_from_wire,
    report_from_wire,
)
from gpufrac.errors import InputError
from gpufrac.model.deployment import DeploymentSpec, shown_spec
from gpufrac.model.manifest import read_objects
from gpufrac.model.workload import WorkloadSpec, spec_diff, spec_from_json, spec_to_json
from gpufrac.planning.sched_decision import decision_to_json
from gpufrac.serving.deployments import gateway_path

NODE_PATHS = "/cluster/v1/"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_BODY = 4 * 1024 * 1024


def create_control_app(
    control: ControlPlane,
    *,
    cluster_token: str,
    tokens: dict[str, Caller] | None = None,
    serving: ClusterServing | None = None,
    history: History | None = None,
) -> FastAPI:
    """``serving``: the cluster's deployments and their gateway (None: deployments refused);
    ``history``: the dashboard's samples (its sampler started by the caller; by default one that
    is never started, so the plots stay empty)."""
    app = FastAPI(title="gpufrac control plane", version="1")
    app.add_exception_handler(InputError, lambda _r, e: problem_answer(e))
    expected = f"bearer {cluster_token}".encode()

    def node_authorized(path: str, authorization: str) -> bool:
        """Before a node call's body is read: a join carries the cluster token, a heartbeat its
        node's credential (each handler checks again)."""
        parts = path[len(NODE_PATHS) :].split("/")
        scheme, _, rest = authorization.strip().partition(" ")
        if len(parts) != 3 or parts[0] != "nodes" or scheme.lower() != "bearer":
            return False
        if parts[2] == "join":
            return hmac.compare_digest(b"bearer " + rest.strip().encode(), expected)
        return parts[2] == "heartbeat" and control.credential_ok(parts[1], rest.strip())

    app.add_middleware(
        Guard,
        tokens=tokens,
        max_body=MAX_BODY,
        own_auth=(NODE_PATHS,),
        own_check=node_authorized,
    )

    def node_call(request: Request) -> None:
        given = request.headers.get("authorization", "").strip().encode()
        scheme, _, rest = given.partition(b" ")
        if not hmac.compare_digest(scheme.lower() + b" " + rest.strip(), expected):
            raise HTTPException(401, "a node needs the cluster token (Authorization: Bearer ...)")

    def node_itself(request: Request, name: str) -> None:
        """The call is node ``name``'s own: its credential, which its join gave it."""
        scheme, _, rest = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not control.credential_ok(name, rest.strip()):
            raise HTTPException(
                401, f"node {name} calls with its own credential (from its join): join again"
            )

    def caller(request: Request) -> Caller:
        found = authenticate(tokens, request.headers.get("authorization", ""))
        if found is None:
            raise HTTPException(401, "a valid API token is needed (Authorization: Bearer TOKEN)")
        return found

    # -- the nodes' calls ------------------------------------------------------------------------

    @app.post(NODE_PATHS + "nodes/{name}/join")
    async def join(request: Request, name: str) -> dict[str, Any]:
        node_call(request)
        body = _read(JoinBody, await request.body())
        if not DNS_LABEL.fullmatch(name):
            raise InputError(f"{name!r} is not a node name", field="name", fix="use a DNS label")
        gpus = [gpu_from_wire(g) for g in body.gpus]
        presented = request.headers.get(CREDENTIAL_HEADER)
        try:
            credential = await run_in_threadpool(
                control.admitted_join, name, presented, body.labels, gpus, body.address
            )
        except NodeRefused as e:
            raise HTTPException(409, str(e)) from None
        except NodeDenied as e:
            raise HTTPException(403, str(e)) from None
        except ValueError as e:
            raise InputError(
                str(e), field="gpus", fix="list each GPU once, the same as when it joined before"
            ) from None
        # null: keep the credential it presented
        return {"joined": name, "lease_s": control.core.lease_s, "credential": credential}

    @app.post(NODE_PATHS + "nodes/{name}/heartbeat", response_model=AnswerBody)
    async def heartbeat(request: Request, name: str) -> AnswerBody:
        node_itself(request, name)
        body = _read(HeartbeatBody, await request.body())
        gpus = None if body.gpus is None else [g.model_dump(by_alias=True) for g in body.gpus]
        answer = await run_in_threadpool(
            control.heartbeat,
            name,
            report_from_wire(body),
            body.views,
            gpus,
            events_from_wire(body),
        )
        return answer_to_wire(answer)

    # -- the users' API --------------------------------------------------------------------------

    @app.get("/api/v1/health")
    def health() -> dict[str, Any]:
        nodes = control.nodes()
        return {
            "status": "ok",
            "role": "control-plane",
            "nodes": len(nodes),
            "nodes_alive": sum(1 for n in nodes if n.state == "alive"),
        }

    @app.get("/api/v1/whoami")
    def whoami(request: Request) -> dict[str, Any]:
        who = caller(request)
        return {"tenant": who.tenant, "admin": who.admin}

    @app.get("/api/v1/nodes")
    def nodes(request: Request) -> dict[str, Any]:
        who = caller(request)
        return {
            "nodes": [
                {
                    "name": n.name,
                    "state": n.state,
                    "labels": n.labels,
                    "gpus": n.gpus,
                    "address": n.address if who.admin else None,
                    "last_heartbeat_s": round(n.seen_s_ago, 3),
                }
                for n in control.nodes()
            ]
        }

    @app.post("/api/v1/workloads")
    @app.post("/api/v1/deployments")  # the same manifest endpoint, as on one machine
    async def apply(request: Request) -> dict[str, Any]:
        who = caller(request)
        text = (await request.body()).decode("utf-8", "replace")
        return await run_in_threadpool(apply_text, who, text)

    def apply_text(who: Caller, text: str) -> dict[str, Any]:
        read = read_objects(text, source="body", default_tenant=who.tenant or "default")
        noted = {id(r.obj): list(r.warnings) for r in read}  # how each document is written
        objects = [r.obj for r in read]
        for o in objects:
            if isinstance(o, DeploymentSpec) and serving is None:
                raise InputError(
                    "this control plane serves no deployments",
                    field="kind",
                    fix="apply the Deployment to a control plane started by gpufrac control",
                )
            if not who.may_see(o.tenant):
                raise HTTPException(
                    403, f"the manifest names tenant {o.tenant!r}; your token is for {who.tenant!r}"
                )
        specs = [o for o in objects if isinstance(o, WorkloadSpec)]
        deployments = [o for o in objects if isinstance(o, DeploymentSpec)]
        results: list[dict[str, Any]] = []
        # one lock for the whole manifest: its checks and what it stores (no two applies between
        # a tenant's bound and its workloads); every check before anything is stored
        with control.lock:
            check_workload_caps(control.store, control.settings, specs, deployments)
            for d in deployments:
                assert serving is not None
                serving.deployments.check(d)
            for spec in specs:
                before = control.store.workload(spec.tenant, spec.name)
                with control.displacements() as told:
                    what, decision = control.apply(spec)
                diff = (
                    spec_diff(before.spec, spec_to_json(spec))
                    if before and what == "replaced"
                    else []
                )
                results.append(
                    {
                        "kind": "Workload",
                        "workload": f"{spec.tenant}/{spec.name}",
                        "result": what,
                        "decision": decision_to_json(decision_seen_by(who, decision)),
                        "spec": spec_to_json(spec),
                        "diff": diff,
                        "warnings": noted[id(spec)],
                        "displaced": displaced_seen_by(who, told),
                    }
                )
            for d in deployments:
                assert serving is not None
                # a replica no node could ever hold: said now, not only later as an event
                refusal = control.core.scheduler.refusal(d.replica_spec(0, 0))
                results.append(
                    {
                        "kind": "Deployment",
                        "deployment": d.key,
                        "result": serving.deployments.apply(d),
                        "decision": None,
                        "diff": [],
                        "url": serving.deployments.gateway_url + gateway_path(d),
                        "warnings": noted[id(d)]
                        + (
                            []
                            if refusal is None or not control.core.nodes
                            else [f"its replicas fit on no node now: {refusal}"]
                        ),
                    }
                )
        if serving is not None and deployments:
            serving.wake()
        return {"results": results}

    def view(who: Caller, tenant: str, name: str) -> dict[str, Any]:
        stored = control.store.workload(tenant, name)
        if stored is None:
            raise HTTPException(404, f"no workload {tenant}/{name}")
        key = f"{tenant}/{name}"
        spec = spec_from_json(stored.spec)
        a = control.core.assigned.get(key)
        phase, reason, node_view = control.status(key)
        placed = control.store.placement(tenant, name)
        restarts, evictions = control.counts(key, node_view)
        cause = control.core.scheduler.pending.causes.get(key) if phase == "pending" else None
        return {
            "tenant": tenant,
            "name": name,
            "generation": stored.generation,
            "spec": shown_spec(stored.spec),
            "phase": phase,
            "reason": shown_text(who, reason, [cause]),
            "attempts": node_view.get("attempts", 0),
            "restarts": restarts,
            "evictions": evictions,
            "exit_code": node_view.get("exit_code"),
            "env": node_view.get("env", {}),
            "placement": None if placed is None else placement_seen_by(who, placed),
            "qos": node_view.get("qos") or static_qos(spec, control.settings),
            "node": a.node if a is not None else control.core.ended_on.get(key),
        }

    @app.get("/api/v1/workloads")
    def list_workloads(request: Request) -> dict[str, Any]:
        who = caller(request)
        with control.lock:
            return {
                "workloads": [
                    view(who, w.tenant, w.name)
                    for w in control.store.workloads()
                    if who.may_see(w.tenant)
                ]
            }

    @app.get("/api/v1/workloads/{tenant}/{name}")
    def get_workload(request: Request, tenant: str, name: str) -> dict[str, Any]:
        who = caller(request)
        if not who.may_see(tenant):
            raise HTTPException(404, f"no workload {tenant}/{name}")
        with control.lock:
            out = view(who, tenant, name)
            out["events"] = [
                event_seen_by(who, e) for e in control.store.events(f"{tenant}/{name}", limit=50)
            ]
            return out

    @app.delete("/api/v1/workloads/{tenant}/{name}")
    def delete_workload(request: Request, tenant: str, name: str) -> dict[str, Any]:
        who = caller(request)
        if not who.may_see(tenant) or not control.delete(tenant, name):
            raise HTTPException(404, f"no workload {tenant}/{name}")
        return {"deleted": f"{tenant}/{name}"}

    @app.get("/api/v1/workloads/{tenant}/{name}/logs")
    def logs(
        request: Request, tenant: str, name: str, tail: int = Query(200, ge=0, le=10**7)
    ) -> dict[str, Any]:
        """The workload's output, from the node it runs (or ran) on."""
        who = caller(request)
        key = f"{tenant}/{name}"
        with control.lock:
            if not who.may_see(tenant) or control.store.workload(tenant, name) is None:
                raise HTTPException(404, f"no workload {key}")
            a = control.core.assigned.get(key)
            node = a.node if a is not None else control.core.ended_on.get(key)
            address = control.addresses.get(node) if node else None
            credential = control.credentials.get(node) if node else None
        if node is None:
            return {"run": None, "lines": []}
        if address is None or credential is None:
            raise HTTPException(503, f"node {node} has given no address to read logs from")
        try:
            r = httpx.get(
                f"{address}/cluster/v1/logs/{tenant}/{name}",
                params={"tail": tail},
                headers={"authorization": f"Bearer {credential}"},  # the node's own
                timeout=5.0,
            )
        except httpx.HTTPError as e:
            raise HTTPException(503, f"node {node} does not answer ({e}); try again") from None
        if r.status_code != 200:
            raise HTTPException(503, f"node {node} answered {r.status_code}; try again")
        found: dict[str, Any] = r.json()
        return found

    @app.post("/api/v1/workloads/{tenant}/{name}/keepalive")
    def keepalive(request: Request, tenant: str, name: str) -> dict[str, Any]:
        """A Ray driver still uses its lease (gpufrac.ray); a lease not kept alive within its time
        to live is given back."""
        who = caller(request)
        if not who.may_see(tenant) or not control.keep_alive(tenant, name):
            raise HTTPException(404, f"no lease {tenant}/{name}")
        return {"kept": f"{tenant}/{name}"}

    def own(request: Request, tenant: str, name: str) -> Caller:
        """A tenant sees only its own deployments: another's look like they do not exist."""
        who = caller(request)
        if not who.may_see(tenant):
            raise HTTPException(404, f"no deployment {tenant}/{name}")
        return who

    if serving is not None:
        add_deployment_routes(app, serving, caller, own)
    add_dashboard_routes(
        app,
        history or History(ClusterSampler(control, serving).read),
        caller,
        tokens_required=tokens is not None,
    )

    registry = control_registry(control)

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics(request: Request) -> Response:
        if not caller(request).admin:
            raise HTTPException(403, "only the admin token may read the metrics")
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(registry), media_type=content_type)

    @app.get("/api/v1/gpus")
    def gpus(request: Request) -> dict[str, Any]:
        who = caller(request)
        with control.lock:
            out = []
            for node, shown in sorted(control.gpu_views.items()):
                for g in shown:  # known here, as in decisions, by node and UUID
                    uuid = f"{node}/{g['uuid']}"
                    cordon = control.core.cordoned.get(uuid) or g.get("cordoned")
                    out.append(
                        _gpu_seen_by(who, {**g, "node": node, "uuid": uuid, "cordoned": cordon})
                    )
            return {"gpus": out}

    def gpu_named(gpu: str) -> str:
        """``NODE/UUID`` or ``NODE/INDEX`` (the index its node shows, as ``get gpus`` does) to the
        GPU's name here (``NODE/UUID``)."""
        node, _, rest = gpu.partition("/")
        with control.lock:
            known = control.core.scheduler.state.by_uuid
            if gpu in known:
                return gpu
            if re.fullmatch(r"[0-9]{1,4}", rest):  # ASCII digits only
                for g in control.gpu_views.get(node, []):
                    # among the GPUs its node joined with (a heartbeat may show others)
                    if g.get("index") == int(rest) and f"{node}/{g.get('uuid')}" in known:
                        return f"{node}/{g['uuid']}"
        raise HTTPException(
            404, f"no GPU {gpu}: name one as NODE/INDEX or NODE/UUID, as get gpus shows them"
        )

    def admin_only(request: Request) -> None:
        if not caller(request).admin:
            raise HTTPException(403, "only the admin token may change GPUs")

    @app.post("/api/v1/gpus/{gpu:path}/cordon")
    def cordon(request: Request, gpu: str) -> dict[str, Any]:
        admin_only(request)
        uuid = gpu_named(gpu)
        control.cordon(uuid)
        return {"cordoned": uuid}

    @app.post("/api/v1/gpus/{gpu:path}/uncordon")
    def uncordon(request: Request, gpu: str) -> dict[str, Any]:
        admin_only(request)
        uuid = gpu_named(gpu)
        placed = control.uncordon(uuid)
        return {"uncordoned": uuid, "placed": [d.workload for d in placed if d.outcome == "placed"]}

    @app.post("/api/v1/gpus/{gpu:path}/drain")
    def drain(request: Request, gpu: str) -> dict[str, Any]:
        admin_only(request)
        uuid = gpu_named(gpu)
        with control.lock, control.displacements() as told:
            moved = control.drain(uuid)
        return {
            "drained": uuid,
            "decisions": [decision_to_json(d) for d in moved],
            "displaced": displaced_seen_by(caller(request), told),
        }

    @app.get("/api/v1/events")
    def events(
        request: Request,
        limit: int = Query(100, ge=1, le=10_000),
        after: int | None = Query(None, ge=0, le=2**63 - 1),
        tenant: str | None = Query(None),
    ) -> dict[str, Any]:
        """The control plane's newest events the caller may see (a tenant: its own workloads'),
        oldest first; ``after`` and ``tenant`` as on one machine's agent."""
        who = caller(request)
        if tenant is not None and not who.may_see(tenant):
            raise HTTPException(403, f"your token is for tenant {who.tenant!r}, not {tenant!r}")
        found = control.store.events(
            limit=limit, tenant=tenant if who.admin else who.tenant, after=after
        )
        return {"events": [event_seen_by(who, e) for e in found]}

    @app.api_route("/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    def not_here(request: Request, rest: str) -> None:
        caller(request)
        raise HTTPException(
            404,
            f"/api/v1/{rest} is not available through the control plane (docs/cluster.md says "
            "what is)",
        )

    return app


def _read(model: type[Any], body: bytes) -> Any:
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InputError(first["msg"], field=where, fix="send what gpufrac node sends") from None


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
