"""An upstream for the gateway tests: answers every request with what it received (path, headers,
body) as JSON. Run by uvicorn with either of its HTTP parsers (h11 or httptools)."""

from __future__ import annotations

import json
from typing import Any


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    out = json.dumps(
        {
            "path": scope["path"],
            "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
            "body": body.decode("latin-1"),
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(out)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": out})
