"""A node agent's own small API, for the control plane only (with this node's own credential,
which only the control plane and this node hold): the output of the workloads it runs, which the
control plane relays to ``gpufrac logs``.

``GET /cluster/v1/logs/TENANT/NAME?tail=N&max_bytes=B`` answers the end of the workload's newest
log as it is written (``text/plain``), read from the end of the file: at most ``B`` bytes and at
most this node's own ``log_relay_max``, starting where a line starts, holding its last ``N`` lines
(0: all; maybe a few more), with ``X-Gpufrac-Run`` (its run's name; absent before a first run) and
``X-Gpufrac-Truncated`` (``true``: the cap left out lines that were asked for). Raw bytes, not
JSON: what the control plane reads is the log's size, never more, so it can refuse a node that
sends more than it asked for.

``GET /cluster/v1/metrics`` answers this node's series (its GPUs with DCGM's names and labels,
``Hostname`` its node name; its workloads), in Prometheus's text format, for the control plane to
relay on its own ``/metrics`` with a ``node`` label (``cluster.metrics_relay``).
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Sequence

import uvicorn
from fastapi import FastAPI, HTTPException, Query, Request, Response
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from gpufrac.runtime.agent import Agent, WorkloadState
from gpufrac.runtime.log_tail import MIB, read_window
from gpufrac.runtime.metrics import AgentCollector

RUN_HEADER = "x-gpufrac-run"
TRUNCATED_HEADER = "x-gpufrac-truncated"
LOG_TYPE = "text/plain; charset=utf-8"


def create_node_app(
    agent: Agent,
    credential: Callable[[], str | None],
    states: Callable[[], Sequence[WorkloadState]] = lambda: (),
) -> FastAPI:
    """``credential``: this node's own, as its last join left it (None before its first);
    ``states``: its workloads as its last reconcile pass saw them."""
    app = FastAPI(title="gpufrac node", version="1", openapi_url=None, docs_url=None)
    own_cap = agent.settings.log_relay_max_mib * MIB
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent, lambda: {s.key: s for s in states()}))

    def check(request: Request, what: str) -> None:
        held = credential()
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        if (
            held is None
            or scheme.lower() != "bearer"
            or not hmac.compare_digest(given.strip().encode(), held.encode())
        ):
            raise HTTPException(401, f"only the control plane reads this node's {what}")

    @app.get("/cluster/v1/metrics")
    def metrics(request: Request) -> Response:
        check(request, "metrics")
        with agent.lock:
            body = generate_latest(registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/cluster/v1/logs/{tenant}/{name}")
    def logs(
        request: Request,
        tenant: str,
        name: str,
        tail: int = Query(200, ge=0, le=10**7),
        max_bytes: int | None = Query(None, ge=1, le=2**40),
    ) -> Response:
        check(request, "logs")
        with agent.lock:  # where the log is; read without the lock
            found = agent.newest_log(tenant, name)
        run, path = found if found is not None else (None, None)
        window, truncated = (
            (b"", False)
            if path is None
            else read_window(path, tail=tail, max_bytes=min(max_bytes or own_cap, own_cap))
        )
        headers = {TRUNCATED_HEADER: "true" if truncated else "false"}
        if run is not None:
            headers[RUN_HEADER] = run
        return Response(window, media_type=LOG_TYPE, headers=headers)

    return app


def serve_in_thread(
    app: FastAPI, host: str, port: int, *, name: str = "gpufrac-node-api"
) -> tuple[uvicorn.Server, int]:
    """Serve ``app`` on a daemon thread of its own (its own event loop), with the head timeout of
    the users' API; returns the server and the port it listens on (``port`` 0: a free one). A port
    that cannot be bound raises ``OSError`` here, in the caller."""
    import socket

    from gpufrac.api.head_timeout import HeadTimeoutProtocol

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", http=HeadTimeoutProtocol))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=name).start()
    return server, bound
