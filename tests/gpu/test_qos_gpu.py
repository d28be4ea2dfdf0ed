"""The SDK's GPU turns on a real GPU: CUDA-event timing, yield points inside a PyTorch step, and a
higher class taking the GPU from a trainer at a module boundary. Written without a GPU at hand (none
was lent to the session that wrote it): `make gpu-check` runs it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufrac.runtime.arbiter_link import ArbiterLink

pytestmark = pytest.mark.gpu

TRAINER = """
import sys, time, torch
from gpufrac.sdk import gpu_turn, yield_points
from gpufrac.sdk.turns import TurnClient
client = TurnClient(sys.argv[1], workload="t/train", domain="gpu0", qos={"rank": 0})
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
yield_points(model)
x = torch.randn(4096, 4096, device="cuda")
print("ready", flush=True)
yields = 0
end = time.time() + float(sys.argv[2])
while time.time() < end:
    with gpu_turn(client) as turn:
        model(x).sum().backward()
    yields += turn.yields
print("yields", yields, flush=True)
"""


def test_a_turn_is_timed_by_cuda_events_and_reported(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    link = ArbiterLink(tmp_path / "arbiter")
    link.sync({}, start=True)
    try:
        from gpufrac.sdk.turns import TurnClient, gpu_turn

        client = TurnClient(link.address, workload="t/solo", domain="gpu0")
        a = torch.randn(8192, 8192, device="cuda")
        for _ in range(5):
            with gpu_turn(client):
                for _ in range(10):
                    a = (a @ a).clamp_(-1, 1)
        stats = link.stats()["t/solo"]
        assert stats["turns"] == 5 and stats["gpu_s"] > 0
        assert stats["gpu_share"] is not None and 0 < stats["gpu_share"] <= 1
        client.close()
    finally:
        link.close()


def test_a_trainer_yields_at_module_boundaries_to_a_higher_class(tmp_path: Path) -> None:
    link = ArbiterLink(tmp_path / "arbiter", preempt="drain")
    link.sync({}, start=True)
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, link.address, "8"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert trainer.stdout is not None and trainer.stdout.readline().strip() == "ready"
        from gpufrac.sdk.turns import TurnClient

        high = TurnClient(link.address, workload="t/infer", domain="gpu0", qos={"rank": 10})
        waits = []
        time.sleep(1.0)
        for _ in range(50):
            time.sleep(0.013)
            t = time.perf_counter()
            high.acquire()
            waits.append(time.perf_counter() - t)
            high.release()
        out, _ = trainer.communicate(timeout=60)
        yields = int(out.split()[-1])
        assert yields > 10  # the trainer gave its turn back inside steps, not only between them
        step = sorted(waits)[len(waits) // 2]
        print(f"high-priority wait p50 {step * 1e3:.2f} ms, max {max(waits) * 1e3:.2f} ms")
        assert max(waits) < 0.05  # never a whole string of steps
    finally:
        trainer.kill()
        link.close()
