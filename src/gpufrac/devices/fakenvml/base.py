"""The fake NVML library's device queries, lifetime and events (MIG calls are in ``library``)."""

from __future__ import annotations

import time
from typing import Any

from gpufrac.devices.fakenvml import api as nv
from gpufrac.devices.simfleet import SimulatedFleet, pid_alive
from gpufrac.model.catalog import GpuModel, MigProfile, catalog


class FakeNvmlDevices:
    """Device queries, library lifetime and events of the fake NVML library."""

    def __init__(self, fleet: SimulatedFleet) -> None:
        self.fleet = fleet
        self._inits = 0
        self._event_sets: dict[int, dict[str, Any]] = {}
        # the names the adapter reads from its library, whichever it is: constants, NVMLError, types
        for name in dir(nv):
            if name.startswith(("NVML", "nvmlEventType", "c_nvml")):
                setattr(self, name, getattr(nv, name))

    # -- helpers --------------------------------------------------------------------------------

    def _take_time(self, operation: str) -> None:
        """Take as long as the fleet says this operation takes (a driver's MIG changes are not
        instant: ``SimulatedFleet.set_latency``). The fleet is not locked meanwhile."""
        seconds = float(self.fleet.read().get("latency", {}).get(operation, 0.0))
        if seconds > 0:
            time.sleep(seconds)

    def _state(self) -> dict[str, Any]:
        if self._inits <= 0:
            raise nv.NVMLError(nv.NVML_ERROR_UNINITIALIZED)
        return self.fleet.read()

    def _gpu(self, state: dict[str, Any], index: int) -> dict[str, Any]:
        if not 0 <= index < len(state["gpus"]):
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        gpu: dict[str, Any] = state["gpus"][index]
        if gpu["lost"]:
            raise nv.NVMLError(nv.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _device(self, handle: Any) -> tuple[dict[str, Any], dict[str, Any] | None, int]:
        """(gpu, gpu instance or None, gpu index) for a device or MIG device handle."""
        value = handle.value if hasattr(handle, "value") else handle
        kind = (value >> 40) if isinstance(value, int) else 0
        if kind == nv.KIND_DEVICE:
            index, _, _ = nv.decode_handle(handle, nv.KIND_DEVICE)
            return self._gpu(self._state(), index), None, index
        index, gi_id, _ = nv.decode_handle(handle, nv.KIND_MIG)
        gpu = self._gpu(self._state(), index)
        return gpu, self._find_gi(gpu, gi_id), index

    @staticmethod
    def _model(gpu: dict[str, Any]) -> GpuModel:
        return catalog()[gpu["model"]]

    @staticmethod
    def _find_gi(gpu: dict[str, Any], gi_id: int) -> dict[str, Any]:
        for gi in gpu["gpu_instances"]:
            if gi["id"] == gi_id:
                return gi  # type: ignore[no-any-return]
        raise nv.NVMLError(nv.NVML_ERROR_NOT_FOUND)

    def _profile(self, gpu: dict[str, Any], profile_id: int) -> MigProfile:
        prof = self._model(gpu).profile_by_id(profile_id)
        if prof is None:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        return prof

    def _live_processes(self, gpu: dict[str, Any]) -> list[dict[str, Any]]:
        """The processes on ``gpu``: those the fleet records, and those that reported their use
        themselves (the SDK channel), on this GPU and on one of its instances that exists."""
        recorded = [p for p in gpu["processes"] if pid_alive(p["pid"])]
        seen = {p["pid"] for p in recorded}
        instances = {gi["id"] for gi in gpu["gpu_instances"]}
        reported = [
            p
            for p in self.fleet.reported()
            if p["gpu"] == gpu["uuid"]
            and p["pid"] not in seen
            and (p["gi_id"] is None or p["gi_id"] in instances)
        ]
        return recorded + reported

    def _mig_devices(self, gpu: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        pairs = []
        for gi in sorted(gpu["gpu_instances"], key=lambda g: g["id"]):
            for ci in sorted(gi["compute_instances"], key=lambda c: c["id"]):
                pairs.append((gi, ci))
        return pairs

    # -- library lifetime -----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._inits += 1

    def nvmlShutdown(self) -> None:
        if self._inits <= 0:
            raise nv.NVMLError(nv.NVML_ERROR_UNINITIALIZED)
        self._inits -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._state()
        return "simulated"

    def nvmlErrorString(self, result: int) -> str:
        return nv.nvmlErrorString(result)

    # -- devices --------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        return len(self._state()["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> nv.c_nvmlDevice_t:
        self._gpu(self._state(), index)
        return nv.c_nvmlDevice_t(nv.make_handle(nv.KIND_DEVICE, index))

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> nv.c_nvmlDevice_t:
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, gpu in enumerate(self._state()["gpus"]):
            if gpu["uuid"] == wanted:
                return self.nvmlDeviceGetHandleByIndex(i)
        raise nv.NVMLError(nv.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._device(handle)[2]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu, gi, _ = self._device(handle)
        if gi is None:
            return str(gpu["uuid"])
        _, _, ci_id = nv.decode_handle(handle, nv.KIND_MIG)
        for ci in gi["compute_instances"]:
            if ci["id"] == ci_id:
                return str(ci["uuid"])
        raise nv.NVMLError(nv.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu, gi, _ = self._device(handle)
        name = self._model(gpu).match_names[0]
        if gi is not None:
            return f"{name} MIG {self._profile(gpu, gi['profile_id']).name}"
        return name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> nv.Struct:
        gpu, _, index = self._device(handle)
        ids = self._model(gpu).pci_device_ids
        bus = f"00000000:{0x10 + index:02X}:00.0"
        return nv.Struct(
            busId=bus.encode(),
            busIdLegacy=bus[4:].encode(),
            domain=0,
            bus=0x10 + index,
            device=0,
            pciDeviceId=int(ids[0], 16) if ids else 0,
            pciSubSystemId=0,
        )

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        gpu, _, _ = self._device(handle)
        key = gpu["model"]
        return (8, 0) if key.startswith(("A100", "A30")) else (9, 0)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> nv.Struct:
        gpu, gi, _ = self._device(handle)
        procs = self._live_processes(gpu)
        if gi is None:
            total = self._model(gpu).memory_total_mib
            used = sum(p["used_mib"] for p in procs)
        else:
            total = self._profile(gpu, gi["profile_id"]).memory_mib or 0
            used = sum(p["used_mib"] for p in procs if p["gi_id"] == gi["id"])
        mib = 1024 * 1024
        return nv.Struct(total=total * mib, used=used * mib, free=max(0, total - used) * mib)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> nv.Struct:
        gpu, gi, _ = self._device(handle)
        if gi is not None or gpu["mig_current"]:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        return nv.Struct(gpu=gpu["utilization"], memory=0)

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        self._device(handle)
        return 0

    def _process_objects(
        self, gpu: dict[str, Any], gi: dict[str, Any] | None, *, mps: bool
    ) -> list[nv.Struct]:
        out = []
        for p in self._live_processes(gpu):
            if gi is not None and p["gi_id"] != gi["id"]:
                continue
            if mps and not p["mps"]:
                continue
            out.append(
                nv.Struct(
                    pid=p["pid"],
                    usedGpuMemory=p["used_mib"] * 1024 * 1024,
                    gpuInstanceId=nv.NVML_VALUE_NOT_AVAILABLE_uint
                    if p["gi_id"] is None
                    else p["gi_id"],
                    computeInstanceId=nv.NVML_VALUE_NOT_AVAILABLE_uint
                    if p["ci_id"] is None
                    else p["ci_id"],
                )
            )
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[nv.Struct]:
        gpu, gi, _ = self._device(handle)
        return self._process_objects(gpu, gi, mps=False)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[nv.Struct]:
        gpu, gi, _ = self._device(handle)
        return self._process_objects(gpu, gi, mps=True)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[nv.Struct]:
        gpu, gi, _ = self._device(handle)
        if gi is not None or gpu["mig_current"]:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        procs = self._live_processes(gpu)
        if not procs:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_FOUND)
        now = int(time.time() * 1e6)
        return [
            nv.Struct(
                pid=p["pid"], timeStamp=now, smUtil=p["sm_util"], memUtil=0, encUtil=0, decUtil=0
            )
            for p in procs
        ]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu, _, _ = self._device(handle)
        key = "volatile" if counterType == nv.NVML_VOLATILE_ECC else "aggregate"
        return int(gpu["ecc"][key]) if errorType == nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0

    # -- events ---------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> nv.c_nvmlEventSet_t:
        self._state()
        key = len(self._event_sets) + 1
        self._event_sets[key] = {"devices": {}, "seen": self.fleet.read()["event_seq"]}
        return nv.c_nvmlEventSet_t(nv.make_handle(nv.KIND_EVENTSET, key))

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._device(handle)
        return (
            nv.nvmlEventTypeXidCriticalError
            | nv.nvmlEventTypeDoubleBitEccError
            | nv.nvmlEventTypeSingleBitEccError
        )

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        _, _, index = self._device(handle)
        key, _, _ = nv.decode_handle(eventSet, nv.KIND_EVENTSET)
        self._event_sets[key]["devices"][index] = eventTypes

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> nv.Struct:
        key, _, _ = nv.decode_handle(eventSet, nv.KIND_EVENTSET)
        es = self._event_sets.get(key)
        if es is None:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + timeoutms / 1000
        while True:
            state = self._state()
            best: tuple[int, int, dict[str, Any]] | None = None
            for index, mask in es["devices"].items():
                for ev in state["gpus"][index]["events"]:
                    etype = (
                        nv.nvmlEventTypeXidCriticalError
                        if ev["type"] == "xid"
                        else nv.nvmlEventTypeDoubleBitEccError
                    )
                    if (
                        ev["seq"] > es["seen"]
                        and etype & mask
                        and (best is None or ev["seq"] < best[0])
                    ):
                        best = (ev["seq"], index, ev)
            if best is not None:
                seq, index, ev = best
                es["seen"] = seq
                return nv.Struct(
                    device=nv.c_nvmlDevice_t(nv.make_handle(nv.KIND_DEVICE, index)),
                    eventType=nv.nvmlEventTypeXidCriticalError
                    if ev["type"] == "xid"
                    else nv.nvmlEventTypeDoubleBitEccError,
                    eventData=ev["data"],
                    gpuInstanceId=nv.NVML_VALUE_NOT_AVAILABLE_uint,
                    computeInstanceId=nv.NVML_VALUE_NOT_AVAILABLE_uint,
                )
            if time.monotonic() >= deadline:
                raise nv.NVMLError(nv.NVML_ERROR_TIMEOUT)
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        key, _, _ = nv.decode_handle(eventSet, nv.KIND_EVENTSET)
        self._event_sets.pop(key, None)
