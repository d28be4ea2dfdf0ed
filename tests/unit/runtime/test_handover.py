"""What a workload is handed (``Handover.grant``): its environment, its devices, its mounts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.model.mig import MigPlacement
from gpufrac.model.workload import GpuRequest, WorkloadSpec, handed_env
from gpufrac.planning.sched_decision import Decision
from gpufrac.planning.sched_state import Allocation
from gpufrac.runtime.handover import Handover
from gpufrac.runtime.mps import MpsDaemons, MpsDomain
from gpufrac.runtime.runner import BindMount

SPEC = WorkloadSpec(name="w", gpu=GpuRequest(memory_mib=4096), command=("true",))


@pytest.fixture
def dev(data_dir: Path) -> Iterator[NvmlDevices]:
    yield open_simulated("h200:1:mig,h200:1", data_dir)


def _handover(dev: NvmlDevices, tmp_path: Path) -> Handover:
    arbiter = str(tmp_path / "arbiter" / "arbiter.sock")
    return Handover(dev, MpsDaemons(tmp_path / "mps", enabled=False), arbiter, 100)


def _arbiter(tmp_path: Path) -> BindMount:
    """The arbiter's directory, read-only: every workload may ask it for turns."""
    return BindMount(tmp_path / "arbiter", str(tmp_path / "arbiter"), read_only=True)


def _alloc(mode: str, compute_pct: int | None = None) -> Allocation:
    return Allocation("default/w", "default", 0, 1, mode, 4096, 250, compute_pct)  # type: ignore[arg-type]


def test_a_time_sliced_workload_is_handed_its_gpu_as_env_and_device(
    dev: NvmlDevices, tmp_path: Path
) -> None:
    uuid = dev.gpus()[1].uuid
    grant = _handover(dev, tmp_path).grant(
        SPEC, Decision("default/w", "placed", mode="timeslice", gpus=(uuid,)), [_alloc("timeslice")]
    )
    assert grant.devices == (uuid,)
    assert grant.env["CUDA_VISIBLE_DEVICES"] == grant.env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert grant.env["GPUFRAC_GPU_MEMORY_LIMIT_MIB"] == "4096"
    assert grant.mounts == (_arbiter(tmp_path),)  # no MPS: nothing more
    assert grant.env["GPUFRAC_ARBITER"] == str(tmp_path / "arbiter" / "arbiter.sock")
    assert not grant.host_ipc
    assert not any(k.startswith("CUDA_MPS_") for k in grant.env)


def test_an_mps_workload_is_handed_the_pipe_directory_to_mount(
    dev: NvmlDevices, tmp_path: Path
) -> None:
    uuid = dev.gpus()[1].uuid
    grant = _handover(dev, tmp_path).grant(
        SPEC, Decision("default/w", "placed", mode="mps", gpus=(uuid,)), [_alloc("mps", 30)]
    )
    pipe = tmp_path / "mps" / uuid / "pipe"
    assert grant.mounts == (_arbiter(tmp_path), BindMount(pipe, str(pipe)))
    assert grant.host_ipc  # MPS's shared memory
    assert grant.env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert grant.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert grant.devices == (uuid,)


def test_a_share_of_two_gpus_under_mps_is_handed_its_domains_daemon(tmp_path: Path) -> None:
    """HAMi's nvidia.com/gpu: 2 with gpucores: both GPUs, the pipe of the one daemon serving them
    together, its memory limit on each of its two devices, its thread percentage; its QoS domain
    its first GPU's."""
    two = open_simulated("h200:2", tmp_path / "data")
    uuids = tuple(g.uuid for g in two.gpus())
    allocs = [Allocation("default/w", "default", 0, i, "mps", 4096, 300, 30) for i in range(2)]
    grant = _handover(two, tmp_path).grant(
        SPEC, Decision("default/w", "placed", mode="mps", gpus=uuids), allocs
    )
    pipe = tmp_path / "mps" / MpsDomain(uuids).key / "pipe"
    assert grant.devices == uuids and grant.env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert grant.env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert grant.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M,1=4096M"
    assert grant.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert grant.env["GPUFRAC_QOS_DOMAIN"] == uuids[0]  # the arbiter: its first GPU's domain
    assert grant.mounts[-1] == BindMount(pipe, str(pipe)) and grant.host_ipc


def test_a_mig_workload_is_handed_its_instance_once_it_exists(
    dev: NvmlDevices, tmp_path: Path
) -> None:
    gpu = dev.gpus()[0]
    mig = MigPlacement(0, "1g.18gb")
    decision = Decision("default/w", "placed", mode="mig", gpus=(gpu.uuid,), mig=mig)
    handover = _handover(dev, tmp_path)
    before = handover.grant(SPEC, decision, [_alloc("mig")])
    assert before.devices == () and before.env["CUDA_VISIBLE_DEVICES"] == ""
    inst = dev.create_instance(gpu.uuid, "1g.18gb", 0)
    after = handover.grant(SPEC, decision, [_alloc("mig")])
    assert after.devices == (inst.uuid,) and after.env["CUDA_VISIBLE_DEVICES"] == inst.uuid
    assert after.env["GPUFRAC_GI_ID"] == str(inst.gi_id)


@pytest.mark.parametrize("mode", ["timeslice", "mps", "mig"])
def test_every_variable_handed_over_is_one_a_manifest_may_not_set(
    dev: NvmlDevices, tmp_path: Path, mode: str
) -> None:
    gpu = dev.gpus()[0 if mode == "mig" else 1]
    mig = MigPlacement(0, "1g.18gb") if mode == "mig" else None
    decision = Decision("default/w", "placed", mode=mode, gpus=(gpu.uuid,), mig=mig)  # type: ignore[arg-type]
    grant = _handover(dev, tmp_path).grant(SPEC, decision, [_alloc(mode, 30)])
    assert grant.env and all(handed_env(k) for k in grant.env), [
        k for k in grant.env if not handed_env(k)
    ]
