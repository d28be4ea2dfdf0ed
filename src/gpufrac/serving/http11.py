"""The HTTP/1.1 server side the gateway and the replica server need, on asyncio protocols, with
requests parsed by httptools (llhttp, the parser uvicorn uses).

Strict on purpose, because the gateway forwards requests to servers that may parse differently: an
obs-folded header line, a bare CR or LF, whitespace before a colon, a header name that is not a
token, a repeated or conflicting ``Content-Length``, ``Content-Length`` with ``Transfer-Encoding``,
or any ``Transfer-Encoding`` but ``chunked`` is answered 400 and the connection closed. A request is
kept as parsed (method, target, header pairs, the whole body), never as the bytes it came in, so
what goes on is written from those parts.

Bounds: a head must arrive within ``head_timeout`` of its first byte and a whole request within
``request_timeout``; a keep-alive connection idle for ``idle_timeout`` is closed; a head over
``MAX_HEAD`` bytes is 431, a body over ``max_body`` is 413, and request bodies held by all
connections of a server together may not pass its ``BodyBudget`` (503). Responses may be
``Content-Length`` or ``chunked``. Connections are kept alive unless either side says ``Connection:
close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import math
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, assert_never, cast

import httptools

# the header with the key a replica knows its gateway by (gateway.py adds it, replica.py checks it)
KEY_HEADER = b"x-gpufrac-replica-key"
MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
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
    headers: list[tuple[bytes, bytes]]  # as parsed: (name, value), in order
    body: bytes
    keep_alive: bool
    # the answer ``admit`` gave once the head was read (status, why): the body was not kept
    refused: tuple[int, str] | None = None

    def header(self, name: bytes) -> bytes | None:
        """The value of the first header called ``name`` (lower case), if any."""
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None


class BodyBudget:
    """Request bytes held by all connections of one server together, up to ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.released = 0  # bytes given back since the owner last reset it (to 0)

    def take(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        n = min(n, self.held)
        self.held -= n
        self.released += n


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


def spent_parser() -> httptools.HttpRequestParser:
    """A parser with no callbacks, for a connection that is gone: its own parser holds the
    connection's methods (a cycle only the garbage collector would break), this one nothing."""
    return httptools.HttpRequestParser(None)


_tasks: set[asyncio.Future[None]] = set()


def keep_task(task: asyncio.Future[None]) -> None:
    """Hold a reference to a task until it is done (the event loop keeps only weak ones)."""
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (on the gateway's data path it measured 1.3-1.5x
    asyncio's), else None: asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run(main)`` on uvloop's loop where it is installed."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main)


class _Wait(enum.Enum):
    """What a connection's deadline is for."""

    IDLE = "idle"  # between requests: closed quietly
    HEAD = "head"  # a request head has begun: 408
    WHOLE = "whole"  # the head is in, the body is not: 408


_CHECKED = frozenset((b"transfer-encoding", b"content-length", b"expect"))


class HttpConnection(asyncio.Protocol):
    """One server-side connection: requests are parsed as they arrive and answered in order, one at
    a time. A subclass answers in ``handle``: at once (it writes, and returns None), or later: it
    returns a coroutine (run as a task; an exception there is answered 500 and closes) or a future
    it completes itself when the answer is out (no task at all)."""

    max_body = 64 * 2**20
    head_timeout = 10.0
    request_timeout = 60.0
    idle_timeout = 75.0
    budget: BodyBudget | None = None  # shared by the server's connections, if set
    max_connections = 4096  # open at once per server process; one more is answered 503 and closed
    open_connections = 0

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Request] = deque()  # parsed, not answered yet (pipelining)
        self.busy = False
        self.answered = False  # some of the current answer has been written
        self._task: asyncio.Future[None] | None = None
        self._current: Request | None = None  # the request whose handler runs
        self._writable = asyncio.Event()
        self._writable.set()
        self._reading_paused = False
        # one timer per connection, moved lazily: the deadline changes a few times per request,
        # the timer only when it would fire too late (see _arm)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._deadline = math.inf
        self._deadline_for = _Wait.IDLE
        # the request being parsed
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_size = 0
        self._body: list[bytes] = []
        self._size = 0
        self._held = 0  # bytes taken from the budget for requests not answered yet
        self._counted = False  # counted in open_connections
        self._head_done = False  # the head is read: header lines now are chunked trailers
        self._refused: tuple[int, str] | None = None  # admit's answer for the request parsed

    def handle(self, req: Request) -> Awaitable[None] | None:
        raise NotImplementedError

    def admit(self, target: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:
        """Whether the request whose head this is may be taken, before its body is read: None, or
        the answer (status, why) it gets instead; its body is then read and dropped, never held
        (an unauthenticated client holds none of the server's body budget)."""
        return None

    # -- connection -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods
        self.transport = tr = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()
        sock = tr.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cls = type(self)
        cls.open_connections += 1
        self._counted = True
        if cls.open_connections > cls.max_connections:  # descriptors are not for the taking
            tr.write(response(503, b"", extra=[b"Retry-After: 1"], keep_alive=False))
            tr.close()
            return
        # a new connection has no more time than a head does to start its first request
        self._arm(self.head_timeout, _Wait.IDLE)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            type(self).open_connections -= 1
            self._counted = False
        self.transport = None
        self._stop_timer()
        self._give_back()
        # let go of the body being read and the requests not answered, and of the parser: it holds
        # this connection's methods, a cycle that only the garbage collector would break, keeping
        # up to a whole body of a client that went away alive until its next full collection
        self._body = []
        self._size = 0
        self.queue.clear()
        self.parser = spent_parser()
        self._writable.set()  # a writer waiting in drain() wakes up and finds the client gone
        if self._task is not None:
            self._task.cancel()  # the client went away: its slot and its replica are let go

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    @property
    def writable(self) -> bool:
        """Whether the client takes what is written (false while its buffer is over the mark)."""
        return self._writable.is_set()

    async def drain(self) -> None:
        """Wait while the client reads slower than the answer comes (flow control)."""
        await self._writable.wait()
        if self.transport is None:
            raise ConnectionError("the client went away")

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:  # raised in a callback of ours
            inner = e.__context__
            status = inner.status if isinstance(inner, HttpError) else 400
            self._refuse(status, str(inner or e))
            return
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not supported")
            return
        except httptools.HttpParserError as e:
            self._refuse(400, f"malformed request: {e}")
            return
        queue = self.queue
        if queue:
            if len(queue) > 1 and self.transport is not None and not self._reading_paused:
                self.transport.pause_reading()  # a pipelining client waits until it is answered
                self._reading_paused = True
            self._next()

    # -- parser callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url, self._headers, self._head_size, self._body, self._size = b"", [], 0, [], 0
        self._head_done, self._refused = False, None
        self._arm(self.head_timeout, _Wait.HEAD)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if self._head_size > MAX_HEAD:
            raise HttpError(431, "request head too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_done:
            return  # a chunked body's trailer: not a header, checked by nobody, passed on never
        headers = self._headers
        headers.append((name, value))
        self._head_size += len(name) + len(value)
        if self._head_size > MAX_HEAD:
            raise HttpError(431, "request head too large")
        if len(headers) > MAX_HEADERS:
            raise HttpError(431, f"more than {MAX_HEADERS} header lines")

    def on_headers_complete(self) -> None:
        self._head_done = True
        if self.parser.get_http_version() not in ("1.0", "1.1"):
            # llhttp reads "GET /a<LF>..." as an HTTP/0.9 line ended by the bare LF inside the
            # target: never forwarded (what follows it would pass as headers)
            raise HttpError(
                400,
                "the request line has no HTTP/1.x version (a bare LF or CR inside the request "
                "target?): send METHOD TARGET HTTP/1.1 with the target percent-encoded",
            )
        self._refused = self.admit(self._url, self._headers)
        self._arm(self.request_timeout, _Wait.WHOLE)
        te = 0
        expect = False
        for k, v in self._headers:  # one pass, for the few headers the framing depends on
            k = k.lower()
            if k not in _CHECKED:
                continue
            if k == b"transfer-encoding":
                te += 1
                if te > 1 or v.strip().lower() != b"chunked":
                    raise HttpError(400, "Transfer-Encoding other than chunked")
            elif k == b"content-length":
                if int(v) > self.max_body:  # llhttp refuses a second, different one
                    raise HttpError(413, f"request body over {self.max_body} bytes")
            elif not expect:  # the first Expect
                expect = True
                # a refused client is not invited to send its body
                if v.lower() == b"100-continue" and self.transport and self._refused is None:
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self.max_body:
            raise HttpError(413, f"request body over {self.max_body} bytes")
        if self._refused is not None:
            return  # read and dropped
        if self.budget is not None:
            if not self.budget.take(len(body)):
                raise HttpError(503, "the server holds too many request bodies; try again")
            self._held += len(body)
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._deadline = math.inf  # answering: the handler has its own timeouts
        body = self._body
        self._body = []  # the request holds the body now; the connection does not
        self.queue.append(
            Request(
                self.parser.get_method().decode("latin-1"),
                self._url.decode("latin-1"),
                self._headers,
                body[0] if len(body) == 1 else b"".join(body),
                self.parser.should_keep_alive(),
                self._refused,
            )
        )

    # -- answering ------------------------------------------------------------------------------

    def _next(self) -> None:
        while self.transport is not None and not self.busy and self.queue:
            req = self.queue.popleft()
            self.answered = False
            if req.refused is not None:
                status, why = req.refused
                extra = [b"Retry-After: 1"] if status == 503 else []
                self.send(error_response(status, why, extra=extra), req)
                continue
            later = self.handle(req)
            if later is not None:
                self.busy = True
                self._current = req
                if isinstance(later, asyncio.Future):
                    fut = later  # completed by the subclass's own callbacks: no task
                else:
                    fut = asyncio.ensure_future(later)
                    keep_task(fut)
                self._task = fut
                fut.add_done_callback(self._done)
            elif req.body:
                self._give_back(len(req.body))
        if not self.busy and not self.queue and self.transport is not None:
            if self._reading_paused:
                self.transport.resume_reading()
                self._reading_paused = False
            if self._deadline == math.inf:  # no request head begun meanwhile
                self._arm(self.idle_timeout, _Wait.IDLE)

    def _done(self, task: asyncio.Future[None]) -> None:
        self._task = None
        self.busy = False
        if self._current is not None:
            if self._current.body:
                self._give_back(len(self._current.body))
            self._current = None
        if not task.cancelled() and task.exception() is not None and self.transport is not None:
            if not self.answered:
                self.transport.write(error_response(500, "internal error", keep_alive=False))
            self.close()
        self._next()

    def _give_back(self, n: int | None = None) -> None:
        """Return ``n`` bytes (all: the connection is gone) to the server's budget."""
        n = self._held if n is None else max(0, min(n, self._held))
        if self.budget is not None and n:
            self.budget.give(n)
        self._held -= n

    def _arm(self, seconds: float, what: _Wait) -> None:
        """In ``seconds``: close, with a 408 if a request had begun (``what``). Only the deadline
        moves; the timer is moved only when it would fire after it (a timer that fires early finds
        the deadline later and waits again)."""
        assert self._loop is not None
        self._deadline = deadline = self._loop.time() + seconds
        self._deadline_for = what
        if self._timer_at > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(deadline, self._expire)
            self._timer_at = deadline

    def _stop_timer(self) -> None:
        self._deadline = math.inf
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = math.inf

    def _expire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        if self.transport is None or self._deadline == math.inf:
            return
        assert self._loop is not None
        if self._loop.time() < self._deadline:  # moved later meanwhile: wait for it
            self._timer = self._loop.call_at(self._deadline, self._expire)
            self._timer_at = self._deadline
            return
        self._deadline = math.inf
        if self.busy or self.queue:
            return  # answering: the handler has its own timeouts
        match self._deadline_for:
            case _Wait.IDLE:
                pass
            case _Wait.HEAD:
                self.write(
                    error_response(408, "the request head did not arrive in time", keep_alive=False)
                )
            case _Wait.WHOLE:
                self.write(
                    error_response(408, "the request did not arrive in time", keep_alive=False)
                )
            case other:
                assert_never(other)
        self.close()

    def _refuse(self, status: int, message: str) -> None:
        if self.transport is not None:
            self.transport.write(error_response(status, message, keep_alive=False))
        self.queue.clear()
        self.close()

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
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()
            self.transport = None
