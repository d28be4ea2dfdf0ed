"""The NVML adapter on a real GPU: the driver's profile table, processes, and MIG mode left
alone."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpufrac.devices.health import DeviceHealth
from gpufrac.devices.nvml import NvmlDevices
from gpufrac.model.catalog import model_for_product_name

pytestmark = pytest.mark.gpu

CHILD = """
import sys, time, torch
x = torch.empty(1024 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # 1 GiB
x.fill_(1); torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(60)
"""


def test_reads_the_driver_profile_table_and_it_matches_the_catalog(real: NvmlDevices) -> None:
    gpus = real.gpus()
    assert gpus, "no GPU listed"
    for gpu in gpus:
        table = real.model(gpu.uuid)
        print(f"GPU {gpu.index} {gpu.name} {gpu.uuid} MIG {gpu.mig_current}; driver profiles:")
        for p in table.profiles:
            print(
                f"  {p.name:12} id={p.profile_id:2} starts={p.placement_starts} "
                f"mem={p.memory_mib} sms={p.sm_count}"
            )
        diffs = real.catalog_differences(gpu.uuid)
        print("  differences from the catalog:", diffs or "none")
        known = model_for_product_name(gpu.name)
        if gpu.mig_current != "unsupported":
            assert table.profiles, "a MIG-capable GPU answered no profiles"
        if known is not None and known.from_driver:
            assert diffs == [], diffs  # the catalog entry is itself a driver reading: exact match


def test_sees_a_child_process_pid_and_memory(real: NvmlDevices) -> None:
    pytest.importorskip("torch")
    gpu = real.gpus()[0]
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "ready", "the child could not allocate GPU memory"
        seen = None
        for _ in range(50):
            seen = next((p for p in real.gpu(gpu.uuid).processes if p.pid == child.pid), None)
            if seen is not None:
                break
            time.sleep(0.1)
        assert seen is not None, f"pid {child.pid} not among {real.gpu(gpu.uuid).processes}"
        print(f"child pid {seen.pid} holds {seen.used_memory_mib} MiB")
        assert seen.used_memory_mib is not None and seen.used_memory_mib >= 1024
        util = DeviceHealth(real).process_utilization(gpu.uuid)
        print("per-process SM utilization:", util)
        if gpu.mig_current != "enabled":
            assert util is not None
    finally:
        child.kill()
        child.wait()
