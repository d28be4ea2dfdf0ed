"""GPU tests: run by `make gpu-check` on a machine with an NVIDIA driver (and PyTorch for the
workloads).

Elsewhere they skip, unless GPUFRAC_REQUIRE_GPU=1 (set by scripts/gpu-check.sh), where a missing
driver is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from gpufrac.devices.errors import DriverUnavailable
from gpufrac.devices.nvml import NvmlDevices, open_real_nvml


@pytest.fixture(scope="session")
def real() -> Iterator[NvmlDevices]:
    try:
        dev = open_real_nvml()
    except DriverUnavailable as e:
        if os.environ.get("GPUFRAC_REQUIRE_GPU") == "1":
            pytest.fail(f"make gpu-check needs an NVIDIA driver: {e}")
        pytest.skip(f"no NVIDIA driver: {e}")
    before = {g.uuid: (g.mig_current, g.mig_pending) for g in dev.gpus()}
    yield dev
    after = {g.uuid: (g.mig_current, g.mig_pending) for g in dev.gpus()}
    dev.close()
    assert after == before, "the GPU tests must leave every card's MIG mode as they found it"
