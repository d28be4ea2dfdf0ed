"""A real agent: `gpufrac agent` as its own process (uvicorn on a free port), on simulated GPUs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gpufrac.cluster.node import NodeAgent
from tests.conftest import kill_leftover_runs

FLEET = "h200:2:mig,h200:2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningAgent:
    url: str
    data_dir: Path
    port: int
    proc: subprocess.Popen[bytes]
    fleet: str = FLEET

    def start(self) -> None:
        self.proc = _spawn(self.port, self.data_dir, self.fleet)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/api/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("the agent did not come up")

    @property
    def gateway(self) -> str:
        return f"http://127.0.0.1:{(self.data_dir / 'gateway.port').read_text()}"

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


def _spawn(port: int, data_dir: Path, fleet: str = FLEET) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GPUFRAC_SIMULATE": fleet, "GPUFRAC_DATA_DIR": str(data_dir)}
    gateway = (
        (data_dir / "gateway.port").read_text() if (data_dir / "gateway.port").exists() else ""
    )
    if not gateway:
        gateway = str(free_port())
        (data_dir / "gateway.port").write_text(gateway)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpufrac.cli",
            "agent",
            "--port",
            str(port),
            "--gateway-port",
            gateway,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(data_dir.parent / "agent.log", "ab"),
    )


def running_agent(
    tmp_path: Path, fleet: str = FLEET, files: dict[str, str] | None = None
) -> Iterator[RunningAgent]:
    """A real agent on ``fleet`` with ``files`` (gpufrac.yaml, tokens.yaml: name -> text) in its
    data directory, for a fixture to yield; killed afterwards, with every run it left."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for name, text in (files or {}).items():
        (data_dir / name).write_text(text)
        (data_dir / name).chmod(0o600)  # tokens.yaml above all: the owner's alone
    port = free_port()
    running = RunningAgent(f"http://127.0.0.1:{port}", data_dir, port, None, fleet)  # type: ignore[arg-type]
    running.start()
    yield running
    running.proc.kill()
    running.proc.wait(timeout=10)
    kill_leftover_runs(data_dir)  # leave nothing behind


def close_nodes(nodes: Iterable[NodeAgent]) -> None:
    """In-process cluster nodes gone with every run they started: each workload deleted, the
    agent closed, what is left of its runs killed."""
    for n in nodes:
        with n.agent.lock:
            for w in n.agent.store.workloads():
                n.agent.delete(w.tenant, w.name)
        n.agent.close()
        kill_leftover_runs(n.agent.data_dir)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    yield from running_agent(tmp_path)


@pytest.fixture
def small_agent(tmp_path: Path) -> Iterator[RunningAgent]:
    """An agent on one H200 in MIG mode and one without."""
    yield from running_agent(tmp_path, "h200:1:mig,h200:1")


TOKENS = {
    "search": "search-token-0123456789",
    "research": "research-token-0123456789",
    "admin": "admin-token-0123456789",
}


def tokens_yaml() -> str:
    return (
        "tokens:\n"
        f"  {TOKENS['search']}: {{tenant: search}}\n"
        f"  {TOKENS['research']}: {{tenant: research}}\n"
        f"  {TOKENS['admin']}: {{admin: true}}\n"
    )


# search may evict another tenant's lower-priority work (the operator's decision: the default is
# own-tenant); research has no setting of its own, so it evicts only its own
TENANT_SETTINGS = "workload_users: agent\ntenants:\n  search: {preemption: lower-priority}\n"


@pytest.fixture
def tenant_agent(tmp_path: Path) -> Iterator[RunningAgent]:
    """An agent with API tokens for two tenants and the admin, running workloads as its own user
    (these tests run Python workloads from a venv other users cannot reach; the sandbox of tenant
    users has its own test); search may evict research's lower-priority work (TENANT_SETTINGS)."""
    yield from running_agent(
        tmp_path, files={"gpufrac.yaml": TENANT_SETTINGS, "tokens.yaml": tokens_yaml()}
    )
