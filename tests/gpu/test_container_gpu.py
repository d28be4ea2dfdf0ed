"""A PyTorch container on a real GPU through gpufrac's CDI spec: the agent writes the spec from
NVML (the GPU's device node, the control nodes, the driver's libraries), podman applies it, and
CUDA works inside with nothing else of the host's driver. Written without a GPU at hand (no device
was lent to the session that wrote it): `scripts/gpu-check.sh --only containers` runs it where
podman and runc are installed (skipped with the reason where they are not)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from gpufrac.devices.nvml import NvmlDevices
from gpufrac.model.settings import ContainerSettings, OperatorSettings
from gpufrac.model.workload import GpuRequest, VolumeMount, WorkloadSpec
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.cdi import CdiSpecs
from tests.integration.containers import ensure_image

pytestmark = pytest.mark.gpu

TORCH = """
import json, os, torch
x = torch.ones(64 * 2**20, device="cuda"); torch.cuda.synchronize()
print(json.dumps({
    "available": torch.cuda.is_available(), "count": torch.cuda.device_count(),
    "name": torch.cuda.get_device_name(0), "sum": float(x.sum().item()),
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "mps": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
}), flush=True)
"""


def _python_paths() -> list[str]:
    """Where this Python and its packages (PyTorch, its CUDA libraries) live, to mount read-only
    at the same paths: the test image holds only mount points."""
    import torch

    found = {
        "/usr",
        sys.prefix,
        sys.base_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        os.path.dirname(os.path.dirname(os.path.realpath(torch.__file__))),
    }
    # the longest first is dropped where a shorter one holds it already
    kept: list[str] = []
    for p in sorted(found, key=len):
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return kept


@pytest.mark.parametrize("sharing", ["timeslice", "mps"])
def test_a_pytorch_container_computes_on_its_gpu_through_gpufracs_cdi_spec(
    real: NvmlDevices, tmp_path: Path, sharing: str
) -> None:
    pytest.importorskip("torch")
    image = ensure_image()
    paths = _python_paths()
    kind = "gpufrac.io/gpucheck"
    settings = OperatorSettings(
        containers=ContainerSettings(
            engine="podman", allowed_mounts=tuple(paths), cdi_kind=kind, cdi_dir="/etc/cdi"
        )
    )
    agent = Agent(tmp_path / "data", real, settings, stop_grace=5)
    gpu = next(g for g in real.gpus() if g.mig_current != "enabled")
    spec = WorkloadSpec(
        name="torch",
        image=image,
        command=(sys.executable, "-c", TORCH),
        mounts=tuple(VolumeMount(p, p) for p in paths),
        gpu=GpuRequest(memory_mib=4096),
        sharing=sharing,  # type: ignore[arg-type]
        restart="never",
        type="job",
    )
    try:
        agent.apply_workload(spec)
        deadline = time.monotonic() + 180
        state = None
        while time.monotonic() < deadline:
            state = {s.key: s for s in agent.reconcile()}["default/torch"]
            if state.phase in ("succeeded", "failed"):
                break
            time.sleep(0.5)
        log = agent.latest_log("default", "torch", 1)
        out = log.read_text() if log is not None else ""
        print(sharing, state, out[-2000:])
        assert state is not None and state.phase == "succeeded", out[-2000:]
        seen = json.loads(out.strip().splitlines()[-1])
        assert seen["available"] and seen["count"] == 1, seen
        assert seen["sum"] == 64 * 2**20, seen
        assert seen["visible"] in (gpu.uuid, *(g.uuid for g in real.gpus())), seen
        assert (seen["mps"] is not None) == (sharing == "mps"), seen
    finally:
        agent.delete("default", "torch")
        agent.runs.wait_stopped(30)
        agent.reconcile()
        agent.close()
        CdiSpecs(Path("/etc/cdi"), kind).remove()
