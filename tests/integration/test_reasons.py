"""Waiting reasons that add up, through a real agent on a fleet without MIG (real processes,
simulated GPUs): over a quota it says the quota alone, with the numbers and the setting; a cordoned
GPU that would hold it is named with what it has free; no mode the fleet lacks is named; and
``describe`` shows the same."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import RunningAgent, running_agent
from tests.integration.test_agent_api import wait_for
from tests.integration.test_cli_contract import cli

PY = sys.executable
SLEEP = json.dumps([PY, "-c", "import time; time.sleep(120)"])


@pytest.fixture
def plain_agent(tmp_path: Path) -> Iterator[RunningAgent]:
    """Two H200s, neither in MIG mode; tenant research may hold 50GiB of GPU memory."""
    yield from running_agent(
        tmp_path, "h200:2", {"gpufrac.yaml": "tenants:\n  research: {gpu_memory: 50GiB}\n"}
    )


def doc(tenant: str, name: str, gpu: str) -> str:
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}, tenant: {tenant}}}\n"
        f"spec:\n  type: service\n  command: {SLEEP}\n  resources: {{gpu: {gpu}}}\n"
    )


def post(agent: RunningAgent, text: str) -> dict[str, Any]:
    r = httpx.post(agent.url + "/api/v1/workloads", content=text, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def reason(agent: RunningAgent, key: str) -> str:
    """The reason it waits, once the agent's next pass has given one."""
    deadline = time.monotonic() + 20
    while True:
        r = httpx.get(f"{agent.url}/api/v1/workloads/{key}", timeout=10)
        assert r.status_code == 200, r.text
        if r.json()["phase"] == "pending" and r.json()["reason"]:
            return str(r.json()["reason"])
        assert time.monotonic() < deadline, r.json()
        time.sleep(0.1)


def test_reasons_name_the_quota_and_the_cordon_with_numbers_and_only_the_fleets_modes(
    plain_agent: RunningAgent,
) -> None:
    agent = plain_agent
    post(agent, doc("research", "first", "{memory: 30GiB}"))
    wait_for(agent, lambda ws: [w["phase"] for w in ws] == ["running"])
    post(agent, doc("research", "second", "{memory: 30GiB}"))
    quota = reason(agent, "research/second")
    # the quota alone: the GPUs have room, so no capacity clause contradicts it
    assert re.search(r"research would use 60(\.0)? ?GiB of GPU memory", quota), quota
    assert re.search(r"over its 50(\.0)? ?GiB quota", quota), quota
    assert "tenants.research.gpu_memory" in quota and "free" not in quota, quota
    described = cli(agent, "describe", "workload", "second", "--tenant", "research").stdout
    assert "tenants.research.gpu_memory" in described, described

    # the GPU research's job is not on: cordoned; a whole GPU is asked for
    gpus = httpx.get(agent.url + "/api/v1/gpus", timeout=10).json()["gpus"]
    held = {g["uuid"] for g in gpus if any(a.get("name") == "first" for a in g["allocations"])}
    assert len(held) == 1
    free = next(g for g in gpus if g["uuid"] not in held)
    r = httpx.post(f"{agent.url}/api/v1/gpus/{free['index']}/cordon", timeout=10)
    assert r.status_code == 200, r.text
    post(agent, doc("default", "whole", "{count: 1}"))
    cordon = reason(agent, "default/whole")
    assert re.search(
        rf"GPU {free['index']} is cordoned \(1[0-9]{{2}}\.[0-9] ?GiB free\)", cordon
    ), cordon
    for text in (quota, cordon):
        assert "MIG" not in text and "mig" not in text.lower(), text  # the fleet has none
        assert "0.0%" not in text, text
