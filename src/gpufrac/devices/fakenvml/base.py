"""The fake NVML library's device queries, lifetime and events (MIG calls are in ``library``)."""

from __future__ import annotations

import time
from typing import Any

from gpufrac.devices.fakenvml import api as nv
from gpufrac.devices.sim_tools import MPS_SERVER_PID, mps_server_pid
from gpufrac.devices.simfleet import SimulatedFleet, pid_alive
from gpufrac.model.catalog import GpuModel, MigProfile, catalog


class FakeNvmlDevices:
    """Device queries, library lifetime and events of the fake NVML library."""

    def __init__(self, fleet: SimulatedFleet) -> None:
        self.fleet = fleet
        self._inits = 0
        self._event_sets: dict[int, dict[str, Any]] = {}
        # GPM: samples by key (None until filled), and per device (GPU index, GPU instance id or
        # None) the busy time of its engine and of its tensor pipes integrated so far: when, and
        # for each, (busy seconds, busy part now)
        self._gpm_samples: dict[int, dict[str, Any] | None] = {}
        self._gpm_next = 0
        self._gpm_busy: dict[
            tuple[int, int | None], tuple[float, dict[str, tuple[float, float]]]
        ] = {}
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
        clients = recorded + reported
        return clients + _mps_servers(gpu, clients)

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
        busy = round(self._busy_percent(gpu, None))
        return nv.Struct(gpu=busy, memory=busy // 2)

    # -- readings of the whole GPU (not of a MIG device: NOT_SUPPORTED there, as on a driver) ---

    def _busy_percent(self, gpu: dict[str, Any], gi: dict[str, Any] | None) -> float:
        """How busy the engine is now (0-100): outside MIG, the GPU's utilization as set or as its
        processes report their SM use (summed, at most 100), whichever is more; in a GPU
        instance, the SM use its processes report (summed, at most 100); a GPU in MIG mode, its
        instances' by their share of the compute slices."""
        if gi is None and not gpu["mig_current"]:
            # what was set (set_utilization), or what its processes report they keep busy
            return float(max(gpu["utilization"], self._reported_percent(gpu, None, "sm_util")))
        return self._reported_percent(gpu, gi, "sm_util")

    def _tensor_percent(self, gpu: dict[str, Any], gi: dict[str, Any] | None) -> float:
        """How much of the time the tensor pipes are busy now (0-100): what the processes on the
        device (or in the GPU instance) report, summed, at most 100; a GPU in MIG mode, its
        instances' by their share of the compute slices."""
        return self._reported_percent(gpu, gi, "tensor_util")

    def _reported_percent(self, gpu: dict[str, Any], gi: dict[str, Any] | None, key: str) -> float:
        procs = self._live_processes(gpu)
        if gi is not None or not gpu["mig_current"]:
            inside = None if gi is None else gi["id"]
            return float(min(100, sum(p.get(key, 0) for p in procs if p["gi_id"] == inside)))
        model = self._model(gpu)
        total = 0.0
        for g in gpu["gpu_instances"]:
            prof = model.profile_by_id(g["profile_id"])
            if prof is not None and model.compute_slices:
                share = prof.compute_slices / model.compute_slices
                total += self._reported_percent(gpu, g, key) * share
        return total

    def _whole_gpu(self, handle: Any) -> tuple[dict[str, Any], GpuModel, float]:
        gpu, gi, _ = self._device(handle)
        if gi is not None:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        return gpu, self._model(gpu), self._busy_percent(gpu, None)

    @staticmethod
    def _hopper(model: GpuModel) -> bool:
        return not model.key.startswith(("A100", "A30"))

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """Milliwatts: idle at 70 W, up to the board's limit when busy."""
        _, model, busy = self._whole_gpu(handle)
        limit = 700 if self._hopper(model) else 400 if model.key.startswith("A100") else 165
        return int((70 + (limit - 70) * busy / 100) * 1000)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        _, _, busy = self._whole_gpu(handle)
        if sensor != nv.NVML_TEMPERATURE_GPU:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        return int(32 + busy * 0.4)

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        """MHz: idle clocks at rest, boost clocks when busy."""
        _, model, busy = self._whole_gpu(handle)
        boost = {nv.NVML_CLOCK_GRAPHICS: 1980, nv.NVML_CLOCK_SM: 1980, nv.NVML_CLOCK_MEM: 2619}
        if type not in boost:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        if not self._hopper(model):
            boost = {k: 1410 if k != nv.NVML_CLOCK_MEM else 1593 for k in boost}
        return boost[type] if busy > 0 else 345 if type != nv.NVML_CLOCK_MEM else boost[type]

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        _, gi, index = self._device(handle)
        if gi is not None:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        return index

    # -- GPM (GPU performance monitoring: Hopper and newer) -------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> nv.Struct:
        gpu, gi, _ = self._device(device)
        if gi is not None:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        return nv.Struct(
            version=nv.NVML_GPM_SUPPORT_VERSION,
            isSupportedDevice=int(self._hopper(self._model(gpu))),
        )

    def nvmlGpmSampleAlloc(self) -> nv.c_nvmlGpmSample_t:
        self._state()
        self._gpm_next += 1
        self._gpm_samples[self._gpm_next] = None
        return nv.c_nvmlGpmSample_t((nv.KIND_GPM_SAMPLE << 40) | self._gpm_next)

    def _sample_key(self, sample: Any) -> int:
        value = sample.value if hasattr(sample, "value") else sample
        if not isinstance(value, int) or (value >> 40) != nv.KIND_GPM_SAMPLE:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        key = value & ((1 << 40) - 1)
        if key not in self._gpm_samples:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        return key

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._gpm_samples.pop(self._sample_key(gpmSample))

    def _take_sample(
        self, gpu: dict[str, Any], index: int, gi: dict[str, Any] | None, key: int
    ) -> None:
        """The busy time so far of the engine ("busy") and of the tensor pipes ("tensor"), each
        integrated from what the fleet said at each sample."""
        device = (index, None if gi is None else int(gi["id"]))
        now = time.monotonic()
        parts_now = {
            "busy": self._busy_percent(gpu, gi) / 100,
            "tensor": self._tensor_percent(gpu, gi) / 100,
        }
        when, before = self._gpm_busy.get(device, (now, {}))
        totals: dict[str, tuple[float, float]] = {}
        for name, part_now in parts_now.items():
            total, part = before.get(name, (0.0, part_now))
            totals[name] = (total + part * (now - when), part_now)
        self._gpm_busy[device] = (now, totals)
        self._gpm_samples[key] = {
            "device": device,
            "at": now,
            **{f"{name}_s": total for name, (total, _) in totals.items()},
        }

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        gpu, gi, index = self._device(device)
        key = self._sample_key(gpmSample)
        if gi is not None:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)  # nvmlGpmMigSampleGet is for those
        if not self._hopper(self._model(gpu)):
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        self._take_sample(gpu, index, None, key)
        return gpmSample

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        gpu, gi, index = self._device(device)
        key = self._sample_key(gpmSample)
        if gi is not None:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        if not self._hopper(self._model(gpu)) or not gpu["mig_current"]:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        self._take_sample(gpu, index, self._find_gi(gpu, gpuInstanceId), key)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        """Each metric asked for between two samples of one device, ``sample1`` the earlier."""
        if metricsGet.version != nv.NVML_GPM_METRICS_GET_VERSION:
            raise nv.NVMLError(nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self._gpm_samples.get(self._sample_key(metricsGet.sample1))
        second = self._gpm_samples.get(self._sample_key(metricsGet.sample2))
        if first is None or second is None or first["device"] != second["device"]:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        seconds = second["at"] - first["at"]
        if seconds <= 0 or not 0 < metricsGet.numMetrics <= nv.NVML_GPM_METRIC_MAX:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        busy = 100 * (second["busy_s"] - first["busy_s"]) / seconds
        tensor = 100 * (second["tensor_s"] - first["tensor_s"]) / seconds
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            if metric.metricId in (nv.NVML_GPM_METRIC_GRAPHICS_UTIL, nv.NVML_GPM_METRIC_SM_UTIL):
                metric.value, metric.nvmlReturn = max(0.0, min(100.0, busy)), nv.NVML_SUCCESS
            elif metric.metricId == nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL:
                metric.value, metric.nvmlReturn = max(0.0, min(100.0, tensor)), nv.NVML_SUCCESS
            elif metric.metricId == nv.NVML_GPM_METRIC_DRAM_BW_UTIL:
                # half the engine's, as this fake's utilization rates give memory half the GPU's
                metric.value, metric.nvmlReturn = max(0.0, min(50.0, busy / 2)), nv.NVML_SUCCESS
            else:
                metric.value, metric.nvmlReturn = 0.0, nv.NVML_ERROR_NOT_SUPPORTED
        return metricsGet

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

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        """The process's name as NVML gives it (its executable's path); the MPS server of a
        simulated GPU is named as the driver's is."""
        if self._inits <= 0:
            raise nv.NVMLError(nv.NVML_ERROR_UNINITIALIZED)
        if pid >= MPS_SERVER_PID:
            return "nvidia-cuda-mps-server"
        try:
            with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
                first = f.read().split(b"\0", 1)[0]
        except OSError:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_FOUND) from None
        if not first:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_FOUND)
        return first.decode(errors="replace")

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[nv.Struct]:
        """A sample per process; under MPS only the MPS server's, with its clients' SM use summed
        (as an H200 answered: ../shared/reference/h200/nvml-notes.md), never one per client."""
        gpu, gi, _ = self._device(handle)
        if gi is not None or gpu["mig_current"]:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        procs = self._live_processes(gpu)
        if not procs:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_FOUND)
        now = int(time.time() * 1e6)
        sm: dict[int, int] = {}
        for p in procs:
            pid = _mps_server_pid(gpu, p) if p["mps"] else p["pid"]
            sm[pid] = min(100, sm.get(pid, 0) + p["sm_util"])
        return [
            nv.Struct(pid=pid, timeStamp=now, smUtil=util, memUtil=0, encUtil=0, decUtil=0)
            for pid, util in sm.items()
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


# The MPS server a daemon runs while it has MPS clients: NVML lists it among the compute processes
# (not among the MPS clients) with its own memory, and gives the clients' SM use under its pid
# alone. The control daemon's stand-in starts no process: the server is listed with the pid the
# stand-in's get_server_list names (sim_tools.mps_server_pid of its pipe directory), past Linux's
# largest, so it never names a real process. A client attached by hand (no pipe directory) is
# served by one per GPU (or GPU instance).
MPS_SERVER_MIB = 66  # what the MPS server held on an H200 (../shared/reference/h200/nvml-notes.md)


def _mps_server_pid(gpu: dict[str, Any], client: dict[str, Any]) -> int:
    pipe = client.get("mps_pipe")
    if pipe:
        return mps_server_pid(str(pipe))
    gi_id = client["gi_id"]
    return mps_server_pid(f"{gpu['uuid']}/{'' if gi_id is None else gi_id}")


def _mps_servers(gpu: dict[str, Any], clients: list[dict[str, Any]]) -> list[dict[str, Any]]:
    servers: dict[int, int | None] = {}  # pid -> its GPU instance
    for p in clients:
        if p["mps"]:
            servers.setdefault(_mps_server_pid(gpu, p), p["gi_id"])
    return [
        {
            "pid": pid,
            "used_mib": MPS_SERVER_MIB,
            "gi_id": gi_id,
            "ci_id": None if gi_id is None else 0,
            "mps": False,
            "sm_util": 0,  # its clients' SM use is theirs (summed under its pid by NVML's sample)
            "tensor_util": 0,
        }
        for pid, gi_id in servers.items()
    ]
