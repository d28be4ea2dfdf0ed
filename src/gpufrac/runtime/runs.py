"""Run directories and the processes in them.

``Runs`` owns ``runs/<tenant>/<name>/g<generation>-<attempt>``: one directory per attempt, each with
the shim's record of how it went (``runtime/shim.py``). The agent reads the truth from these
directories, so a restarted agent knows what ran. The small helpers below are shared with the CLI
and metrics.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpufrac.model.deployment import REPLICA_KEY_ENV
from gpufrac.runtime.cgroups import HostLimits, Layout
from gpufrac.runtime.process_runner import ProcessRunner, port_owners, process_group
from gpufrac.runtime.python_view import PythonView
from gpufrac.runtime.runner import Launch, RunHandle, Runner
from gpufrac.runtime.shim import live, read_status

__all__ = ["Runs", "port_owners", "probe", "process_group", "read_json", "write_json"]

GONE = ".gone"  # attempts of removed workloads that are still ending
HANDED_OVER = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_", "GPUFRAC_")


NO_CGROUPS = (
    "gpufrac: warning: no cgroup hierarchy is writable here, so workloads run in their process "
    "group only: a process that leaves its group (setsid) is not paused by QoS, not counted by "
    "the memory watchdog and not stopped with the workload until it ends, and host limits "
    "(host_memory, cpus, pids) are not applied (docs/agent.md, Cgroups)"
)


class Runs:
    def __init__(
        self, root: Path, *, stop_grace: float = 10.0, cgroups: Layout | None = None
    ) -> None:
        """``cgroups``: where workloads' cgroups live (default: what this machine offers the
        agent, ``cgroups.detect``); a layout that is not ``usable`` runs them in process groups."""
        self.root = root
        self.stop_grace = stop_grace
        process = ProcessRunner(cgroups)
        self.cgroups = process.cgroups
        if not self.cgroups.usable and cgroups is None:
            print(NO_CGROUPS, file=sys.stderr)
        self.runner: Runner = process  # the one runner today (runtime/runner.py)
        # a cluster node's lease file (cluster/node.py): each run's shim stops its workload once
        # the lease in it has run out; None on a machine on its own
        self.lease_file: Path | None = None
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)  # specs (their env) and logs: the agent's alone

    def of(self, tenant: str, name: str) -> Path:
        return self.root / tenant / name

    def attempts(self, tenant: str, name: str, generation: int) -> list[Path]:
        """The attempts of one generation, oldest first."""
        root = self.of(tenant, name)
        if not root.exists():
            return []
        found = [p for p in root.glob(f"g{generation}-*") if p.name.split("-")[-1].isdigit()]
        return sorted(found, key=lambda p: int(p.name.split("-")[-1]))

    def latest(self, tenant: str, name: str, generation: int) -> Path | None:
        """The newest attempt (its output.log is the workload's log)."""
        attempts = self.attempts(tenant, name, generation)
        return attempts[-1] if attempts else None

    def launch(
        self,
        tenant: str,
        name: str,
        generation: int,
        attempt: int,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        workdir: str | None,
        user: str | int | None,
        group: int | None = None,
        view: PythonView | None = None,
        limits: HostLimits | None = None,
    ) -> Path:
        run_dir = self.of(tenant, name) / f"g{generation}-{attempt}"
        self.runner.start(
            RunHandle(run_dir, self.runner.kind),
            Launch(
                command,
                env,
                workdir,
                user,
                group,
                view,
                limits or HostLimits(),
                self.lease_file,
            ),
        )
        return run_dir

    def handle(self, run_dir: Path) -> RunHandle:
        """The handle of a run (every run is the process runner's today)."""
        return RunHandle(run_dir, self.runner.kind)

    def owns(self, run_dir: Path, *, pid: int | None = None, port: int | None = None) -> bool:
        """Whether process ``pid`` (or the listener on ``port``) is the run's workload's."""
        return self.runner.owns(self.handle(run_dir), pid=pid, port=port)

    def stop_live(self, tenant: str, name: str, reason: str = "") -> bool:
        """Stop every attempt still running (SIGTERM, SIGKILL after the grace); ``reason`` is kept
        in the run as why it was stopped. True if one was running."""
        root = self.of(tenant, name)
        stopped = False
        if not root.exists():
            return False
        for run_dir in root.iterdir():
            if run_dir.is_dir() and not read_status(run_dir).done:
                if reason:
                    write_json(run_dir / "killed.json", {"reason": reason})
                self.runner.stop(self.handle(run_dir), grace=self.stop_grace)
                stopped = True
        return stopped

    def remove(self, tenant: str, name: str) -> None:
        """Stop what runs and forget every attempt (the workload is deleted or replaced). Attempts
        still ending (a workload in its grace after SIGTERM) are moved aside to ``.gone`` until
        they have ended (``sweep``), so the name is free at once."""
        self.stop_live(tenant, name)
        root = self.of(tenant, name)
        if not root.exists():
            return
        if all(read_status(r).done or not live(r) for r in root.iterdir() if r.is_dir()):
            shutil.rmtree(root, ignore_errors=True)
            return
        gone = self.root / GONE
        gone.mkdir(parents=True, exist_ok=True)
        os.replace(root, gone / f"{tenant}.{name}.{time.time_ns()}")

    def sweep(self) -> None:
        """Forget removed attempts that have ended since."""
        gone = self.root / GONE
        if not gone.exists():
            return
        for entry in gone.iterdir():
            runs = [r for r in entry.iterdir() if r.is_dir()] if entry.is_dir() else []
            if all(read_status(r).done or not live(r) for r in runs):
                shutil.rmtree(entry, ignore_errors=True)

    def wait_stopped(self, timeout: float) -> bool:
        """Wait until every removed attempt has ended; True if they all did within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            self.sweep()
            gone = self.root / GONE
            if not gone.exists() or not any(gone.iterdir()):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def probe(kind: str, port: int, path: str, host: str = "127.0.0.1") -> bool:
    """One readiness probe on this machine: a TCP connect, or an HTTP GET answered with 2xx/3xx,
    at ``host`` (where workloads listen: ``$GPUFRAC_HOST``)."""
    try:
        if kind == "tcp":
            with socket.create_connection((host, port), timeout=0.5):
                return True
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=1.0) as r:
            return 200 <= int(r.status) < 400
    except (OSError, ValueError):
        return False


def read_json(path: Path) -> dict[str, object]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def write_json(path: Path, value: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def handed_env(run_dir: Path | None) -> dict[str, str]:
    """The GPU environment a run was started with (read back from its spec)."""
    if run_dir is None:
        return {}
    try:
        env = json.loads((run_dir / "spec.json").read_text()).get("env") or {}
    except (OSError, ValueError):
        return {}
    # a replica's key is a secret between it and its gateway: not shown
    return {k: v for k, v in env.items() if k.startswith(HANDED_OVER) and k != REPLICA_KEY_ENV}
