"""One MPS control daemon per GPU that hosts MPS workloads, each with its own pipe and log
directory.

The agent starts a daemon (``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES`` set to the
GPU, ``CUDA_MPS_PIPE_DIRECTORY`` in the agent's shared directory, where workloads running as
tenants' own uids can reach it, and ``CUDA_MPS_LOG_DIRECTORY`` in the data directory, which they
cannot read) before the first MPS workload on a GPU starts, and stops it (``echo quit``) when the
last one is gone. Each client gets the pipe directory, its pinned device memory limit
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) and its active thread percentage
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) in its environment, never the log directory.

The control daemon runs one MPS server per uid: clients of another uid wait until the running
server's clients have all ended. Tenants that share an MPS GPU (``mps_share_tenants``) therefore
take turns rather than run at once, while one tenant's workloads (one uid) share a server.

On simulated GPUs, or where the MPS binaries are missing, no daemon is started; the environment is
still handed over, so a workload sees what it would see on a real GPU. This module has not yet run
on a real GPU (the GPU check of the agent issue covers it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"


class MpsDaemons:
    def __init__(self, root: Path, *, enabled: bool, log_root: Path | None = None) -> None:
        self.root = root  # pipe directories: reachable by every workload's uid
        self.log_root = log_root or root  # log directories: the agent's alone
        self.enabled = enabled and shutil.which(CONTROL) is not None

    def pipe_dir(self, gpu_uuid: str) -> Path:
        return self.root / gpu_uuid / "pipe"

    def log_dir(self, gpu_uuid: str) -> Path:
        return self.log_root / gpu_uuid / "log"

    def client_env(self, gpu_uuid: str, memory_mib: int, compute_pct: int | None) -> dict[str, str]:
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu_uuid)),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory_mib}M",
        }
        if compute_pct is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(compute_pct)
        return env

    def running(self, gpu_uuid: str) -> bool:
        return (self.pipe_dir(gpu_uuid) / "control").exists()

    def ensure(self, gpu_uuid: str) -> bool:
        """Start the GPU's daemon if it is not running; False where no daemon can be started."""
        if not self.enabled:
            return False
        if self.running(gpu_uuid):
            return True
        for d in (self.root, self.root / gpu_uuid, self.pipe_dir(gpu_uuid)):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)  # clients of any uid connect; only the agent's user writes here
        self.log_dir(gpu_uuid).mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": gpu_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu_uuid)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(gpu_uuid)),
        }
        subprocess.run([CONTROL, "-d"], env=env, check=True, timeout=30)
        return True

    def stop(self, gpu_uuid: str) -> None:
        if not self.enabled or not self.running(gpu_uuid):
            return
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu_uuid))}
        subprocess.run([CONTROL], input=b"quit\n", env=env, check=False, timeout=30)
