"""The DCGM families of ``/metrics`` from GPU states as the device layer reads them: a reading
there is a series with DCGM's labels, a reading the device cannot give has none (never a 0)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufrac.model.gpu import (
    MIG_DISABLED,
    MIG_ENABLED,
    GpuReadings,
    GpuState,
    MigInstanceState,
)
from gpufrac.runtime.metrics import gpu_families
from tests.prom import samples, value


def gpu(
    index: int, *, readings: GpuReadings, instances: tuple[MigInstanceState, ...] = ()
) -> GpuState:
    return GpuState(
        uuid=f"GPU-{index}",
        index=index,
        name="NVIDIA H200",
        model="H200-141GB",
        pci_device_id="0x233510DE",
        memory_total_mib=143771,
        memory_used_mib=0,
        utilization_gpu=None if instances else 0,
        mig_current=MIG_ENABLED if instances else MIG_DISABLED,
        mig_pending=MIG_ENABLED if instances else MIG_DISABLED,
        instances=instances,
        readings=readings,
    )


def scrape(gpus: list[GpuState]) -> str:
    class Gpus(Collector):
        def collect(self) -> Iterator[Metric]:
            return gpu_families(gpus, "node-a", "550.54")

    registry = CollectorRegistry()
    registry.register(Gpus())
    return generate_latest(registry).decode()


def test_tensor_pipe_activity_per_gpu_and_per_mig_instance_where_gpm_gives_it() -> None:
    busy = MigInstanceState("1g.18gb", 0, 9, "MIG-a", True, tensor_active=0.35)
    first = MigInstanceState("1g.18gb", 1, 10, "MIG-b", False)  # a first sample: no rate yet
    text = scrape(
        [
            gpu(0, readings=GpuReadings(tensor_active=0.05), instances=(busy, first)),
            gpu(1, readings=GpuReadings(tensor_active=0.8)),
            gpu(2, readings=GpuReadings()),  # before Hopper: no GPM
        ]
    )
    name = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
    assert value(text, name, UUID="GPU-1") == 0.8
    assert value(text, name, UUID="GPU-0", GPU_I_ID="9") == 0.35
    ((labels, whole),) = [
        (la, v) for la, v in samples(text, name, UUID="GPU-0") if "GPU_I_ID" not in la
    ]
    assert whole == 0.05
    assert labels == {
        "gpu": "0",
        "UUID": "GPU-0",
        "modelName": "NVIDIA H200",
        "Hostname": "node-a",
        "DCGM_FI_DRIVER_VERSION": "550.54",
    }
    assert samples(text, name, GPU_I_ID="10") == []
    assert samples(text, name, UUID="GPU-2") == []
    # the engine's activity is its own reading, not the tensor pipes'
    assert samples(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE") == []


def test_dram_activity_per_gpu_and_per_mig_instance_where_gpm_gives_it() -> None:
    """DCGM_FI_PROF_DRAM_ACTIVE: what a MIG instance has in place of the memory copy utilization
    (NVML gives no utilization rates in MIG mode)."""
    inst = MigInstanceState("1g.18gb", 0, 9, "MIG-a", True, dram_active=0.2)
    text = scrape(
        [
            gpu(0, readings=GpuReadings(dram_active=0.03), instances=(inst,)),
            gpu(1, readings=GpuReadings(memory_util=40, dram_active=0.4)),
            gpu(2, readings=GpuReadings(memory_util=10)),  # before Hopper: no GPM
        ]
    )
    name = "DCGM_FI_PROF_DRAM_ACTIVE"
    assert value(text, name, UUID="GPU-0", GPU_I_ID="9") == 0.2
    assert [v for la, v in samples(text, name, UUID="GPU-0") if "GPU_I_ID" not in la] == [0.03]
    assert value(text, name, UUID="GPU-1") == 0.4
    assert samples(text, name, UUID="GPU-2") == []
    assert value(text, "DCGM_FI_DEV_MEM_COPY_UTIL", UUID="GPU-2") == 10
