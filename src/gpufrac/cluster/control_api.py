"""The control plane's HTTP API: the users' API, the very routes one machine's agent serves
(``api.user_api`` over ``cluster.control_service``), so the CLI works against a cluster unchanged;
and beside it the node protocol, which is not part of the user API:

* ``/cluster/v1/nodes/NAME/join`` and ``.../heartbeat``: the node agents' calls. A join carries the
  cluster token (``Authorization: Bearer TOKEN``, compared in constant time) and, from a node that
  has one, its own credential (``X-Gpufrac-Node-Credential``); the answer gives a new node its
  credential, and a name whose lease a live node holds is refused (409) without it. Heartbeats
  carry the node's credential only: the cluster token alone speaks for no node.

A node reads its workloads' logs for the control plane on its own small API (``cluster.node_api``).
"""

from __future__ import annotations

import hmac
import re
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from gpufrac.api.app import create_app
from gpufrac.api.tokens import Caller
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

    app = create_app(
        ControlPlaneService(control, serving, history),
        serving,
        tokens=tokens,
        max_body=MAX_BODY,
        title="gpufrac control plane",
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

    # -- the nodes' calls ------------------------------------------------------------------------

    # the node protocol is not the user API: not in /openapi.json, which is the same on both
    @app.post(NODE_PATHS + "nodes/{name}/join", include_in_schema=False)
    async def join(request: Request, name: str) -> dict[str, Any]:
        node_call(request)
        body = _read(JoinBody, await request.body())
        if not DNS_LABEL.fullmatch(name):
            raise InputError(f"{name!r} is not a node name", field="name", fix="use a DNS label")
        gpus = [gpu_from_wire(g) for g in body.gpus]
        presented = request.headers.get(CREDENTIAL_HEADER)
        try:
            credential = await run_in_threadpool(
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

    @app.post(
        NODE_PATHS + "nodes/{name}/heartbeat", response_model=AnswerBody, include_in_schema=False
    )
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

    return app


def _read(model: type[Any], body: bytes) -> Any:
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InputError(first["msg"], field=where, fix="send what gpufrac node sends") from None
