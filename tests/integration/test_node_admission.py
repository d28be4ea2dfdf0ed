"""Node admission over real HTTP on loopback: a fake node speaking the real join and heartbeat
protocol with the cluster token alone gets nothing until an admin approves it, and then no more
GPUs than approved; denied, revoked and pruned nodes' credentials stop working."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufrac.cluster.control import ControlPlane
from gpufrac.cluster.control_api import (
    NODE_PATHS,
    create_control_app,
    create_node_listener_app,
)
from gpufrac.cluster.node_api import serve_in_thread
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from tests.cluster_apps import Routed

TOKEN = "cluster-secret"
NODE = {"authorization": f"Bearer {TOKEN}"}


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[tuple[Routed, ControlPlane, Clock]]:
    clock = Clock()
    control = ControlPlane(tmp_path, OperatorSettings(node_prune_after_s=100.0), clock=clock)
    users, port = serve_in_thread(create_control_app(control), "127.0.0.1", 0)
    nodes, node_port = serve_in_thread(
        create_node_listener_app(control, cluster_token=TOKEN), "127.0.0.1", 0
    )
    with (
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as user_http,
        httpx.Client(base_url=f"http://127.0.0.1:{node_port}", timeout=10) as node_http,
    ):
        http = Routed(user_http, node_http)
        deadline = time.monotonic() + 10
        for path in ("/api/v1/health", NODE_PATHS):
            while True:
                try:
                    http.get(path)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
        yield http, control, clock
    users.should_exit = nodes.should_exit = True
    control.close()


def join(http: Routed, name: str, n: int, **more: Any) -> httpx.Response:
    gpus = [{"uuid": f"GPU-{name}-{i}", "model": "B200-180GB", "mig": False} for i in range(n)]
    return http.post(f"/cluster/v1/nodes/{name}/join", json={"gpus": gpus, **more}, headers=NODE)


def beat(http: Routed, name: str, credential: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {credential}"}
    return http.post(f"/cluster/v1/nodes/{name}/heartbeat", json={}, headers=headers)


def secret_service() -> WorkloadSpec:
    return WorkloadSpec(
        name="db",
        tenant="beta",
        command=("sleep", "60"),
        gpu=GpuRequest(count=1),
        env={"BETA_DB_PASSWORD": "hunter2"},
    )


def test_a_node_with_the_cluster_token_alone_gets_nothing_until_approved_then_its_cap(
    plane: tuple[Routed, ControlPlane, Clock],
) -> None:
    http, control, _ = plane
    r = join(http, "fake", 64, labels={"zone": "eu"}, address="http://127.0.0.1:9")
    assert r.status_code == 200, r.text
    credential = r.json()["credential"]
    control.apply_workload(secret_service())
    answer = beat(http, "fake", credential).json()
    assert answer["status"] == "pending" and answer["run"] == []
    assert "hunter2" not in json.dumps(answer)
    assert [n.name for n in control.pending_nodes()] == ["fake"]
    assert control.status("beta/db")[0] == "pending"
    # shown as it waits, with no traffic and no log reads there
    assert [(n.name, n.state) for n in control.nodes()] == [("fake", "pending")]
    assert control.addresses == {}
    assert [e.kind for e in control.store.events() if e.subject == "fake"] == ["node_pending"]
    # approved with 2 of the 64 it declared: what waited is placed there, on those 2 only
    control.approve("fake", 2)
    assert [(n.name, n.gpus) for n in control.nodes()] == [("fake", 2)]
    answer = beat(http, "fake", credential).json()
    assert answer["status"] == "ok"
    assert [a["decision"]["workload"] for a in answer["run"]] == ["beta/db"]
    # another join under its name without its credential is refused while it lives; its own
    # join again keeps the cap
    assert join(http, "fake", 64).status_code == 409
    gpus = [{"uuid": f"GPU-fake-{i}", "model": "B200-180GB", "mig": False} for i in range(64)]
    kept = http.post(
        "/cluster/v1/nodes/fake/join",
        json={"gpus": gpus},
        headers={**NODE, "x-gpufrac-node-credential": credential},
    )
    assert kept.status_code == 200 and kept.json()["credential"] is None
    assert [(n.name, n.gpus) for n in control.nodes()] == [("fake", 2)]


def test_deny_revoke_and_prune_take_the_credential_away(
    plane: tuple[Routed, ControlPlane, Clock],
) -> None:
    http, control, clock = plane
    one = join(http, "one", 1).json()["credential"]
    two = join(http, "two", 1).json()["credential"]
    control.deny("one")
    assert beat(http, "one", one).status_code == 401
    denied = join(http, "one", 1)
    assert denied.status_code == 403 and "denied" in denied.text
    control.approve("two")
    assert beat(http, "two", two).json()["status"] == "ok"
    control.revoke("two")
    assert beat(http, "two", two).status_code == 401
    assert "two" not in {n.name for n in control.admitted()}
    three = join(http, "three", 1).json()["credential"]
    control.approve("three")
    assert beat(http, "three", three).json()["status"] == "ok"
    clock.now = 50.0
    control.tick()  # lost (its lease ran out), not yet pruned
    assert "three" in {n.name for n in control.admitted()}
    clock.now = 200.0
    control.tick()
    assert "three" not in {n.name for n in control.admitted()}
    assert beat(http, "three", three).status_code == 401
    kinds = [e.kind for e in control.store.events() if e.subject in ("one", "two", "three")]
    assert {"node_denied", "node_revoked", "node_pruned", "node_approved"} <= set(kinds)


def test_nodes_joined_before_the_upgrade_are_approved_on_upgrade(tmp_path: Path) -> None:
    (tmp_path / "node-credentials.json").write_text(json.dumps({"old": "its-secret"}))
    control = ControlPlane(tmp_path)
    assert [(n.name, n.state) for n in control.admitted()] == [("old", "approved")]
    assert control.credential_ok("old", "its-secret")
    assert not (tmp_path / "node-credentials.json").exists()
    control.close()


def test_the_admin_approves_a_pending_node_from_the_cli_and_a_tenant_may_not(
    plane: tuple[Routed, ControlPlane, Clock],
) -> None:
    http, _, _ = plane
    credential = join(http, "edge", 4).json()["credential"]
    url = str(http.users.base_url).rstrip("/")
    listed = cli_at(url, "nodes", "list")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"edge\s+pending\s+4", listed.stdout), listed.stdout
    assert "gpufrac nodes approve NAME" in listed.stdout
    wrong = http.post("/api/v1/nodes/edge/deny", params={"gpus": 1})
    assert wrong.status_code == 422 and "gpus" in wrong.text  # gpus goes with approve only
    approved = cli_at(url, "nodes", "approve", "edge", "--gpus", "1", "--json")
    assert approved.returncode == 0, approved.stderr
    now = json.loads(approved.stdout)["now"]
    assert (now["state"], now["gpus"], now["gpu_cap"]) == ("alive", 1, 1)
    assert beat(http, "edge", credential).json()["status"] == "ok"
    gone = cli_at(url, "nodes", "revoke", "edge")
    assert gone.returncode == 0 and "revoked" in gone.stdout, gone.stderr
    assert beat(http, "edge", credential).status_code == 401
    unknown = cli_at(url, "nodes", "approve", "nobody")
    assert unknown.returncode == 2 and "name" in unknown.stderr, unknown.stderr


def cli_at(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUFRAC_SERVER": url, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "gpufrac.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
