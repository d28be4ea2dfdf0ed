"""Whom NVML's per-process utilization names under MPS: each client, or the MPS server? Run by
``scripts/gpu-check.sh`` (its ``bench`` part) on a real GPU, to settle what gpufrac's metrics
assume (docs/agent.md, Metrics: under MPS ``gpufrac_workload_sm_utilization_percent`` is left out,
since the samples are taken to be the server's). Written without a GPU at hand.

It starts gpufrac's MPS control daemon for GPU 0 (its own pipe directory), runs two PyTorch
clients doing matrix products under it, samples ``nvmlDeviceGetProcessUtilization`` for a few
seconds and prints, per pid seen, whether it is a client, the server or something else, with its
mean SM use; the same on the GPU without MPS as the baseline. ``--json PATH`` keeps the rows."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLIENT = """
import time, torch
a = torch.randn(4096, 4096, device="cuda")
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    b = a @ a
    torch.cuda.synchronize()
"""


def sample(handle: object, seconds: float) -> dict[int, list[int]]:
    import pynvml

    seen: dict[int, list[int]] = {}
    last = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.5)
        try:
            got = pynvml.nvmlDeviceGetProcessUtilization(handle, last)
        except pynvml.NVMLError as e:
            print(f"nvmlDeviceGetProcessUtilization: {e}")
            continue
        for s in got:
            seen.setdefault(int(s.pid), []).append(int(s.smUtil))
            last = max(last, int(s.timeStamp))
    return seen


def run(label: str, env: dict[str, str], handle: object, seconds: float) -> list[dict[str, object]]:
    clients = [
        subprocess.Popen([sys.executable, "-c", CLIENT, str(seconds + 4)], env=env)
        for _ in range(2)
    ]
    time.sleep(3)  # CUDA up in both
    seen = sample(handle, seconds)
    for c in clients:
        c.wait(timeout=60)
    mine = {c.pid for c in clients}
    rows = []
    for pid, sm in sorted(seen.items()):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            name = "?"
        role = "client" if pid in mine else "mps server" if "mps-server" in name else name
        rows.append(
            {
                "run": label,
                "pid": pid,
                "role": role,
                "samples": len(sm),
                "mean_sm": sum(sm) / len(sm),
            }
        )
    if not rows:
        rows.append({"run": label, "pid": None, "role": "no samples", "samples": 0, "mean_sm": 0})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    try:
        import pynvml
        import torch  # noqa: F401 - the clients need it
    except ImportError as e:
        print(f"skipped: {e} (needs nvidia-ml-py and PyTorch on a GPU machine)")
        return 0
    from gpufrac.runtime.mps import MpsDaemons

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    rows = run("without MPS", {**os.environ, "CUDA_VISIBLE_DEVICES": uuid}, handle, args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        mps = MpsDaemons(Path(tmp), enabled=True)
        if not mps.ensure(uuid):
            print("no MPS control daemon here: only the baseline")
        else:
            try:
                env = {
                    **os.environ,
                    "CUDA_VISIBLE_DEVICES": uuid,
                    **mps.client_env(uuid, 8192, None),
                }
                rows += run("under MPS", env, handle, args.seconds)
            finally:
                mps.stop(uuid)
    print("| run | pid | role | samples | mean SM % |\n| --- | ---: | --- | ---: | ---: |")
    for r in rows:
        print(f"| {r['run']} | {r['pid']} | {r['role']} | {r['samples']} | {r['mean_sm']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
