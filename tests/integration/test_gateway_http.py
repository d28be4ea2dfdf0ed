"""The gateway's HTTP/1.1 handling, with a real replica server and raw sockets (no agent)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.integration.conftest import free_port
from tests.integration.serving_fixtures import stream_chunks

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gateway() -> Iterator[int]:
    replica_port, port = free_port(), free_port()
    route = {"name": "m", "replicas": [{"id": "r1", "port": replica_port}]}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gpufrac.serving.replica", "examples.serving.models:echo_sum",
             "--port", str(replica_port)],
            cwd=ROOT, stdout=subprocess.PIPE,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "gpufrac.serving.gateway", "--port", str(port),
             "--route", json.dumps(route)],
            cwd=ROOT, stdout=subprocess.PIPE,
        ),
    ]  # fmt: skip
    for p in procs:
        assert p.stdout is not None and p.stdout.readline()  # serving / ready
    yield port
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(s: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    """One response from ``s`` (``buf`` keeps what arrived beyond it)."""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    end = buf.index(b"\r\n\r\n")
    head = bytes(buf[:end]).decode()
    status = int(head.split(" ", 2)[1])
    length = next(
        (
            int(line.split(":")[1])
            for line in head.split("\r\n")
            if line.lower().startswith("content-length")
        ),
        0,
    )
    if head.startswith("HTTP/1.1 100"):
        length = 0
    while len(buf) < end + 4 + length:
        buf += s.recv(65536)
    body = bytes(buf[end + 4 : end + 4 + length])
    del buf[: end + 4 + length]
    return status, body


def post(body: bytes, extra: str = "") -> bytes:
    return (
        f"POST /serve/m/predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def test_pipelined_and_fragmented_requests_are_answered_in_order(gateway: int) -> None:
    s, buf = connect(gateway), bytearray()
    s.sendall(post(b'{"inputs": [1]}') + post(b'{"inputs": [1, 2]}'))  # two at once
    assert read_response(s, buf) == (200, b'{"outputs": 1}')
    assert read_response(s, buf) == (200, b'{"outputs": 3}')
    for byte in post(b'{"inputs": [4, 5]}'):  # one byte a packet
        s.sendall(bytes([byte]))
        time.sleep(0.0005)
    assert read_response(s, buf) == (200, b'{"outputs": 9}')


def test_expect_100_continue_is_answered_before_the_body(gateway: int) -> None:
    s, buf = connect(gateway), bytearray()
    body = b'{"inputs": [7]}'
    s.sendall(
        post(b"", "Expect: 100-continue\r\n").replace(b"Length: 0", f"Length: {len(body)}".encode())
    )
    assert read_response(s, buf)[0] == 100  # at once, not after the client's own wait
    s.sendall(body)
    assert read_response(s, buf) == (200, b'{"outputs": 7}')


def test_a_head_answer_has_no_body_and_the_connection_goes_on(gateway: int) -> None:
    s, buf = connect(gateway), bytearray()
    s.sendall(b"HEAD /serve/m/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 ") and rest == b""
    buf.clear()
    time.sleep(0.2)
    s.sendall(post(b'{"inputs": [2, 2]}'))
    assert read_response(s, buf) == (200, b'{"outputs": 4}')  # nothing left over from the HEAD


def test_bad_requests_get_an_error_not_a_hang(gateway: int) -> None:
    s, buf = connect(gateway), bytearray()
    s.sendall(b"NONSENSE\r\n\r\n")
    assert read_response(s, buf)[0] == 400
    s2, buf2 = connect(gateway), bytearray()
    body = b'{"inputs": [1]}'
    s2.sendall(
        b"POST /serve/m/predict HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    )
    assert read_response(s2, buf2)[0] == 200  # a chunked body goes on with its length
    s3, buf3 = connect(gateway), bytearray()
    s3.sendall(post(b'{"inputs": [1]}').replace(b"/serve/m/", b"/serve/nope/"))
    assert read_response(s3, buf3)[0] == 404


class _Upstream(BaseHTTPRequestHandler):
    """``/slow`` answers after 2 s, ``/fast`` at once, ``/stream`` in 3 chunks 0.6 s apart."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/stream":
            stream_chunks(self, lambda i: f"chunk {i}\n", 0.6)
            return
        if self.path == "/slow":
            time.sleep(2.0)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def narrow_gateway() -> Iterator[int]:
    """A gateway with one slot (max_concurrency 1) and a 1 s timeout, over a scripted upstream."""
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    route = {
        "name": "n", "replicas": [{"id": "u", "port": upstream.server_address[1]}],
        "max_concurrency": 1, "queue_limit": 8, "timeout_s": 1.0,
    }  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufrac.serving.gateway",
         "--port", str(port), "--route", json.dumps(route)],
        cwd=ROOT, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline()
    yield port
    proc.kill()
    proc.wait(timeout=10)
    upstream.shutdown()


def test_a_client_that_goes_away_gives_its_slot_back(narrow_gateway: int) -> None:
    gone = connect(narrow_gateway)
    gone.sendall(post(b"{}").replace(b"/serve/m/predict", b"/serve/n/slow"))
    time.sleep(0.2)
    gone.close()  # while its request holds the only slot
    time.sleep(0.2)
    s, buf = connect(narrow_gateway), bytearray()
    started = time.monotonic()
    s.sendall(post(b"{}").replace(b"/serve/m/predict", b"/serve/n/fast"))
    assert read_response(s, buf) == (200, b"ok")
    # at once, not when the abandoned request would have freed the slot (its 1 s timeout, 0.6 s on)
    assert time.monotonic() - started < 0.3


def test_a_stream_longer_than_the_timeout_is_not_cut_while_it_flows(narrow_gateway: int) -> None:
    s = connect(narrow_gateway)
    s.sendall(post(b"{}").replace(b"/serve/m/predict", b"/serve/n/stream"))
    data = b""
    while not data.endswith(b"0\r\n\r\n"):
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    assert b"chunk 2" in data and b"504" not in data


def test_a_bad_content_length_is_refused(gateway: int) -> None:
    for value in (b"-40", b"+5", b"1_0"):
        s, buf = connect(gateway), bytearray()
        s.sendall(b"GET /serve/m/healthz HTTP/1.1\r\nContent-Length: " + value + b"\r\n\r\n")
        assert read_response(s, buf)[0] == 400, value
    s, buf = connect(gateway), bytearray()
    s.sendall(post(b'{"inputs": [3]}'))  # and the gateway and its replica still serve
    assert read_response(s, buf) == (200, b'{"outputs": 3}')


def test_a_commanded_gateway_answers_503_until_the_agent_has_sent_everything(
    tmp_path: Path,
) -> None:
    """A gateway the agent (re)starts listens before it knows the deployments: until the agent says
    "G" a request gets a 503 to retry, not a 404 for a deployment that exists."""
    from gpufrac.runtime.child_link import ChildLink

    port = free_port()
    link = ChildLink("request gateway", "gpufrac.serving.gateway", tmp_path / "gateway.log")
    link.start(["--host", "127.0.0.1", "--port", str(port)])
    try:
        s, buf = connect(port), bytearray()
        s.sendall(b"GET /serve/m/x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s, buf)[0] == 503
        link.call("A " + json.dumps({"tokens": None}))
        s.sendall(post(b"{}"))
        assert read_response(s, buf)[0] == 503  # tokens alone are not everything
        link.call("G")
        s.sendall(b"GET /serve/m/x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s, buf)[0] == 404  # settled: an unknown name is unknown
    finally:
        link.close()
