"""The gateway's memory comes back after large request bodies (issue 26): a client without a token
sends 20 MiB bodies to a ``public: true`` deployment and goes away midway, or has them answered, and
the gateway process's resident memory (``VmRSS``) returns to what it was after the first few. The
gateway runs as its own process, commanded over its admin link as the agent does, in front of a
replica that reads each body and answers ``ok``. And the cause, in-process: a connection that went
away is freed at once, with the garbage collector off."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar, Literal, assert_never
from weakref import WeakSet

import pytest

from gpufrac.runtime.child_link import ChildLink
from gpufrac.serving.http11 import HttpConnection, Request, loop_factory, response

MIB = 2**20
BODY = 20 * MIB
SLACK = 64 * MIB  # the bound: RSS after 50 bodies within this of RSS after the first 5
HEAD = b"POST /serve/m/predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % BODY
PIECE = b"x" * MIB


class _Sink(BaseHTTPRequestHandler):
    """A replica that reads the body and answers ``ok``."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        left = int(self.headers["Content-Length"])
        into = memoryview(bytearray(MIB))
        while left:
            got = self.rfile.readinto(into[: min(left, MIB)])
            if not got:
                return
            left -= got
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Gateway:
    port: int
    pid: int


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    replica = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    replica.daemon_threads = True
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    log = tmp_path / "gateway.log"
    link = ChildLink("gateway", "gpufrac.serving.gateway", log)
    link.start(["--port", "0"])
    try:
        # API tokens are in use, the deployment is public: a caller without a token is served
        link.call("A " + json.dumps({"tokens": {"0" * 64: "team"}}))
        route = {
            "name": "m",
            "tenant": "team",
            "public": True,
            "replicas": [{"id": "r1", "port": replica.server_address[1]}],
        }
        link.call("C " + json.dumps(route))
        link.call("G")
        assert link.proc is not None
        yield Gateway(int(link.ready_line.split()[1]), link.proc.pid)
    finally:
        link.close()
        replica.shutdown()
        replica.server_close()


def rss(pid: int) -> int:
    """The process's resident memory, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def settled(pid: int, *, below: int = 0, seconds: float = 1.0) -> int:
    """The lowest RSS seen within ``seconds``, ending early once it is at most ``below``: the
    gateway lets go of a body after its connection's end reaches it, and hands free memory back to
    the system about once a second."""
    lowest = rss(pid)
    deadline = time.monotonic() + seconds
    while lowest > below and time.monotonic() < deadline:
        time.sleep(0.1)
        lowest = min(lowest, rss(pid))
    return lowest


How = Literal["aborted", "answered", "answered, kept open"]


def one_body(port: int, i: int, how: How) -> socket.socket | None:
    """One 20 MiB body, the ``i``-th: its head and 16 MiB of it, then away (a reset, or every
    other one a close); or all of it, answered ``ok``, then closed, or kept open (returned)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(HEAD)
        for _ in range(16 if how == "aborted" else 20):
            s.sendall(PIECE)
        match how:
            case "aborted":
                if i % 2 == 0:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            case "answered" | "answered, kept open":
                got = b""
                while not got.endswith(b"\r\n\r\nok"):
                    more = s.recv(65536)
                    assert more, f"the gateway closed without an answer: {got!r}"
                    got += more
                assert got.startswith(b"HTTP/1.1 200 "), got
            case other:
                assert_never(other)
    except BaseException:
        s.close()
        raise
    if how == "answered, kept open":
        return s
    s.close()
    return None


@pytest.mark.parametrize(
    ("how", "count"), [("aborted", 50), ("answered", 15), ("answered, kept open", 15)]
)
def test_memory_comes_back_after_large_bodies(gateway: Gateway, how: How, count: int) -> None:
    held: list[socket.socket] = []

    def send(first: int, last: int) -> None:  # five connections at a time: an attacker uses many
        with ThreadPoolExecutor(5) as pool:
            for start in range(first, last, 5):
                kept = pool.map(lambda i: one_body(gateway.port, i, how), range(start, start + 5))
                held.extend(s for s in kept if s is not None)

    try:
        send(0, 5)
        after_five = settled(gateway.pid)
        send(5, count)
        after_all = settled(gateway.pid, below=after_five + SLACK, seconds=5.0)
    finally:
        for s in held:
            s.close()
    assert after_all <= after_five + SLACK, (
        f"the gateway's RSS went from {after_five // MIB} MiB after 5 bodies to "
        f"{after_all // MIB} MiB after {count} ({how}), and stayed there"
    )


class _Kept(HttpConnection):
    alive: ClassVar[WeakSet[HttpConnection]] = WeakSet()
    lost = threading.Event()  # a connection's end reached the server

    def __init__(self) -> None:
        super().__init__()
        _Kept.alive.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        _Kept.lost.set()

    def handle(self, req: Request) -> None:
        self.send(response(200, b"ok"), req)


@pytest.mark.parametrize("whole", [False, True], ids=["aborted", "answered"])
def test_a_connection_that_went_away_is_freed_without_the_garbage_collector(whole: bool) -> None:
    """Its parser held its methods: a cycle that kept its body alive until a full collection."""
    _Kept.lost.clear()
    loop = (loop_factory() or asyncio.new_event_loop)()
    server = loop.run_until_complete(loop.create_server(_Kept, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    gc.collect()
    gc.disable()
    try:
        port = server.sockets[0].getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % MIB)
            s.sendall(PIECE if whole else PIECE[:-1])
            if whole:
                assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert _Kept.lost.wait(10), "the server did not see the connection end"
        deadline = time.monotonic() + 5
        while _Kept.alive and time.monotonic() < deadline:  # the loop's last references go
            time.sleep(0.05)
        assert not _Kept.alive, "a connection that went away is still referenced"
    finally:
        gc.enable()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        server.close()
        loop.close()
