"""The gateway's data path (serving/gateway.py) against scripted replicas over real sockets, on
asyncio's loop and on uvloop's: header plans worked out once per header set, the answer relayed from
the upstream connection's callbacks, its timeouts, retries, reuse and flow control."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest

from gpufrac.serving.gateway import Gateway, _Client, _request_head, _response_head
from gpufrac.serving.http11 import Request, loop_factory

# -- header plans ----------------------------------------------------------------------------------


def head(headers: list[tuple[bytes, bytes]], body: bytes = b"", method: str = "POST") -> bytes:
    return _request_head(
        Request(method, "/serve/m/p", headers, body, True), "/p", keep_authorization=True
    )


def test_the_request_head_is_written_from_the_parsed_parts() -> None:
    got = head([(b"Host", b"x"), (b"X-A", b"1"), (b"Content-Length", b"3")], b"abc")
    assert got == b"POST /p HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nContent-Length: 3\r\n\r\n"
    assert head([(b"Host", b"x")], method="GET") == b"GET /p HTTP/1.1\r\nHost: x\r\n\r\n"
    assert head([(b"Host", b"x")]) == b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"


def test_a_plan_depends_on_what_the_connection_header_names() -> None:
    names = [b"Host", b"Connection", b"X-A", b"X-B"]
    for _ in range(2):  # made, then taken from the cache
        a = head(list(zip(names, [b"x", b"keep-alive, X-A", b"1", b"2"], strict=True)))
        b = head(list(zip(names, [b"x", b"X-B", b"1", b"2"], strict=True)))
        assert b"X-A" not in a and b"X-B: 2" in a
        assert b"X-B" not in b and b"X-A: 1" in b
        assert b"Connection" not in a + b


def test_a_connection_value_cannot_pass_for_a_header_name() -> None:
    first = head([(b"Connection", b"foo"), (b"X", b"1")])
    second = head([(b"Connection", b"bar"), (b"X", b"1"), (b"foo", b"2")])
    assert b"X: 1" in first and b"foo" not in first
    assert b"X: 1\r\nfoo: 2\r\n" in second


def test_percent_signs_in_names_and_values_pass_unchanged() -> None:
    got = head([(b"X-%s%d", b"%s %d %%"), (b"Host", b"x")], method="GET")
    assert got == b"GET /p HTTP/1.1\r\nX-%s%d: %s %d %%\r\nHost: x\r\n\r\n"


def test_authorization_is_dropped_only_where_tokens_are_in_use() -> None:
    req = Request(
        "GET", "/serve/m/p", [(b"Authorization", b"Bearer t"), (b"Proxy-Authorization", b"p")],
        b"", True,
    )  # fmt: skip
    assert b"Authorization: Bearer t" in _request_head(req, "/p", keep_authorization=True)
    assert b"uthorization" not in _request_head(req, "/p", keep_authorization=False)


CL0 = (b"Content-Length", b"0")


@pytest.mark.parametrize(
    ("status", "headers", "keep_alive", "expected", "chunked", "until_close"),
    [
        (200, [(b"Content-Length", b"2"), (b"X", b"1")], True, b"X: 1\r\nContent-Length: 2", 0, 0),
        (200, [(b"Transfer-Encoding", b"chunked")], True, b"Transfer-Encoding: chunked", 1, 0),
        (200, [(b"X", b"1")], True, b"X: 1\r\nConnection: close", 0, 1),
        (204, [(b"X", b"1")], True, b"X: 1", 0, 0),
        (200, [CL0], False, b"Content-Length: 0\r\nConnection: close", 0, 0),
        (200, [(b"Connection", b"X"), (b"X", b"1"), (b"Keep-Alive", b"5"), CL0], True,
         b"Content-Length: 0", 0, 0),
    ],
)  # fmt: skip
def test_the_response_head_is_written_anew(
    status: int,
    headers: list[tuple[bytes, bytes]],
    keep_alive: bool,
    expected: bytes,
    chunked: bool,
    until_close: bool,
) -> None:
    for _ in range(2):
        got = _response_head(status, headers, keep_alive)
        first = b"HTTP/1.1 %d " % status
        assert got[0].startswith(first) and got[0].endswith(b"\r\n" + expected + b"\r\n\r\n")
        assert got[1:] == (bool(chunked), bool(until_close))


# -- live: a gateway in a thread, replicas scripted over raw sockets -------------------------------

LOOPS = ["asyncio"] + (["uvloop"] if loop_factory() is not None else [])


class Replica:
    """Accepts connections and runs ``script(sock, n)`` for the n-th (from 0) in its own thread."""

    def __init__(self, script: Callable[[socket.socket, int], None]) -> None:
        self.script = script
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.sent = 0  # body bytes a script says it sent
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            n, self.connections = self.connections, self.connections + 1
            threading.Thread(target=self._run, args=(sock, n), daemon=True).start()

    def _run(self, sock: socket.socket, n: int) -> None:
        with sock, suppress(OSError):
            self.script(sock, n)


def read_request(sock: socket.socket, buf: bytearray) -> bytes | None:
    """One request's head from ``sock`` (bodies are not used here); None at the end."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    end = buf.index(b"\r\n\r\n") + 4
    got = bytes(buf[:end])
    del buf[:end]
    return got


def answer_each(
    reply: Callable[[int], bytes], *, close_after: int | None = None
) -> Callable[[socket.socket, int], None]:
    """A script answering every request on a connection with ``reply(i)``."""

    def script(sock: socket.socket, n: int) -> None:
        buf = bytearray()
        i = 0
        while read_request(sock, buf) is not None:
            if close_after is not None and i >= close_after:
                return  # closes without a byte of answer
            sock.sendall(reply(i))
            i += 1

    return script


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@contextmanager
def gateway(
    kind: str, replica: Replica, timeout_s: float = 5.0
) -> Iterator[tuple[int, Gateway, asyncio.AbstractEventLoop]]:
    factory = loop_factory() if kind == "uvloop" else asyncio.new_event_loop
    assert factory is not None
    loop = factory()
    gw = Gateway()
    gw.loop = loop
    gw.configure(
        {
            "name": "m",
            "replicas": [{"id": "r1", "port": replica.port}],
            "timeout_s": timeout_s,
            "max_concurrency": 8,
        }
    )
    server = loop.run_until_complete(loop.create_server(lambda: _Client(gw), "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server.sockets[0].getsockname()[1], gw, loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        replica.listener.close()


def in_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> Any:
    async def call() -> Any:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), loop).result(10)


def ask(port: int, request: bytes = b"GET /serve/m/x HTTP/1.1\r\nHost: x\r\n\r\n") -> bytes:
    """Send ``request`` on a new connection and read until the gateway closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
            if got.startswith(b"HTTP/1.1 200") and got.endswith(b"ok"):
                break
        return got


@pytest.mark.parametrize("kind", LOOPS)
def test_no_head_within_the_timeout_is_504_and_the_slot_goes_back(kind: str) -> None:
    def silent(sock: socket.socket, n: int) -> None:
        read_request(sock, bytearray())
        time.sleep(2)

    replica = Replica(silent)
    with gateway(kind, replica, timeout_s=0.3) as (port, gw, loop):
        started = time.monotonic()
        got = ask(port)
        assert got.startswith(b"HTTP/1.1 504") and time.monotonic() - started < 1.5
        stats = in_loop(loop, gw.stats)["m"]
        assert (stats["in_flight"], stats["errors"]) == (0, 1)
        assert stats["counts"]["r1"]["codes"] == {"504": 1}


@pytest.mark.parametrize("kind", LOOPS)
def test_a_body_that_stalls_closes_the_client_connection(kind: str) -> None:
    def stalls(sock: socket.socket, n: int) -> None:
        read_request(sock, bytearray())
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        time.sleep(2)

    replica = Replica(stalls)
    with gateway(kind, replica, timeout_s=0.3) as (port, gw, loop):
        got = ask(port)
        assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"\r\n\r\nabc")
        stats = in_loop(loop, gw.stats)["m"]
        assert (stats["in_flight"], stats["errors"]) == (0, 1)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_body_to_the_end_of_the_connection_is_relayed_whole(kind: str) -> None:
    def until_close(sock: socket.socket, n: int) -> None:
        read_request(sock, bytearray())
        sock.sendall(b"HTTP/1.1 200 OK\r\n\r\npart one, ")
        time.sleep(0.05)
        sock.sendall(b"part two")

    replica = Replica(until_close)
    with gateway(kind, replica) as (port, gw, loop):
        got = ask(port)
        assert got.endswith(b"Connection: close\r\n\r\npart one, part two")
        assert in_loop(loop, gw.stats)["m"]["errors"] == 0


@pytest.mark.parametrize("kind", LOOPS)
def test_a_stale_pooled_connection_is_tried_again_on_a_new_one(kind: str) -> None:
    replica = Replica(answer_each(lambda i: OK, close_after=1))
    with gateway(kind, replica) as (port, _, _):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            buf = bytearray()
            for _ in range(3):
                s.sendall(b"GET /serve/m/x HTTP/1.1\r\nHost: x\r\n\r\n")
                while not buf.endswith(b"ok"):
                    buf += s.recv(65536)
                assert buf.startswith(b"HTTP/1.1 200")
                buf.clear()
        assert replica.connections == 3  # each connection answered once, then went stale


@pytest.mark.parametrize(
    "reply",
    [
        OK + b"garbage",  # bytes after the answer
        OK + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno",  # a second answer unasked
    ],
)
@pytest.mark.parametrize("kind", LOOPS)
def test_a_connection_that_sent_more_than_one_answer_is_not_reused(kind: str, reply: bytes) -> None:
    replica = Replica(answer_each(lambda i: reply))
    with gateway(kind, replica) as (port, _, _):
        for _ in range(2):
            got = ask(port, b"GET /serve/m/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"\r\n\r\nok")
        assert replica.connections == 2


@pytest.mark.parametrize("kind", LOOPS)
def test_interim_answers_are_skipped_and_a_head_answer_is_not_reused(kind: str) -> None:
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    replica = Replica(answer_each(lambda i: early + OK))
    with gateway(kind, replica) as (port, _, _):
        got = ask(port)
        assert got.startswith(b"HTTP/1.1 200") and b"103" not in got
        got = ask(port, b"HEAD /serve/m/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"\r\n\r\n")
        assert replica.connections == 1
        assert ask(port).endswith(b"ok")
        assert replica.connections == 2  # after a HEAD the connection was not pooled


@pytest.mark.parametrize("kind", LOOPS)
def test_a_slow_client_pauses_the_replica_and_gets_every_byte(kind: str) -> None:
    size = 32 * 2**20
    pattern = bytes(range(256)) * 4096  # 1 MiB

    def big(sock: socket.socket, n: int) -> None:
        read_request(sock, bytearray())
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // len(pattern)):
            sock.sendall(pattern)
            replica.sent += len(pattern)

    replica = Replica(big)
    with gateway(kind, replica) as (port, gw, loop):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            s.connect(("127.0.0.1", port))
            s.settimeout(10)
            s.sendall(b"GET /serve/m/x HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(1.0)  # reads nothing meanwhile
            assert replica.sent < size // 2  # held back, not read into the gateway's memory
            buf = bytearray()
            while b"\r\n\r\n" not in buf:
                buf += s.recv(65536)
            del buf[: buf.index(b"\r\n\r\n") + 4]
            digest = hashlib.sha256(buf)
            got = len(buf)
            while got < size:
                chunk = s.recv(2**20)
                assert chunk
                digest.update(chunk)
                got += len(chunk)
        assert got == size
        assert digest.digest() == hashlib.sha256(pattern * (size // len(pattern))).digest()
        assert in_loop(loop, gw.stats)["m"]["errors"] == 0


@pytest.mark.parametrize("kind", LOOPS)
def test_a_request_without_a_valid_token_holds_no_body_budget(kind: str) -> None:
    """The token is checked on the head: a refused request's body is read and dropped, so clients
    without a token cannot fill the budget every tenant's bodies share."""
    from gpufrac.serving.http11 import BodyBudget

    replica = Replica(answer_each(lambda i: OK))
    before = _Client.budget
    _Client.budget = BodyBudget(10 * 2**20)
    try:
        with gateway(kind, replica) as (port, gw, loop):
            token = b"search-token-0123456789"
            in_loop(
                loop,
                lambda: gw.set_tokens({"tokens": {hashlib.sha256(token).hexdigest(): "t"}}),
            )
            gw.routes["m"].tenant = "t"
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"POST /serve/m/x HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n")
                s.sendall(b"x" * 3_000_000)
                time.sleep(0.3)
                assert in_loop(loop, lambda: _Client.budget.held) == 0  # type: ignore[union-attr]
                s.sendall(b"x" * 1_000_000)
                got = s.recv(65536)
            assert got.startswith(b"HTTP/1.1 401")
            authorised = (
                b"POST /serve/m/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token
                + b"\r\nContent-Length: 2\r\n\r\nhi"
            )  # fmt: skip
            assert ask(port, authorised).startswith(b"HTTP/1.1 200")
    finally:
        _Client.budget = before


@pytest.mark.parametrize("kind", LOOPS)
def test_chunk_trailers_are_not_passed_on_as_headers(kind: str) -> None:
    heads: list[bytes] = []

    def keep(sock: socket.socket, n: int) -> None:
        buf = bytearray()
        while (head := read_request(sock, buf)) is not None:
            heads.append(head)
            sock.sendall(OK)

    replica = Replica(keep)
    with gateway(kind, replica) as (port, _, _):
        request = (
            b"POST /serve/m/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\nab\r\n0\r\nX-Trailer: t\r\nHost: evil\r\n\r\n"
        )
        assert ask(port, request).startswith(b"HTTP/1.1 200")
    assert heads and b"X-Trailer" not in heads[0] and b"evil" not in heads[0]
    assert heads[0].count(b"Host:") == 1
