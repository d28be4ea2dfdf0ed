"""Logs relayed through a control plane, bounded, with real processes on loopback: ``gpufrac
control --local 2`` (two real node agents) and a fake node that joins with the real protocol and
declares an address where this test serves its "logs": trickled a byte at a time, or 64 MiB at
once. 45 parallel ``logs`` calls for workloads on the trickling node leave the control plane's
``/health`` answered and its real nodes alive and unfenced; the calls over the per-tenant and
per-node bounds are answered 429 with Retry-After, the others 504 at their deadline; the node
never sees more relays at once than the per-node bound; a node sending more than the cap is
refused without the control plane's memory growing by what it sent; ``gpufrac logs`` says each."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import free_port, running_agent

PY = sys.executable
DEADLINE_S = 2
PER_TENANT = 4
PER_NODE = 6
SETTINGS = f"""log_relay_deadline: {DEADLINE_S}s
log_relay_max: 1MiB
log_relay_per_tenant: {PER_TENANT}
log_relay_per_node: {PER_NODE}
"""
HUGE_MIB = 64  # what the fake node sends for "huge", against a cap of 1 MiB


class FakeLogs(BaseHTTPRequestHandler):
    """The fake node's log API: ``slow`` trickles a byte every 0.2 s (for up to 30 s), ``huge``
    sends 64 MiB as fast as it is read; counts the relays under way at once."""

    server: LogServer

    def do_GET(self) -> None:
        s = self.server
        with s.lock:
            s.now += 1
            s.most = max(s.most, s.now)
        try:
            self.send_response(200)
            self.send_header("content-type", "text/plain; charset=utf-8")
            self.send_header("x-gpufrac-run", "g1-a1")
            self.end_headers()  # no Content-Length: the body ends when the connection does
            if "/huge" in self.path:
                chunk = b"x" * 1023 + b"\n"
                for _ in range(HUGE_MIB * 1024):
                    self.wfile.write(chunk)
            else:
                for _ in range(150):
                    if s.stop.wait(0.2):
                        break
                    self.wfile.write(b".")
                    self.wfile.flush()
        except OSError:
            pass  # the relay gave up (its deadline, its cap): what the test wants
        finally:
            with s.lock:
                s.now -= 1

    def log_message(self, *args: Any) -> None:
        pass


class LogServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), FakeLogs)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.now = 0
        self.most = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@dataclass
class Plane:
    url: str
    node_url: str  # the control plane's node port
    data: Path
    proc: subprocess.Popen[bytes]
    logs: LogServer
    # one client for every call (thread-safe): a client each would load the CA bundle each time,
    # CPU this test's 45 threads would fight over
    http: httpx.Client = field(
        default_factory=lambda: httpx.Client(timeout=60, limits=httpx.Limits(max_connections=64))
    )
    stop: threading.Event = field(default_factory=threading.Event)

    def get(self, path: str, **kw: Any) -> Any:
        r = self.http.get(self.url + path, **kw)
        assert r.status_code == 200, r.text
        return r.json()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PY, "-m", "gpufrac.cli", *args, "--server", self.url],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "200"},
            check=False,
        )


def wait(ok: Callable[[], bool], what: Callable[[], object], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ok():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out: {what()}")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def join_fake_node(plane: Plane) -> None:
    """Join as node ``slow`` (labelled zone=slow) with the cluster token, be approved by the
    admin, and heartbeat every half second from a thread until the test ends."""
    token = (plane.data / "cluster-token").read_text().strip()
    gpus = [{"uuid": "GPU-slow-0", "model": "B200-180GB", "mig": False}]
    joined = plane.http.post(
        plane.node_url + "/cluster/v1/nodes/slow/join",
        json={"gpus": gpus, "labels": {"zone": "slow"}, "address": plane.logs.url},
        headers={"authorization": f"Bearer {token}"},
    )
    assert joined.status_code == 200, joined.text
    credential = joined.json()["credential"]
    approved = plane.http.post(plane.url + "/api/v1/nodes/slow/approve")
    assert approved.status_code == 200, approved.text

    def beat() -> None:
        while not plane.stop.wait(0.5):
            with contextlib.suppress(httpx.HTTPError):
                plane.http.post(
                    plane.node_url + "/cluster/v1/nodes/slow/heartbeat",
                    json={},
                    headers={"authorization": f"Bearer {credential}"},
                )

    threading.Thread(target=beat, daemon=True).start()


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    data = tmp_path / "control"
    data.mkdir()
    (data / "gpufrac.yaml").write_text(SETTINGS)
    port, node_port = free_port(), free_port()
    args = [PY, "-m", "gpufrac.cli", "control", "--local", "2", "--port", str(port)]
    args += ["--node-port", str(node_port), "--gateway-port", str(free_port())]
    args += ["--data-dir", str(data)]
    with open(tmp_path / "control.log", "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=log)
    logs = LogServer()
    threading.Thread(target=logs.serve_forever, daemon=True).start()
    p = Plane(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{node_port}", data, proc, logs)
    try:
        yield p
    finally:
        p.stop.set()
        logs.stop.set()
        logs.shutdown()
        logs.server_close()
        p.http.close()
        proc.terminate()  # the control plane stops its local nodes with it
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def manifest(tenant: str, name: str) -> str:
    return f"""apiVersion: gpufrac/v1
kind: Workload
metadata: {{name: {name}, tenant: {tenant}}}
spec:
  type: service
  command: ["sleep", "300"]
  resources: {{gpu: {{memory: 1GiB}}}}
  sharing: timeslice
  node_selector: {{zone: slow}}
"""


def nodes(plane: Plane) -> dict[str, str]:
    return {n["name"]: n["state"] for n in plane.get("/api/v1/nodes")["nodes"]}


def test_slow_and_talkative_nodes_hold_nothing_up(plane: Plane) -> None:
    wait(
        lambda: nodes(plane) == {"local-0": "alive", "local-1": "alive"},
        lambda: plane.get("/api/v1/nodes"),
    )
    join_fake_node(plane)
    placed = [("a", "slow"), ("b", "slow"), ("c", "huge")]
    # and on a real node (local-1), a job that writes 8 MiB
    on_local = CHATTY + "  node_selector: {gpufrac.io/kind: mps}\n"
    text = "---\n".join([*(manifest(t, n) for t, n in placed), on_local])
    applied = plane.http.post(plane.url + "/api/v1/workloads", content=text)
    assert applied.status_code == 200, applied.text
    for t, n in placed:
        wait(
            lambda t=t, n=n: plane.get(f"/api/v1/workloads/{t}/{n}")["node"] == "slow",
            lambda t=t, n=n: plane.get(f"/api/v1/workloads/{t}/{n}"),
        )

    # 45 calls at once, for two tenants' workloads on the trickling node
    def call(i: int) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        r = plane.http.get(plane.url + f"/api/v1/workloads/{'ab'[i % 2]}/slow/logs")
        return r, time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(45) as pool:
        calls = [pool.submit(call, i) for i in range(45)]
        wait(lambda: plane.logs.now > 0, lambda: "no relay reached the fake node")
        # meanwhile the control plane answers (on the old code: not before the trickles end)
        health = plane.http.get(plane.url + "/api/v1/health", timeout=5)
        assert health.status_code == 200 and health.json()["status"] == "ok", health.text
        done = [c.result() for c in calls]

    codes = sorted(r.status_code for r, _ in done)
    assert set(codes) == {429, 504}, codes
    assert 1 <= plane.logs.most <= PER_NODE  # never more relays at once than the node's bound
    busy = [r for r, _ in done if r.status_code == 429]
    for r in busy:
        assert r.headers["content-type"] == "application/problem+json"
        assert r.headers["retry-after"] == str(DEADLINE_S)
        assert r.json()["retry_after_s"] == DEADLINE_S
    said = {r.json()["detail"] for r in busy}
    assert any("log_relay_per_tenant" in d for d in said), said
    assert any("log_relay_per_node" in d for d in said), said
    for r, took in done:
        if r.status_code == 504:
            detail = r.json()["detail"]
            assert "node slow did not send the logs" in detail and "log_relay_deadline" in detail
            assert took < DEADLINE_S + 15  # ended by its deadline (generous: a noisy machine)

    # a node sending 64 MiB past a 1 MiB cap: refused, the rest never read nor held
    before = rss_kib(plane.proc.pid)
    for _ in range(3):
        r = plane.http.get(plane.url + "/api/v1/workloads/c/huge/logs", params={"tail": 0})
        assert r.status_code == 503, r.text
        assert "sent more than the 1 MiB of logs asked for" in r.json()["detail"]
    grown_mib = (rss_kib(plane.proc.pid) - before) / 1024
    assert grown_mib < HUGE_MIB / 2, f"the control plane grew by {grown_mib:.0f} MiB"

    # a real node answers the newest lines that fit the control plane's cap, and says so
    wait(
        lambda: plane.get("/api/v1/workloads/default/chatty")["phase"] == "succeeded",
        lambda: plane.get("/api/v1/workloads/default/chatty"),
    )
    whole = plane.get("/api/v1/workloads/default/chatty/logs", params={"tail": 0})
    assert whole["truncated"] is True and len(whole["lines"]) == (1 << 20) // 1013
    assert whole["lines"][-1].startswith("line 008191 ")
    last = plane.get("/api/v1/workloads/default/chatty/logs", params={"tail": 2})
    assert last["truncated"] is False and [x[:11] for x in last["lines"]] == [
        "line 008190",
        "line 008191",
    ]

    # the CLI says each plainly
    shown = plane.cli("logs", "c/huge", "--tail", "0")
    assert shown.returncode == 1 and "sent more than the 1 MiB" in shown.stderr, shown.stderr
    slow = plane.cli("logs", "a/slow")
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert "node slow did not send the logs of a/slow within 2 s" in slow.stderr, slow.stderr

    # the real nodes were neither held lost nor fenced
    assert nodes(plane) == {"local-0": "alive", "local-1": "alive", "slow": "alive"}
    kinds = {(e["kind"], e["subject"]) for e in plane.get("/api/v1/events?limit=1000")["events"]}
    assert not {k for k in kinds if k[0] in ("node_lost", "fenced")}, kinds
    for i in range(2):
        said_by_node = (plane.data / "nodes" / f"local-{i}" / "node.log").read_text()
        assert "fenced" not in said_by_node and "cannot reach" not in said_by_node, said_by_node


class Busy(BaseHTTPRequestHandler):
    """A server whose log reads are all under way: the workload is there, its logs 429."""

    def do_GET(self) -> None:
        if self.path.startswith("/api/v1/workloads/a/slow/logs"):
            body = (
                b'{"type":"urn:gpufrac:busy","title":"too many such calls are under way at '
                b'once","status":429,"detail":"4 log reads of tenant a are under way at once, '
                b'the most allowed (log_relay_per_tenant in gpufrac.yaml); try again in 2 s",'
                b'"retry_after_s":2}'
            )
            self.send_response(429)
            self.send_header("content-type", "application/problem+json")
            self.send_header("retry-after", "2")
        else:
            body = b'{"tenant":"a","name":"slow","phase":"running"}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_cli_says_when_the_server_is_busy_and_when_to_try_again() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        shown = subprocess.run(
            [PY, "-m", "gpufrac.cli", "logs", "a/slow"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "GPUFRAC_SERVER": f"http://127.0.0.1:{server.server_address[1]}"},
            check=False,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "4 log reads of tenant a are under way at once" in shown.stderr, shown.stderr
    assert "try again after 2 s (Retry-After)" in shown.stderr, shown.stderr


WRITE = "for i in range(8192): print('line %06d' % i, 'x' * 1000)"  # 8192 lines of 1013 bytes
CHATTY = f"""apiVersion: gpufrac/v1
kind: Workload
metadata: {{name: chatty}}
spec:
  type: job
  command: ["{PY}", "-c", "{WRITE}"]
  resources: {{gpu: {{memory: 1GiB}}}}
  sharing: timeslice
"""


def test_one_machine_reads_a_big_log_from_its_end_within_the_cap(tmp_path: Path) -> None:
    """8 MiB of output, a 1 MiB cap: ``tail=0`` answers the newest lines that fit, whole, and
    says older ones were left out; a tail that fits is answered whole."""
    files = {"gpufrac.yaml": "workload_users: agent\nlog_relay_max: 1MiB\n"}
    for agent in running_agent(tmp_path, "h200:1", files):
        with httpx.Client(base_url=agent.url, timeout=30) as http:
            assert http.post("/api/v1/workloads", content=CHATTY).status_code == 200
            wait(
                lambda: http.get("/api/v1/workloads/default/chatty").json()["phase"] == "succeeded",
                lambda: http.get("/api/v1/workloads/default/chatty").json(),
            )
            whole = http.get("/api/v1/workloads/default/chatty/logs", params={"tail": 0}).json()
            assert whole["truncated"] is True
            assert len(whole["lines"]) == (1 << 20) // 1013  # as many as 1 MiB holds
            assert whole["lines"][-1].startswith("line 008191 ")
            assert all(len(line) == 1012 for line in whole["lines"])  # each one whole
            last = http.get("/api/v1/workloads/default/chatty/logs", params={"tail": 3}).json()
            assert last["truncated"] is False
            assert [line[:11] for line in last["lines"]] == [
                "line 008189",
                "line 008190",
                "line 008191",
            ]
        shown = subprocess.run(
            [PY, "-m", "gpufrac.cli", "logs", "chatty", "--tail", "0", "--server", agent.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.returncode == 0, shown.stderr
        assert "older output left out" in shown.stderr, shown.stderr
        assert shown.stdout.splitlines()[-1].startswith("line 008191 ")
