"""What every request to the agent passes before any handler works on it (an ASGI middleware).

With tokens configured, a request without a valid token is answered 401 before its body is read
(only the health check, the API's own description and the dashboard's static page are open). A body
over the limit is answered 413: at once when its Content-Length says so, else as soon as the bytes
read pass the limit; the connection is then closed without reading the rest. A handler gets the body
already read, so no client can hold a handler (or the agent's lock) while it trickles bytes in.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gpufrac.api.tokens import Caller, authenticate
from gpufrac.model.numbers import is_digits

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset(
    {"/api/v1/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
    # the dashboard's static page (api/dashboard.py): it asks for a token and sends it from script
    | {"/ui", "/ui/", "/ui/index.html", "/ui/app.js", "/ui/style.css"}
)
DEFAULT_MAX_BODY = 1024 * 1024


class Guard:
    def __init__(
        self,
        app: App,
        *,
        tokens: dict[str, Caller] | None,
        max_body: int,
        own_auth: tuple[str, ...] = (),
        own_check: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.max_body = max_body
        # path prefixes whose calls carry a token of their own (a cluster's node calls), and how
        # to check it (path, Authorization) before the body is read: a refused caller sends none
        self.own_auth = own_auth
        self.own_check = own_check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if (
            scope["path"] not in OPEN_PATHS
            and not scope["path"].startswith(self.own_auth or ("\0",))
            and authenticate(self.tokens, headers.get("authorization", "")) is None
        ):
            await _answer(send, 401, "a valid API token is needed (Authorization: Bearer TOKEN)")
            return
        if (
            self.own_check is not None
            and scope["path"].startswith(self.own_auth or ("\0",))
            and not self.own_check(scope["path"], headers.get("authorization", ""))
        ):
            await _answer(send, 401, "not a node of this cluster (its token or credential)")
            return
        length = headers.get("content-length")
        if length is not None and (not is_digits(length) or int(length) > self.max_body):
            await _answer(send, 413 if is_digits(length) else 400, self._too_big(length))
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body:
                await _answer(send, 413, self._too_big(None))
                return
            more = message.get("more_body", False)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # after the body: wait for the client to go away

        await self.app(scope, replay, send)

    def _too_big(self, length: str | None) -> str:
        if length is not None and not is_digits(length):  # '²'.isdigit() is true
            return f"Content-Length {length!r} is not a number of bytes"
        return (
            f"the body is over the limit of {self.max_body:,} bytes"
            " (the operator's api_max_body setting; split the manifest into several requests)"
        )


async def _answer(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
