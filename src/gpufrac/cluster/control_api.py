"""The control plane's HTTP APIs, on two listeners:

* the users' API (``create_control_app``), the very routes one machine's agent serves
  (``api.user_api`` over ``cluster.control_service``), so the CLI works against a cluster unchanged;
* the node protocol (``create_node_listener_app``), on a port of its own (``gpufrac control
  --node-port``), its own thread, event loop and worker threads, so that no user request can delay
  a heartbeat: ``/cluster/v1/nodes/NAME/join`` and ``.../heartbeat``, the node agents' calls. A
  join carries the cluster token (``Authorization: Bearer TOKEN``, compared in constant time) and,
  from a node that has one, its own credential (``X-Gpufrac-Node-Credential``); the answer gives a
  new node its credential, and a name whose lease a live node holds is refused (409) without it.
  Heartbeats carry the node's credential only: the cluster token alone speaks for no node. The
  users' port answers node calls 404, naming the node port.

A node reads its workloads' logs for the control plane on its own small API (``cluster.node_api``).
"""

from __future__ import annotations

import asyncio
import hmac
import re
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, HTTPException, Request
from pydantic import ValidationError

from gpufrac.api.app import create_app
from gpufrac.api.guard import Guard
from gpufrac.api.tokens import Caller
from gpufrac.api.user_api import problem_answer
from gpufrac.cluster.control import ControlPlane, NodeDenied, NodeRefused
from gpufrac.cluster.control_service import ControlPlaneService
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
from gpufrac.runtime.history import History

NODE_PATHS = "/cluster/v1/"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_BODY = 4 * 1024 * 1024  # a node's heartbeat: its views of every workload, its GPUs, events
T = TypeVar("T")


def create_control_app(
    control: ControlPlane,
    *,
    tokens: dict[str, Caller] | None = None,
    serving: ClusterServing | None = None,
    history: History | None = None,
    node_port: int | None = None,
) -> FastAPI:
    """The users' API of a cluster. ``serving``: the cluster's deployments and their gateway (None:
    deployments refused); ``history``: the dashboard's samples (its sampler started by the caller;
    by default one that is never started, so the plots stay empty); ``node_port``: where the node
    listener is, said to a node that calls here."""
    app = create_app(
        ControlPlaneService(control, serving, history),
        serving,
        tokens=tokens,
        max_body=control.settings.api_max_body_mib << 20,
        title="gpufrac control plane",
        own_auth=(NODE_PATHS,),
        own_check=lambda _path, _authorization: True,  # answered below, with no body read
    )
    where = f"port {node_port}" if node_port is not None else "its node port"

    @app.api_route(NODE_PATHS + "{rest:path}", methods=["GET", "POST"], include_in_schema=False)
    def misdirected(rest: str) -> None:
        raise HTTPException(
            404,
            f"node calls go to this control plane's node listener ({where}), not to the users' "
            "API: gpufrac node --control http://HOST:NODE_PORT (docs/cluster.md)",
        )

    return app


HEARTBEAT_WORKERS = 4  # threads that work out heartbeats' answers: the node listener's own


def create_node_listener_app(control: ControlPlane, *, cluster_token: str) -> FastAPI:
    """The node protocol, served on its own listener (``serve_node_listener``): its own event
    loop and threads, so no user request (a big manifest, a slow log relay, a crowd of calls)
    delays a heartbeat. A heartbeat is noted as heard the moment its body is read (``heard``),
    before it waits for the control plane's lock."""
    from concurrent.futures import ThreadPoolExecutor

    expected = f"bearer {cluster_token}".encode()
    pool = ThreadPoolExecutor(HEARTBEAT_WORKERS, thread_name_prefix="gpufrac-heartbeats")

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

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        yield
        pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="gpufrac node listener", openapi_url=None, docs_url=None, lifespan=lifespan)
    app.add_middleware(
        Guard, tokens=None, max_body=MAX_BODY, own_auth=(NODE_PATHS,), own_check=node_authorized
    )
    app.add_exception_handler(InputError, lambda _r, e: problem_answer(e))

    async def in_pool(fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

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

    @app.post(NODE_PATHS + "nodes/{name}/join")
    async def join(request: Request, name: str) -> dict[str, Any]:
        node_call(request)
        body = _read(JoinBody, await request.body())
        if not DNS_LABEL.fullmatch(name):
            raise InputError(f"{name!r} is not a node name", field="name", fix="use a DNS label")
        gpus = [gpu_from_wire(g) for g in body.gpus]
        presented = request.headers.get(CREDENTIAL_HEADER)
        try:
            credential = await in_pool(
                control.admitted_join,
                name,
                presented,
                body.labels,
                gpus,
                body.address,
                body.version,
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
        control.heard(name)
        body = _read(HeartbeatBody, await request.body())
        gpus = None if body.gpus is None else [g.model_dump(by_alias=True) for g in body.gpus]
        answer = await in_pool(
            control.heartbeat,
            name,
            report_from_wire(body),
            body.views,
            gpus,
            events_from_wire(body),
        )
        return answer_to_wire(answer)

    return app


def _read(model: type[Any], body: bytes) -> Any:
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InputError(first["msg"], field=where, fix="send what gpufrac node sends") from None
