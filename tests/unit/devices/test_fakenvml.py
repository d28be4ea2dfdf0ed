"""The fake NVML library answers like pynvml: same constants, argument shapes and error codes."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pynvml
import pytest

from gpufrac.devices.fakenvml import FakeNvml, NVMLError
from gpufrac.devices.fakenvml import api as fakenvml
from gpufrac.devices.simfleet import SimulatedFleet
from tests.conftest import load_data


@pytest.fixture
def nv(data_dir: Path) -> FakeNvml:
    lib = FakeNvml(SimulatedFleet.open("h200:1:mig,h200:1", data_dir))
    lib.nvmlInit()
    return lib


def code(exc: pytest.ExceptionInfo[NVMLError]) -> int:
    return exc.value.value


def test_constants_match_pynvml() -> None:
    for name in dir(fakenvml):
        if name.startswith(
            (
                "NVML_ERROR_",
                "NVML_GPU_INSTANCE_PROFILE_",
                "NVML_COMPUTE_INSTANCE_PROFILE_",
                "NVML_DEVICE_MIG_",
                "NVML_GPM_",
                "nvmlEventType",
            )
        ):
            if name.endswith("_COUNT") or name == "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED":
                continue
            assert getattr(fakenvml, name) == getattr(pynvml, name), name
    assert fakenvml.NVML_SUCCESS == pynvml.NVML_SUCCESS
    assert ctypes.sizeof(fakenvml.c_nvmlGpuInstancePlacement_t) == ctypes.sizeof(
        pynvml.c_nvmlGpuInstancePlacement_t
    )


def test_error_strings_match_pynvml() -> None:
    for value in (
        fakenvml.NVML_ERROR_NOT_SUPPORTED,
        fakenvml.NVML_ERROR_IN_USE,
        fakenvml.NVML_ERROR_GPU_IS_LOST,
        fakenvml.NVML_ERROR_NOT_FOUND,
    ):
        assert str(NVMLError(value)) == pynvml.NVMLError._errcode_to_string.get(
            value, str(NVMLError(value))
        )


def test_calls_before_init_are_uninitialized(data_dir: Path) -> None:
    lib = FakeNvml(SimulatedFleet.open("h200", data_dir))
    with pytest.raises(NVMLError) as exc:
        lib.nvmlDeviceGetCount()
    assert code(exc) == fakenvml.NVML_ERROR_UNINITIALIZED


def test_profile_info_and_placements_answer_with_mig_off_like_the_h200_driver(nv: FakeNvml) -> None:
    reading = load_data("nvml-reading.json")["gi_profiles"]
    placements = load_data("nvml-placements.json")
    h = nv.nvmlDeviceGetHandleByIndex(1)  # MIG disabled
    assert nv.nvmlDeviceGetMigMode(h) == [0, 0]
    for enum in range(fakenvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        if str(enum) not in reading:
            with pytest.raises(NVMLError) as exc:
                nv.nvmlDeviceGetGpuInstanceProfileInfo(h, enum)
            assert code(exc) == fakenvml.NVML_ERROR_NOT_SUPPORTED
            continue
        info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, enum)
        want = reading[str(enum)]
        for field in ("id", "sliceCount", "instanceCount", "multiprocessorCount", "memorySizeMB"):
            assert getattr(info, field) == want[field], (enum, field)
        assert info.name.decode() == want["name"]
        arr = (fakenvml.c_nvmlGpuInstancePlacement_t * 8)()
        n = ctypes.c_uint(8)
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(n))
        got = [[arr[i].start, arr[i].size] for i in range(n.value)]
        assert got == placements[want["name"]]["placements"]


def test_placements_count_query_and_insufficient_size(nv: FakeNvml) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(0)
    n = ctypes.c_uint(0)
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, 19, None, ctypes.byref(n))
    assert n.value == 7
    arr = (fakenvml.c_nvmlGpuInstancePlacement_t * 2)()
    n = ctypes.c_uint(2)
    with pytest.raises(NVMLError) as exc:
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, 19, arr, ctypes.byref(n))
    assert code(exc) == fakenvml.NVML_ERROR_INSUFFICIENT_SIZE


def _create(nv: FakeNvml, index: int, profile_id: int, start: int, size: int) -> object:
    p = fakenvml.c_nvmlGpuInstancePlacement_t(start, size)
    return nv.nvmlDeviceCreateGpuInstanceWithPlacement(
        nv.nvmlDeviceGetHandleByIndex(index), profile_id, ctypes.byref(p)
    )


def test_instance_create_and_list_are_not_supported_with_mig_off(nv: FakeNvml) -> None:
    with pytest.raises(NVMLError) as exc:
        _create(nv, 1, 9, 0, 4)
    assert code(exc) == fakenvml.NVML_ERROR_NOT_SUPPORTED
    arr = (fakenvml.c_nvmlGpuInstance_t * 8)()
    with pytest.raises(NVMLError) as exc:
        nv.nvmlDeviceGetGpuInstances(
            nv.nvmlDeviceGetHandleByIndex(1), 9, arr, ctypes.byref(ctypes.c_uint(8))
        )
    assert code(exc) == fakenvml.NVML_ERROR_NOT_SUPPORTED


def test_overlap_and_limits_are_insufficient_resources(nv: FakeNvml) -> None:
    _create(nv, 0, 9, 0, 4)  # 3g.71gb@0
    for pid, start, size in [(5, 0, 4), (19, 2, 1), (0, 0, 8)]:  # 4g@0, 1g@2, 7g@0 all overlap
        with pytest.raises(NVMLError) as exc:
            _create(nv, 0, pid, start, size)
        assert code(exc) == fakenvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    _create(nv, 0, 20, 4, 1)  # 1g.18gb+me@4
    with pytest.raises(NVMLError) as exc:
        _create(nv, 0, 20, 5, 1)  # a second +me instance
    assert code(exc) == fakenvml.NVML_ERROR_INSUFFICIENT_RESOURCES


def test_bad_placement_is_invalid_argument(nv: FakeNvml) -> None:
    for pid, start, size in [(9, 2, 4), (19, 7, 1), (9, 0, 2), (99, 0, 1)]:
        with pytest.raises(NVMLError) as exc:
            _create(nv, 0, pid, start, size)
        assert code(exc) == fakenvml.NVML_ERROR_INVALID_ARGUMENT


def test_compute_instances_and_mig_devices(nv: FakeNvml) -> None:
    gi = _create(nv, 0, 14, 2, 2)  # 2g.35gb@2
    info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, fakenvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, 0
    )
    with pytest.raises(NVMLError) as exc:
        nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, fakenvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0
        )
    assert code(exc) == fakenvml.NVML_ERROR_NOT_SUPPORTED
    ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
    with pytest.raises(NVMLError) as exc:
        nv.nvmlGpuInstanceCreateComputeInstance(gi, info.id)  # the GI's slices are used up
    assert code(exc) == fakenvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    h = nv.nvmlDeviceGetHandleByIndex(0)
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert nv.nvmlDeviceIsMigDeviceHandle(mig)
    assert nv.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert nv.nvmlDeviceGetGpuInstanceId(mig) == nv.nvmlGpuInstanceGetInfo(gi).id
    assert nv.nvmlDeviceGetMemoryInfo(mig).total == 33280 * 1024 * 1024
    assert nv.nvmlDeviceGetName(mig) == "NVIDIA H200 MIG 2g.35gb"
    with pytest.raises(NVMLError) as exc:
        nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
    assert code(exc) == fakenvml.NVML_ERROR_NOT_FOUND
    with pytest.raises(NVMLError) as exc:
        nv.nvmlGpuInstanceDestroy(gi)  # a compute instance is still there
    assert code(exc) == fakenvml.NVML_ERROR_IN_USE
    nv.nvmlComputeInstanceDestroy(ci)
    nv.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(NVMLError) as exc:
        nv.nvmlGpuInstanceGetInfo(gi)
    assert code(exc) == fakenvml.NVML_ERROR_NOT_FOUND


def test_processes_make_instances_and_mode_changes_in_use(nv: FakeNvml, data_dir: Path) -> None:
    import os

    fleet = nv.fleet
    gi = _create(nv, 0, 19, 0, 1)
    ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    gi_id = nv.nvmlGpuInstanceGetInfo(gi).id
    fleet.attach_process(
        nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(0)), os.getpid(), 512, gi_id=gi_id
    )
    with pytest.raises(NVMLError) as exc:
        nv.nvmlComputeInstanceDestroy(ci)
    assert code(exc) == fakenvml.NVML_ERROR_IN_USE
    procs = nv.nvmlDeviceGetComputeRunningProcesses(
        nv.nvmlDeviceGetMigDeviceHandleByIndex(nv.nvmlDeviceGetHandleByIndex(0), 0)
    )
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(os.getpid(), 512 * 1024 * 1024)]
    # a non-MIG GPU with a process: the mode change stays pending with IN_USE as activation status
    h1 = nv.nvmlDeviceGetHandleByIndex(1)
    fleet.attach_process(nv.nvmlDeviceGetUUID(h1), os.getpid(), 100)
    assert (
        nv.nvmlDeviceSetMigMode(h1, fakenvml.NVML_DEVICE_MIG_ENABLE) == fakenvml.NVML_ERROR_IN_USE
    )
    assert nv.nvmlDeviceGetMigMode(h1) == [0, 1]
    fleet.detach_process(os.getpid())
    assert nv.nvmlDeviceSetMigMode(h1, fakenvml.NVML_DEVICE_MIG_ENABLE) == fakenvml.NVML_SUCCESS
    assert nv.nvmlDeviceGetMigMode(h1) == [1, 1]


def test_dead_processes_are_not_listed(nv: FakeNvml) -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    h = nv.nvmlDeviceGetHandleByIndex(1)
    nv.fleet.attach_process(nv.nvmlDeviceGetUUID(h), child.pid, 100)
    assert nv.nvmlDeviceGetComputeRunningProcesses(h) == []


def test_process_utilization_not_supported_on_mig(nv: FakeNvml) -> None:
    import os

    h0, h1 = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(NVMLError) as exc:
        nv.nvmlDeviceGetProcessUtilization(h0, 0)
    assert code(exc) == fakenvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(NVMLError) as exc:
        nv.nvmlDeviceGetProcessUtilization(h1, 0)
    assert code(exc) == fakenvml.NVML_ERROR_NOT_FOUND  # no samples yet
    assert nv.nvmlDeviceGetUtilizationRates(h1).gpu == 0
    nv.fleet.attach_process(nv.nvmlDeviceGetUUID(h1), os.getpid(), 100, sm_util=42)
    assert [(s.pid, s.smUtil) for s in nv.nvmlDeviceGetProcessUtilization(h1, 0)] == [
        (os.getpid(), 42)
    ]
    # the GPU is as busy as its processes keep it (or as set, if more)
    assert nv.nvmlDeviceGetUtilizationRates(h1).gpu == 42
    with pytest.raises(NVMLError) as exc:
        nv.nvmlDeviceGetUtilizationRates(h0)  # MIG-enabled GPU
    assert code(exc) == fakenvml.NVML_ERROR_NOT_SUPPORTED


def test_under_mps_the_server_is_listed_and_its_sample_holds_its_clients_sm_use(
    nv: FakeNvml,
) -> None:
    """As an H200 answered (../shared/reference/h200/nvml-notes.md): under MPS the compute
    processes are the MPS server (its own memory) and each client, the MPS list only the
    clients, and the per-process SM samples name the server alone, its clients' use summed; a
    process outside MPS keeps its own sample."""
    import os
    import subprocess
    import sys

    from gpufrac.devices.fakenvml.base import MPS_SERVER_MIB, MPS_SERVER_PID

    h = nv.nvmlDeviceGetHandleByIndex(1)
    uuid = nv.nvmlDeviceGetUUID(h)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        nv.fleet.attach_process(uuid, os.getpid(), 100, mps=True, sm_util=30)
        nv.fleet.attach_process(uuid, other.pid, 200, mps=True, sm_util=25)
        listed = {p.pid: p.usedGpuMemory >> 20 for p in nv.nvmlDeviceGetComputeRunningProcesses(h)}
        servers = [pid for pid in listed if pid >= MPS_SERVER_PID]
        assert len(servers) == 1 and listed[servers[0]] == MPS_SERVER_MIB
        assert {os.getpid(), other.pid} < set(listed)
        assert {p.pid for p in nv.nvmlDeviceGetMPSComputeRunningProcesses(h)} == {
            os.getpid(),
            other.pid,
        }
        samples = {s.pid: s.smUtil for s in nv.nvmlDeviceGetProcessUtilization(h, 0)}
        assert samples == {servers[0]: 55}
        assert nv.nvmlDeviceGetMemoryInfo(h).used >> 20 == 300 + MPS_SERVER_MIB
        nv.fleet.attach_process(uuid, other.pid, 200, sm_util=25)  # now outside MPS
        samples = {s.pid: s.smUtil for s in nv.nvmlDeviceGetProcessUtilization(h, 0)}
        assert samples == {servers[0]: 30, other.pid: 25}
        nv.fleet.detach_process(os.getpid())  # the last client gone: so is its server
        assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)] == [other.pid]
    finally:
        other.kill()
        other.wait()


def test_a_reporting_process_is_an_mps_client_where_a_daemon_answers_at_its_pipe(
    tmp_path: Path,
) -> None:
    from gpufrac.devices.simfleet import _mps_client

    pipe = tmp_path / "pipe"
    pipe.mkdir()
    assert not _mps_client({"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    (pipe / "control").touch()
    assert _mps_client({"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})


def test_lost_gpu_answers_gpu_is_lost(nv: FakeNvml) -> None:
    uuid = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(1))
    h = nv.nvmlDeviceGetHandleByIndex(1)
    nv.fleet.set_lost(uuid)
    for call in (
        lambda: nv.nvmlDeviceGetHandleByIndex(1),
        lambda: nv.nvmlDeviceGetMemoryInfo(h),
        lambda: nv.nvmlDeviceGetUUID(h),
    ):
        with pytest.raises(NVMLError) as exc:
            call()
        assert code(exc) == fakenvml.NVML_ERROR_GPU_IS_LOST


def test_xid_and_ecc_events(nv: FakeNvml) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(1)
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(
        h, fakenvml.nvmlEventTypeXidCriticalError | fakenvml.nvmlEventTypeDoubleBitEccError, es
    )
    with pytest.raises(NVMLError) as exc:
        nv.nvmlEventSetWait(es, 10)
    assert code(exc) == fakenvml.NVML_ERROR_TIMEOUT
    uuid = nv.nvmlDeviceGetUUID(h)
    nv.fleet.inject_xid(uuid, 79)
    nv.fleet.add_ecc_errors(uuid, 2)
    first = nv.nvmlEventSetWait(es, 100)
    assert (first.eventType, first.eventData) == (fakenvml.nvmlEventTypeXidCriticalError, 79)
    second = nv.nvmlEventSetWait(es, 100)
    assert second.eventType == fakenvml.nvmlEventTypeDoubleBitEccError
    assert nv.nvmlDeviceGetTotalEccErrors(h, 1, 0) == 2
    nv.nvmlEventSetFree(es)


def test_what_is_not_a_small_file_of_its_process_owner_in_the_drop_box_is_no_report(
    nv: FakeNvml,
) -> None:
    """The drop box is writable by every user: a FIFO or a link named after a live pid is
    neither waited on nor followed (either hung or exhausted the agent), nor is a huge file read;
    the process's own small report is read."""
    import json
    import os
    import subprocess
    import sys
    import time

    fleet = nv.fleet
    box = fleet.open_reports()
    env = {**os.environ, "GPUFRAC_GPU_UUID": "GPU-x"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    report = box / f"{child.pid}.json"
    try:
        os.mkfifo(report)
        assert fleet.reported() == []  # at once: a FIFO is not waited on
        report.unlink()
        os.symlink("/dev/zero", report)
        started = time.monotonic()
        assert fleet.reported() == [] and time.monotonic() - started < 2
        report.unlink()
        report.write_text(json.dumps({"mib": 1}) + " " * 10_000)
        assert fleet.reported() == []  # larger than any report
        report.write_text(json.dumps({"mib": 5}))
        assert [(r["pid"], r["gpu"], r["used_mib"]) for r in fleet.reported()] == [
            (child.pid, "GPU-x", 5)
        ]
    finally:
        child.kill()
        child.wait()
        report.unlink(missing_ok=True)
