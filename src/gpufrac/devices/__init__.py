"""The device layer: GPUs read and changed through one NVML adapter, real or simulated beneath
it."""

from __future__ import annotations

from pathlib import Path

from gpufrac.devices.errors import DeviceError, DriverUnavailable
from gpufrac.devices.fakenvml import FakeNvml
from gpufrac.devices.nvml import NvmlDevices, open_real_nvml
from gpufrac.devices.sim_tools import write_sim_tools
from gpufrac.devices.simfleet import SimulatedFleet

__all__ = ["DeviceError", "DriverUnavailable", "NvmlDevices", "open_devices", "open_simulated"]


def open_simulated(spec: str, data_dir: Path) -> NvmlDevices:
    """The adapter over a simulated fleet (``h200:1:mig,h200:1``), its state kept in
    ``data_dir``."""
    fleet = SimulatedFleet.open(spec, data_dir)
    dev = NvmlDevices(FakeNvml(fleet), simulated=True)
    # where a workload's gpufrac.sdk.report_gpu_use() reports (a drop box outside the data
    # directory)
    dev.sdk_env = {"GPUFRAC_GPU_REPORTS": str(fleet.open_reports())}
    # the driver's tools the simulation stands in for (nvidia-cuda-mps-control), on its PATH
    dev.tool_path = str(write_sim_tools(data_dir / "simulated" / "bin"))
    return dev


def open_devices(simulate: str | None, data_dir: Path) -> NvmlDevices:
    """Simulated GPUs when ``simulate`` names a fleet, else the machine's driver."""
    if simulate:
        return open_simulated(simulate, data_dir)
    return open_real_nvml()
