"""Errors of the device layer, one per kind of answer the driver gives.

The NVML adapter turns every NVML error into one of these, whichever library (real or simulated) is
below it, so the layers above never see an NVML code.
"""

from __future__ import annotations

from gpufrac.errors import GpufracError


class DeviceError(GpufracError):
    """A driver call failed. ``code`` is the NVML return code where there was one."""

    def __init__(self, message: str, *, code: int | None = None, hint: str | None = None) -> None:
        self.message = message
        self.code = code
        self.hint = hint
        super().__init__(message if not hint else f"{message}\nhint: {hint}")


class DriverUnavailable(DeviceError):
    """No NVIDIA driver or NVML library on this machine."""


class NotSupported(DeviceError):
    """The GPU or its current mode does not support the call (for example MIG calls with MIG
    off)."""


class InsufficientResources(DeviceError):
    """The GPU has no room: overlapping placement, profile at its instance limit, no compute
    slices."""


class InUse(DeviceError):
    """Processes (or compute instances) hold the GPU or instance."""


class GpuLost(DeviceError):
    """The GPU fell off the bus or is otherwise unreachable."""


class DeviceNotFound(DeviceError):
    """No such GPU, instance or MIG device."""


class InvalidArgument(DeviceError):
    """The driver refused an argument (a start slot the profile does not allow, say)."""
