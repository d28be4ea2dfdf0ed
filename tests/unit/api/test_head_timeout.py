"""The control API's connections: a request head that does not arrive whole in time is answered 408
and its connection closed, while other callers are answered as usual. uvicorn serving a small app
over real sockets, with a 1 s head timeout."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from gpufrac.api.head_timeout import HeadTimeoutProtocol


class Quick(HeadTimeoutProtocol):
    head_timeout_s = 1.0


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    assert scope["type"] == "http"
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=free, log_level="warning", http=Quick)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield free
    server.should_exit = True
    thread.join(timeout=10)


def closed_by_server(s: socket.socket, within: float = 20.0) -> bytes:
    """What the server sent before closing; fails if it is still open after ``within``."""
    s.settimeout(within)
    got = b""
    while chunk := s.recv(4096):
        got += chunk
    return got


def get(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return closed_by_server(s)


def test_a_silent_connection_is_closed_and_others_are_answered(port: int) -> None:
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    assert get(port).endswith(b"ok")  # answered while the silent ones are held
    for s in silent:
        assert closed_by_server(s).startswith(b"HTTP/1.1 408")
        s.close()


def test_a_head_trickled_in_is_cut_off(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\n")
        s.settimeout(20)
        cut = False
        for _ in range(100):  # a header byte every 0.2 s: never done
            try:
                s.sendall(b"X")
            except OSError:
                cut = True
                break
            time.sleep(0.2)
        assert cut or closed_by_server(s).startswith(b"HTTP/1.1 408")


def test_a_keep_alive_connection_serves_several_requests(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        for _ in range(3):
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(20)
            got = b""
            while not got.endswith(b"ok"):
                got += s.recv(4096)
            assert got.startswith(b"HTTP/1.1 200")
            time.sleep(0.6)  # within the keep-alive timeout; the head timer is per request


def test_one_connection_too_many_is_503_and_closed(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Quick, "max_connections", 3)
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    time.sleep(0.2)  # accepted
    with socket.create_connection(("127.0.0.1", port)) as extra:
        assert closed_by_server(extra).startswith(b"HTTP/1.1 503")
    for s in held:
        s.close()
