"""Request smuggling through the gateway: byte sequences that parsers disagree on are refused (400,
connection closed) before anything reaches a replica, and with several clients at once against an
upstream of either parser uvicorn has (h11, httptools), no response ever reaches the wrong
client."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import free_port
from tests.integration.test_gateway_http import connect, read_response

ROOT = Path(__file__).resolve().parents[2]
SMUGGLED = b"GET /serve/e/smuggled HTTP/1.1\r\nHost: x\r\nX-Client: evil\r\n\r\n"

# each: a request head (and body) that some parser reads as two requests
ATTACKS = {
    "obs-fold": b"POST /serve/e/a HTTP/1.1\r\nHost: x\r\nX-A: a\r\n Content-Length: %d\r\n"
    b"Content-Length: 0\r\n\r\n",
    "bare LF": b"POST /serve/e/a HTTP/1.1\r\nHost: x\nContent-Length: %d\r\n\r\n",
    "bare CR": b"POST /serve/e/a HTTP/1.1\r\nHost: x\rContent-Length: %d\r\n\r\n",
    "space before colon": b"POST /serve/e/a HTTP/1.1\r\nHost: x\r\nContent-Length : %d\r\n\r\n",
    "not a token": b"POST /serve/e/a HTTP/1.1\r\nHost: x\r\nContent[Length]: %d\r\n\r\n",
    "two lengths": b"POST /serve/e/a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
    b"Content-Length: %d\r\n\r\n",
    "length twice": b"POST /serve/e/a HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
    b"Content-Length: %d\r\n\r\n",
    "length and chunked": b"POST /serve/e/a HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "gzip": b"POST /serve/e/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n"
    b"Content-Length: %d\r\n\r\n",
    "gzip, chunked": b"POST /serve/e/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n"
    b"\r\n0\r\n\r\n",
}


def attack(head: bytes) -> bytes:
    n = len(SMUGGLED)
    count = head.count(b"%d")
    return (head % ((n,) * count) if count else head) + SMUGGLED


@pytest.fixture(params=["h11", "httptools"])
def gateway(request: pytest.FixtureRequest) -> Iterator[int]:
    upstream, port = free_port(), free_port()
    route = {"name": "e", "replicas": [{"id": "u", "port": upstream}], "max_concurrency": 4}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tests.integration.echo_asgi:app", "--port",
             str(upstream), "--http", request.param, "--log-level", "warning"],
            cwd=ROOT,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "gpufrac.serving.gateway", "--port", str(port),
             "--route", json.dumps(route)],
            cwd=ROOT, stdout=subprocess.PIPE,
        ),
    ]  # fmt: skip
    assert procs[1].stdout is not None and procs[1].stdout.readline()
    for _ in range(200):  # uvicorn is up when it accepts a connection
        try:
            socket.create_connection(("127.0.0.1", upstream), timeout=1).close()
            break
        except OSError:
            threading.Event().wait(0.05)
    yield port
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def test_smuggling_is_refused_and_answers_never_cross(gateway: int) -> None:
    wrong: list[str] = []
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            s, buf = connect(gateway), bytearray()
            for n in range(15):
                body = f"client {i} request {n}".encode()
                s.sendall(
                    b"POST /serve/e/echo HTTP/1.1\r\nHost: x\r\nX-Client: c%d\r\n"
                    b"Authorization: Bearer secret-%d\r\nContent-Length: %d\r\n\r\n%s"
                    % (i, i, len(body), body)
                )
                status, answer = read_response(s, buf)
                seen = json.loads(answer)
                mine = ["x-client", f"c{i}"] in seen["headers"] and seen["body"] == body.decode()
                if status != 200 or not mine:
                    wrong.append(f"client {i} got {status} {answer[:200]!r}")
        except BaseException as e:
            errors.append(e)

    def smuggler() -> None:
        try:
            for name, head in ATTACKS.items():
                s, buf = connect(gateway), bytearray()
                s.sendall(attack(head))
                status, answer = read_response(s, buf)
                if status != 400:
                    wrong.append(f"{name}: {status} {answer[:200]!r}")
                s.settimeout(5)
                if s.recv(65536) != b"":  # closed after the 400: nothing more is read from it
                    wrong.append(f"{name}: the connection stayed open")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=smuggler))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert not wrong, wrong
    # the connections the gateway pooled still answer in step: the next answer is this request's
    s, buf = connect(gateway), bytearray()
    for n in range(5):
        s.sendall(b"GET /serve/e/last-%d HTTP/1.1\r\nHost: x\r\n\r\n" % n)
        status, answer = read_response(s, buf)
        assert status == 200 and json.loads(answer)["path"] == f"/last-{n}"


def test_headers_named_in_connection_are_not_passed_on(gateway: int) -> None:
    s, buf = connect(gateway), bytearray()
    s.sendall(
        b"POST /serve/e/echo HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, X-Hop, x-other\r\n"
        b"X-Hop: 1\r\nX-Other: 2\r\nX-Kept: 3\r\nProxy-Authorization: Basic eDp5\r\n"
        b"Content-Length: 2\r\n\r\nhi"
    )
    status, answer = read_response(s, buf)
    names = {n for n, _ in json.loads(answer)["headers"]}
    assert status == 200 and "x-kept" in names and "host" in names
    assert not names & {"x-hop", "x-other", "proxy-authorization"}


@pytest.fixture
def strict_gateway() -> Iterator[int]:
    """A gateway with short client timeouts and small body bounds, with one route ``slow`` to a
    replica that never answers (a refused request's body is never held: bounds on bodies are
    tested on a route that exists)."""
    port = free_port()
    never = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    route = json.dumps({"name": "slow", "replicas": [{"id": "r", "port": never.getsockname()[1]}]})
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufrac.serving.gateway", "--port", str(port),
         "--head-timeout", "1", "--request-timeout", "2", "--idle-timeout", "2",
         "--max-body", "100000", "--total-bodies", "250000", "--route", route],
        cwd=ROOT, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline()
    yield port
    proc.kill()
    proc.wait(timeout=10)
    never.close()


def test_slow_and_greedy_clients_are_bounded(strict_gateway: int) -> None:
    started = time.monotonic()
    slow = [connect(strict_gateway) for _ in range(100)]
    for s in slow:
        s.sendall(b"POST /serve/none/x HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
    trickle = connect(strict_gateway)  # a head, then a body that never ends
    trickle.sendall(b"POST /serve/none/x HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\nab")
    idle = connect(strict_gateway)
    for s in [*slow, trickle]:
        status, _ = read_response(s, bytearray())
        assert status == 408
    assert idle.recv(10) == b""  # an idle connection is closed, quietly
    assert time.monotonic() - started < 8
    # one body over the limit, and bodies that together pass the server's bound
    big = connect(strict_gateway)
    big.sendall(b"POST /serve/slow/x HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n")
    assert read_response(big, bytearray())[0] == 413
    held = []
    statuses = []
    for _ in range(4):
        s = connect(strict_gateway)
        s.sendall(b"POST /serve/slow/x HTTP/1.1\r\nHost: x\r\nContent-Length: 99000\r\n\r\n")
        s.sendall(b"x" * 90000)
        held.append(s)
    for s in held:
        s.settimeout(0.5)
        try:
            statuses.append(read_response(s, bytearray())[0])
        except TimeoutError:
            statuses.append(0)  # still held, within the bound
    assert statuses.count(503) >= 1 and statuses.count(0) >= 2, statuses
