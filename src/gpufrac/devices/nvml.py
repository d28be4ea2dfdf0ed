"""The one adapter between gpufrac and NVML.

``NvmlDevices`` talks to a library with pynvml's surface: the real ``pynvml`` (imported here and
nowhere else) or ``FakeNvml`` over simulated GPUs. The code path is the same for both; every NVML
error becomes a ``DeviceError`` subclass, "not supported" readings become ``None``, and a missing
driver becomes one clear error with a hint.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Literal, TypeVar, assert_never, get_args

from gpufrac.devices.errors import (
    DeviceError,
    DeviceNotFound,
    DriverUnavailable,
    GpuLost,
    InsufficientResources,
    InUse,
    InvalidArgument,
    NotSupported,
)
from gpufrac.model.catalog import (
    GpuModel,
    MigProfile,
    compare_profile_tables,
    model_for_product_name,
)
from gpufrac.model.gpu import (
    MIG_DISABLED,
    MIG_ENABLED,
    MIG_UNSUPPORTED,
    GpuReadings,
    GpuState,
    MigInstanceState,
    MigMode,
    ProcessState,
)

T = TypeVar("T")
_MIB = 1024 * 1024
_NOT_AVAILABLE = 0xFFFFFFFF
NO_DRIVER_HINT = (
    "no NVIDIA driver here: pass --simulate h200:1:mig,h200:1 (or set GPUFRAC_SIMULATE) "
    "to use simulated GPUs"
)


@dataclass(frozen=True, slots=True)
class MigModeChange:
    """What a MIG mode change did: ``activated`` False means it is pending (``reason`` says why)."""

    current: MigMode
    pending: MigMode
    activated: bool
    reason: str | None


def open_real_nvml() -> NvmlDevices:
    """The adapter over the machine's own driver, or ``DriverUnavailable`` with a hint."""
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise DriverUnavailable("nvidia-ml-py is not installed", hint=NO_DRIVER_HINT) from e
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise DriverUnavailable(
            f"cannot talk to an NVIDIA driver ({e})", hint=NO_DRIVER_HINT
        ) from e
    except OSError as e:  # pragma: no cover - broken installs
        raise DriverUnavailable(f"cannot load NVML ({e})", hint=NO_DRIVER_HINT) from e
    return NvmlDevices(pynvml, simulated=False, initialized=True)


class NvmlDevices:
    """GPUs, their MIG instances and processes, read and changed through one NVML-shaped library."""

    def __init__(self, lib: Any, *, simulated: bool, initialized: bool = False) -> None:
        self.lib = lib
        self.simulated = simulated
        self.sdk_env: dict[str, str] = {}  # handed to workloads (simulated GPUs: the SDK's channel)
        # a directory searched before PATH for the driver's tools (nvidia-cuda-mps-control):
        # simulated GPUs' stand-ins (devices/sim_tools.py); None on a real driver
        self.tool_path: str | None = None
        if not initialized:
            self.call(lib.nvmlInit)
        self._models: dict[str, GpuModel] = {}
        self.gpm = GpmReader(self)

    def close(self) -> None:
        self.gpm.clear()
        self.quiet(self.lib.nvmlShutdown)

    def __enter__(self) -> NvmlDevices:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- error handling -------------------------------------------------------------------------

    def call(self, fn: Callable[..., T], *args: Any, what: str = "") -> T:
        try:
            return fn(*args)
        except self.lib.NVMLError as e:
            raise self.translate(e, what or fn.__name__) from None

    def quiet(self, fn: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(self.lib.NVMLError):
            fn(*args)

    def optional(self, fn: Callable[..., T], *args: Any) -> T | None:
        """A reading the driver may not support: ``None`` for not supported / not found."""
        try:
            return fn(*args)
        except self.lib.NVMLError as e:
            if e.value in (self.lib.NVML_ERROR_NOT_SUPPORTED, self.lib.NVML_ERROR_NOT_FOUND):
                return None
            raise self.translate(e, fn.__name__) from None

    def reading(self, name: str, *args: Any) -> Any:
        """A reading for ``/metrics`` that a driver may lack altogether (an older one without the
        function, a card or MIG device that does not support it): None then, never an error; a
        GPU that fell off the bus still raises ``GpuLost``."""
        fn = getattr(self.lib, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except self.lib.NVMLError as e:
            if e.value == self.lib.NVML_ERROR_GPU_IS_LOST:
                raise self.translate(e, name) from None
            return None

    def translate(self, e: Any, what: str) -> DeviceError:
        lib, code = self.lib, int(e.value)
        text = f"{what}: {e}"
        if code in (
            lib.NVML_ERROR_UNINITIALIZED,
            lib.NVML_ERROR_DRIVER_NOT_LOADED,
            lib.NVML_ERROR_LIBRARY_NOT_FOUND,
        ):
            return DriverUnavailable(text, code=code, hint=NO_DRIVER_HINT)
        kinds: dict[int, type[DeviceError]] = {
            lib.NVML_ERROR_NOT_SUPPORTED: NotSupported,
            lib.NVML_ERROR_INSUFFICIENT_RESOURCES: InsufficientResources,
            lib.NVML_ERROR_IN_USE: InUse,
            lib.NVML_ERROR_GPU_IS_LOST: GpuLost,
            lib.NVML_ERROR_NOT_FOUND: DeviceNotFound,
            lib.NVML_ERROR_INVALID_ARGUMENT: InvalidArgument,
        }
        if code == lib.NVML_ERROR_NO_PERMISSION:
            return DeviceError(text, code=code, hint="this change needs root")
        return kinds.get(code, DeviceError)(text, code=code)

    # -- handles --------------------------------------------------------------------------------

    def handle(self, uuid: str) -> Any:
        try:
            return self.lib.nvmlDeviceGetHandleByUUID(uuid)
        except self.lib.NVMLError as e:
            if e.value == self.lib.NVML_ERROR_NOT_FOUND:
                raise DeviceNotFound(
                    f"no GPU with UUID {uuid}", code=e.value, hint="gpufrac gpus lists them"
                ) from None
            raise self.translate(e, "nvmlDeviceGetHandleByUUID") from None

    def count(self) -> int:
        return int(self.call(self.lib.nvmlDeviceGetCount))

    def driver_version(self) -> str:
        return str(self.call(self.lib.nvmlSystemGetDriverVersion))

    # -- the profile table ----------------------------------------------------------------------

    def model(self, uuid: str) -> GpuModel:
        """The GPU's MIG geometry as its driver reports it (the driver's table wins over the
        catalog)."""
        if uuid not in self._models:
            self._models[uuid] = self._read_model(self.handle(uuid))
        return self._models[uuid]

    def _read_model(self, handle: Any) -> GpuModel:
        lib = self.lib
        name = text(self.call(lib.nvmlDeviceGetName, handle))
        known = model_for_product_name(name)
        memory = self.call(lib.nvmlDeviceGetMemoryInfo, handle)
        profiles: list[MigProfile] = []
        if self.optional(lib.nvmlDeviceGetMigMode, handle) is not None:
            for enum in range(int(lib.NVML_GPU_INSTANCE_PROFILE_COUNT)):
                prof = self._read_profile(handle, enum)
                if prof is not None and all(p.profile_id != prof.profile_id for p in profiles):
                    profiles.append(prof)
        profiles.sort(key=lambda p: (p.compute_slices, p.memory_slots, p.media_extensions))
        return GpuModel(
            key=known.key if known else name,
            match_names=(name,),
            memory_total_mib=int(memory.total) // _MIB,
            sm_count=max((p.sm_count or 0 for p in profiles), default=0)
            or (known.sm_count if known else 0),
            memory_slots=max(
                (s + p.memory_slots for p in profiles for s in p.placement_starts), default=0
            ),
            compute_slices=max((p.compute_slices for p in profiles), default=0),
            profiles=tuple(profiles),
            pci_device_ids=(self._pci_ids(handle)[0],),
            source="read from the driver" + (" (simulated)" if self.simulated else ""),
            verified=True,
            from_driver=True,
        )

    def _read_profile(self, handle: Any, enum: int) -> MigProfile | None:
        lib = self.lib
        try:
            info = lib.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
        except lib.NVMLError as e:
            if e.value in (lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_INVALID_ARGUMENT):
                return None
            raise self.translate(e, "nvmlDeviceGetGpuInstanceProfileInfo") from None
        placements = self.placements(handle, int(info.id))
        name = text(info.name).removeprefix("MIG ").strip().lower()
        return MigProfile(
            name=name,
            profile_id=int(info.id),
            compute_slices=int(info.sliceCount),
            memory_slots=placements[0][1] if placements else 0,
            max_instances=int(info.instanceCount),
            placement_starts=tuple(s for s, _ in placements),
            memory_mib=int(info.memorySizeMB) or None,
            sm_count=int(info.multiprocessorCount) or None,
            media_extensions="+me" in name,
        )

    def placements(self, handle: Any, profile_id: int) -> list[tuple[int, int]]:
        """(start, size) pairs the driver allows for a profile, whether MIG is on or not."""
        lib = self.lib
        arr = (lib.c_nvmlGpuInstancePlacement_t * 8)()
        count = ctypes.c_uint(8)
        self.call(
            lib.nvmlDeviceGetGpuInstancePossiblePlacements,
            handle,
            profile_id,
            arr,
            ctypes.byref(count),
        )
        return [(int(arr[i].start), int(arr[i].size)) for i in range(count.value)]

    def catalog_differences(self, uuid: str) -> list[str]:
        """Where the driver's profile table differs from gpufrac's catalog (empty: they agree)."""
        driver = self.model(uuid)
        known = model_for_product_name(driver.match_names[0])
        if known is None:
            return []
        return compare_profile_tables(known, driver)

    # -- reading GPUs ---------------------------------------------------------------------------

    def gpus(self) -> list[GpuState]:
        out = []
        for index in range(self.count()):
            try:
                handle = self.lib.nvmlDeviceGetHandleByIndex(index)
                out.append(self._read_gpu(handle, index))
            except self.lib.NVMLError as e:
                if e.value != self.lib.NVML_ERROR_GPU_IS_LOST:
                    raise self.translate(e, f"GPU {index}") from None
                out.append(GpuState.lost(index, simulated=self.simulated))
            except GpuLost:
                out.append(GpuState.lost(index, simulated=self.simulated))
        return out

    def gpu(self, uuid: str) -> GpuState:
        handle = self.handle(uuid)
        return self._read_gpu(handle, int(self.call(self.lib.nvmlDeviceGetIndex, handle)))

    def _read_gpu(self, handle: Any, index: int) -> GpuState:
        lib = self.lib
        uuid = text(self.call(lib.nvmlDeviceGetUUID, handle))
        name = text(self.call(lib.nvmlDeviceGetName, handle))
        memory = self.call(lib.nvmlDeviceGetMemoryInfo, handle)
        util = self.optional(lib.nvmlDeviceGetUtilizationRates, handle)
        mode = self.optional(lib.nvmlDeviceGetMigMode, handle)
        current = MIG_UNSUPPORTED if mode is None else _mode(mode[0])
        pending = MIG_UNSUPPORTED if mode is None else _mode(mode[1])
        instances: tuple[MigInstanceState, ...] = ()
        processes = {p.pid: p for p in self._processes(handle, None)}
        if current == MIG_ENABLED:
            instances, mig_procs = self._read_instances(handle, uuid)
            for p in mig_procs:
                processes[p.pid] = p
            read = [(i, self.gpm.read(handle, uuid, i.gi_id)) for i in instances]
            instances = tuple(
                replace(
                    i,
                    gr_engine_active=gpm.get("gr_engine_active"),
                    tensor_active=gpm.get("tensor_active"),
                    dram_active=gpm.get("dram_active"),
                )
                for i, gpm in read
            )
        self.gpm.keep(uuid, {i.gi_id for i in instances})
        known = model_for_product_name(name)
        warnings = tuple(self.catalog_differences(uuid)) if known is not None else ()
        pci_device, pci_subsystem = self._pci_ids(handle)
        return GpuState(
            uuid=uuid,
            index=index,
            name=name,
            model=known.key if known else None,
            pci_device_id=pci_device,
            pci_subsystem_id=pci_subsystem,
            memory_total_mib=int(memory.total) // _MIB,
            memory_used_mib=int(memory.used) // _MIB,
            utilization_gpu=None if util is None else int(util.gpu),
            mig_current=current,
            mig_pending=pending,
            instances=instances,
            processes=tuple(sorted(processes.values(), key=lambda p: p.pid)),
            simulated=self.simulated,
            warnings=warnings,
            readings=self._readings(handle, uuid, util),
        )

    def _readings(self, handle: Any, uuid: str, util: Any) -> GpuReadings:
        lib = self.lib
        pci = self.reading("nvmlDeviceGetPciInfo", handle)
        power = self.reading("nvmlDeviceGetPowerUsage", handle)
        clock = self.reading("nvmlDeviceGetClockInfo", handle, getattr(lib, "NVML_CLOCK_SM", 1))
        temp = self.reading("nvmlDeviceGetTemperature", handle, lib.NVML_TEMPERATURE_GPU)
        minor = self.reading("nvmlDeviceGetMinorNumber", handle)
        gpm = self.gpm.read(handle, uuid, None)
        return GpuReadings(
            pci_bus_id=None if pci is None else text(pci.busId),
            minor_number=None if minor is None else int(minor),
            power_w=None if power is None else int(power) / 1000,
            sm_clock_mhz=None if clock is None else int(clock),
            memory_util=None if util is None else int(util.memory),
            temperature_c=None if temp is None else int(temp),
            gr_engine_active=gpm.get("gr_engine_active"),
            tensor_active=gpm.get("tensor_active"),
            dram_active=gpm.get("dram_active"),
        )

    def _pci_ids(self, handle: Any) -> tuple[str, str]:
        """(device and vendor id, subsystem id), each ``0x`` + 8 hex digits, or ``unknown``."""
        info = self.optional(self.lib.nvmlDeviceGetPciInfo, handle)
        if info is None:
            return "unknown", "unknown"
        return f"0x{int(info.pciDeviceId):08X}", f"0x{int(info.pciSubSystemId):08X}"

    def _processes(self, handle: Any, gi_id: int | None) -> list[ProcessState]:
        """The compute processes, each MPS client (NVML's MPS list) and MPS server (the process
        NVML names ``nvidia-cuda-mps-server``, looked for only where there are clients) marked."""
        raw = self.optional(self.lib.nvmlDeviceGetComputeRunningProcesses, handle) or []
        mps = self.reading("nvmlDeviceGetMPSComputeRunningProcesses", handle) or []
        clients = {int(p.pid) for p in mps}
        out = []
        for p in raw:
            used = getattr(p, "usedGpuMemory", None)
            pgi = getattr(p, "gpuInstanceId", None)
            if pgi is None or int(pgi) >= _NOT_AVAILABLE:
                pgi = gi_id
            pid = int(p.pid)
            role: Literal["client", "server"] | None = None
            if pid in clients:
                role = "client"
            elif clients and _is_mps_server(self.reading("nvmlSystemGetProcessName", pid)):
                role = "server"
            out.append(
                ProcessState(
                    pid=pid,
                    used_memory_mib=None if used is None else int(used) // _MIB,
                    gi_id=None if pgi is None else int(pgi),
                    mps=role,
                )
            )
        return out

    def _read_instances(
        self, handle: Any, uuid: str
    ) -> tuple[tuple[MigInstanceState, ...], list[ProcessState]]:
        lib = self.lib
        model = self.model(uuid)
        # MIG devices (one per compute instance): their UUIDs and processes, by GPU instance id
        uuids: dict[int, str] = {}
        procs: dict[int, list[ProcessState]] = {}
        # an instance destroyed while it is read (by another thread, or another program) is
        # NOT_FOUND part-way: it is left out, as if read a moment later
        for i in range(int(self.call(lib.nvmlDeviceGetMaxMigDeviceCount, handle))):
            mig = self.optional(lib.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
            if mig is None:
                continue
            gi = self.optional(lib.nvmlDeviceGetGpuInstanceId, mig)
            uuid_of = self.optional(lib.nvmlDeviceGetUUID, mig)
            if gi is None or uuid_of is None:
                continue
            gi_id = int(gi)
            uuids.setdefault(gi_id, text(uuid_of))
            procs.setdefault(gi_id, []).extend(self._processes(mig, gi_id))
        instances = []
        for prof in model.profiles:
            for gi in self._gpu_instances(handle, prof.profile_id):
                info = self.optional(lib.nvmlGpuInstanceGetInfo, gi)
                if info is None:
                    continue
                gi_id = int(info.id)
                try:
                    ci_ids = tuple(sorted(self._compute_instance_ids(gi, prof)))
                except DeviceNotFound:
                    continue
                instances.append(
                    MigInstanceState(
                        profile=prof.name,
                        start=int(info.placement.start),
                        gi_id=gi_id,
                        uuid=uuids.get(gi_id),
                        busy=bool(procs.get(gi_id)),
                        memory_mib=prof.memory_mib,
                        ci_ids=ci_ids,
                    )
                )
        all_procs = [p for ps in procs.values() for p in ps]
        return tuple(sorted(instances, key=lambda x: (x.start, x.gi_id))), all_procs

    def _gpu_instances(self, handle: Any, profile_id: int) -> list[Any]:
        lib = self.lib
        arr = (lib.c_nvmlGpuInstance_t * 8)()
        count = ctypes.c_uint(8)
        self.call(lib.nvmlDeviceGetGpuInstances, handle, profile_id, arr, ctypes.byref(count))
        return [arr[i] for i in range(count.value)]

    def _ci_profile_id(self, gi: Any, compute_slices: int) -> int | None:
        enum = getattr(self.lib, f"NVML_COMPUTE_INSTANCE_PROFILE_{compute_slices}_SLICE", None)
        if enum is None:
            return None
        info = self.optional(self.lib.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, enum, 0)
        return None if info is None else int(info.id)

    def _compute_instances(self, gi: Any, prof: MigProfile) -> list[Any]:
        """Handles of every compute instance in GPU instance ``gi``, whatever its size."""
        lib = self.lib
        found: list[Any] = []
        for slices in range(1, prof.compute_slices + 1):
            ci_profile = self._ci_profile_id(gi, slices)
            if ci_profile is None:
                continue
            arr = (lib.c_nvmlComputeInstance_t * 8)()
            count = ctypes.c_uint(8)
            self.call(
                lib.nvmlGpuInstanceGetComputeInstances, gi, ci_profile, arr, ctypes.byref(count)
            )
            found += [arr[i] for i in range(count.value)]
        return found

    def _compute_instance_ids(self, gi: Any, prof: MigProfile) -> list[int]:
        return [
            int(self.call(self.lib.nvmlComputeInstanceGetInfo, ci).id)
            for ci in self._compute_instances(gi, prof)
        ]

    # -- changing MIG ---------------------------------------------------------------------------

    def set_mig_mode(self, uuid: str, enabled: bool) -> MigModeChange:
        lib = self.lib
        handle = self.handle(uuid)
        mode = lib.NVML_DEVICE_MIG_ENABLE if enabled else lib.NVML_DEVICE_MIG_DISABLE
        status = int(self.call(lib.nvmlDeviceSetMigMode, handle, mode))
        current, pending = self.call(lib.nvmlDeviceGetMigMode, handle)
        reason = None
        if status != lib.NVML_SUCCESS:
            reason = str(lib.NVMLError(status))
            if status == lib.NVML_ERROR_IN_USE:
                reason = (
                    "the GPU is in use (processes or MIG instances hold it); the change is pending"
                )
        self._models.pop(uuid, None)
        return MigModeChange(_mode(current), _mode(pending), status == lib.NVML_SUCCESS, reason)

    def create_gpu_instance(self, uuid: str, profile: str, start: int) -> int:
        """Create a GPU instance at an explicit placement; returns its GPU instance id."""
        lib = self.lib
        prof = self.model(uuid).profile(profile)
        placement = lib.c_nvmlGpuInstancePlacement_t(start, prof.memory_slots)
        gi = self.call(
            lib.nvmlDeviceCreateGpuInstanceWithPlacement,
            self.handle(uuid),
            prof.profile_id,
            ctypes.byref(placement),
            what=f"create {prof.name}@{start} on {uuid}",
        )
        return int(self.call(lib.nvmlGpuInstanceGetInfo, gi).id)

    def create_compute_instance(self, uuid: str, gi_id: int) -> None:
        """Create the compute instance that fills GPU instance ``gi_id``."""
        lib = self.lib
        gi = self.call(
            lib.nvmlDeviceGetGpuInstanceById, self.handle(uuid), gi_id, what=f"GPU instance {gi_id}"
        )
        prof = self._gi_profile(uuid, gi)
        ci_profile = self._ci_profile_id(gi, prof.compute_slices)
        if ci_profile is None:
            raise NotSupported(f"no compute-instance profile fills {prof.name}")
        self.call(
            lib.nvmlGpuInstanceCreateComputeInstance,
            gi,
            ci_profile,
            what=f"create compute instance in GPU instance {gi_id} on {uuid}",
        )

    def destroy_compute_instances(self, uuid: str, gi_id: int) -> None:
        """Destroy every compute instance of GPU instance ``gi_id``."""
        lib = self.lib
        gi = self.call(
            lib.nvmlDeviceGetGpuInstanceById, self.handle(uuid), gi_id, what=f"GPU instance {gi_id}"
        )
        for ci in self._compute_instances(gi, self._gi_profile(uuid, gi)):
            self.call(
                lib.nvmlComputeInstanceDestroy,
                ci,
                what=f"destroy compute instance of GPU instance {gi_id} on {uuid}",
            )

    def destroy_gpu_instance(self, uuid: str, gi_id: int) -> None:
        """Destroy GPU instance ``gi_id`` (its compute instances must be gone: IN_USE otherwise)."""
        lib = self.lib
        gi = self.call(
            lib.nvmlDeviceGetGpuInstanceById, self.handle(uuid), gi_id, what=f"GPU instance {gi_id}"
        )
        self.call(lib.nvmlGpuInstanceDestroy, gi, what=f"destroy GPU instance {gi_id} on {uuid}")

    def _gi_profile(self, uuid: str, gi: Any) -> MigProfile:
        profile_id = int(self.call(self.lib.nvmlGpuInstanceGetInfo, gi).profileId)
        prof = self.model(uuid).profile_by_id(profile_id)
        if prof is None:
            raise DeviceNotFound(
                f"GPU instance profile id {profile_id} is not in the driver's table for {uuid}"
            )
        return prof

    def create_instance(self, uuid: str, profile: str, start: int) -> MigInstanceState:
        """Create a GPU instance at an explicit placement, with one compute instance filling it.

        All or nothing: if the compute instance cannot be created, the GPU instance is destroyed
        again.
        """
        gi_id = self.create_gpu_instance(uuid, profile, start)
        try:
            self.create_compute_instance(uuid, gi_id)
        except BaseException:
            with contextlib.suppress(DeviceError):
                self.destroy_gpu_instance(uuid, gi_id)
            raise
        for inst in self.gpu(uuid).instances:
            if inst.gi_id == gi_id:
                return inst
        raise DeviceNotFound(f"GPU instance {gi_id} vanished after creation on {uuid}")

    def destroy_instance(self, uuid: str, gi_id: int) -> None:
        """Destroy a GPU instance: its compute instances first, then itself."""
        self.destroy_compute_instances(uuid, gi_id)
        self.destroy_gpu_instance(uuid, gi_id)


GpmMetric = Literal["gr_engine_active", "tensor_active", "dram_active"]
GPM_METRICS: tuple[GpmMetric, ...] = get_args(GpmMetric)


def gpm_metric_id(lib: Any, metric: GpmMetric) -> int:
    """NVML's GPM metric for a DCGM field: ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` is the time any
    graphics/compute work ran, ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` the time any tensor pipe did,
    ``DCGM_FI_PROF_DRAM_ACTIVE`` how much of the device memory's bandwidth was used."""
    match metric:
        case "gr_engine_active":
            return int(lib.NVML_GPM_METRIC_GRAPHICS_UTIL)
        case "tensor_active":
            return int(lib.NVML_GPM_METRIC_ANY_TENSOR_UTIL)
        case "dram_active":
            return int(lib.NVML_GPM_METRIC_DRAM_BW_UTIL)
        case _:
            assert_never(metric)


# what GPM gave between a device's last two samples, each 0-1; a metric not there (no rate yet,
# or one the device does not give) is absent
GpmValues = Mapping[GpmMetric, float]
NO_GPM: GpmValues = MappingProxyType({})


class GpmReader:
    """DCGM's profiling fields through NVML's GPM (Hopper and newer): ``GpmMetric``, each the part
    of the time a unit was busy between two samples of a GPU (``nvmlGpmSampleGet``) or of one of
    its GPU instances (``nvmlGpmMigSampleGet``), all read from one pair of samples in one
    ``nvmlGpmMetricsGet``. Each device's last sample is kept: a reading compares a new sample with
    it once at least ``MIN_INTERVAL_S`` has passed (else the last values stand), so the first
    reading of a device has no values yet, as no rate has a first sample alone; a metric the
    driver answers for with an error is left out, the others kept."""

    MIN_INTERVAL_S = 0.5

    def __init__(self, dev: NvmlDevices) -> None:
        self.dev = dev
        self._lock = threading.Lock()
        self._supported: dict[str, bool] = {}
        # (GPU UUID, GPU instance id or None) -> (sample, when taken, last values)
        self._last: dict[tuple[str, int | None], tuple[Any, float, GpmValues]] = {}

    def read(self, handle: Any, uuid: str, gi_id: int | None) -> GpmValues:
        lib = self.dev.lib
        with self._lock:
            if uuid not in self._supported:
                support = self.dev.reading("nvmlGpmQueryDeviceSupport", handle)
                self._supported[uuid] = bool(support is not None and support.isSupportedDevice)
            if not self._supported[uuid]:
                return NO_GPM
            sample = self.dev.reading("nvmlGpmSampleAlloc")
            if sample is None:
                return NO_GPM
            taken = (
                self.dev.reading("nvmlGpmSampleGet", handle, sample)
                if gi_id is None
                else self.dev.reading("nvmlGpmMigSampleGet", handle, gi_id, sample)
            )
            now = time.monotonic()
            key = (uuid, gi_id)
            before = self._last.get(key)
            if taken is None or (before is not None and now - before[1] < self.MIN_INTERVAL_S):
                self.dev.quiet(lib.nvmlGpmSampleFree, sample)
                return NO_GPM if taken is None or before is None else before[2]
            values = NO_GPM if before is None else self._between(before[0], sample)
            if before is not None:
                self.dev.quiet(lib.nvmlGpmSampleFree, before[0])
            self._last[key] = (sample, now, values)
            return values

    def _between(self, first: Any, second: Any) -> GpmValues:
        lib = self.dev.lib
        asked = lib.c_nvmlGpmMetricsGet_t()
        asked.version = lib.NVML_GPM_METRICS_GET_VERSION
        asked.numMetrics = len(GPM_METRICS)
        asked.sample1, asked.sample2 = first, second
        for i, metric in enumerate(GPM_METRICS):
            asked.metrics[i].metricId = gpm_metric_id(lib, metric)
        got = self.dev.reading("nvmlGpmMetricsGet", asked)
        if got is None:
            return NO_GPM
        return MappingProxyType(
            {
                metric: max(0.0, min(1.0, float(got.metrics[i].value) / 100))
                for i, metric in enumerate(GPM_METRICS)
                if int(got.metrics[i].nvmlReturn) == lib.NVML_SUCCESS
            }
        )

    def keep(self, uuid: str, gi_ids: set[int]) -> None:
        """Forget the samples of GPU instances of ``uuid`` that are gone."""
        with self._lock:
            for key in [k for k in self._last if k[0] == uuid and k[1] not in (None, *gi_ids)]:
                self.dev.quiet(self.dev.lib.nvmlGpmSampleFree, self._last.pop(key)[0])

    def clear(self) -> None:
        with self._lock:
            for sample, _, _ in self._last.values():
                self.dev.quiet(self.dev.lib.nvmlGpmSampleFree, sample)
            self._last.clear()


def _mode(value: Any) -> MigMode:
    return MIG_ENABLED if int(value) == 1 else MIG_DISABLED


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def _is_mps_server(name: Any) -> bool:
    """Whether NVML's name of a process (a path, as bytes or text) is the MPS server's."""
    if name is None:
        return False
    return text(name).rsplit("/", 1)[-1] == "nvidia-cuda-mps-server"
