"""One MPS control daemon per MPS domain, each with its own pipe and log directory.

An MPS domain (``MpsDomain``) is the set of devices one daemon serves: a GPU, a MIG instance
shared inside (its MIG device), or the GPUs of a share of each of several GPUs (HAMi's
``nvidia.com/gpu: 2`` with ``gpucores``), which one daemon serves together. NVIDIA's MPS
documentation (Appendix: Environment Variables): a control daemon started with
``CUDA_VISIBLE_DEVICES=UUID_1,UUID_2`` serves both; its clients see them remapped as device 0 and
device 1 and select them by UUID in their own ``CUDA_VISIBLE_DEVICES``;
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` takes a limit per device (``0=1G,1=512M``, ordinals as the
client sees its devices), ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` applies to each of its devices. A
device is served by at most one daemon: the scheduler keeps every MPS workload of a GPU on the
same GPUs (``planning.sched_plugins.mps_domain``), and before a domain's daemon starts, any other
of ours that serves one of its devices is stopped (``serving``; the executor stops only idle
ones).

A domain's directories are named by its ``key``: the device's UUID for one device (so one GPU's
pipe directory is ``ROOT/UUID/pipe``), else ``domain-`` and a digest of its sorted UUIDs, with the
UUIDs in a ``devices`` file beside its log directory (the agent's alone), so that a daemon still
running after an agent restart is found and stopped when its domain is idle.

The agent starts a daemon (``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES`` set to the
domain's devices, ``CUDA_MPS_PIPE_DIRECTORY`` in the agent's shared directory, where workloads
running as tenants' own uids can reach it, and ``CUDA_MPS_LOG_DIRECTORY`` in the data directory,
which they cannot read) before the first MPS workload of a domain starts, and stops it (``echo
quit``) when the last one is gone. Each client gets the pipe directory, its pinned device memory
limit on each device (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) and its active thread percentage
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
running server's limits (by ``get_server_list``) to the largest among the domain's MPS workloads
(the memory limit on each of its devices), and hands each workload its own, lower or equal,
limits in its environment. What a workload can still do: raise its own limits up to the largest
of its domain's MPS workloads (never past the domain's largest grant); workloads with equal
limits are fully bound.

Where the MPS binaries are missing, no daemon is started; the environment is still handed over.
Simulated GPUs put a stand-in ``nvidia-cuda-mps-control`` on the simulation's PATH
(``devices/sim_tools.py``), which records the commands it receives.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CONTROL = "nvidia-cuda-mps-control"
ALL_THREADS = 100
SERVERS_TTL_S = 5.0  # how long a daemon's list of servers is taken as current
DOMAIN_PREFIX = "domain-"  # the key of a domain of several devices
DEVICES_FILE = "devices"  # beside a domain's log directory: the UUIDs it serves, one a line


@dataclass(frozen=True, slots=True)
class MpsDomain:
    """The devices one MPS control daemon serves, in the order its clients list them (the
    daemon's ordinals: device 0, device 1, ...): one GPU, one MIG device, or several GPUs."""

    devices: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.devices or len(set(self.devices)) != len(self.devices):
            raise ValueError(f"an MPS domain needs distinct devices, not {self.devices!r}")
        if any(not d or "/" in d or "," in d or d.startswith(".") for d in self.devices):
            raise ValueError(f"an MPS domain's devices are UUIDs, not {self.devices!r}")

    @property
    def key(self) -> str:
        """Its directories' name: the UUID of its one device, else a digest of its sorted UUIDs
        (short, path-safe; the same devices, the same key)."""
        if len(self.devices) == 1:
            return self.devices[0]
        digest = hashlib.sha256(",".join(sorted(self.devices)).encode()).hexdigest()
        return DOMAIN_PREFIX + digest[:16]

    @property
    def visible(self) -> str:
        """Its devices as ``CUDA_VISIBLE_DEVICES`` lists them."""
        return ",".join(self.devices)

    def describe(self) -> str:
        if len(self.devices) == 1:
            return self.devices[0]
        return f"GPUs {', '.join(self.devices)} together"


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
        self._limits: dict[str, tuple[int, int]] = {}  # per domain key: server limits last set
        # per domain key: when its servers were last listed, and their pids
        self._servers: dict[str, tuple[float, frozenset[int]]] = {}

    def pipe_dir(self, domain: MpsDomain) -> Path:
        return self.root / domain.key / "pipe"

    def log_dir(self, domain: MpsDomain) -> Path:
        return self.log_root / domain.key / "log"

    def client_env(
        self, domain: MpsDomain, memory_mib: int, compute_pct: int | None
    ) -> dict[str, str]:
        """A client's environment: the domain's pipe directory, its pinned memory limit on each of
        the domain's devices (``0=XM,1=XM``: ordinals as the client sees its devices, which are
        the domain's) and its thread percentage (on each of them)."""
        limits = ",".join(f"{i}={memory_mib}M" for i in range(len(domain.devices)))
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(domain)),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": limits,
        }
        if compute_pct is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(compute_pct)
        return env

    def running(self, domain: MpsDomain) -> bool:
        return (self.pipe_dir(domain) / "control").exists()

    def domains(self) -> list[MpsDomain]:
        """The domains of several devices whose daemons run (from their ``devices`` files: those
        started before an agent restart too)."""
        out: list[MpsDomain] = []
        if not self.log_root.is_dir():
            return out
        for d in sorted(self.log_root.glob(DOMAIN_PREFIX + "*")):
            try:
                devices = tuple((d / DEVICES_FILE).read_text().split())
                domain = MpsDomain(devices)
            except (OSError, ValueError):
                continue
            if domain.key == d.name and self.running(domain):
                out.append(domain)
        return out

    def serving(self, domain: MpsDomain) -> list[MpsDomain]:
        """The other daemons of ours running that serve one of ``domain``'s devices: each device's
        own and those of running domains of several devices (a device is served by one daemon
        at most: these must stop before ``domain``'s starts)."""
        mine = set(domain.devices)
        alone = [MpsDomain((d,)) for d in domain.devices]
        found = [o for o in alone if o != domain and self.running(o)]
        found += [o for o in self.domains() if o.key != domain.key and mine & set(o.devices)]
        return found

    def ensure(self, domain: MpsDomain) -> Literal["started", "running", "off"]:
        """Start the domain's daemon if it is not running: ``started`` (it was started now),
        ``running`` (it ran already), ``off`` (no daemon can be started: MPS off or its control
        program missing)."""
        if not self.enabled:
            return "off"
        if self.running(domain):
            return "running"
        for d in (self.root, self.root / domain.key, self.pipe_dir(domain)):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)  # clients of any uid connect; only the agent's user writes here
        self.log_dir(domain).mkdir(mode=0o700, parents=True, exist_ok=True)
        if len(domain.devices) > 1:
            (self.log_root / domain.key / DEVICES_FILE).write_text(
                "".join(f"{d}\n" for d in domain.devices)
            )
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": domain.visible,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(domain)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(domain)),
        }
        assert self.control is not None
        subprocess.run([self.control, "-d"], env=env, check=True, timeout=30)
        self._limits.pop(domain.key, None)  # a new daemon: its defaults are set anew
        return "started"

    def server_pids(self, domain: MpsDomain) -> frozenset[int]:
        """The pids of the MPS servers the domain's daemon runs, as it lists them
        (``get_server_list``), read at most every ``SERVERS_TTL_S``: the only servers whose NVML
        reading is taken as its clients' (a process that merely calls itself
        nvidia-cuda-mps-server is none of them). Empty where no daemon of ours runs."""
        if not self.enabled or not self.running(domain):
            self._servers.pop(domain.key, None)
            return frozenset()
        now = time.monotonic()
        cached = self._servers.get(domain.key)
        if cached is not None and now - cached[0] < SERVERS_TTL_S:
            return cached[1]
        try:
            listed = self._send(domain, ["get_server_list"]).split()
        except (OSError, subprocess.SubprocessError):
            return frozenset()
        pids = frozenset(int(p) for p in listed if p.isdigit())
        self._servers[domain.key] = (now, pids)
        return pids

    def bound(self, domain: MpsDomain, memory_mib: int, compute_pct: int | None) -> list[str]:
        """Set the server-side limits of the domain's daemon: the defaults for the next server it
        starts and the limits of each server running, to ``memory_mib`` of pinned device memory
        on each of its devices (by the daemon's ordinals) and ``compute_pct`` of the threads
        (None: all), the largest among the domain's MPS workloads. The commands sent (none where
        these are already set)."""
        if not self.enabled or not self.running(domain):
            return []
        pct = ALL_THREADS if compute_pct is None else compute_pct
        if self._limits.get(domain.key) == (memory_mib, pct):
            return []
        servers = self._send(domain, ["get_server_list"]).split()
        ordinals = range(len(domain.devices))
        commands = [
            f"set_default_active_thread_percentage {pct}",
            *(f"set_default_device_pinned_mem_limit {i} {memory_mib}M" for i in ordinals),
        ]
        for pid in (p for p in servers if p.isdigit()):
            commands += [
                f"set_active_thread_percentage {pid} {pct}",
                *(f"set_device_pinned_mem_limit {pid} {i} {memory_mib}M" for i in ordinals),
            ]
        self._send(domain, commands)
        self._limits[domain.key] = (memory_mib, pct)
        return commands

    def _send(self, domain: MpsDomain, commands: list[str]) -> str:
        assert self.control is not None
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(domain))}
        done = subprocess.run(
            [self.control],
            input="".join(f"{c}\n" for c in commands).encode(),
            env=env,
            capture_output=True,
            check=True,
            timeout=30,
        )
        return done.stdout.decode(errors="replace")

    def stop(self, domain: MpsDomain) -> None:
        if not self.enabled or not self.running(domain):
            return
        assert self.control is not None
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(domain))}
        subprocess.run([self.control], input=b"quit\n", env=env, check=False, timeout=30)
        self._limits.pop(domain.key, None)
