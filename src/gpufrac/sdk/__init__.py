"""Helpers imported inside workloads.

* ``memory_limit_mib()``: the GPU memory this workload was given (``GPUFRAC_GPU_MEMORY_LIMIT_MIB``).
* ``cap_torch_memory()``: cap PyTorch's CUDA allocator to that limit, so an over-limit allocation
  fails inside the workload (a clean ``OutOfMemoryError``) before the agent's watchdog has to stop
  it.
* ``report_gpu_memory(mib)``: on simulated GPUs, the documented channel through which a workload
  says how much GPU memory it holds. The agent reads it back through the device adapter, like NVML's
  per-process memory on a real GPU, and shows it labelled as simulated. On a real GPU it does
  nothing: the driver already knows.
* ``gpu_turn()``: hold this workload's turn on its GPU for one request or one step, as the node's
  QoS arbiter grants it (``gpufrac.sdk.turns``); ``yield_points(model)`` adds yield points inside a
  PyTorch step (``gpufrac.sdk.torch_turns``). See docs/qos.md.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from gpufrac.sdk.torch_turns import yield_points
from gpufrac.sdk.turns import TurnClient, current_turn, gpu_turn

__all__ = [
    "TurnClient",
    "attempt",
    "cap_torch_memory",
    "current_turn",
    "gpu_turn",
    "memory_limit_mib",
    "report_gpu_memory",
    "yield_points",
]


def memory_limit_mib() -> int | None:
    value = os.environ.get("GPUFRAC_GPU_MEMORY_LIMIT_MIB", "")
    return int(value) if _digits(value) else None


def attempt() -> int:
    """Which attempt of this workload this is (1 for the first run, 2 after one restart, ...)."""
    value = os.environ.get("GPUFRAC_ATTEMPT", "1")
    return int(value) if _digits(value) else 1


def _digits(value: str) -> bool:
    """ASCII digits only: ``"²".isdigit()`` is true, and ``int("²")`` raises."""
    return value.isascii() and value.isdigit()


def torch_memory_fraction(total_bytes: int) -> float | None:
    """The share of a device of ``total_bytes`` this workload's PyTorch may hold: the engine's own
    fraction where ``spec.engine: pytorch`` handed one (``GPUFRAC_TORCH_MEMORY_FRACTION``, the
    budget over the visible device, kept below 1 for the driver's own use), else the memory limit
    over the device; None where neither is known."""
    text = os.environ.get("GPUFRAC_TORCH_MEMORY_FRACTION", "")
    try:
        share = float(text) if text.isascii() else math.nan
    except ValueError:
        share = math.nan
    if 0.0 < share <= 1.0:
        return share
    limit = memory_limit_mib()
    if limit is None or total_bytes <= 0:
        return None
    return min(1.0, limit * 2**20 / total_bytes)


def cap_torch_memory(device: int = 0) -> bool:
    """Limit PyTorch's caching allocator on ``device`` to this workload's memory
    (``torch_memory_fraction``); False if not possible."""
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    share = torch_memory_fraction(torch.cuda.get_device_properties(device).total_memory)
    if share is None:
        return False
    torch.cuda.set_per_process_memory_fraction(share, device)
    return True


def report_gpu_memory(mib: int) -> bool:
    """Simulated GPUs only: record that this process holds ``mib`` MiB on its GPU (or MIG
    instance)."""
    return report_gpu_use(mib)


def report_gpu_use(mib: int, sm_percent: int = 0, tensor_percent: int = 0, device: int = 0) -> bool:
    """Simulated GPUs only: record that this process holds ``mib`` MiB on its GPU (or MIG instance),
    keeps ``sm_percent`` of its SMs busy and its tensor pipes ``tensor_percent`` of the time (at
    most ``sm_percent``: GPM's tensor activity), as NVML would show a real process's use. The report
    goes to the drop box the agent names in ``GPUFRAC_GPU_REPORTS`` (one file per process and
    device); the device it is about is the one this process was handed, or for a share of several
    GPUs its ``device``-th (in ``CUDA_VISIBLE_DEVICES`` order). False where there is no such
    channel."""
    where = os.environ.get("GPUFRAC_GPU_REPORTS")
    if not where:
        return False
    name = f"{os.getpid()}" if device == 0 else f"{os.getpid()}.{int(device)}"
    path = Path(where) / f"{name}.json"
    tmp = path.with_name(f".{name}.tmp")
    try:
        tmp.write_text(
            json.dumps({"mib": int(mib), "sm": int(sm_percent), "tensor": int(tensor_percent)})
        )
        os.replace(tmp, path)
    except OSError:
        return False
    return True
