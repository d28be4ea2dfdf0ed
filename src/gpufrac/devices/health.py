"""Health and per-process readings through the NVML adapter: Xid/ECC events, per-process SM use.

These readings are what the node agent's health checks and metrics use; they go through the same
``NvmlDevices`` (and so the same library, real or simulated) as everything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gpufrac.devices.nvml import NvmlDevices, text

DeviceEventKind = Literal["xid", "ecc_double_bit", "ecc_single_bit", "other"]


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    gpu_uuid: str
    kind: DeviceEventKind
    data: int


class DeviceHealth:
    """Events and per-process readings of the GPUs behind one adapter."""

    def __init__(self, dev: NvmlDevices) -> None:
        self.dev = dev
        self._event_set: Any = None

    def close(self) -> None:
        if self._event_set is not None:
            self.dev.quiet(self.dev.lib.nvmlEventSetFree, self._event_set)
            self._event_set = None

    def process_utilization(self, uuid: str) -> dict[int, int] | None:
        """SM utilization per pid, or None where the driver does not report it (MIG)."""
        handle = self.dev.handle(uuid)
        try:
            samples = self.dev.lib.nvmlDeviceGetProcessUtilization(handle, 0)
        except self.dev.lib.NVMLError as e:
            if e.value == self.dev.lib.NVML_ERROR_NOT_SUPPORTED:
                return None
            if e.value == self.dev.lib.NVML_ERROR_NOT_FOUND:
                return {}
            raise self.dev.translate(e, "nvmlDeviceGetProcessUtilization") from None
        return {int(s.pid): int(s.smUtil) for s in samples}

    def ecc_uncorrected(self, uuid: str) -> int | None:
        lib = self.dev.lib
        return self.dev.optional(
            lib.nvmlDeviceGetTotalEccErrors, self.dev.handle(uuid), 1, 0
        )  # uncorrected, volatile

    def wait_event(self, timeout_ms: int) -> DeviceEvent | None:
        """The next Xid or ECC event on any GPU, or None after ``timeout_ms``."""
        lib = self.dev.lib
        if self._event_set is None:
            self._event_set = self.dev.call(lib.nvmlEventSetCreate)
            for gpu in self.dev.gpus():
                if gpu.health != "ok":
                    continue
                handle = self.dev.handle(gpu.uuid)
                types = self.dev.optional(lib.nvmlDeviceGetSupportedEventTypes, handle) or 0
                wanted = types & (
                    lib.nvmlEventTypeXidCriticalError
                    | lib.nvmlEventTypeDoubleBitEccError
                    | lib.nvmlEventTypeSingleBitEccError
                )
                if wanted:
                    self.dev.call(lib.nvmlDeviceRegisterEvents, handle, wanted, self._event_set)
        try:
            data = lib.nvmlEventSetWait(self._event_set, timeout_ms)
        except lib.NVMLError as e:
            if e.value == lib.NVML_ERROR_TIMEOUT:
                return None
            raise self.dev.translate(e, "nvmlEventSetWait") from None
        kinds: dict[int, DeviceEventKind] = {
            lib.nvmlEventTypeXidCriticalError: "xid",
            lib.nvmlEventTypeDoubleBitEccError: "ecc_double_bit",
            lib.nvmlEventTypeSingleBitEccError: "ecc_single_bit",
        }
        kind = kinds.get(int(data.eventType), "other")
        uuid = text(self.dev.call(lib.nvmlDeviceGetUUID, data.device))
        return DeviceEvent(gpu_uuid=uuid, kind=kind, data=int(data.eventData))
