"""The workload sandbox: an agent running as root with API tokens runs each tenant's workloads as
the tenant's own unprivileged user, so a tenant's job cannot read the tokens, the store, or another
tenant's runs and logs, nor signal another tenant's processes. Workloads here are shell commands
(the test's Python lives where other users cannot reach)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import kill_leftover_runs
from tests.integration.conftest import TOKENS, RunningAgent, free_port, tokens_yaml

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tenant users need a root agent")


@pytest.fixture
def root_agent(tmp_path: Path) -> Iterator[RunningAgent]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "tokens.yaml").write_text(tokens_yaml())  # the default: workload_users: auto
    port = free_port()
    running = RunningAgent(f"http://127.0.0.1:{port}", data_dir, port, None)  # type: ignore[arg-type]
    running.start()
    yield running
    running.proc.kill()
    running.proc.wait(timeout=10)
    kill_leftover_runs(data_dir)


def h(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[who]}"}


def shell(name: str, tenant: str, script: str, kind: str = "job") -> str:
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}, tenant: {tenant}}}\n"
        f"spec:\n  type: {kind}\n  command: [/bin/sh, -c, {script!r}]\n"
        "  resources: {gpu: {fraction: 0.1}}\n  sharing: timeslice\n  restart: never\n"
    )


def finished(agent: RunningAgent, tenant: str, name: str) -> dict[str, Any]:
    url = f"{agent.url}/api/v1/workloads/{tenant}/{name}"
    deadline = time.monotonic() + 30
    while True:
        w: dict[str, Any] = httpx.get(url, headers=h(tenant)).json()
        if w["phase"] in ("succeeded", "failed"):
            return w
        assert time.monotonic() < deadline, w
        time.sleep(0.1)


def test_a_tenants_workload_cannot_reach_the_agent_or_another_tenant(
    root_agent: RunningAgent,
) -> None:
    url = root_agent.url + "/api/v1"
    data = root_agent.data_dir
    victim = shell("victim", "research", "echo research-secret; sleep 60", "service")
    assert httpx.post(url + "/workloads", content=victim, headers=h("research")).status_code == 200
    deadline = time.monotonic() + 30
    while (
        httpx.get(url + "/workloads/research/victim", headers=h("research")).json()["phase"]
        != "running"
    ):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    victim_pid = int((next((data / "runs/research/victim").glob("g1-*")) / "child.json")
                     .read_text().split('"pid": ')[1].split(",")[0])  # fmt: skip
    attack = (
        f"id -u; id -G; cat {data}/tokens.yaml && echo READ-TOKENS; "
        f"cat {data}/state.db > /dev/null && echo READ-STORE; "
        f"ls {data}/runs/research && echo LISTED-RUNS; "
        f"cat {data}/runs/research/victim/*/output.log && echo READ-LOG; "
        f"kill -STOP {victim_pid} && echo SIGNALLED; "
        "echo HOME=$HOME; env | grep -c GPUFRAC_TOKEN || true; echo done"
    )
    job = shell("attack", "search", attack)
    assert httpx.post(url + "/workloads", content=job, headers=h("search")).status_code == 200
    assert finished(root_agent, "search", "attack")["phase"] == "succeeded"
    out = httpx.get(url + "/workloads/search/attack/logs", headers=h("search")).json()["lines"]
    text = "\n".join(out)
    uid = int(out[0])
    assert uid >= 200_000 and out[1].split() == [str(uid)]  # its own user, no other group
    for leak in ("READ-TOKENS", "READ-STORE", "LISTED-RUNS", "READ-LOG", "SIGNALLED"):
        assert leak not in text, text
    assert TOKENS["admin"] not in text and "research-secret" not in text
    assert "done" in text
    # the same tenant gets the same user again; another tenant another one
    again = shell("again", "search", "id -u")
    assert httpx.post(url + "/workloads", content=again, headers=h("search")).status_code == 200
    finished(root_agent, "search", "again")
    lines = httpx.get(url + "/workloads/search/again/logs", headers=h("search")).json()["lines"]
    assert int(lines[0]) == uid
    other = shell("who", "research", "id -u")
    assert httpx.post(url + "/workloads", content=other, headers=h("research")).status_code == 200
    finished(root_agent, "research", "who")
    lines = httpx.get(url + "/workloads/research/who/logs", headers=h("research")).json()["lines"]
    assert int(lines[0]) not in (0, uid)
    # spec.user only from the tenant's allowlist (none configured here)
    named = shell("named", "search", "id -u").replace("  restart:", "  user: root\n  restart:")
    r = httpx.post(url + "/workloads", content=named, headers=h("search"))
    assert r.status_code == 422 and "spec" in r.text and "user" in r.text
