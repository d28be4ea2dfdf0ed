"""Small real workloads for the quickstart: PyTorch on the GPU where both are there, NumPy on the CPU
otherwise (pure Python if NumPy is missing too), so the demo needs no large install.

usage: python examples/quickstart/work.py serve|train|batch|flaky|hog [seconds]
"""

from __future__ import annotations

import sys
import time

from gpufrac import sdk


def backend() -> tuple[str, object]:
    try:
        import torch

        if torch.cuda.is_available():
            sdk.cap_torch_memory()
            return "torch-cuda", torch
    except ImportError:
        pass
    try:
        import numpy

        return "numpy-cpu", numpy
    except ImportError:
        return "python", None


def step(kind: str, lib: object, n: int) -> float:
    """One unit of work: an n x n matrix product; returns a number so it is not optimized away."""
    if kind == "torch-cuda":
        a = lib.randn(n, n, device="cuda")  # type: ignore[attr-defined]
        return float((a @ a).sum().item())
    if kind == "numpy-cpu":
        a = lib.random.rand(n, n)  # type: ignore[attr-defined]
        return float((a @ a).sum())
    return float(sum(i * i for i in range(n * 10)))


def main() -> int:
    mode = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    kind, lib = backend()
    limit = sdk.memory_limit_mib() or 1024
    print(f"{mode}: attempt {sdk.attempt()}, backend {kind}, memory limit {limit} MiB", flush=True)
    if mode == "flaky" and sdk.attempt() == 1:
        print("flaky: crashing on purpose (the agent restarts it)", flush=True)
        return 3
    use = limit * 3 if mode == "hog" else limit // 2
    sdk.report_gpu_memory(use)  # simulated GPUs only; a real GPU's driver sees the real use
    if mode == "hog":
        print(f"hog: using {use} MiB, over its limit: the watchdog stops it", flush=True)
    deadline = time.monotonic() + seconds
    steps = 0
    while mode == "serve" or time.monotonic() < deadline:
        with sdk.gpu_turn():  # one step at a time, as the node's QoS arbiter grants it
            step(kind, lib, 192)
        steps += 1
        if steps % 200 == 0:
            print(f"{mode}: {steps} steps", flush=True)
        time.sleep(0.005)
    print(f"{mode}: done after {steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
