"""The request gateway: ``/serve/{deployment}/...`` spread over the deployment's replicas.

A data path apart from the control API, in its own process (``python -m gpufrac.serving.gateway``),
built on asyncio protocols (on uvloop's loop where it is installed) with no framework on the request
path:

* **Data path**: a request with a free slot goes out on a pooled keep-alive connection as it is
  parsed, with no task of its own (one is made only to wait for a slot or to open a connection); its
  head is written from a plan worked out once per distinct sequence of header names (and the values
  of its ``Connection`` headers), and the answer is relayed from the upstream connection's parser
  callbacks: what one read from the replica brought goes to the client in one write, and reading
  from the replica pauses while the client's connection is full.

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
* **Timeouts**: ``timeout_s`` for the answer's head (``504`` past it), and again for each wait for
  more of its body while the client keeps up (the client's connection is closed); from clients, a
  request head within ``--head-timeout`` (10 s) and a whole request within ``--request-timeout``
  (60 s) of its first byte (``408``), and an idle keep-alive connection closed after
  ``--idle-timeout`` (75 s).
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
import math
import re
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httptools

from gpufrac.runtime.native_memory import NativeMemory
from gpufrac.serving.http11 import (
    KEY_HEADER,
    REASONS,
    BodyBudget,
    HttpConnection,
    HttpError,
    Request,
    error_response,
    keep_task,
)
from gpufrac.serving.http11 import run as run_loop
from gpufrac.serving.routing import Replica, Route

MAX_BODY = 64 * 2**20  # one request's body
TOTAL_BODIES = 256 * 2**20  # request bodies held by all connections together
DOWN_SECONDS = 1.0  # a replica that failed to answer is skipped this long
CONNECT_SECONDS = 3.0  # a connection to a replica not made within this: another replica
WINDOW_SECONDS = 10.0
TRIM_AFTER = 16 * 2**20  # bytes of request bodies let go before free memory is handed back
TRIM_CHECK_S = 1.0
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
# KEY_HEADER: the key a replica knows its gateway by (``serving.replica``): the gateway's to add,
# no client's
_NOT_FORWARDED = frozenset(_HOP + _FRAMING + (b"authorization", KEY_HEADER))
_NOT_RELAYED = frozenset(_HOP + _FRAMING + (KEY_HEADER,))


ADMIN = ""  # the tenant a token of the admin maps to


def _key_line(key: Any) -> bytes:
    """The header line that carries a replica's key (none: b""); a key is a URL-safe token."""
    if key is None or key == "":
        return b""
    text = str(key)
    if not re.fullmatch(r"[A-Za-z0-9_-]{16,128}", text):
        raise ValueError("a replica's key is 16 to 128 URL-safe characters")
    return b"X-Gpufrac-Replica-Key: " + text.encode() + b"\r\n"


def route_of(target: str) -> tuple[str, str]:
    """``/serve/NAME/REST?QUERY`` (or ``/serve/NAME?QUERY``) to the deployment's name and the
    target its replica gets (``/REST?QUERY``)."""
    tail = target[7:]
    slash, query = tail.find("/"), tail.find("?")
    cut = min((i for i in (slash, query) if i >= 0), default=len(tail))
    rest = tail[cut:]
    return tail[:cut], rest if rest.startswith("/") else "/" + rest


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
        # each replica's idle keep-alive connections (at most 64, the last used first)
        self.pools: dict[Replica, list[_Upstream]] = {}
        # the loop it serves on, where known (asyncio.get_running_loop() costs a getpid() call on
        # Python 3.11)
        self.loop: asyncio.AbstractEventLoop | None = None
        # refusals of requests that name no deployment the gateway has (404, 401 without a
        # token, 503 while it starts), by status: counted here, not under a name a client chose
        self.refused: dict[int, int] = {}

    def set_tokens(self, raw: dict[str, Any]) -> None:
        tokens = raw.get("tokens")
        self.tokens = None if tokens is None else {str(k): str(v) for k, v in tokens.items()}

    def caller(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """The tenant of the request's token (ADMIN for the admin's), or None without a valid
        one."""
        assert self.tokens is not None
        value = next((v for k, v in headers if k.lower() == b"authorization"), b"")
        if value[:7].lower() != b"bearer ":  # the scheme's name is case-insensitive
            return None
        return self.tokens.get(hashlib.sha256(value[7:].strip()).hexdigest())

    def refusal(self, target: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:
        """Why a request for ``target`` is not taken (status, why), or None: decided from its
        head alone, so a refused request's body is never held. Each refusal is counted once (a
        request is refused either when its head is read or when it is started, not both): under
        the deployment it names where the gateway has it, else in ``refused``."""
        if not target.startswith("/serve/"):
            return self._refuse(None, 404, "not found: use /serve/{deployment}/...")
        if not self.settled:
            return self._refuse(None, 503, "the gateway is starting: try again")
        name = route_of(target)[0]
        named = route = self.routes.get(name)
        if self.tokens is not None and (route is None or not route.public):
            # without a valid token every name that is not public answers the same 401, so none
            # tells whether a private deployment of that name exists
            who = self.caller(headers)
            if who is None:
                why = "a valid API token is needed (Authorization: Bearer TOKEN)"
                return self._refuse(named, 401, why)
            if route is not None and who not in (ADMIN, route.tenant):
                route = None  # another tenant's deployment looks like none at all
        if route is None:
            return self._refuse(named, 404, f"no deployment {name!r}")
        return None

    def _refuse(self, route: Route | None, status: int, why: str) -> tuple[int, str]:
        counts = self.refused if route is None else route.codes
        counts[status] = counts.get(status, 0) + 1
        return status, why

    # -- configuration (from the agent) ---------------------------------------------------------

    def configure(self, raw: dict[str, Any]) -> None:
        """Set a deployment's replicas and limits; a bad message changes nothing."""
        name = str(raw["name"])
        wanted = {
            str(r["id"]): (
                str(r.get("host", "127.0.0.1")),
                int(r["port"]),
                float(r.get("busy", 0.0)),
                _key_line(r.get("key")),
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
        for field_name in ("timeout_s", "cold_start_timeout_s"):
            if field_name in numbers:
                setattr(route, field_name, numbers[field_name])
        for rid in [k for k in route.replicas if k not in wanted]:
            gone = route.replicas.pop(rid)
            self._retire(gone)  # in-flight requests on it finish on their own connections
            if gone.outstanding:
                route.retiring[rid] = gone  # reported until its last request is answered
        for rid, (host, port, busy, key) in wanted.items():
            rep = route.replicas.get(rid)
            if rep is None or (rep.host, rep.port, rep.key) != (host, port, key):
                if rep is not None:
                    self._retire(rep)  # moved: its connections go to where it was
                rep = Replica(rid, host, port, key=key)
                route.replicas[rid] = rep
            rep.busy = busy
        route.wake()

    def _retire(self, replica: Replica) -> None:
        replica.retired = True
        for conn in self.pools.pop(replica, []):
            conn.close()

    def remove(self, name: str) -> None:
        route = self.routes.pop(name, None)
        if route is None:
            return
        for rep in route.replicas.values():
            self._retire(rep)
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
        # "" is no deployment's name: what was refused before a deployment of the gateway's was
        # named (404, 401 for a name it does not have, 503 while it starts)
        out[""] = {"codes": {str(c): n for c, n in self.refused.items()}}
        return out

    # -- requests -------------------------------------------------------------------------------

    def start(self, client: _Client, req: Request) -> Awaitable[None] | None:
        """Answer ``req``: at once (None) where the gateway answers it itself; else a future the
        exchange completes from its callbacks (a free slot on a replica), or a coroutine that
        waits for a slot first."""
        path = req.target
        refused = self.refusal(path, req.headers)  # the head may have changed nothing since
        if refused is not None:
            status, why = refused
            extra = [b"Retry-After: 1"] if status == 503 else []
            client.send(error_response(status, why, extra=extra), req)
            return None
        name, rest = route_of(path)
        route = self.routes[name]
        started = time.monotonic()
        replica = None if route.waiters else route.pick(started)
        if replica is None:
            return self._queued(client, req, route, rest, started)
        replica.outstanding += 1
        ex = _Exchange(self, client, req, route, rest, started)
        ex.go(replica)
        return ex.done

    async def serve(self, client: _Client, req: Request) -> None:
        """``start``, awaited to the end of the answer."""
        later = self.start(client, req)
        if later is not None:
            await later

    async def _queued(
        self, client: _Client, req: Request, route: Route, path: str, started: float
    ) -> None:
        try:
            replica = await self._slot(route)
        except HttpError as e:
            route.codes[e.status] = route.codes.get(e.status, 0) + 1
            extra = [b"Retry-After: 1"] if e.status == 429 else None
            client.send(error_response(e.status, str(e), extra=extra), req)
            return
        ex = _Exchange(self, client, req, route, path, started)
        ex.go(replica)
        await ex.done

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


class _Exchange:
    """One request on a slot of a replica, from the request sent to the end of the answer, driven
    by its upstream connection's callbacks: no task of its own unless it must open a connection.

    Before any response byte a connection that fails is tried once more: a pooled one fresh on the
    same replica, a fresh one on another replica (the failed one is skipped for ``DOWN_SECONDS``).
    ``timeout_s`` bounds the wait for the response head (504) and every wait for more of the body
    while the client keeps up (the client's connection is closed)."""

    __slots__ = (
        "client",
        "code",
        "conn",
        "data",
        "done",
        "fresh",
        "gateway",
        "over",
        "path",
        "replica",
        "req",
        "route",
        "started",
        "tried",
    )

    def __init__(
        self,
        gateway: Gateway,
        client: _Client,
        req: Request,
        route: Route,
        path: str,
        started: float,
    ) -> None:
        self.gateway, self.client, self.req, self.route = gateway, client, req, route
        self.path, self.started = path, started
        self.conn: _Upstream | None = None
        self.fresh = False  # the connection was opened for this request
        self.tried = False  # another replica was tried already
        self.code = 0  # the status the client was answered with (0: none yet)
        self.data: bytes | None = None  # the request's head as sent, kept for a second try
        self.over = False
        loop = gateway.loop or asyncio.get_running_loop()
        self.done: asyncio.Future[None] = loop.create_future()
        client.exchange = self

    def go(self, replica: Replica) -> None:
        """Send on a pooled connection to ``replica`` (whose slot is taken), or open one."""
        self.replica = replica
        pool = self.gateway.pools.get(replica)
        while pool:
            conn = pool.pop()
            if not conn.closed:
                self._send(conn, False)
                return
            conn.close()
        self._open()

    def _open(self) -> None:
        keep_task(asyncio.ensure_future(self._connect()))

    async def _connect(self) -> None:
        replica = self.replica
        pools = self.gateway.pools
        pool = pools.get(replica)
        if pool is None:
            pool = [] if replica.retired else pools.setdefault(replica, [])
        loop = asyncio.get_running_loop()
        try:
            # a replica on a machine that is gone does not refuse: it never answers. Nothing has
            # been sent yet, so a connection not made in CONNECT_SECONDS tries another replica
            async with asyncio.timeout(min(CONNECT_SECONDS, self.route.timeout_s)):
                _, conn = await loop.create_connection(
                    lambda: _Upstream(pool), replica.host, replica.port
                )
        except (OSError, TimeoutError):
            if not self.over:
                self.no_response()
            return
        except BaseException:
            self.finish()
            raise
        if self.over:
            conn.close()  # the client went away meanwhile
            return
        self._send(conn, True)

    def _send(self, conn: _Upstream, fresh: bool) -> None:
        self.conn, self.fresh = conn, fresh
        data = self.data
        if data is None:
            data = self.data = _request_head(
                self.req, self.path, keep_authorization=self.gateway.tokens is None
            )
        key = self.replica.key
        if key:  # the head ends with its blank line: the replica's key goes before it
            data = data[:-2] + key + b"\r\n"
        conn.begin(self, data, self.route.timeout_s)
        if not self.client.writable:  # the client has not taken the last answer yet
            conn.pause()

    # -- from the upstream connection -----------------------------------------------------------

    def head(self, conn: _Upstream) -> None:
        """The final response head arrived: it goes to the client with the first body bytes."""
        self.code = conn.status

    def complete(self, conn: _Upstream, reusable: bool) -> None:
        """The whole answer is out (``reusable``: exactly one, and nothing said against reuse)."""
        replica = self.replica
        self.conn = None
        pool = conn.pool
        if reusable and not replica.retired and len(pool) < 64 and not conn.closed:
            conn.idle()
            pool.append(conn)
        else:
            conn.close()
        if not self.req.keep_alive or conn.until_close:
            self.client.close()
        replica.served += 1
        now = time.monotonic()
        self.route.done.append((now, now - self.started))
        self.finish()

    def lost(self, conn: _Upstream) -> None:
        """The connection ended before the answer was whole."""
        self.conn = None
        if conn.seen:  # the answer had begun: not safe to send it again
            self.broken()
        elif not self.fresh:  # a stale pooled connection: once more on a new one
            self._open()
        else:
            self.no_response()

    def no_response(self) -> None:
        """No response byte from the replica (refused, reset, closed): another one, once."""
        route, replica = self.route, self.replica
        now = time.monotonic()
        replica.down_until = now + DOWN_SECONDS
        other = None if self.tried else route.pick(now, avoid=replica)
        if other is None:
            route.errors += 1
            self.code = 502
            self.client.send(error_response(502, "no replica answered"), self.req)
            self.finish()
            return
        self.tried = True
        route.retries += 1
        other.outstanding += 1
        self.gateway._release(route, replica)
        self.go(other)

    def timed_out(self) -> None:
        self.route.errors += 1
        if self.conn is not None:
            self.conn.close()  # its state is unknown
            self.conn = None
        client = self.client
        if not self.code and not client.answered:
            self.code = 504
            client.send(
                error_response(504, f"no answer within {self.route.timeout_s:g}s"), self.req
            )
        client.close()  # an answer that had begun cannot turn into a 504 now
        self.finish()

    def broken(self) -> None:
        """The answer broke off midway or made no sense: the client sees its connection close."""
        self.route.errors += 1
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self.code = self.code or 502
        self.client.close()
        self.finish()

    # -- the end --------------------------------------------------------------------------------

    def abort(self) -> None:
        """The client went away: its slot and its replica are let go."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self.finish()

    def finish(self) -> None:
        if self.over:
            return
        self.over = True
        if self.client.exchange is self:
            self.client.exchange = None
        self.gateway._release(self.route, self.replica)
        if self.code:
            self.replica.observe(self.code, time.monotonic() - self.started)
        if not self.done.done():
            self.done.set_result(None)


class _Upstream(asyncio.Protocol):
    """A keep-alive connection to one replica. Its answer is parsed as it arrives (httptools, one
    parser for the connection's life) and relayed from the parser's callbacks: what one read
    brought goes to the client in one write, and reading pauses while the client's connection is
    full (flow control). Pooled again only after exactly one complete answer."""

    def __init__(self, pool: list[_Upstream]) -> None:
        self.pool = pool  # the replica's idle connections, where this one goes back
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.ex: _Exchange | None = None
        self.closed = False
        self.paused = False  # reading paused: the client reads slower than the answer comes
        self.idle_s = 60.0
        # the answer in progress
        self.head_only = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.seen = False  # some byte of a response arrived (not safe to retry elsewhere)
        self.head_done = False
        self.whole = False
        self.messages = 0
        self.keep_alive = True
        self.chunked = False
        self.until_close = False  # no length: the body runs to the end of the connection
        self.out: list[bytes] = []  # for the client, written once per read
        # one timer, moved lazily as HttpConnection's is
        self._loop = asyncio.get_running_loop()
        self.deadline = math.inf
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def begin(self, ex: _Exchange, data: bytes, timeout_s: float) -> None:
        assert self.transport is not None
        self.ex = ex
        self.head_only = ex.req.method == "HEAD"
        self.status, self.seen, self.head_done, self.whole, self.messages = (
            0,
            False,
            False,
            False,
            0,
        )
        self.idle_s = timeout_s
        self._arm(self._loop.time() + timeout_s)
        body = ex.req.body
        if not body:
            self.transport.write(data)
        elif len(body) <= 16384:  # one write, one segment
            self.transport.write(data + body)
        else:  # a large body is not copied once more to go with its head
            self.transport.write(data)
            self.transport.write(body)

    def idle(self) -> None:
        self.ex = None
        self.deadline = math.inf
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.ex = None
        self.closed = True
        self.deadline = math.inf
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    # -- flow control toward the client ---------------------------------------------------------

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
            self.deadline = math.inf  # a slow client is not the replica's stall

    def resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
            if self.ex is not None:
                self._arm(self._loop.time() + self.idle_s)

    # -- asyncio --------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not its subclasses

    def data_received(self, data: bytes) -> None:
        ex = self.ex
        if ex is None:  # a byte nobody asked for: never the next client's answer
            self.close()
            return
        self.seen = True
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            if not self.whole:
                self.out.clear()
                ex.broken()  # a malformed response from the replica
                return
            self.messages += 1  # garbage after a whole answer: it stands, the connection goes
        out = self.out
        if self.whole and self.chunked:
            out.append(b"0\r\n\r\n")
        if out:
            ex.client.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()
        if self.whole:
            ex.complete(self, self.messages == 1 and self.keep_alive and not self.head_only)
        elif self.head_done and not self.paused:
            self.deadline = self._loop.time() + self.idle_s  # later than the timer: no move

    def eof_received(self) -> bool:
        self._ended(True)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._ended(exc is None)
        self.close()
        with contextlib.suppress(ValueError):
            self.pool.remove(self)
        # the parser holds this connection's methods: a cycle only the garbage collector breaks
        self.parser = httptools.HttpResponseParser(None)
        self.out.clear()
        self.headers = []

    def _ended(self, clean: bool) -> None:
        """The replica closed its end (``clean``) or the connection broke."""
        self.closed = True
        ex = self.ex
        if ex is None:
            return
        if clean and self.head_done and self.until_close:  # the body ran to the end
            self.whole = True
            if self.out:
                ex.client.write(b"".join(self.out))
                self.out.clear()
            ex.complete(self, False)
        else:
            self.ex = None
            ex.lost(self)

    # -- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.messages += 1
        if self.head_done:  # a second response after the first: never reuse this connection
            self.whole = True
            return
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
        ex = self.ex
        assert ex is not None
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        self.head_done = True
        head, self.chunked, self.until_close = _response_head(
            status, self.headers, ex.req.keep_alive
        )
        self.out.append(head)
        ex.head(self)
        if self.head_only:  # llhttp cannot be told a HEAD answer has no body: never reused
            self.whole = True

    def on_body(self, body: bytes) -> None:
        if self.head_done and self.messages == 1 and not self.head_only:
            self.out.append(b"%x\r\n%s\r\n" % (len(body), body) if self.chunked else body)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.whole = True

    # -- the deadline ---------------------------------------------------------------------------

    def _arm(self, deadline: float) -> None:
        self.deadline = deadline
        if self._timer_at > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(deadline, self._expire)
            self._timer_at = deadline

    def _expire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        ex = self.ex
        if ex is None or self.deadline == math.inf:
            return
        if self._loop.time() < self.deadline:  # moved later meanwhile: wait for it
            self._arm(self.deadline)
            return
        self.close()
        ex.conn = None
        ex.timed_out()


# -- header rewriting: worked out once per distinct header set ------------------------------------

# how a head is written on, worked out once per distinct sequence of header names: a template with
# the names in it and %s for each value, the indices of those values, the indices of the Connection
# headers (where there are any, the plan depends on their values too), chunked, until close
_Plan = tuple[bytes, tuple[int, ...], tuple[int, ...], bool, bool]
_request_plans: dict[tuple[Any, ...], _Plan] = {}
_response_plans: dict[tuple[Any, ...], _Plan] = {}
_PLANS_MAX = 512  # distinct header sets remembered, each way (emptied when full)


def _kept(headers: list[tuple[bytes, bytes]], dropped: frozenset[bytes]) -> list[int]:
    """Indices of the header lines to pass on: all but ``dropped`` and those the message's
    ``Connection`` header names (hop-by-hop for this message alone, RFC 9110 7.6.1)."""
    lower = [n.lower() for n, _ in headers]
    named = {
        t.strip().lower()
        for n, (_, v) in zip(lower, headers, strict=True)
        if n == b"connection"
        for t in v.split(b",")
    } - {b"host"}
    return [i for i, n in enumerate(lower) if n not in dropped and n not in named]


def _plan(
    plans: dict[tuple[Any, ...], _Plan],
    key: tuple[Any, ...],
    headers: list[tuple[bytes, bytes]],
    make: Callable[[list[tuple[bytes, bytes]]], _Plan],
) -> _Plan:
    """The plan for ``headers`` under ``key`` (their names and what else it depends on), made
    once by ``make(headers)``. Where a ``Connection`` header may name others, the plan under
    ``key`` only says where it is, and the plan proper is kept under ``(key, its values)``."""
    plan = plans.get(key)
    if plan is not None and plan[2]:
        plan = plans.get((key, tuple([headers[i][1] for i in plan[2]])))
    if plan is None:
        if len(plans) >= _PLANS_MAX:
            plans.clear()
        plan = make(headers)
        conn = plan[2]
        if conn:
            plans[key] = (b"", (), conn, False, False)
            plans[(key, tuple([headers[i][1] for i in conn]))] = plan
        else:
            plans[key] = plan
    return plan


def _escape(b: bytes) -> bytes:
    return b.replace(b"%", b"%%")


def _connection_headers(headers: list[tuple[bytes, bytes]]) -> tuple[int, ...]:
    return tuple(i for i, (n, _) in enumerate(headers) if n.lower() == b"connection")


def _request_head(req: Request, path: str, *, keep_authorization: bool) -> bytes:
    """The request's head as sent to a replica: the request line, the headers as parsed but the
    hop-by-hop ones (and ``Authorization``, the caller's gpufrac token, where tokens are in use),
    and the body's length; the body follows as it is."""
    headers = req.headers
    key = (keep_authorization, req.method, *[n for n, _ in headers])
    method = req.method

    def make(headers: list[tuple[bytes, bytes]]) -> _Plan:
        dropped = _NOT_RELAYED if keep_authorization else _NOT_FORWARDED
        keep = _kept(headers, dropped)
        lines = [_escape(method.encode("latin-1")) + b" %s HTTP/1.1"]
        lines += [_escape(headers[i][0]) + b": %s" for i in keep]
        template = b"\r\n".join(lines) + b"\r\n%s"
        return template, tuple(keep), _connection_headers(headers), False, False

    template, keep, _, _, _ = _plan(_request_plans, key, headers, make)
    body = req.body
    if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        tail = b"Content-Length: %d\r\n\r\n" % len(body)
    else:
        tail = b"\r\n"
    return template % (path.encode("latin-1"), *[headers[i][1] for i in keep], tail)


def _response_head(
    status: int, headers: list[tuple[bytes, bytes]], keep_alive: bool
) -> tuple[bytes, bool, bool]:
    """The head a replica's answer goes on with (its hop-by-hop and framing headers written anew),
    whether its body is chunked, and whether it runs to the end of the connection."""
    key = (status, keep_alive, *[n for n, _ in headers])

    def make(headers: list[tuple[bytes, bytes]]) -> _Plan:
        keep = _kept(headers, _NOT_RELAYED)
        lower = [n.lower() for n, _ in headers]
        length = lower.index(b"content-length") if b"content-length" in lower else None
        chunked = b"transfer-encoding" in lower
        bodiless = status in (204, 304) or 100 <= status < 200
        lines = [b"HTTP/1.1 %d " % status + _escape(REASONS.get(status, "OK").encode())]
        lines += [_escape(headers[i][0]) + b": %s" for i in keep]
        if length is not None:
            lines.append(b"Content-Length: %s")
            keep.append(length)
        elif chunked:
            lines.append(b"Transfer-Encoding: chunked")
        until_close = length is None and not chunked and not bodiless
        if not keep_alive or until_close:
            lines.append(b"Connection: close")
        template = b"\r\n".join(lines) + b"\r\n\r\n"
        conn = _connection_headers(headers)
        return template, tuple(keep), conn, chunked and length is None, until_close

    template, keep, _, chunked, until_close = _plan(_response_plans, key, headers, make)
    return template % tuple([headers[i][1] for i in keep]), chunked, until_close


class _Client(HttpConnection):
    """One client connection of the gateway."""

    max_body = MAX_BODY

    def __init__(self, gateway: Gateway) -> None:
        super().__init__()
        self.gateway = gateway
        self.exchange: _Exchange | None = None  # the request on its way to a replica

    def handle(self, req: Request) -> Awaitable[None] | None:
        return self.gateway.start(self, req)

    def admit(self, target: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:
        return self.gateway.refusal(target.decode("latin-1"), headers)

    def connection_lost(self, exc: Exception | None) -> None:
        ex = self.exchange
        super().connection_lost(exc)
        if ex is not None:
            ex.abort()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.exchange is not None and self.exchange.conn is not None:
            self.exchange.conn.pause()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.exchange is not None and self.exchange.conn is not None:
            self.exchange.conn.resume()


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


def _give_memory_back(
    loop: asyncio.AbstractEventLoop, budget: BodyBudget, native: NativeMemory
) -> None:
    """Every ``TRIM_CHECK_S``: once ``TRIM_AFTER`` bytes of request bodies were let go since the
    last time, hand the allocator's free pages back to the system (``malloc_trim``). Python frees a
    body as soon as it is answered or its client goes away, but glibc keeps much of what it freed:
    with bodies arriving on several connections at once the pages between them stayed resident
    (bench/gateway.py, memory)."""
    if budget.released >= TRIM_AFTER:
        budget.released = 0
        native.trim()
    loop.call_later(TRIM_CHECK_S, _give_memory_back, loop, budget, native)


async def run(
    host: str,
    port: int,
    admin_fd: int | None,
    routes: list[dict[str, Any]],
    total_bodies: int = TOTAL_BODIES,
) -> None:
    _Client.budget = budget = BodyBudget(total_bodies)
    gateway = Gateway()
    gateway.settled = admin_fd is None  # commanded: not before the agent says so
    gateway.loop = asyncio.get_running_loop()
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
    _give_memory_back(loop, budget, NativeMemory())
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
    routes = [json.loads(r) for r in args.route]
    run_loop(run(args.host, args.port, args.admin_fd, routes, args.total_bodies))
    return 0


if __name__ == "__main__":
    sys.exit(main())
