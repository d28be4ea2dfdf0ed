"""A share of each of several GPUs (HAMi's ``nvidia.com/gpu: 2`` with ``gpumem``; issue 31)
through a real agent on simulated GPUs: the job sees both its GPUs, in its decision's order, with
its limit on each, and the fleet view shows its share on each GPU; over its limit on its second
GPU alone, it is stopped."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import gpufrac
from tests.integration.conftest import RunningAgent, running_agent

PY = sys.executable
SRC = Path(gpufrac.__file__).parents[1]  # the gpufrac under test, its SDK too (spec.env)
CODE = (
    "import os,time; print(os.environ['CUDA_VISIBLE_DEVICES'], "
    "os.environ['GPUFRAC_GPU_MEMORY_LIMIT_MIB'], flush=True); time.sleep(60)"
)
# within its limit on its first GPU, over it on its second (the sum apart)
HOG = (
    "from gpufrac import sdk; import time; sdk.report_gpu_use(1000); "
    "sdk.report_gpu_use(11000, device=1); time.sleep(60)"
)


def job(name: str, code: str) -> str:
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}}}\n"
        f'spec:\n  command: ["{PY}", "-c", "{code}"]\n  restart: never\n'
        f"  env: {{PYTHONPATH: {SRC}}}\n"
        "  resources: {gpu: {count: 2, memory: 10GiB}}\n"
    )


@pytest.fixture
def two_gpus(tmp_path: Path) -> Iterator[RunningAgent]:
    yield from running_agent(tmp_path, "h200:2")


def test_a_job_with_a_share_of_two_gpus_sees_both_and_holds_a_share_of_each(
    two_gpus: RunningAgent,
) -> None:
    url = two_gpus.url + "/api/v1"
    r = httpx.post(url + "/workloads", content=job("pair", CODE), timeout=10)
    assert r.status_code == 200, r.text
    lines: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not lines:
        lines = httpx.get(url + "/workloads/default/pair/logs", timeout=5).json()["lines"]
        time.sleep(0.1)
    w = httpx.get(url + "/workloads/default/pair", timeout=5).json()
    gpus = httpx.get(url + "/gpus", timeout=5).json()["gpus"]
    uuids = [g["uuid"] for g in sorted(gpus, key=lambda g: g["index"])]
    assert w["placement"]["gpus"] == uuids and w["placement"]["mode"] == "timeslice"
    assert lines == [f"{','.join(uuids)} 10240"]  # both GPUs, and its limit on each
    assert w["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    for g in gpus:  # its share on each GPU
        (share,) = g["allocations"]
        assert (share["name"], share["mode"], share["memory_mib"]) == ("pair", "timeslice", 10240)
        assert g["reserved_memory_mib"] == 10240
    assert httpx.delete(url + "/workloads/default/pair", timeout=10).status_code == 200
    # over its limit on its second GPU only: stopped, naming that GPU
    assert httpx.post(url + "/workloads", content=job("hog", HOG), timeout=10).status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        hog = httpx.get(url + "/workloads/default/hog", timeout=5).json()
        if hog["phase"] == "failed":
            break
        time.sleep(0.2)
    assert f"11000 MiB of GPU memory on {uuids[1]}, over its 10240 MiB limit" in hog["reason"]
