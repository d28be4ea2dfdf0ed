"""Where gpufrac keeps its state, and which GPUs it talks to."""

from __future__ import annotations

import os
from pathlib import Path

SIMULATE_ENV = "GPUFRAC_SIMULATE"
DATA_DIR_ENV = "GPUFRAC_DATA_DIR"
DEMO_FLEET = "h200:1:mig,h200:1"


def data_dir(explicit: Path | None = None) -> Path:
    """``--data-dir``, else ``$GPUFRAC_DATA_DIR``, else ``$XDG_DATA_HOME/gpufrac`` (~/.local/share)."""
    if explicit is not None:
        return explicit
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpufrac"


def simulate_spec(explicit: str | None = None) -> str | None:
    """``--simulate``, else ``$GPUFRAC_SIMULATE``, else None (the real driver)."""
    if explicit:
        return explicit
    return os.environ.get(SIMULATE_ENV) or None
