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

Limits the workload cannot lift. A client's environment is read by the client itself, so a
workload can change it before it initialises CUDA. NVIDIA's MPS documentation says of
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` that the client's variable "will only further constrain the
limit set by the control daemon (via set_default_active_thread_percentage or
set_active_thread_percentage)... If the control daemon has a lower setting, the control daemon
setting will be obeyed by the client instead" (docs.nvidia.com/deploy/mps, Environment
Variables). The same is taken to hold for ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` against
``set_default_device_pinned_mem_limit`` / ``set_device_pinned_mem_limit`` (not verified here: the
H200 check covers it). So the server side bounds and the environment only lowers: before an MPS
workload starts, the agent sets the daemon's defaults (for the next server it starts) and each
running server's limits (by ``get_server_list``) to the largest among the GPU's MPS workloads, and
hands each workload its own, lower or equal, limits in its environment. What a workload can still
do: raise its own limits up to the largest of its GPU's MPS workloads (never past the GPU's
largest grant); workloads with equal limits are fully bound.

Where the MPS binaries are missing, no daemon is started; the environment is still handed over.
Simulated GPUs put a stand-in ``nvidia-cuda-mps-control`` on the simulation's PATH
(``devices/sim_tools.py``), which records the commands it receives.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
ALL_THREADS = 100


class MpsDaemons:
    def __init__(
        self,
        root: Path,
        *,
        enabled: bool,
        log_root: Path | None = None,
        tool_path: str | None = None,
    ) -> None:
        """``tool_path``: a directory searched before PATH for the control program (the device
        layer's, where it stands in for the driver's tools)."""
        self.root = root  # pipe directories: reachable by every workload's uid
        self.log_root = log_root or root  # log directories: the agent's alone
        search = os.pathsep.join(p for p in (tool_path, os.environ.get("PATH")) if p)
        self.control = shutil.which(CONTROL, path=search or None)
        self.enabled = enabled and self.control is not None
        self._limits: dict[str, tuple[int, int]] = {}  # per GPU: the server-side limits last set

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
        assert self.control is not None
        subprocess.run([self.control, "-d"], env=env, check=True, timeout=30)
        self._limits.pop(gpu_uuid, None)  # a new daemon: its defaults are set anew
        return True

    def bound(self, gpu_uuid: str, memory_mib: int, compute_pct: int | None) -> list[str]:
        """Set the server-side limits of the GPU's daemon: the defaults for the next server it
        starts and the limits of each server running, to ``memory_mib`` of pinned device memory
        and ``compute_pct`` of the threads (None: all), the largest among the GPU's MPS
        workloads. The commands sent (none where these are already set)."""
        if not self.enabled or not self.running(gpu_uuid):
            return []
        pct = ALL_THREADS if compute_pct is None else compute_pct
        if self._limits.get(gpu_uuid) == (memory_mib, pct):
            return []
        servers = self._send(gpu_uuid, ["get_server_list"]).split()
        commands = [
            f"set_default_active_thread_percentage {pct}",
            f"set_default_device_pinned_mem_limit 0 {memory_mib}M",
        ]
        for pid in (p for p in servers if p.isdigit()):
            commands += [
                f"set_active_thread_percentage {pid} {pct}",
                f"set_device_pinned_mem_limit {pid} 0 {memory_mib}M",
            ]
        self._send(gpu_uuid, commands)
        self._limits[gpu_uuid] = (memory_mib, pct)
        return commands

    def _send(self, gpu_uuid: str, commands: list[str]) -> str:
        assert self.control is not None
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu_uuid))}
        done = subprocess.run(
            [self.control],
            input="".join(f"{c}\n" for c in commands).encode(),
            env=env,
            capture_output=True,
            check=True,
            timeout=30,
        )
        return done.stdout.decode(errors="replace")

    def stop(self, gpu_uuid: str) -> None:
        if not self.enabled or not self.running(gpu_uuid):
            return
        assert self.control is not None
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu_uuid))}
        subprocess.run([self.control], input=b"quit\n", env=env, check=False, timeout=30)
        self._limits.pop(gpu_uuid, None)
