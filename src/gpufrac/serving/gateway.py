"""The request gateway: ``/serve/{deployment}/...`` spread over the deployment's replicas.

A data path apart from the control API, in its own process (``python -m gpufrac.serving.gateway``),
built on asyncio protocols with no framework on the request path:

* **Routing**: least outstanding requests with power-of-two choices. Each replica has
  ``max_concurrency`` slots; its score is its outstanding requests weighted by how busy its GPU is
  (``busy``, 0..1, which the agent sends: SM utilization where NVML reports it).
* **Waiting**: when every slot is taken, a request waits in the deployment's FIFO queue (at most
  ``queue_limit``), and is woken when a slot frees or a replica is added, never by polling. Only a full
  queue is answered ``429`` with ``Retry-After``. With no replica at all (scaled to zero) requests wait
  the same way while one starts (``cold_start_timeout_s``).
* **Retries**: a connection that fails before any response byte arrived is tried once more on another
  replica (a stale keep-alive connection is first retried fresh on the same one); the failed replica is
  skipped for a second.
* **Streaming**: ``Content-Length`` and ``chunked`` responses pass through as they arrive.
* **Timeouts**: ``timeout_s`` per request upstream (``504`` past it).

The agent configures it over its own end of a socket pair (``--admin-fd``): ``C {json}`` sets a
deployment's replicas and limits, ``X name`` removes one, ``T`` answers the statistics the autoscaler
reads (in flight, queued, per replica outstanding, rate and p99 latency over the last window).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import sys
import time
from collections.abc import Awaitable
from typing import Any

from gpufrac.serving.http11 import HttpConnection, HttpError, Request, error_response
from gpufrac.serving.routing import Replica, Route, Upstream

MAX_BODY = 64 * 2**20
DOWN_SECONDS = 1.0  # a replica that failed to answer is skipped this long
WINDOW_SECONDS = 10.0
# hop-by-hop headers, and Expect (the gateway already holds the whole body)
_HOP = (b"connection", b"keep-alive", b"proxy-connection", b"upgrade", b"te", b"expect")


class Gateway:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}

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
                "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1000 if lat else None,
                "rejected": route.rejected,
                "errors": route.errors,
                "retries": route.retries,
                "replicas": {
                    r.id: {"outstanding": r.outstanding, "served": r.served}
                    for r in route.replicas.values()
                },
                "retiring": {r.id: {"outstanding": r.outstanding} for r in route.retiring.values()},
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
        name, _, rest = path[7:].partition("/")
        route = self.routes.get(name)
        if route is None:
            client.send(error_response(404, f"no deployment {name!r}"), req)
            return
        started = time.monotonic()
        try:
            replica = await self._slot(route)
        except HttpError as e:
            extra = [b"Retry-After: 1"] if e.status == 429 else None
            client.send(error_response(e.status, str(e), extra=extra), req)
            return
        try:
            # phase 1, up to the response head: retried once elsewhere, 504 past the timeout
            for attempt in range(2):
                try:
                    async with asyncio.timeout(route.timeout_s):  # cheaper than wait_for: no task
                        conn, status_head = await self._request(req, replica, "/" + rest)
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
            await self._relay(client, req, replica, conn, status_head, route.timeout_s)
            replica.served += 1
            route.done.append((time.monotonic(), time.monotonic() - started))
        except _NoResponse:
            route.errors += 1
            client.send(error_response(502, "no replica answered"), req)
        except TimeoutError:
            route.errors += 1
            if client.answered:
                client.close()  # the answer had begun: it cannot turn into a 504 now
            else:
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
            client.close()
        finally:
            self._release(route, replica)

    async def _slot(self, route: Route) -> Replica:
        r = route.pick(time.monotonic())
        if r is not None and not route.waiters:
            r.outstanding += 1
            return r
        if len(route.waiters) >= route.queue_limit:
            route.rejected += 1
            raise HttpError(429, f"deployment {route.name} is at capacity; its queue is full")
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

    async def _request(self, req: Request, replica: Replica, path: str) -> tuple[Upstream, bytes]:
        """Send the request and read the final response head (interim 1xx heads are skipped)."""
        head = [f"{req.method} {path} HTTP/1.1".encode()]
        head += [h for h in req.headers if h.partition(b":")[0].strip().lower() not in _HOP]
        data = b"\r\n".join(head) + b"\r\n\r\n" + req.body
        fresh = False
        while True:
            try:
                conn, fresh = await replica.connect(fresh)
            except OSError:
                raise _NoResponse from None
            try:
                conn.writer.write(data)
                status_head = await conn.reader.readuntil(b"\r\n\r\n")
                while 100 <= _status(status_head) < 200:  # 100 Continue, 103 Early Hints
                    status_head = await conn.reader.readuntil(b"\r\n\r\n")
                return conn, status_head
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                conn.close()
                if fresh:
                    raise _NoResponse from None
                fresh = True  # a stale pooled connection: once more on a new one
            except BaseException:
                conn.close()  # timed out or cancelled: the connection is in an unknown state
                raise

    async def _relay(
        self,
        client: _Client,
        req: Request,
        replica: Replica,
        conn: Upstream,
        status_head: bytes,
        idle_s: float,
    ) -> None:
        """Pass the response on as it arrives, with flow control toward the client."""
        try:
            keep = await self._relay_body(client, req, conn, status_head, idle_s)
        except BaseException:
            conn.close()
            raise
        if keep and not replica.retired and len(replica.idle) < 64:
            replica.idle.append(conn)
        else:
            conn.close()
        if not req.keep_alive:
            client.close()

    async def _relay_body(
        self, client: _Client, req: Request, conn: Upstream, status_head: bytes, idle_s: float
    ) -> bool:
        """Returns whether the upstream connection may be reused."""
        lines = status_head[:-4].split(b"\r\n")
        length: int | None = None
        chunked = False
        upstream_keep = True
        out = [lines[0]]
        for line in lines[1:]:
            name = line.partition(b":")[0].strip().lower()
            if name == b"content-length":
                length = _length(line.partition(b":")[2])
            elif name == b"transfer-encoding" and b"chunked" in line.lower():
                chunked = True
            elif name == b"connection":
                upstream_keep = b"close" not in line.lower()
                continue
            elif name in _HOP:
                continue
            out.append(line)
        if not req.keep_alive:
            out.append(b"Connection: close")
        head_out = b"\r\n".join(out) + b"\r\n\r\n"
        reader = conn.reader

        async def read(coro: Any) -> bytes:
            async with asyncio.timeout(idle_s):
                data: bytes = await coro
            return data

        status = _status(status_head)
        if req.method == "HEAD" or status in (204, 304):
            client.write(head_out)  # no body, whatever Content-Length says
            return False  # in case the replica sent one anyway: never reuse the connection
        if length is not None:
            body = await read(reader.readexactly(length)) if length else b""
            client.write(head_out + body)
            return upstream_keep
        client.write(head_out)
        if chunked:
            while True:
                size_line = await read(reader.readuntil(b"\r\n"))
                size = int(size_line.split(b";")[0], 16)
                chunk = await read(reader.readexactly(size + 2)) if size else b""
                client.write(size_line + chunk)
                await client.drain()
                if size == 0:
                    while (trailer := await read(reader.readuntil(b"\r\n"))) != b"\r\n":
                        client.write(trailer)
                    client.write(b"\r\n")
                    return upstream_keep
        while data := await read(reader.read(65536)):  # the body runs to the end of the connection
            client.write(data)
            await client.drain()
        client.close()
        return False


def _status(head: bytes) -> int:
    try:
        return int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise ValueError("a malformed response head from the replica") from None


def _length(value: bytes) -> int:
    v = value.strip()
    if not v.isdigit():
        raise ValueError("a bad Content-Length from the replica")
    return int(v)


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
            elif op == "T":
                reply = gateway.stats()
            else:
                raise ValueError(f"unknown message {op!r}")
            writer.write(b"K " + json.dumps(reply).encode() + b"\n")
        except Exception as e:
            writer.write(b"E " + json.dumps({"error": str(e)}).encode() + b"\n")
        await writer.drain()
    stop.set()  # the agent is gone


async def run(host: str, port: int, admin_fd: int | None, routes: list[dict[str, Any]]) -> None:
    gateway = Gateway()
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
    args = p.parse_args(argv)
    try:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(run(args.host, args.port, args.admin_fd, [json.loads(r) for r in args.route]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
