"""The agent on a real GPU: memory limits under MPS and without it. Written without a GPU at hand
(no device was lent to the session that wrote it): `make gpu-check` runs it on an H200."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gpufrac.devices.nvml import NvmlDevices
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.runtime.agent import Agent, WorkloadState
from gpufrac.runtime.mps import MpsDomain

pytestmark = pytest.mark.gpu

HOLD = """
import sys, time, torch
from gpufrac import sdk
{cap}
gib = int(sys.argv[1])
x = torch.empty(gib * 2**30, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
print("holding", gib, "GiB", flush=True)
time.sleep(int(sys.argv[2]))
"""


def spec(name: str, gib: int, seconds: int, sharing: str, cap: bool) -> WorkloadSpec:
    code = HOLD.format(cap="sdk.cap_torch_memory()" if cap else "")
    gpu = (
        GpuRequest(memory_mib=4096, compute_pct=40)
        if sharing == "mps"
        else GpuRequest(memory_mib=4096)
    )
    return WorkloadSpec(
        name=name,
        gpu=gpu,
        command=(sys.executable, "-c", code, str(gib), str(seconds)),
        sharing=sharing,
        restart="never",
        type="job",
    )


def settle(agent: Agent, timeout: float = 120.0) -> dict[str, WorkloadState]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = {s.key: s for s in agent.reconcile()}
        if states["default/hog"].phase == "failed" and states["default/ok"].phase in (
            "running",
            "succeeded",
        ):
            return states
        time.sleep(0.5)
    raise AssertionError(f"not settled: {states}")


@pytest.mark.parametrize(
    ("sharing", "cap"), [("mps", False), ("timeslice", True), ("timeslice", False)]
)
def test_the_over_limit_workload_fails_alone(
    real: NvmlDevices, tmp_path: Path, sharing: str, cap: bool
) -> None:
    pytest.importorskip("torch")
    agent = Agent(tmp_path / "data", real, stop_grace=5)
    try:
        agent.apply_workload(spec("ok", 2, 30, sharing, cap))
        agent.apply_workload(spec("hog", 6, 30, sharing, cap))  # 6 GiB against a 4 GiB limit
        states = settle(agent)
        print(
            sharing, "cap" if cap else "no cap", {k: (s.phase, s.reason) for k, s in states.items()}
        )
        assert states["default/ok"].phase in ("running", "succeeded")
        if sharing == "mps":
            placed = states["default/ok"].decision
            assert placed is not None
            assert agent.mps.enabled and agent.mps.running(MpsDomain((placed.gpus[0],)))
    finally:
        agent.delete("default", "ok")
        agent.delete("default", "hog")
        agent.reconcile()
    if sharing == "mps":
        assert not any(
            agent.mps.running(MpsDomain((g.uuid,))) for g in real.gpus()
        )  # the daemon is stopped at the end
