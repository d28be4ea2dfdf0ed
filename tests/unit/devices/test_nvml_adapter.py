"""The NVML adapter, run against the fake NVML library beneath it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.devices.errors import (
    DeviceNotFound,
    GpuLost,
    InsufficientResources,
    InUse,
    InvalidArgument,
    NotSupported,
)
from gpufrac.devices.health import DeviceHealth
from gpufrac.devices.simfleet import SimulatedFleet, parse_simulate_spec
from gpufrac.errors import InputError
from gpufrac.model.catalog import catalog


def test_reads_the_demo_fleet(sim: NvmlDevices) -> None:
    gpus = sim.gpus()
    assert [(g.index, g.model, g.mig_current, g.simulated) for g in gpus] == [
        (0, "H200-141GB", "enabled", True),
        (1, "H200-141GB", "disabled", True),
    ]
    assert all(g.uuid.startswith("GPU-") for g in gpus)
    assert gpus[0].pci_device_id == "0x233510DE"
    assert gpus[0].memory_total_mib == 143771
    assert gpus[0].utilization_gpu is None  # not reported on a MIG-enabled GPU, never zero
    assert gpus[1].utilization_gpu == 0


def test_uuids_are_stable_and_state_is_shared_between_commands(data_dir: Path) -> None:
    first = open_simulated("h200:1:mig,h200:1", data_dir)
    uuid = first.gpus()[0].uuid
    first.create_instance(uuid, "3g.71gb", 4)
    first.close()
    second = open_simulated("h200:1:mig,h200:1", data_dir)  # a separate command
    assert second.gpus()[0].uuid == uuid
    assert [str(p) for p in second.gpus()[0].layout] == ["3g.71gb@4"]
    other_dir = open_simulated("h200:1:mig,h200:1", data_dir / "elsewhere")
    assert other_dir.gpus()[0].uuid == uuid  # stable UUIDs, not tied to one state file
    assert other_dir.gpus()[0].instances == ()


@pytest.mark.parametrize(
    "key", [k for k, m in catalog().items() if all(p.memory_mib for p in m.profiles)]
)
def test_driver_table_of_a_simulated_gpu_matches_the_catalog(key: str, data_dir: Path) -> None:
    dev = open_simulated(f"{key}:1", data_dir)
    uuid = dev.gpus()[0].uuid
    assert dev.catalog_differences(uuid) == []
    assert dev.model(uuid).profiles == catalog()[key].profiles


def test_create_and_destroy_instances(sim: NvmlDevices) -> None:
    uuid = sim.gpus()[0].uuid
    a = sim.create_instance(uuid, "3g.71gb", 0)
    b = sim.create_instance(uuid, "2g.35gb", 4)
    c = sim.create_instance(uuid, "1g.18gb", 6)
    assert [str(p) for p in sim.gpu(uuid).layout] == ["3g.71gb@0", "2g.35gb@4", "1g.18gb@6"]
    assert len({a.uuid, b.uuid, c.uuid}) == 3 and all(
        i.uuid and i.uuid.startswith("MIG-") for i in (a, b, c)
    )
    assert a.ci_ids == (0,) and a.memory_mib == 71424
    sim.destroy_instance(uuid, b.gi_id)
    assert [str(p) for p in sim.gpu(uuid).layout] == ["3g.71gb@0", "1g.18gb@6"]
    again = sim.create_instance(uuid, "2g.35gb", 4)
    assert again.uuid != b.uuid  # a re-created instance is a new MIG device


def test_an_instance_takes_the_latency_set_once_to_create_and_once_to_destroy(
    sim: NvmlDevices, fleet: SimulatedFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``set_latency`` is the time of a whole instance (its GPU and compute instance): creating
    one sleeps the create time once, destroying it the destroy time once, nothing more."""
    import gpufrac.devices.fakenvml.base as fake_base

    slept: list[float] = []
    monkeypatch.setattr(fake_base.time, "sleep", slept.append)
    fleet.set_latency(create_s=0.3, destroy_s=0.2)
    uuid = sim.gpus()[0].uuid
    made = sim.create_instance(uuid, "1g.18gb", 0)
    assert slept == [0.3]
    sim.destroy_instance(uuid, made.gi_id)
    assert slept == [0.3, 0.2]


def test_every_error_kind_is_translated(sim: NvmlDevices, fleet: SimulatedFleet) -> None:
    mig, plain = (g.uuid for g in sim.gpus())
    with pytest.raises(NotSupported):
        sim.create_instance(plain, "1g.18gb", 0)  # MIG off
    sim.create_instance(mig, "4g.71gb", 0)
    with pytest.raises(InsufficientResources):
        sim.create_instance(mig, "3g.71gb", 0)  # overlap
    with pytest.raises(InvalidArgument):
        sim.create_instance(mig, "3g.71gb", 2)  # a start the profile does not allow
    with pytest.raises(InputError, match="does not exist on H200-141GB"):
        sim.create_instance(mig, "1g.10gb", 4)
    gi = sim.gpu(mig).instances[0].gi_id
    fleet.attach_process(mig, os.getpid(), 1000, gi_id=gi)
    with pytest.raises(InUse):
        sim.destroy_instance(mig, gi)
    assert sim.gpu(mig).instances[0].busy
    with pytest.raises(DeviceNotFound):
        sim.destroy_instance(mig, 42)
    with pytest.raises(DeviceNotFound):
        sim.gpu("GPU-00000000-0000-0000-0000-000000000000")
    fleet.set_lost(plain)
    with pytest.raises(GpuLost):
        sim.gpu(plain)
    assert [g.health for g in sim.gpus()] == ["ok", "lost"]


def test_a_failed_compute_instance_leaves_no_gpu_instance(
    sim: NvmlDevices, monkeypatch: pytest.MonkeyPatch
) -> None:
    uuid = sim.gpus()[0].uuid
    lib = sim.lib

    def refuse(gi: object, profile: int) -> object:
        raise lib.NVMLError(lib.NVML_ERROR_INSUFFICIENT_RESOURCES)

    monkeypatch.setattr(lib, "nvmlGpuInstanceCreateComputeInstance", refuse)
    with pytest.raises(InsufficientResources):
        sim.create_instance(uuid, "3g.71gb", 0)
    monkeypatch.undo()
    assert sim.gpu(uuid).instances == ()


def test_mig_mode_change_pending_while_in_use(sim: NvmlDevices, fleet: SimulatedFleet) -> None:
    plain = sim.gpus()[1].uuid
    fleet.attach_process(plain, os.getpid(), 100)
    change = sim.set_mig_mode(plain, True)
    assert not change.activated and change.pending == "enabled" and change.current == "disabled"
    assert change.reason and "in use" in change.reason
    fleet.detach_process(os.getpid())
    change = sim.set_mig_mode(plain, True)
    assert change.activated and change.current == "enabled"
    assert sim.gpu(plain).mig_enabled


def test_a_real_child_process_is_seen_with_its_memory(
    sim: NvmlDevices, fleet: SimulatedFleet
) -> None:
    plain = sim.gpus()[1].uuid
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        fleet.attach_process(plain, child.pid, 2048, sm_util=30)
        procs = sim.gpu(plain).processes
        assert [(p.pid, p.used_memory_mib) for p in procs] == [(child.pid, 2048)]
        assert sim.gpu(plain).memory_used_mib == 2048
        assert DeviceHealth(sim).process_utilization(plain) == {child.pid: 30}
        assert (
            DeviceHealth(sim).process_utilization(sim.gpus()[0].uuid) is None
        )  # MIG: not reported
    finally:
        child.kill()
        child.wait()
    assert sim.gpu(plain).processes == ()


def test_mps_clients_and_their_server_are_marked_and_the_servers_use_is_theirs_when_alone(
    sim: NvmlDevices, fleet: SimulatedFleet
) -> None:
    """The adapter marks NVML's MPS clients and the process NVML names nvidia-cuda-mps-server;
    the server's sample (its clients' use summed) is a workload's own only where every client on
    the GPU is that workload's."""
    plain = sim.gpus()[1].uuid
    kids = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(3)
    ]
    a, b, outside = (k.pid for k in kids)
    try:
        fleet.attach_process(plain, a, 1000, mps=True, sm_util=30)
        fleet.attach_process(plain, outside, 500, sm_util=20)  # not an MPS client
        g = sim.gpu(plain)
        roles = {p.pid: p.mps for p in g.processes}
        server = next(pid for pid, role in roles.items() if role == "server")
        assert roles == {a: "client", outside: None, server: "server"}
        by_pid = DeviceHealth(sim).process_utilization(plain)
        assert by_pid == {server: 30, outside: 20}
        trusted = frozenset({server})  # as the control daemon lists it
        assert g.mps_sm_of({a}, by_pid, trusted) == 30
        assert g.mps_sm_of({a}, by_pid, frozenset()) is None  # a server no daemon of ours lists
        assert g.mps_sm_of({outside}, by_pid, trusted) is None  # not a client
        fleet.attach_process(plain, b, 1000, mps=True, sm_util=25)
        g, by_pid = sim.gpu(plain), DeviceHealth(sim).process_utilization(plain) or {}
        assert by_pid[server] == 55
        assert g.mps_sm_of({a}, by_pid, trusted) is None  # b shares it: neither's own use
        assert g.mps_sm_of({a, b}, by_pid, trusted) == 55  # one workload's two processes
        assert g.to_json()["processes"][0]["mps"] in ("client", "server", None)
    finally:
        for k in kids:
            k.kill()
            k.wait()
    assert sim.gpu(plain).processes == ()


def test_events_through_the_adapter(sim: NvmlDevices, fleet: SimulatedFleet) -> None:
    plain = sim.gpus()[1].uuid
    health = DeviceHealth(sim)
    assert health.wait_event(10) is None
    fleet.inject_xid(plain, 48)
    event = health.wait_event(500)
    assert event is not None and (event.gpu_uuid, event.kind, event.data) == (plain, "xid", 48)
    fleet.add_ecc_errors(plain, 1)
    event = health.wait_event(500)
    assert event is not None and event.kind == "ecc_double_bit"
    assert health.ecc_uncorrected(plain) == 1


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "no GPUs"),
        ("h200:0", "neither a count"),
        ("h200:two", "neither a count"),
        ("a100", "ambiguous"),
        ("b200", "cannot be simulated"),
        ("h200,,a30", "empty entry"),
    ],
)
def test_bad_simulate_specs(spec: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment) as exc:
        parse_simulate_spec(spec)
    assert exc.value.field == "--simulate"


def test_simulate_spec_forms() -> None:
    specs = parse_simulate_spec("h200:2:mig,a30,h100:mig")
    assert [(s.model.key, s.mig) for s in specs] == [
        ("H200-141GB", True),
        ("H200-141GB", True),
        ("A30-24GB", False),
        ("H100-80GB", True),
    ]


def test_the_driver_table_wins_and_differences_are_warned(
    sim: NvmlDevices, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver whose 3g.71gb reports different memory than the catalog: gpufrac uses and shows the
    driver's."""
    lib = sim.lib
    real = lib.nvmlDeviceGetGpuInstanceProfileInfo

    def odd(handle: object, enum: int, version: int = 2) -> object:
        info = real(handle, enum, version)
        if info.id == 9:
            info.memorySizeMB = 70000
        return info

    monkeypatch.setattr(lib, "nvmlDeviceGetGpuInstanceProfileInfo", odd)
    sim._models.clear()
    uuid = sim.gpus()[0].uuid
    assert sim.model(uuid).profile("3g.71gb").memory_mib == 70000
    assert sim.catalog_differences(uuid) == ["3g.71gb.memory_mib: catalog 71424, driver 70000"]
    assert sim.gpu(uuid).warnings == ("3g.71gb.memory_mib: catalog 71424, driver 70000",)


def test_dcgm_readings_are_given_where_nvml_gives_them_and_none_elsewhere(
    sim: NvmlDevices, fleet: SimulatedFleet
) -> None:
    mig, plain = sim.gpus()
    fleet.set_utilization(plain.uuid, 100)
    mig, plain = sim.gpus()
    assert plain.readings.pci_bus_id == "00000000:11:00.0"
    assert plain.readings.minor_number == 1
    assert plain.readings.power_w == 700.0  # a busy H200 at its limit
    assert plain.readings.sm_clock_mhz == 1980
    assert plain.readings.memory_util == 50
    assert plain.readings.temperature_c == 72
    # MIG mode: NVML gives no utilization rates; the GPU's power and clocks it does give
    assert mig.readings.memory_util is None and mig.utilization_gpu is None
    assert mig.readings.power_w == 70.0
    # a MIG device's own handle answers NOT_SUPPORTED for the GPU's readings, as a driver does
    inst = sim.create_instance(mig.uuid, "1g.18gb", 0)
    lib = sim.lib
    handle = lib.nvmlDeviceGetMigDeviceHandleByIndex(sim.handle(mig.uuid), 0)
    assert inst.uuid == lib.nvmlDeviceGetUUID(handle)
    for call in (lib.nvmlDeviceGetPowerUsage, lib.nvmlDeviceGetMinorNumber):
        with pytest.raises(lib.NVMLError) as e:
            call(handle)
        assert e.value.value == lib.NVML_ERROR_NOT_SUPPORTED
        assert sim.reading(call.__name__, handle) is None


def test_gpm_engine_activity_between_two_samples_per_gpu_and_per_mig_instance(
    sim: NvmlDevices, fleet: SimulatedFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    mig, plain = sim.gpus()
    inst = sim.create_instance(mig.uuid, "1g.18gb", 0)
    fleet.attach_process(mig.uuid, os.getpid(), 100, gi_id=inst.gi_id, sm_util=40)
    fleet.set_utilization(plain.uuid, 30)
    first = {g.uuid: g for g in sim.gpus()}
    # a first sample alone gives no rate: no value, never a 0
    assert first[plain.uuid].readings.gr_engine_active is None
    assert first[mig.uuid].instances[0].gr_engine_active is None
    clock[0] += 2
    second = {g.uuid: g for g in sim.gpus()}
    assert second[plain.uuid].readings.gr_engine_active == pytest.approx(0.30)
    assert second[mig.uuid].instances[0].gr_engine_active == pytest.approx(0.40)
    # the whole GPU: its one busy 1-slice instance of 7
    assert second[mig.uuid].readings.gr_engine_active == pytest.approx(0.40 / 7)
    fleet.set_utilization(plain.uuid, 90)
    clock[0] += 0.1  # too soon after the last sample: the last value stands
    assert sim.gpu(plain.uuid).readings.gr_engine_active == pytest.approx(0.30)
    # over the 2 s since the sample kept: 30% until the driver saw 90% (at the sample of 0.1 s,
    # which it counted though the adapter dropped it), then 90%
    clock[0] += 1.9
    assert sim.gpu(plain.uuid).readings.gr_engine_active == pytest.approx(
        (0.1 * 0.3 + 1.9 * 0.9) / 2
    )


def test_gpm_tensor_pipe_activity_per_gpu_and_per_mig_instance(
    sim: NvmlDevices, fleet: SimulatedFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DCGM_FI_PROF_PIPE_TENSOR_ACTIVE's reading: NVML_GPM_METRIC_ANY_TENSOR_UTIL between two
    samples, from the same pair as the engine's activity; none on a first sample."""
    clock = [1000.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    mig, plain = sim.gpus()
    inst = sim.create_instance(mig.uuid, "1g.18gb", 0)
    fleet.attach_process(mig.uuid, os.getpid(), 100, gi_id=inst.gi_id, sm_util=40, tensor_util=35)
    fleet.attach_process(plain.uuid, os.getppid(), 100, sm_util=80, tensor_util=90)
    first = {g.uuid: g for g in sim.gpus()}
    assert first[plain.uuid].readings.tensor_active is None
    assert first[mig.uuid].instances[0].tensor_active is None
    clock[0] += 2
    second = {g.uuid: g for g in sim.gpus()}
    # a process's tensor pipes are busy at most while its SMs are: 90% asked, 80% given
    assert second[plain.uuid].readings.tensor_active == pytest.approx(0.80)
    assert second[mig.uuid].instances[0].tensor_active == pytest.approx(0.35)
    assert second[mig.uuid].readings.tensor_active == pytest.approx(0.35 / 7)
    # the engine's activity comes from the same samples, apart
    assert second[mig.uuid].instances[0].gr_engine_active == pytest.approx(0.40)
    # and the DRAM bandwidth's (the fake: half the engine's, as its utilization rates give)
    assert second[mig.uuid].instances[0].dram_active == pytest.approx(0.20)
    plain_readings = second[plain.uuid].readings
    assert plain_readings.gr_engine_active is not None
    assert plain_readings.dram_active == pytest.approx(plain_readings.gr_engine_active / 2)


def test_a_workload_reports_its_tensor_use_through_the_sdk(
    sim: NvmlDevices, fleet: SimulatedFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    plain = sim.gpus()[1]
    script = (
        "import sys, time; from gpufrac import sdk; sdk.report_gpu_use(100, 60, 25);"
        " print(flush=True); time.sleep(30)"
    )
    env = {**os.environ, **sim.sdk_env, "GPUFRAC_GPU_UUID": plain.uuid}
    child = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"\n"
        sim.gpus()
        clock[0] += 2
        assert sim.gpu(plain.uuid).readings.tensor_active == pytest.approx(0.25)
    finally:
        child.kill()
        child.wait()


def test_a_gpm_metric_the_driver_refuses_is_left_out_the_others_kept(
    sim: NvmlDevices, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    lib = sim.lib
    answer = lib.nvmlGpmMetricsGet

    def no_tensor(asked: Any) -> Any:
        got = answer(asked)
        for i in range(got.numMetrics):
            if got.metrics[i].metricId == lib.NVML_GPM_METRIC_ANY_TENSOR_UTIL:
                got.metrics[i].nvmlReturn = lib.NVML_ERROR_NOT_SUPPORTED
        return got

    monkeypatch.setattr(lib, "nvmlGpmMetricsGet", no_tensor)
    plain = sim.gpus()[1]
    clock[0] += 2
    readings = sim.gpu(plain.uuid).readings
    assert readings.tensor_active is None
    assert readings.gr_engine_active == 0.0


def test_gpm_is_not_read_before_hopper(data_dir: Path) -> None:
    dev = open_simulated("a100-40gb:1", data_dir)
    lib = dev.lib
    handle = dev.handle(dev.gpus()[0].uuid)
    assert lib.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 0
    with pytest.raises(lib.NVMLError) as e:
        lib.nvmlGpmSampleGet(handle, lib.nvmlGpmSampleAlloc())
    assert e.value.value == lib.NVML_ERROR_NOT_SUPPORTED
    dev.gpus()
    readings = dev.gpus()[0].readings
    assert readings.gr_engine_active is None and readings.tensor_active is None
    dev.close()


def test_gpm_metrics_get_checks_its_samples_as_nvml_does(sim: NvmlDevices) -> None:
    lib = sim.lib
    mig, plain = (sim.handle(g.uuid) for g in sim.gpus())
    one, two = lib.nvmlGpmSampleAlloc(), lib.nvmlGpmSampleAlloc()
    asked = lib.c_nvmlGpmMetricsGet_t()
    asked.version, asked.numMetrics = lib.NVML_GPM_METRICS_GET_VERSION, 1
    asked.sample1, asked.sample2 = one, two
    asked.metrics[0].metricId = lib.NVML_GPM_METRIC_GRAPHICS_UTIL
    with pytest.raises(lib.NVMLError):  # samples not taken yet
        lib.nvmlGpmMetricsGet(asked)
    lib.nvmlGpmSampleGet(mig, one)
    lib.nvmlGpmSampleGet(plain, two)
    with pytest.raises(lib.NVMLError) as e:  # two devices' samples
        lib.nvmlGpmMetricsGet(asked)
    assert e.value.value == lib.NVML_ERROR_INVALID_ARGUMENT
    asked.version = 2
    with pytest.raises(lib.NVMLError) as e:
        lib.nvmlGpmMetricsGet(asked)
    assert e.value.value == lib.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    lib.nvmlGpmSampleFree(one)
    with pytest.raises(lib.NVMLError):
        lib.nvmlGpmSampleFree(one)
