"""The fake NVML library's constants, error and ctypes types: pynvml's names and values."""

from __future__ import annotations

import ctypes
from typing import Any

from gpufrac.model.catalog import MigProfile

# -- constants, with pynvml's names and values ----------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_GPU_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_GPU_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = 0x8
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12

NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0

NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1

nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8

NVML_VALUE_NOT_AVAILABLE_uint = 0xFFFFFFFF

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2

NVML_GPM_METRIC_GRAPHICS_UTIL = 1  # % of time any compute/graphics app was active (0-100)
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5  # % of time the SMs were doing any tensor operations (0-100)
NVML_GPM_METRIC_DRAM_BW_UTIL = 10  # % of DRAM bandwidth used vs the theoretical maximum (0-100)
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1

_ERROR_TEXT = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_IN_USE: "In use by another client",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Version mismatch",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml's error shape: ``.value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(value)

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML error {self.value}")


def nvmlErrorString(result: int) -> str:
    return _ERROR_TEXT.get(result, f"NVML error {result}")


# -- ctypes argument types, laid out like pynvml's -------------------------------------------------


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


c_nvmlComputeInstancePlacement_t = c_nvmlGpuInstancePlacement_t


class c_nvmlDevice_t(ctypes.c_void_p):
    pass


class c_nvmlGpuInstance_t(ctypes.c_void_p):
    pass


class c_nvmlComputeInstance_t(ctypes.c_void_p):
    pass


class c_nvmlEventSet_t(ctypes.c_void_p):
    pass


class c_nvmlGpmSample_t(ctypes.c_void_p):
    """Opaque, as pynvml's pointer to a sample is."""


class c_metricInfo_t(ctypes.Structure):
    _fields_ = [
        ("shortName", ctypes.c_char_p),
        ("longName", ctypes.c_char_p),
        ("unit", ctypes.c_char_p),
    ]


class c_nvmlGpmMetric_t(ctypes.Structure):
    _fields_ = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_double),
        ("metricInfo", c_metricInfo_t),
    ]


class c_nvmlGpmMetricsGet_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", c_nvmlGpmSample_t),
        ("sample2", c_nvmlGpmSample_t),
        ("metrics", c_nvmlGpmMetric_t * NVML_GPM_METRIC_MAX),
    ]


# -- returned values (pynvml returns ctypes structs or friendly objects with these attributes) -----


class Struct:
    """A returned record: attributes named as on pynvml's structs."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:  # for mypy: attributes are dynamic
        raise AttributeError(name)


KIND_DEVICE, KIND_GI, KIND_CI, KIND_MIG, KIND_EVENTSET, KIND_GPM_SAMPLE = 1, 2, 3, 4, 5, 6


def make_handle(kind: int, gpu: int, gi: int = 0, ci: int = 0) -> int:
    return (kind << 40) | (gpu << 16) | ((gi & 0xFF) << 8) | (ci & 0xFF)


def decode_handle(handle: Any, kind: int) -> tuple[int, int, int]:
    value = handle.value if hasattr(handle, "value") else handle
    if not isinstance(value, int) or (value >> 40) != kind:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return (value >> 16) & 0xFFFFFF, (value >> 8) & 0xFF, value & 0xFF


def profile_enum(profile: MigProfile) -> int:
    """The NVML_GPU_INSTANCE_PROFILE_* enum a profile answers to (what GetGpuInstanceProfileInfo
    takes)."""
    if profile.compute_slices == 1 and profile.memory_slots >= 2:
        return NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    if profile.media_extensions:
        return {
            1: NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
            2: NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1,
        }[profile.compute_slices]
    return {
        1: NVML_GPU_INSTANCE_PROFILE_1_SLICE,
        2: NVML_GPU_INSTANCE_PROFILE_2_SLICE,
        3: NVML_GPU_INSTANCE_PROFILE_3_SLICE,
        4: NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        7: NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    }[profile.compute_slices]


CI_ENUM = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


def deref(ref: Any) -> Any:
    """The c_uint behind ``ctypes.byref(c_uint)`` (or the c_uint itself)."""
    return getattr(ref, "_obj", ref)
