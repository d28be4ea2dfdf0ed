"""The request gateway: ``/serve/{deployment}/...`` spread over the deployment's replicas.

A data path apart from the control API, in its own process (``python -m gpufrac.serving.gateway``),
built on asyncio protocols with no framework on the request path:

* **Routing**: least outstanding requests with power-of-two choices. Each replica has
  ``max_concurrency`` slots; its score is its outstanding requests weighted by how busy its GPU is
  (``busy``, 0..1, which the agent sends: SM utilization where NVML reports it).
* **Waiting**: when every slot is taken, a request waits in the deployment's FIFO queue (at most
  ``queue_limit``), and is woken when a slot frees or a replica is added, never by polling. Only a
  full queue is answered ``429`` with ``Retry-After``. With no replica at all (scaled to zero)
  requests wait the same way while one starts (``cold_start_timeout_s``).
* **Retries**: a connection that fails before any response byte arrived is tried once more on
  another replica (a stale keep-alive connection is first retried fresh on the same one); the failed
  replica is skipped for a second.
* **Streaming**: ``Content-Length`` and ``chunked`` responses pass through as they arrive.
* **Timeouts**: ``timeout_s`` per request upstream (``504`` past it); from clients, a request head
  within ``--head-timeout`` (10 s) and a whole request within ``--request-timeout`` (60 s) of its
  first byte (``408``), and an idle keep-alive connection closed after ``--idle-timeout`` (75 s).
* **Bounds**: a body of at most 64 MiB (``413``), and 256 MiB of request bodies held by all
  connections together (``503`` past it).
* **Strict HTTP**: requests are parsed by httptools (docs in ``http11``): ambiguous framing is
  refused, and what goes to a replica is written from the parsed parts; a replica's answer is parsed
  too, and its connection is pooled again only after exactly one complete answer.

The agent configures it over its own end of a socket pair (``--admin-fd``): ``C {json}`` sets a
deployment's replicas, limits, tenant and ``public``, ``X name`` removes one, ``A {"tokens": ...}``
sets the API tokens (their SHA-256, mapped to a tenant; a deployment that is not public answers only
its tenant's and the admin's tokens, and ``Authorization`` is not passed on), ``T`` answers the
statistics the autoscaler reads (in flight, queued, per replica outstanding, rate and p50 and p99
latency over the last window) and the counters the agent's ``/metrics`` shows (per replica answers
by status code and a latency histogram with fixed buckets, ``LATENCY_BUCKETS``; per deployment 429s,
retries, errors, cold starts and what the gateway answered itself). Counting a request is a few
integer increments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import signal
import socket
import sys
import time
from collections.abc import Awaitable
from typing import Any

import httptools

from gpufrac.serving.http11 import (
    REASONS,
    BodyBudget,
    HttpConnection,
    HttpError,
    Request,
    error_response,
)
from gpufrac.serving.routing import Replica, Route, Upstream

MAX_BODY = 64 * 2**20  # one request's body
TOTAL_BODIES = 256 * 2**20  # request bodies held by all connections together
DOWN_SECONDS = 1.0  # a replica that failed to answer is skipped this long
WINDOW_SECONDS = 10.0
# hop-by-hop headers, and Expect (the gateway already holds the whole body)
_HOP = (
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authorization",
    b"upgrade",
    b"te",
    b"expect",
)
# written by the gateway itself from what it parsed, never copied
_FRAMING = (b"content-length", b"transfer-encoding", b"trailer")
_NOT_FORWARDED = frozenset(_HOP + _FRAMING + (b"authorization",))
_NOT_RELAYED = frozenset(_HOP + _FRAMING)


ADMIN = ""  # the tenant a token of the admin maps to


class Gateway:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        # sha256 of each API token -> its tenant (ADMIN for the admin's); None: no tokens, all may
        # call
        self.tokens: dict[str, str] | None = None
        # False from the start of a gateway the agent commands until the agent has sent its tokens
        # and every deployment ("G"): meanwhile requests get a 503 to retry, never a 404 or an open
        # door
        self.settled = True

    def set_tokens(self, raw: dict[str, Any]) -> None:
        tokens = raw.get("tokens")
        self.tokens = None if tokens is None else {str(k): str(v) for k, v in tokens.items()}

    def caller(self, req: Request) -> str | None:
        """The tenant of the request's token (ADMIN for the admin's), or None without a valid
        one."""
        assert self.tokens is not None
        value = req.header(b"authorization") or b""
        if value[:7].lower() != b"bearer ":  # the scheme's name is case-insensitive
            return None
        return self.tokens.get(hashlib.sha256(value[7:].strip()).hexdigest())

    # -- configuration (from the agent) ---------------------------------------------------------

    def configure(self, raw: dict[str, Any]) -> None:
        """Set a deployment's replicas and limits; a bad message changes nothing."""
        name = str(raw["name"])
        wanted = {
            str(r["id"]): (
                str(r.get("host", "127.0.0.1")),
                int(r["port"]),
                float(r.get("busy", 0.0)),
            )
            for r in raw.get("replicas", [])
        }  # read whole before anything changes
        numbers = {
            k: float(raw[k])
            for k in ("max_concurrency", "queue_limit", "timeout_s", "cold_start_timeout_s")
            if k in raw
        }
        route = self.routes.setdefault(name, Route(name))
        route.tenant = str(raw.get("tenant", route.tenant))
        route.public = bool(raw.get("public", route.public))
        if "max_concurrency" in numbers:
            route.max_concurrency = max(1, int(numbers["max_concurrency"]))
        if "queue_limit" in numbers:
            route.queue_limit = max(0, int(numbers["queue_limit"]))  # 0: 429 once all are busy
        for key in ("timeout_s", "cold_start_timeout_s"):
            if key in numbers:
                setattr(route, key, numbers[key])
        for rid in [k for k in route.replicas if k not in wanted]:
            gone = route.replicas.pop(rid)
            gone.retired = True
            for conn in gone.idle:
                conn.close()  # in-flight requests on it finish on their own connections
            gone.idle.clear()
            if gone.outstanding:
                route.retiring[rid] = gone  # reported until its last request is answered
        for rid, (host, port, busy) in wanted.items():
            rep = route.replicas.get(rid)
            if rep is None or (rep.host, rep.port) != (host, port):
                rep = Replica(rid, host, port)
                route.replicas[rid] = rep
            rep.busy = busy
        route.wake()

    def remove(self, name: str) -> None:
        route = self.routes.pop(name, None)
        if route is None:
            return
        for rep in route.replicas.values():
            rep.retired = True
            for conn in rep.idle:
                conn.close()
            rep.idle.clear()
        for fut in route.waiters:
            if not fut.done():
                fut.set_exception(HttpError(404, f"deployment {name} was deleted"))

    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        out: dict[str, Any] = {}
        for name, route in self.routes.items():
            while route.done and route.done[0][0] < now - WINDOW_SECONDS:
                route.done.popleft()
            lat = sorted(s for _, s in route.done)
            out[name] = {
                "in_flight": sum(r.outstanding for r in route.replicas.values()),
                "queued": sum(1 for f in route.waiters if not f.done()),
                "rate": len(lat) / WINDOW_SECONDS,
                "p50_ms": lat[int(0.5 * (len(lat) - 1))] * 1000 if lat else None,
                "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1000 if lat else None,
                "rejected": route.rejected,
                "errors": route.errors,
                "retries": route.retries,
                "replicas": {
                    r.id: {"outstanding": r.outstanding, "served": r.served}
                    for r in route.replicas.values()
                },
                "retiring": {r.id: {"outstanding": r.outstanding} for r in route.retiring.values()},
                # counters since the gateway started, for the agent's /metrics
                "cold_starts": route.cold_starts,
                "codes": {str(c): n for c, n in route.codes.items()},
                "counts": {
                    r.id: r.counts() for r in (*route.retiring.values(), *route.replicas.values())
                },
            }
            for rid in [k for k, r in route.retiring.items() if r.outstanding <= 0]:
                del route.retiring[rid]
        return out

    # -- requests -------------------------------------------------------------------------------

    async def serve(self, client: _Client, req: Request) -> None:
        path = req.target
        if not path.startswith("/serve/"):
            client.send(error_response(404, "not found: use /serve/{deployment}/..."), req)
            return
        if not self.settled:
            client.send(
                error_response(
                    503, "the gateway is starting: try again", extra=[b"Retry-After: 1"]
                ),
                req,
            )
            return
        name, _, rest = path[7:].partition("/")
        route = self.routes.get(name)
        if self.tokens is not None and (route is None or not route.public):
            # without a valid token every name that is not public answers the same 401, so none
            # tells whether a private deployment of that name exists
            who = self.caller(req)
            if who is None:
                client.send(
                    error_response(
                        401, "a valid API token is needed (Authorization: Bearer TOKEN)"
                    ),
                    req,
                )
                return
            if route is not None and who not in (ADMIN, route.tenant):
                route = None  # another tenant's deployment looks like none at all
        if route is None:
            client.send(error_response(404, f"no deployment {name!r}"), req)
            return
        started = time.monotonic()
        try:
            replica = await self._slot(route)
        except HttpError as e:
            route.codes[e.status] = route.codes.get(e.status, 0) + 1
            extra = [b"Retry-After: 1"] if e.status == 429 else None
            client.send(error_response(e.status, str(e), extra=extra), req)
            return
        code = 0  # the status the client was answered with (0: none, it went away)
        try:
            # phase 1, up to the response head: retried once elsewhere, 504 past the timeout
            for attempt in range(2):
                try:
                    async with asyncio.timeout(route.timeout_s):  # cheaper than wait_for: no task
                        conn, answer = await self._request(req, replica, "/" + rest)
                    break
                except _NoResponse:
                    replica.down_until = time.monotonic() + DOWN_SECONDS
                    other = route.pick(time.monotonic(), avoid=replica) if attempt == 0 else None
                    if other is None:
                        raise
                    route.retries += 1
                    other.outstanding += 1
                    self._release(route, replica)
                    replica = other
            # phase 2, the body as it comes: a stall or a lost client just ends the connection
            code = answer.status
            await self._relay(client, req, replica, conn, answer, route.timeout_s)
            replica.served += 1
            now = time.monotonic()
            route.done.append((now, now - started))
        except _NoResponse:
            route.errors += 1
            code = 502
            client.send(error_response(502, "no replica answered"), req)
        except TimeoutError:
            route.errors += 1
            if client.answered:
                client.close()  # the answer had begun: it cannot turn into a 504 now
            else:
                code = 504
                client.send(error_response(504, f"no answer within {route.timeout_s:g}s"), req)
                client.close()
        except (
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            OSError,
            ValueError,
        ):
            route.errors += 1  # the reply broke off midway: the client sees its connection close
            code = code or 502
            client.close()
        finally:
            self._release(route, replica)
            if code:
                replica.observe(code, time.monotonic() - started)

    async def _slot(self, route: Route) -> Replica:
        r = route.pick(time.monotonic())
        if r is not None and not route.waiters:
            r.outstanding += 1
            return r
        if len(route.waiters) >= route.queue_limit:
            route.rejected += 1
            raise HttpError(429, f"deployment {route.name} is at capacity; its queue is full")
        if not route.replicas:
            route.cold_starts += 1  # waits while the autoscaler starts one
        fut: asyncio.Future[Replica] = asyncio.get_running_loop().create_future()
        route.waiters.append(fut)
        route.wake()
        limit = route.cold_start_timeout_s if not route.replicas else route.timeout_s
        try:
            return await asyncio.wait_for(asyncio.shield(fut), limit)
        except (TimeoutError, asyncio.CancelledError) as e:
            # gave up (or the client went away): a slot it was handed meanwhile goes back
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._release(route, fut.result())
            fut.cancel()
            with contextlib.suppress(ValueError):
                route.waiters.remove(fut)  # no longer counts against the queue limit
            if isinstance(e, asyncio.CancelledError):
                raise
            raise HttpError(503, f"no replica of {route.name} free within {limit:g}s") from None

    def _release(self, route: Route, replica: Replica) -> None:
        replica.outstanding -= 1
        route.wake()

    async def _request(
        self, req: Request, replica: Replica, path: str
    ) -> tuple[Upstream, _Response]:
        """Send the request, written afresh from its parsed parts, and read the final response
        head (interim 1xx heads are skipped)."""
        data = _request_bytes(req, path, keep_authorization=self.tokens is None)
        fresh = False
        while True:
            try:
                conn, fresh = await replica.connect(fresh)
            except OSError:
                raise _NoResponse from None
            answer = _Response(req.method == "HEAD")
            try:
                conn.writer.write(data)
                while not answer.head_done:
                    chunk = await conn.reader.read(65536)
                    if not chunk:
                        raise asyncio.IncompleteReadError(b"", None)
                    answer.feed(chunk)
                return conn, answer
            except (OSError, asyncio.IncompleteReadError):
                conn.close()
                if answer.seen:  # the answer had begun: not safe to send it again
                    raise ConnectionError("the replica's answer broke off") from None
                if fresh:
                    raise _NoResponse from None
                fresh = True  # a stale pooled connection: once more on a new one
            except BaseException:
                conn.close()  # timed out, cancelled or malformed: its state is unknown
                raise

    async def _relay(
        self,
        client: _Client,
        req: Request,
        replica: Replica,
        conn: Upstream,
        answer: _Response,
        idle_s: float,
    ) -> None:
        """Pass the response on as it arrives, with flow control toward the client."""
        try:
            keep = await self._relay_body(client, req, conn, answer, idle_s)
        except BaseException:
            conn.close()
            raise
        if keep and not replica.retired and len(replica.idle) < 64 and conn.clean():
            replica.idle.append(conn)
        else:
            conn.close()
        if not req.keep_alive:
            client.close()

    async def _relay_body(
        self, client: _Client, req: Request, conn: Upstream, answer: _Response, idle_s: float
    ) -> bool:
        """Returns whether the upstream connection may be reused: only after exactly one complete
        response that said nothing against it."""
        length = answer.header(b"content-length")
        chunked = answer.header(b"transfer-encoding") is not None
        out = [f"HTTP/1.1 {answer.status} {REASONS.get(answer.status, 'OK')}".encode()]
        out += _end_to_end(answer.headers, _NOT_RELAYED)
        if length is not None:
            out.append(b"Content-Length: " + length)
        elif chunked:
            out.append(b"Transfer-Encoding: chunked")
        if not req.keep_alive or (length is None and not chunked and not answer.bodiless):
            out.append(b"Connection: close")
        client.write(b"\r\n".join(out) + b"\r\n\r\n")
        if req.method == "HEAD":
            return False  # llhttp cannot be told the response has no body: never reused
        reader = conn.reader
        while True:
            for piece in answer.take():
                client.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            if answer.complete:
                break
            await client.drain()
            async with asyncio.timeout(idle_s):
                data = await reader.read(65536)
            if not data:
                if length is None and not chunked:  # the body ran to the end of the connection
                    client.close()
                    return False
                raise asyncio.IncompleteReadError(b"", None)
            answer.feed(data)
        if chunked:
            client.write(b"0\r\n\r\n")
        return answer.reusable


class _Response:
    """An upstream response as httptools parses it: the head, then body pieces as they come."""

    def __init__(self, head_only: bool) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.head_only = head_only
        self.headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.seen = False  # some byte of a response arrived (not safe to retry elsewhere)
        self.head_done = False
        self.complete = False
        self.messages = 0
        self.keep_alive = True
        self._pieces: list[bytes] = []

    @property
    def bodiless(self) -> bool:
        return self.status in (204, 304) or 100 <= self.status < 200

    @property
    def reusable(self) -> bool:
        return self.complete and self.messages == 1 and self.keep_alive

    def feed(self, data: bytes) -> None:
        self.seen = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            if (
                self.complete
            ):  # garbage after a whole answer: the answer stands, the connection goes
                self.messages += 1
                return
            raise ValueError(f"a malformed response from the replica: {e}") from None

    def take(self) -> list[bytes]:
        out, self._pieces = self._pieces, []
        return out

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n.lower() == name), None)

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.head_done:  # a second response after the first: never reuse this connection
            self.messages += 1
            self.complete = True
            return
        self.messages += 1
        self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head_done:
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.head_done:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # 100 Continue, 103 Early Hints: wait for the final head
            self.messages -= 1
            self.headers = []
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        self.head_done = True
        if self.head_only:
            self.complete = True

    def on_body(self, body: bytes) -> None:
        if self.head_done and self.messages == 1:
            self._pieces.append(body)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True


def _end_to_end(headers: list[tuple[bytes, bytes]], dropped: frozenset[bytes]) -> list[bytes]:
    """Header lines to pass on: all but ``dropped`` and those the message's ``Connection`` header
    names (hop-by-hop for this message alone, RFC 9110 7.6.1)."""
    named = {
        t.strip().lower() for n, v in headers if n.lower() == b"connection" for t in v.split(b",")
    } - {b"host"}
    return [
        n + b": " + v for n, v in headers if n.lower() not in dropped and n.lower() not in named
    ]


def _request_bytes(req: Request, path: str, *, keep_authorization: bool) -> bytes:
    """The request as sent to a replica: the request line, the headers as parsed but the
    hop-by-hop ones (and ``Authorization``, the caller's gpufrac token, where tokens are in use),
    and the whole body with its length."""
    dropped = _NOT_RELAYED if keep_authorization else _NOT_FORWARDED
    lines = [f"{req.method} {path} HTTP/1.1".encode()]
    lines += _end_to_end(req.headers, dropped)
    if req.body or req.method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(b"Content-Length: " + str(len(req.body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + req.body


class _NoResponse(Exception):
    """The replica gave no response byte (refused, reset, closed): safe to try another."""


class _Client(HttpConnection):
    """One client connection of the gateway."""

    max_body = MAX_BODY

    def __init__(self, gateway: Gateway) -> None:
        super().__init__()
        self.gateway = gateway

    def handle(self, req: Request) -> Awaitable[None]:
        return self.gateway.serve(self, req)


async def _admin(gateway: Gateway, fd: int, stop: asyncio.Event) -> None:
    reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=fd), limit=2**26)
    while line := await reader.readline():
        try:
            op, _, rest = line.decode().strip().partition(" ")
            if op == "C":
                gateway.configure(json.loads(rest))
                reply: Any = {}
            elif op == "X":
                gateway.remove(rest.strip())
                reply = {}
            elif op == "A":
                gateway.set_tokens(json.loads(rest))
                reply = {}
            elif op == "G":
                gateway.settled = True
                reply = {}
            elif op == "T":
                reply = gateway.stats()
            else:
                raise ValueError(f"unknown message {op!r}")
            writer.write(b"K " + json.dumps(reply).encode() + b"\n")
        except Exception as e:
            writer.write(b"E " + json.dumps({"error": str(e)}).encode() + b"\n")
        await writer.drain()
    stop.set()  # the agent is gone


async def run(
    host: str,
    port: int,
    admin_fd: int | None,
    routes: list[dict[str, Any]],
    total_bodies: int = TOTAL_BODIES,
) -> None:
    _Client.budget = BodyBudget(total_bodies)
    gateway = Gateway()
    gateway.settled = admin_fd is None  # commanded: not before the agent says so
    for raw in routes:
        gateway.configure(raw)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(gateway), host, port, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bound = server.sockets[0].getsockname()[1]
    print(f"ready {bound}", flush=True)
    admin = asyncio.ensure_future(_admin(gateway, admin_fd, stop)) if admin_fd is not None else None
    async with server:
        await stop.wait()
    if admin is not None:
        admin.cancel()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpufrac.serving.gateway")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8480)
    p.add_argument("--admin-fd", type=int)
    p.add_argument(
        "--route",
        action="append",
        default=[],
        help='a deployment as JSON: {"name": "m", "replicas": [{"id": "r1", "port": 9000}]}',
    )
    p.add_argument("--head-timeout", type=float, default=_Client.head_timeout)
    p.add_argument("--request-timeout", type=float, default=_Client.request_timeout)
    p.add_argument("--idle-timeout", type=float, default=_Client.idle_timeout)
    p.add_argument("--max-body", type=int, default=MAX_BODY, help="bytes of one request body")
    p.add_argument(
        "--total-bodies", type=int, default=TOTAL_BODIES, help="bytes of all request bodies held"
    )
    args = p.parse_args(argv)
    _Client.head_timeout = args.head_timeout
    _Client.request_timeout = args.request_timeout
    _Client.idle_timeout = args.idle_timeout
    _Client.max_body = args.max_body
    try:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    except ImportError:
        pass
    routes = [json.loads(r) for r in args.route]
    asyncio.run(run(args.host, args.port, args.admin_fd, routes, args.total_bodies))
    return 0


if __name__ == "__main__":
    sys.exit(main())
