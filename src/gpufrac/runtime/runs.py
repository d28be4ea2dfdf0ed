"""Run directories and the processes in them: small helpers the agent shares with the CLI and metrics."""

from __future__ import annotations

import json
import os
import socket
import urllib.request
from pathlib import Path

HANDED_OVER = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_", "GPUFRAC_")


def probe(kind: str, port: int, path: str) -> bool:
    """One readiness probe on this machine: a TCP connect, or an HTTP GET answered with 2xx/3xx."""
    try:
        if kind == "tcp":
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1.0) as r:
            return 200 <= int(r.status) < 400
    except (OSError, ValueError):
        return False


def process_group(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[-1].split()[2])
    except (OSError, ValueError, IndexError):
        return None


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
    return {k: v for k, v in env.items() if k.startswith(HANDED_OVER)}
