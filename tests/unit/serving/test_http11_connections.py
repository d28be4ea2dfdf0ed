"""The gateway's HTTP/1.1 connections (serving/http11.py) over real sockets: at most
``max_connections`` at once (one more is answered 503 and closed), and a connection that never
starts a request is closed after the head timeout, not the keep-alive one."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest

from gpufrac.serving.http11 import HttpConnection, Request, response


class Echo(HttpConnection):
    max_connections = 3
    head_timeout = 10.0
    open_connections = 0

    def handle(self, req: Request) -> None:
        self.send(response(200, b"ok"), req)


@pytest.fixture
def port() -> Iterator[int]:
    Echo.open_connections = 0  # the count is the server process's (one server per process)
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(Echo, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield server.sockets[0].getsockname()[1]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


def read_all(s: socket.socket) -> bytes:
    s.settimeout(20)
    got = b""
    while chunk := s.recv(4096):
        got += chunk
    return got


def test_one_connection_too_many_is_503_and_closed(port: int) -> None:
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    extra = socket.create_connection(("127.0.0.1", port))
    assert read_all(extra).startswith(b"HTTP/1.1 503")
    for s in held:
        s.close()


def test_a_connection_that_never_asks_is_closed_after_the_head_timeout(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Echo, "head_timeout", 0.3)
    s = socket.create_connection(("127.0.0.1", port))
    assert read_all(s) == b""  # closed quietly: it never asked anything
    with socket.create_connection(("127.0.0.1", port)) as again:  # its slot was given back
        again.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert read_all(again).endswith(b"ok")


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/x\nHost: x\r\nConnection: close\r\n\r\n",  # a bare LF ends the target: HTTP/0.9
        b"GET /v1/x\nX-Smuggled: b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ],
)
def test_a_bare_lf_inside_the_request_target_is_refused_not_forwarded(
    port: int, head: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head)
        got = read_all(s)
    assert got.startswith(b"HTTP/1.1 400") and b"HTTP/1.x version" in got, got
    assert not got.endswith(b"ok")  # never handled
