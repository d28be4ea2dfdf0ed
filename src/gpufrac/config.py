"""Where gpufrac keeps its state, and which GPUs it talks to."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

SIMULATE_ENV = "GPUFRAC_SIMULATE"
DATA_DIR_ENV = "GPUFRAC_DATA_DIR"
TOKEN_ENV = "GPUFRAC_TOKEN"  # the API token every command sends (docs/agent.md)
DEMO_FLEET = "h200:1:mig,h200:1"
DEFAULT_GATEWAY_PORT = 8480  # the request gateway's (serving/gateway.py)


def data_dir(explicit: Path | None = None) -> Path:
    """``--data-dir``, else ``$GPUFRAC_DATA_DIR``, else ``$XDG_DATA_HOME/gpufrac``
    (~/.local/share)."""
    if explicit is not None:
        return explicit
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpufrac"


def shared_path(data: Path) -> Path:
    """The path ``shared_dir`` makes for ``data`` (one per data directory)."""
    digest = hashlib.sha1(str(data.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"gpufrac-{digest}"


def shared_dir(data: Path) -> Path:
    """Where the agent of ``data`` keeps what its workloads must reach (the QoS arbiter's socket and
    yield flags): outside the data directory, which workloads are not shown, and owned by the agent
    (a directory someone else made there, or a link, is refused)."""
    path = shared_path(data)
    path.mkdir(mode=0o755, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise RuntimeError(f"{path} is not a directory of this user's; remove it and start again")
    return path


def simulate_spec(explicit: str | None = None) -> str | None:
    """``--simulate``, else ``$GPUFRAC_SIMULATE``, else None (the real driver)."""
    if explicit:
        return explicit
    return os.environ.get(SIMULATE_ENV) or None
