"""The agent stays alive and says when it is not: a store that cannot be written makes /health say
degraded (with why) and writes answer 503, the reconcile loop keeps going, and all of it recovers by
itself once the store can be written again. In-process agent, real processes, simulated GPUs."""

from __future__ import annotations

import errno
import os
import signal
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from gpufrac.api.app import create_app
from gpufrac.devices import open_simulated
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.service import AgentService
from gpufrac.runtime.shim import read_status
from tests.conftest import kill_leftover_runs
from tests.prom import value

WRITES = ("BEGIN", "INSERT", "UPDATE", "DELETE")


class FaultyDb:
    """The store's connection, with writes failing while ``broken`` (as a full or failing disk)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.broken = False
        self.agent: Agent | None = None

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if self.broken and sql.lstrip().split()[0].upper() in WRITES:
            raise sqlite3.OperationalError("disk I/O error")
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def manifest(name: str) -> str:
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}}}\nspec:\n"
        f"  command: [{sys.executable}, -c, 'import time; time.sleep(60)']\n"
        "  resources: {gpu: {fraction: 0.25}}\n"
    )


def until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture
def client(data_dir: Path) -> Iterator[tuple[httpx.Client, FaultyDb]]:
    """The agent's app served over real HTTP by uvicorn in a thread."""
    agent = Agent(data_dir, open_simulated("h200:1", data_dir))
    faulty = FaultyDb(agent.store.db)
    agent.store.db = faulty  # type: ignore[assignment]
    faulty.agent = agent
    service = AgentService(agent, interval=0.1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(service, loop=service), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until(lambda: server.started)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
        yield c, faulty
    server.should_exit = True
    thread.join(timeout=10)
    kill_leftover_runs(data_dir)


def test_an_unwritable_store_is_degraded_health_and_recovers(
    client: tuple[httpx.Client, FaultyDb],
) -> None:
    c, faulty = client
    assert c.get("/api/v1/health").json() == {
        "status": "ok",
        "version": c.get("/api/v1/health").json()["version"],
        "problems": [],
        "role": "agent",
        "nodes": 1,
        "nodes_alive": 1,
    }
    assert c.post("/api/v1/workloads", content=manifest("before")).status_code == 200

    def phase(name: str) -> str | None:
        r = c.get(f"/api/v1/workloads/default/{name}")
        return r.json()["phase"] if r.status_code == 200 else None

    until(lambda: phase("before") == "running")
    faulty.broken = True
    until(lambda: c.get("/api/v1/health").json()["status"] == "degraded")
    problems = c.get("/api/v1/health").json()["problems"]
    assert any("writing the store failed: disk I/O error" in p for p in problems), problems
    refused = c.post("/api/v1/workloads", content=manifest("during"))
    assert refused.status_code == 503 and "nothing was changed" in refused.text
    assert phase("before") == "running" and phase("during") is None
    metrics = c.get("/metrics").text
    assert value(metrics, "gpufrac_agent_failing_steps") in (1, 2)
    faulty.broken = False
    until(lambda: c.get("/api/v1/health").json()["status"] == "ok")
    assert c.post("/api/v1/workloads", content=manifest("after")).status_code == 200
    until(lambda: phase("after") == "running")  # the loop went on all along
    kinds = [(e["kind"], e["subject"]) for e in c.get("/api/v1/events?limit=1000").json()["events"]]
    assert ("action_recovered", "agent") in kinds


def test_a_data_directory_that_refuses_a_write_is_a_503_not_a_500(
    client: tuple[httpx.Client, FaultyDb], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, faulty = client
    assert c.post("/api/v1/workloads", content=manifest("w")).status_code == 200
    assert faulty.agent is not None

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(faulty.agent.runs, "remove", full)
    r = c.delete("/api/v1/workloads/default/w")
    assert r.status_code == 503 and "No space left" in r.text, r.text
    assert r.headers["retry-after"]
    monkeypatch.undo()
    assert c.delete("/api/v1/workloads/default/w").status_code == 200


def test_a_job_whose_outcome_is_unknown_waits_for_an_admin_to_clear_it(
    client: tuple[httpx.Client, FaultyDb],
) -> None:
    """Its shim killed, an on-failure job may have exited 0: it is not run again until the admin
    clears it (POST .../clear-unknown), then it is, as a failed attempt."""
    c, faulty = client
    doc = manifest("j").replace("spec:\n", "spec:\n  type: job\n  restart: on-failure\n")
    assert c.post("/api/v1/workloads", content=doc).status_code == 200
    path = "/api/v1/workloads/default/j"
    until(lambda: c.get(path).json()["phase"] == "running")
    assert c.post(f"{path}/clear-unknown").status_code == 409  # its outcome is not unknown
    assert faulty.agent is not None
    run = faulty.agent.runs.attempts("default", "j", 1)[-1]
    shim = read_status(run).shim_pid
    assert shim is not None
    os.kill(shim, signal.SIGKILL)
    until(lambda: c.get(path).json()["phase"] == "unknown")
    time.sleep(0.5)  # some passes on: still unknown, and not run again
    seen = c.get(path).json()
    assert seen["phase"] == "unknown" and seen["attempts"] == 1, seen
    assert "gpufrac clear-unknown default/j" in seen["reason"], seen
    assert c.post("/api/v1/workloads/default/nope/clear-unknown").status_code == 404
    cleared = c.post(f"{path}/clear-unknown")
    assert cleared.status_code == 200 and cleared.json() == {"cleared": "default/j"}, cleared.text
    until(lambda: c.get(path).json()["attempts"] == 2)
    kinds = [e["kind"] for e in c.get(f"{path}").json()["events"]]
    assert "outcome_cleared" in kinds
