"""The little of HTTP/1.1 the gateway and the replica server need, on asyncio protocols.

No framework sits on the request path: a request head is split on CRLF once, headers are kept as
raw lines, and a body is read by ``Content-Length`` (request bodies must have one; ``chunked`` request
bodies are answered 411). Responses may be ``Content-Length`` or ``chunked``; the gateway passes either
through as it arrives. Connections are kept alive unless either side says ``Connection: close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Awaitable
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
    seen_length = False
    keep_alive = version == "HTTP/1.1"
    headers = lines[1:]
    for line in headers:
        name, _, value = line.partition(b":")
        lname = name.strip().lower()
        if lname == b"content-length":
            v = value.strip()
            if not v.isdigit() or (seen_length and int(v) != length):
                raise HttpError(400, "bad Content-Length: give one length, in digits")
            length, seen_length = int(v), True
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


_tasks: set[asyncio.Future[None]] = set()


def keep_task(task: asyncio.Future[None]) -> None:
    """Hold a reference to a task until it is done (the event loop keeps only weak ones)."""
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


class HttpConnection(asyncio.Protocol):
    """One server-side connection: requests are read from the stream and answered in order, one at
    a time. A subclass answers in ``handle``: at once (it writes, and returns None), or later (it
    returns an awaitable, run as a task; an exception there is answered 500 and closes)."""

    max_body = 64 * 2**20

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.answered = False  # some of the current answer has been written
        self._continued = False
        self._task: asyncio.Task[None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._reading_paused = False

    def handle(self, req: Request) -> Awaitable[None] | None:
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._writable.set()  # a writer waiting in drain() wakes up and finds the client gone
        if self._task is not None:
            self._task.cancel()  # the client went away: its slot and its replica are let go

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def drain(self) -> None:
        """Wait while the client reads slower than the answer comes (flow control)."""
        await self._writable.wait()
        if self.transport is None:
            raise ConnectionError("the client went away")

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next()
        elif len(self.buf) > MAX_HEAD + self.max_body and self.transport is not None:
            self.transport.pause_reading()  # a pipelining client waits until this answer is out
            self._reading_paused = True

    def _next(self) -> None:
        while self.transport is not None and not self.busy:
            try:
                parsed = parse_request(self.buf, self.max_body)
            except HttpError as e:
                self.transport.write(error_response(e.status, str(e), keep_alive=False))
                self.close()
                return
            if parsed is None:
                self._continue()
                return
            req, used = parsed
            self._continued = False
            self.answered = False
            del self.buf[:used]
            later = self.handle(req)
            if later is not None:
                self.busy = True
                task = asyncio.ensure_future(later)
                self._task = task
                keep_task(task)
                task.add_done_callback(self._done)

    def _continue(self) -> None:
        """A client that sent ``Expect: 100-continue`` waits for this before sending its body."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self._continued or self.transport is None:
            return
        if b"\r\nexpect:100-continue" in bytes(self.buf[:end]).lower().replace(b" ", b""):
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._continued = True

    def _done(self, task: asyncio.Task[None]) -> None:
        self._task = None
        self.busy = False
        if self._reading_paused and self.transport is not None:
            self.transport.resume_reading()
            self._reading_paused = False
        if not task.cancelled() and task.exception() is not None and self.transport is not None:
            if not self.answered:
                self.transport.write(error_response(500, "internal error", keep_alive=False))
            self.close()
        self._next()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.answered = True
            self.transport.write(data)

    def send(self, data: bytes, req: Request) -> None:
        """A whole answer; the connection closes after it if the request asked so. A HEAD request
        gets the head alone."""
        if req.method == "HEAD":
            data = data[: data.find(b"\r\n\r\n") + 4]
        self.write(data)
        if not req.keep_alive:
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
