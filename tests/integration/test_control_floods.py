"""A hostile tenant's bounded floods against a cluster's control plane and its node agents, all
real processes on loopback: nothing the tenant sends delays the nodes' heartbeats enough for a
node to fence itself or be held lost, and another tenant's calls are answered throughout."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import kill_leftover_runs
from tests.integration.conftest import TOKENS, free_port, tokens_yaml

PY = sys.executable
FLOOD_S = 6.0  # longer than a node's fencing time (4 s)


@dataclass
class Plane:
    url: str
    data: Path
    proc: subprocess.Popen[bytes]

    def call(self, method: str, path: str, token: str = "admin", **kw: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {TOKENS[token]}"}
        return httpx.request(method, self.url + path, headers=headers, timeout=30, **kw)

    def get(self, path: str, token: str = "admin") -> Any:
        r = self.call("GET", path, token)
        assert r.status_code == 200, r.text
        return r.json()


def wait(what: str, ok: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ok():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    data = tmp_path / "control"
    data.mkdir()
    (data / "tokens.yaml").write_text(tokens_yaml())
    (data / "tokens.yaml").chmod(0o600)
    port = free_port()
    args = [PY, "-m", "gpufrac.cli", "control", "--local", "2", "--port", str(port)]
    args += ["--node-port", str(free_port()), "--gateway-port", str(free_port())]
    with open(tmp_path / "control.log", "ab") as log:
        proc = subprocess.Popen([*args, "--data-dir", str(data)], stdout=log, stderr=log)
    p = Plane(f"http://127.0.0.1:{port}", data, proc)
    try:
        wait(
            "two nodes alive",
            lambda: [n["state"] for n in p.get("/api/v1/nodes")["nodes"]] == ["alive", "alive"],
        )
        yield p
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        kill_leftover_runs(tmp_path)


SERVICE = (
    "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: steady, tenant: search}\n"
    f"spec:\n  type: service\n  command: [{PY}, -c, 'import time; time.sleep(600)']\n"
    "  resources: {gpu: {memory: 5Gi}}\n"
)


def test_a_flood_of_big_manifests_fences_no_node_and_holds_no_other_tenant(plane: Plane) -> None:
    r = plane.call("POST", "/api/v1/workloads", "search", content=SERVICE)
    assert r.status_code == 200, r.text
    wait(
        "steady running",
        lambda: plane.get("/api/v1/workloads/search/steady", "search")["phase"] == "running",
    )
    flow = "a: [" + ",".join(["1"] * 450_000) + "]\n"  # ~900 KB, as the attack sent
    answers: Counter[int] = Counter()
    no_retry_after: list[int] = []
    reads: list[int] = []
    stop = time.monotonic() + FLOOD_S

    def flood() -> None:
        with httpx.Client(timeout=60) as http:
            while time.monotonic() < stop:
                got = http.post(
                    plane.url + "/api/v1/workloads",
                    content=flow,
                    headers={"authorization": f"Bearer {TOKENS['research']}"},
                )
                answers[got.status_code] += 1
                if got.status_code == 429 and not got.headers.get("retry-after"):
                    no_retry_after.append(got.status_code)

    def read() -> None:  # another tenant, meanwhile
        while time.monotonic() < stop:
            reads.append(plane.call("GET", "/api/v1/workloads", "search").status_code)
            time.sleep(0.2)

    threads = [threading.Thread(target=flood) for _ in range(10)] + [threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(answers) <= {413, 429} and answers[413] >= 1, answers
    assert not no_retry_after
    assert reads and set(reads) == {200}, Counter(reads)
    time.sleep(1.5)  # a fencing's event comes with the node's next answered heartbeat
    kinds = Counter(e["kind"] for e in plane.get("/api/v1/events?limit=500")["events"])
    assert kinds["fenced"] == 0 and kinds["node_lost"] == 0, kinds
    assert [n["state"] for n in plane.get("/api/v1/nodes")["nodes"]] == ["alive", "alive"]
    steady = plane.get("/api/v1/workloads/search/steady", "search")
    assert (steady["phase"], steady["attempts"], steady["restarts"]) == ("running", 1, 0), steady
