"""The web dashboard at ``/ui`` (the agent's own page: ``api/ui/``, package data) and the history
behind its plots, ``GET /api/v1/history``.

The page is static: its script calls the API with the token the user typed (kept in the tab's
``sessionStorage``, sent as ``Authorization: Bearer``; no cookies), so what it shows is what the API
lets that token see. Its Content-Security-Policy lets it load and call nothing but this agent.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import RedirectResponse, Response

from gpufrac.api.openapi import errors
from gpufrac.api.schemas import HistoryAnswer

if TYPE_CHECKING:
    from gpufrac.model.caller import Caller
    from gpufrac.runtime.history import History

# the page's files, and their types; OPEN_PATHS in api/guard.py lets them load without a token
UI_FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


@cache
def ui_file(name: str) -> bytes:
    return resources.files("gpufrac.api").joinpath("ui", name).read_bytes()


def add_dashboard_routes(
    app: APIRouter,
    history: History,
    caller: Callable[[Request], Caller],
    *,
    tokens_required: bool,
) -> None:
    """``history``: what the plots show (one machine's, or a cluster's); ``tokens_required``: the
    page asks for a token before it calls the API."""
    auth = b'content="token"' if tokens_required else b'content="none"'

    def page(name: str) -> Response:
        if name not in UI_FILES:
            raise HTTPException(404, f"no file {name} in the dashboard")
        body = ui_file(name)
        if name == "index.html":
            body = body.replace(
                b'<meta name="gpufrac-auth" content="none">',
                b'<meta name="gpufrac-auth" ' + auth + b">",
            )
        return Response(body, media_type=UI_FILES[name], headers=HEADERS)

    @app.get("/ui", include_in_schema=False)
    def dashboard() -> Response:
        return page("index.html")

    @app.get("/ui/", include_in_schema=False)
    def dashboard_slash() -> RedirectResponse:
        return RedirectResponse("/ui")

    @app.get("/ui/{name}", include_in_schema=False)
    def dashboard_file(name: str) -> Response:
        return page(name)

    @app.get(
        "/api/v1/history",
        response_model=HistoryAnswer,
        responses=errors(401, 422),
        operation_id="history_api_v1_history_get",  # as before the handler was renamed
    )
    def history_samples(
        request: Request,
        since: float | None = Query(None, description="only samples taken after this time (s)"),
    ) -> dict[str, Any]:
        """The last 15 minutes, sampled every few seconds: per GPU memory used, utilization and
        memory reserved; per MIG instance and per workload what it uses (a tenant: its own); per
        deployment rate, latency, queue and replicas; ``times`` are seconds since the epoch, and
        every series has one value (or null) per time."""
        return history.view(caller(request), since)
