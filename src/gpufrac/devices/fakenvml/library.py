"""The fake NVML library: pynvml's surface over simulated GPUs. MIG calls here, the rest in
``base``."""

from __future__ import annotations

import ctypes
import uuid as uuidlib
from typing import Any

from gpufrac.devices.fakenvml import api as nv
from gpufrac.devices.fakenvml.base import FakeNvmlDevices
from gpufrac.model.catalog import GpuModel, MigProfile


class FakeNvml(FakeNvmlDevices):
    """pynvml's surface over a ``SimulatedFleet``. Handles are opaque, as in pynvml."""

    # -- MIG mode and profiles ------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu, gi, _ = self._device(handle)
        if gi is not None:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        return [int(gpu["mig_current"]), int(gpu["mig_pending"])]

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        """Returns the activation status, as pynvml does: IN_USE leaves the change pending."""
        _, gi, index = self._device(handle)
        if gi is not None or mode not in (nv.NVML_DEVICE_MIG_DISABLE, nv.NVML_DEVICE_MIG_ENABLE):
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        with self.fleet.mutate() as state:
            gpu = self._gpu(state, index)
            gpu["mig_pending"] = mode
            busy = bool(self._live_processes(gpu)) or bool(gpu["gpu_instances"])
            if busy and mode != gpu["mig_current"]:
                return nv.NVML_ERROR_IN_USE
            gpu["mig_current"] = mode
            return nv.NVML_SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu, gi, _ = self._device(handle)
        if gi is not None:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        return self._model(gpu).compute_slices

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: Any, profile: int, version: int = 2
    ) -> nv.Struct:
        gpu, gi, _ = self._device(handle)
        if gi is not None:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= profile < nv.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        for prof in self._model(gpu).profiles:
            if nv.profile_enum(prof) == profile:
                return nv.Struct(
                    version=version,
                    id=prof.profile_id,
                    isP2pSupported=0,
                    sliceCount=prof.compute_slices,
                    instanceCount=prof.max_instances,
                    multiprocessorCount=prof.sm_count or 0,
                    copyEngineCount=prof.compute_slices,
                    decoderCount=prof.compute_slices,
                    encoderCount=0,
                    jpegCount=prof.compute_slices,
                    ofaCount=1 if prof.media_extensions or prof.compute_slices == 7 else 0,
                    memorySizeMB=prof.memory_mib or 0,
                    name=f"MIG {prof.name}".encode(),
                )
        raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        gpu, gi, _ = self._device(handle)
        if gi is not None:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        prof = self._profile(gpu, profileId)
        count = nv.deref(countRef)
        needed = len(prof.placement_starts)
        if placementsRef is None:
            count.value = needed
            return nv.NVML_SUCCESS
        if count.value < needed:
            count.value = needed
            raise nv.NVMLError(nv.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, start in enumerate(prof.placement_starts):
            placementsRef[i].start = start
            placementsRef[i].size = prof.memory_slots
        count.value = needed
        return nv.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profileId: int) -> int:
        gpu, _, _ = self._device(handle)
        if not gpu["mig_current"]:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        prof = self._profile(gpu, profileId)
        return sum(
            1 for s in prof.placement_starts if _fits(self._model(gpu), gpu, prof, s) is None
        )

    # -- GPU instances --------------------------------------------------------------------------

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profileId: int, placement: Any
    ) -> nv.c_nvmlGpuInstance_t:
        _, gi, index = self._device(handle)
        if gi is not None:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        self._take_time("create_gpu_instance")
        with self.fleet.mutate() as state:
            gpu = self._gpu(state, index)
            if not gpu["mig_current"]:
                raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
            model = self._model(gpu)
            prof = self._profile(gpu, profileId)
            placement = nv.deref(placement)
            start, size = int(placement.start), int(placement.size)
            if start not in prof.placement_starts or size != prof.memory_slots:
                raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
            problem = _fits(model, gpu, prof, start)
            if problem is not None:
                raise nv.NVMLError(problem)
            used_ids = {g["id"] for g in gpu["gpu_instances"]}
            gi_id = next(i for i in range(1, 256) if i not in used_ids)
            gpu["gpu_instances"].append(
                {
                    "id": gi_id,
                    "profile_id": prof.profile_id,
                    "start": start,
                    "size": size,
                    "compute_instances": [],
                }
            )
        return nv.c_nvmlGpuInstance_t(nv.make_handle(nv.KIND_GI, index, gi_id))

    def nvmlDeviceCreateGpuInstance(self, handle: Any, profileId: int) -> nv.c_nvmlGpuInstance_t:
        gpu, _, _ = self._device(handle)
        prof = self._profile(gpu, profileId)
        for start in prof.placement_starts:
            if _fits(self._model(gpu), gpu, prof, start) is None:
                placement = nv.c_nvmlGpuInstancePlacement_t(start, prof.memory_slots)
                return self.nvmlDeviceCreateGpuInstanceWithPlacement(
                    handle, profileId, ctypes.byref(placement)
                )
        if not gpu["mig_current"]:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        raise nv.NVMLError(nv.NVML_ERROR_INSUFFICIENT_RESOURCES)

    def nvmlDeviceGetGpuInstances(
        self, handle: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        gpu, _, index = self._device(handle)
        if not gpu["mig_current"]:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        self._profile(gpu, profileId)
        found = sorted(g["id"] for g in gpu["gpu_instances"] if g["profile_id"] == profileId)
        count = nv.deref(countRef)
        if gpuInstancesRef is not None and count.value < len(found):
            count.value = len(found)
            raise nv.NVMLError(nv.NVML_ERROR_INSUFFICIENT_SIZE)
        if gpuInstancesRef is not None:
            for i, gi_id in enumerate(found):
                gpuInstancesRef[i] = nv.c_nvmlGpuInstance_t(
                    nv.make_handle(nv.KIND_GI, index, gi_id)
                )
        count.value = len(found)
        return nv.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(
        self, handle: Any, gpuInstanceId: int
    ) -> nv.c_nvmlGpuInstance_t:
        gpu, _, index = self._device(handle)
        if not gpu["mig_current"]:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        self._find_gi(gpu, gpuInstanceId)
        return nv.c_nvmlGpuInstance_t(nv.make_handle(nv.KIND_GI, index, gpuInstanceId))

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> nv.Struct:
        index, gi_id, _ = nv.decode_handle(gpuInstance, nv.KIND_GI)
        gi = self._find_gi(self._gpu(self._state(), index), gi_id)
        return nv.Struct(
            device=nv.c_nvmlDevice_t(nv.make_handle(nv.KIND_DEVICE, index)),
            id=gi["id"],
            profileId=gi["profile_id"],
            placement=nv.c_nvmlGpuInstancePlacement_t(gi["start"], gi["size"]),
        )

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        index, gi_id, _ = nv.decode_handle(gpuInstance, nv.KIND_GI)
        self._take_time("destroy_gpu_instance")
        with self.fleet.mutate() as state:
            gpu = self._gpu(state, index)
            gi = self._find_gi(gpu, gi_id)
            if gi["compute_instances"] or any(
                p["gi_id"] == gi_id for p in self._live_processes(gpu)
            ):
                raise nv.NVMLError(nv.NVML_ERROR_IN_USE)
            gpu["gpu_instances"] = [g for g in gpu["gpu_instances"] if g["id"] != gi_id]
            gpu["processes"] = [p for p in gpu["processes"] if p["gi_id"] != gi_id]
        return nv.NVML_SUCCESS

    # -- compute instances ----------------------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpuInstance: Any, profile: int, engProfile: int, version: int = 2
    ) -> nv.Struct:
        index, gi_id, _ = nv.decode_handle(gpuInstance, nv.KIND_GI)
        gpu = self._gpu(self._state(), index)
        gi_prof = self._profile(gpu, self._find_gi(gpu, gi_id)["profile_id"])
        slices = {v: k for k, v in nv.CI_ENUM.items()}.get(profile)
        if slices is None or slices > gi_prof.compute_slices or engProfile != 0:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        return nv.Struct(
            id=profile,
            sliceCount=slices,
            instanceCount=gi_prof.compute_slices // slices,
            multiprocessorCount=(gi_prof.sm_count or 0) * slices // gi_prof.compute_slices,
        )

    def nvmlGpuInstanceCreateComputeInstance(
        self, gpuInstance: Any, profileId: int
    ) -> nv.c_nvmlComputeInstance_t:
        index, gi_id, _ = nv.decode_handle(gpuInstance, nv.KIND_GI)
        with self.fleet.mutate() as state:
            gpu = self._gpu(state, index)
            gi = self._find_gi(gpu, gi_id)
            gi_prof = self._profile(gpu, gi["profile_id"])
            slices = {v: k for k, v in nv.CI_ENUM.items()}.get(profileId)
            if slices is None or slices > gi_prof.compute_slices:
                raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
            used = sum(
                {v: k for k, v in nv.CI_ENUM.items()}[c["profile_id"]]
                for c in gi["compute_instances"]
            )
            if used + slices > gi_prof.compute_slices:
                raise nv.NVMLError(nv.NVML_ERROR_INSUFFICIENT_RESOURCES)
            ci_id = next(
                i for i in range(0, 8) if i not in {c["id"] for c in gi["compute_instances"]}
            )
            state["created"] += 1
            mig_uuid = "MIG-" + str(
                uuidlib.uuid5(uuidlib.UUID(gpu["uuid"][4:]), f"{gi_id}/{ci_id}/{state['created']}")
            )
            gi["compute_instances"].append({"id": ci_id, "profile_id": profileId, "uuid": mig_uuid})
        return nv.c_nvmlComputeInstance_t(nv.make_handle(nv.KIND_CI, index, gi_id, ci_id))

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        index, gi_id, _ = nv.decode_handle(gpuInstance, nv.KIND_GI)
        gi = self._find_gi(self._gpu(self._state(), index), gi_id)
        found = sorted(c["id"] for c in gi["compute_instances"] if c["profile_id"] == profileId)
        count = nv.deref(countRef)
        if computeInstancesRef is not None and count.value < len(found):
            count.value = len(found)
            raise nv.NVMLError(nv.NVML_ERROR_INSUFFICIENT_SIZE)
        if computeInstancesRef is not None:
            for i, ci_id in enumerate(found):
                computeInstancesRef[i] = nv.c_nvmlComputeInstance_t(
                    nv.make_handle(nv.KIND_CI, index, gi_id, ci_id)
                )
        count.value = len(found)
        return nv.NVML_SUCCESS

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> nv.Struct:
        index, gi_id, ci_id = nv.decode_handle(computeInstance, nv.KIND_CI)
        gi = self._find_gi(self._gpu(self._state(), index), gi_id)
        for ci in gi["compute_instances"]:
            if ci["id"] == ci_id:
                return nv.Struct(
                    device=nv.c_nvmlDevice_t(nv.make_handle(nv.KIND_DEVICE, index)),
                    gpuInstance=nv.c_nvmlGpuInstance_t(nv.make_handle(nv.KIND_GI, index, gi_id)),
                    id=ci_id,
                    profileId=ci["profile_id"],
                    placement=nv.c_nvmlGpuInstancePlacement_t(0, 0),
                )
        raise nv.NVMLError(nv.NVML_ERROR_NOT_FOUND)

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        index, gi_id, ci_id = nv.decode_handle(computeInstance, nv.KIND_CI)
        with self.fleet.mutate() as state:
            gpu = self._gpu(state, index)
            gi = self._find_gi(gpu, gi_id)
            if not any(c["id"] == ci_id for c in gi["compute_instances"]):
                raise nv.NVMLError(nv.NVML_ERROR_NOT_FOUND)
            if any(p["gi_id"] == gi_id and p["ci_id"] == ci_id for p in self._live_processes(gpu)):
                raise nv.NVMLError(nv.NVML_ERROR_IN_USE)
            gi["compute_instances"] = [c for c in gi["compute_instances"] if c["id"] != ci_id]
        return nv.NVML_SUCCESS

    # -- MIG device handles ---------------------------------------------------------------------

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> nv.c_nvmlDevice_t:
        gpu, gi, gpu_index = self._device(handle)
        if gi is not None or not gpu["mig_current"]:
            raise nv.NVMLError(
                nv.NVML_ERROR_NOT_SUPPORTED if gi is None else nv.NVML_ERROR_INVALID_ARGUMENT
            )
        pairs = self._mig_devices(gpu)
        if not 0 <= index < len(pairs):
            raise nv.NVMLError(nv.NVML_ERROR_NOT_FOUND)
        g, c = pairs[index]
        return nv.c_nvmlDevice_t(nv.make_handle(nv.KIND_MIG, gpu_index, g["id"], c["id"]))

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> int:
        value = handle.value if hasattr(handle, "value") else handle
        return int(isinstance(value, int) and (value >> 40) == nv.KIND_MIG)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        _, gi, _ = self._device(handle)
        if gi is None:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        return int(gi["id"])

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        _, gi, _ = self._device(handle)
        if gi is None:
            raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
        return nv.decode_handle(handle, nv.KIND_MIG)[2]

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> nv.c_nvmlDevice_t:
        index, _, _ = nv.decode_handle(migDevice, nv.KIND_MIG)
        return self.nvmlDeviceGetHandleByIndex(index)


def _fits(model: GpuModel, gpu: dict[str, Any], prof: MigProfile, start: int) -> int | None:
    """None if ``prof`` can be created at ``start`` now, else the NVML error code the driver
    gives."""
    used_slots: set[int] = set()
    compute = 0
    same = 0
    media = False
    for gi in gpu["gpu_instances"]:
        other = model.profile_by_id(gi["profile_id"])
        if other is None:
            continue
        used_slots.update(range(gi["start"], gi["start"] + gi["size"]))
        compute += other.compute_slices
        same += other.profile_id == prof.profile_id
        media = media or other.media_extensions
    if used_slots & set(range(start, start + prof.memory_slots)):
        return nv.NVML_ERROR_INSUFFICIENT_RESOURCES
    if compute + prof.compute_slices > model.compute_slices or same >= prof.max_instances:
        return nv.NVML_ERROR_INSUFFICIENT_RESOURCES
    if media and prof.media_extensions:
        return nv.NVML_ERROR_INSUFFICIENT_RESOURCES
    return None
