"""A node agent's own small API, for the control plane only (with this node's own credential,
which only the control plane and this node hold): the output of the workloads it runs, which the
control plane relays to ``gpufrac logs``."""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI, HTTPException, Query, Request

from gpufrac.runtime.agent import Agent


def create_node_app(agent: Agent, credential: Callable[[], str | None]) -> FastAPI:
    """``credential``: this node's own, as its last join left it (None before its first)."""
    app = FastAPI(title="gpufrac node", version="1", openapi_url=None, docs_url=None)

    @app.get("/cluster/v1/logs/{tenant}/{name}")
    def logs(
        request: Request, tenant: str, name: str, tail: int = Query(200, ge=0, le=10**7)
    ) -> dict[str, object]:
        held = credential()
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        if (
            held is None
            or scheme.lower() != "bearer"
            or not hmac.compare_digest(given.strip().encode(), held.encode())
        ):
            raise HTTPException(401, "only the control plane reads this node's logs")
        with agent.lock:
            found = agent.log_tail(tenant, name, tail)
        run, lines = found if found is not None else (None, [])
        return {"run": run, "lines": lines}

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
