from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.devices.simfleet import SimulatedFleet

DATA = Path(__file__).parent / "data"

settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci")


def load_data(name: str) -> Any:
    return json.loads((DATA / name).read_text())


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the user's data directory or a GPUFRAC_SIMULATE from the environment."""
    monkeypatch.setenv("GPUFRAC_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("GPUFRAC_SIMULATE", raising=False)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def sim(data_dir: Path) -> Iterator[NvmlDevices]:
    """The demo fleet: GPU 0 an H200 in MIG mode, GPU 1 an H200 without."""
    dev = open_simulated("h200:1:mig,h200:1", data_dir)
    yield dev
    dev.close()


@pytest.fixture
def fleet(data_dir: Path, sim: NvmlDevices) -> SimulatedFleet:
    return SimulatedFleet.open("h200:1:mig,h200:1", data_dir)
