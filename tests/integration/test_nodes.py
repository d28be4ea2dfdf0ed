"""A machine as a node: its name and labels come from gpufrac.yaml, the CLI and API show the node
beside each GPU and workload, and ``spec.node_selector`` decides where a workload may run, through a
real agent."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningAgent, free_port, kill_leftover_runs
from tests.integration.test_agent_api import manifest, wait_for
from tests.integration.test_cli_views import cli

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def labelled_agent(tmp_path: Path) -> Iterator[RunningAgent]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "gpufrac.yaml").write_text(
        "node:\n  name: gpu-a\n  labels: {zone: eu, gpufrac.io/pool: train}\n"
    )
    port = free_port()
    running = RunningAgent(f"http://127.0.0.1:{port}", data_dir, port, None)  # type: ignore[arg-type]
    running.start()
    yield running
    running.proc.kill()
    running.proc.wait(timeout=10)
    kill_leftover_runs(data_dir)


def with_selector(name: str, selector: str) -> str:
    return manifest(name, SLEEP) + f"  node_selector: {selector}\n"


def test_the_node_is_named_and_its_labels_choose_where_a_workload_runs(
    labelled_agent: RunningAgent,
) -> None:
    url = labelled_agent.url + "/api/v1/workloads"
    for name, selector in (("eu", "{zone: eu}"), ("us", "{zone: us, gpufrac.io/pool: train}")):
        r = httpx.post(url, content=with_selector(name, selector), timeout=10)
        assert r.status_code == 200, r.text
    got = wait_for(
        labelled_agent,
        lambda ws: {w["name"]: w["phase"] for w in ws} == {"eu": "running", "us": "pending"},
    )
    us = next(w for w in got["workloads"] if w["name"] == "us")
    assert us["reason"] == "no node has its spec.node_selector labels: node gpu-a lacks zone=us"
    assert us["spec"]["node_selector"] == {"zone": "us", "gpufrac.io/pool": "train"}
    gpus = httpx.get(labelled_agent.url + "/api/v1/gpus", timeout=10).json()["gpus"]
    assert {g["node"] for g in gpus} == {"gpu-a"}
    table = cli(labelled_agent, "get", "workloads")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if " eu " in f" {line} ")
    assert "gpu-a" in row.split()
    shown = cli(labelled_agent, "get", "gpus", "-o", "wide")
    assert shown.returncode == 0 and "gpu-a" in shown.stdout, shown.stdout
    # a bad label is refused whole, naming the field; nothing is stored
    r = httpx.post(url, content=with_selector("bad", "{'zone!': eu}"), timeout=10)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["spec", "node_selector", "zone!"]
    assert "bad" not in {w["name"] for w in httpx.get(url, timeout=10).json()["workloads"]}
