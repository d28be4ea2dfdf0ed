"""The API's FastAPI app: the user API (``api.user_api``, the same on one machine and on a cluster)
behind the guard (the token before the body, a bounded body). ``gpufrac agent`` serves it over one
machine's agent (``runtime.service.AgentService``, with ``serving.agent_deployments``), and
``gpufrac control`` over a cluster's control plane, which adds its nodes' own routes
(``cluster.control_api``).
The OpenAPI description is at ``/openapi.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import Match

from gpufrac import __version__
from gpufrac.api.control_service import ControlService
from gpufrac.api.deployments_api import DeploymentsService
from gpufrac.api.guard import DEFAULT_MAX_BODY, Guard
from gpufrac.api.tokens import Caller
from gpufrac.api.user_api import add_user_api


class Loop(Protocol):
    """What runs beside the API while it serves (the agent's reconcile loop)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def create_app(
    service: ControlService,
    serving: DeploymentsService | None = None,
    *,
    loop: Loop | None = None,
    tokens: dict[str, Caller] | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    title: str = "gpufrac agent",
    own_auth: tuple[str, ...] = (),
    own_check: Callable[[str, str], bool] | None = None,
) -> FastAPI:
    """``serving``: the deployments (None: their routes answer 501); ``loop``: started with the
    app and stopped with it; ``own_auth``/``own_check``: paths whose calls carry a token of their
    own, and how the guard checks it (a cluster's node calls)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        if loop is not None:
            loop.start()
        yield
        if loop is not None:
            loop.stop()

    app = FastAPI(title=title, version=__version__, lifespan=lifespan)
    app.add_middleware(  # the token, then a bounded body
        Guard, tokens=tokens, max_body=max_body, own_auth=own_auth, own_check=own_check
    )
    add_user_api(app, service, serving, tokens=tokens)
    app.add_exception_handler(405, _method_not_allowed)
    return app


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


async def _method_not_allowed(request: Request, exc: Exception) -> Response:
    """A method a path does not take: 405 with ``Allow`` naming every method the path takes, as
    ``/openapi.json`` lists them (Starlette names only those of the first route whose path
    matches: ``Allow: POST`` for ``/api/v1/workloads``, whose GET is another route)."""
    allowed = [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL
            for route in request.app.router.routes
        )
    ]
    return JSONResponse(
        {"detail": "Method Not Allowed"},
        status_code=405,
        headers={"Allow": ", ".join(allowed)},
    )
