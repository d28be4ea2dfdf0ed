"""The little of HTTP/1.1 the gateway and the replica server need, on asyncio protocols.

No framework sits on the request path: a request head is split on CRLF once, headers are kept as
raw lines, and a body is read by ``Content-Length`` (request bodies must have one; ``chunked`` request
bodies are answered 411). Responses may be ``Content-Length`` or ``chunked``; the gateway passes either
through as it arrives. Connections are kept alive unless either side says ``Connection: close``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_HEAD = 64 * 1024
REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Request:
    method: str
    target: str
    headers: list[bytes]  # raw header lines, without CRLF
    body: bytes
    keep_alive: bool


def parse_request(buf: bytearray, max_body: int) -> tuple[Request, int] | None:
    """A complete request at the start of ``buf`` and its length, or None if more bytes are needed."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > MAX_HEAD:
            raise HttpError(431, "request head too large")
        return None
    lines = bytes(buf[:end]).split(b"\r\n")
    try:
        method, target, version = lines[0].decode("latin-1").split(" ")
    except ValueError:
        raise HttpError(400, "malformed request line") from None
    length = 0
    keep_alive = version == "HTTP/1.1"
    headers = lines[1:]
    for line in headers:
        name, _, value = line.partition(b":")
        lname = name.strip().lower()
        if lname == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                raise HttpError(400, "bad Content-Length") from None
        elif lname == b"transfer-encoding" and b"chunked" in value.lower():
            raise HttpError(411, "a request body needs Content-Length")
        elif lname == b"connection":
            v = value.strip().lower()
            keep_alive = v == b"keep-alive" if not keep_alive else v != b"close"
    if length > max_body:
        raise HttpError(413, f"request body over {max_body} bytes")
    total = end + 4 + length
    if len(buf) < total:
        return None
    return Request(method, target, headers, bytes(buf[end + 4 : total]), keep_alive), total


def response(
    status: int,
    body: bytes,
    *,
    content_type: bytes = b"application/json",
    extra: list[bytes] | None = None,
    keep_alive: bool = True,
) -> bytes:
    head = [
        f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}".encode(),
        b"Content-Type: " + content_type,
        b"Content-Length: " + str(len(body)).encode(),
    ]
    if not keep_alive:
        head.append(b"Connection: close")
    head += extra or []
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def json_response(status: int, value: Any, **kw: Any) -> bytes:
    return response(status, json.dumps(value).encode(), **kw)


def error_response(status: int, message: str, **kw: Any) -> bytes:
    return json_response(status, {"error": message}, **kw)
