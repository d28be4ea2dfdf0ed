"""Snapshots of GPUs as the device layer reads them: frozen values, with the JSON shape later work
reads.

``gpufrac gpus --json`` prints ``{"gpus": [GpuState.to_json(), ...]}``; see docs/json.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gpufrac.model.mig import MigPlacement

MigMode = Literal["enabled", "disabled", "unsupported"]
Health = Literal["ok", "lost"]
MIG_ENABLED: MigMode = "enabled"
MIG_DISABLED: MigMode = "disabled"
MIG_UNSUPPORTED: MigMode = "unsupported"


@dataclass(frozen=True, slots=True)
class ProcessState:
    """A process holding memory on a GPU (or on one MIG instance of it). ``mps``: an MPS client
    (NVML's MPS process list has it) or the MPS server that runs their work (NVML names its
    process ``nvidia-cuda-mps-server``); None outside MPS."""

    pid: int
    used_memory_mib: int | None  # None where the driver does not say
    gi_id: int | None = None
    mps: Literal["client", "server"] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "used_memory_mib": self.used_memory_mib,
            "gi_id": self.gi_id,
            "mps": self.mps,
        }


@dataclass(frozen=True, slots=True)
class MigInstanceState:
    """A GPU instance (with its compute instance) that exists on a GPU."""

    profile: str
    start: int
    gi_id: int
    uuid: str | None  # the MIG device UUID, once a compute instance exists
    busy: bool
    memory_mib: int | None = None
    ci_ids: tuple[int, ...] = ()
    # part of the time its graphics/compute engine was busy (0-1), from NVML's GPM
    # (nvmlGpmMigSampleGet: Hopper and newer); None where the driver cannot say
    gr_engine_active: float | None = None
    # part of the time its tensor pipes were busy (0-1), the same way
    tensor_active: float | None = None
    # part of its device memory's bandwidth used (0-1), the same way
    dram_active: float | None = None

    @property
    def placement(self) -> MigPlacement:
        return MigPlacement(self.start, self.profile)

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "start": self.start,
            "gi_id": self.gi_id,
            "ci_ids": list(self.ci_ids),
            "uuid": self.uuid,
            "busy": self.busy,
            "memory_mib": self.memory_mib,
            "gr_engine_active": self.gr_engine_active,
            "tensor_active": self.tensor_active,
            "dram_active": self.dram_active,
        }


@dataclass(frozen=True, slots=True)
class GpuReadings:
    """A GPU's readings beyond memory and utilization, each None where NVML does not give it."""

    pci_bus_id: str | None = None  # 00000000:17:00.0, as nvidia-smi and DCGM write it
    minor_number: int | None = None  # /dev/nvidiaN
    power_w: float | None = None  # power draw now
    sm_clock_mhz: int | None = None
    memory_util: int | None = None  # % of time device memory was read or written
    temperature_c: int | None = None
    gr_engine_active: float | None = None  # 0-1, GPM (Hopper and newer)
    tensor_active: float | None = None  # 0-1, GPM: any tensor pipe busy
    dram_active: float | None = None  # 0-1, GPM: device memory bandwidth used

    def to_json(self) -> dict[str, Any]:
        return {
            "pci_bus_id": self.pci_bus_id,
            "minor_number": self.minor_number,
            "power_w": self.power_w,
            "sm_clock_mhz": self.sm_clock_mhz,
            "memory_util": self.memory_util,
            "temperature_c": self.temperature_c,
            "gr_engine_active": self.gr_engine_active,
            "tensor_active": self.tensor_active,
            "dram_active": self.dram_active,
        }


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU as read from the driver (or the simulated driver)."""

    uuid: str
    index: int
    name: str  # the product name, exactly as the driver says it
    model: str | None  # catalog key, None for a GPU gpufrac has no MIG geometry for
    pci_device_id: str
    memory_total_mib: int
    memory_used_mib: int
    utilization_gpu: int | None
    mig_current: MigMode
    mig_pending: MigMode
    instances: tuple[MigInstanceState, ...] = ()
    processes: tuple[ProcessState, ...] = ()
    simulated: bool = False
    health: Health = "ok"
    warnings: tuple[str, ...] = field(default=())
    # what else NVML reads of the GPU, each None where the driver does not support it (on a
    # MIG device, or before Hopper for GPM): DCGM's fields of the same meaning in ``/metrics``
    readings: GpuReadings = field(default_factory=lambda: GpuReadings())
    # PCI subsystem device and vendor id, 0xSSSSVVVV (the board maker's); "unknown" where not read
    pci_subsystem_id: str = "unknown"

    def mps_sm_of(
        self, pids: set[int], sm_by_pid: dict[int, int], servers: frozenset[int]
    ) -> int | None:
        """The SM use of the MPS clients ``pids`` on this GPU (outside MIG) where NVML's reading
        is theirs alone: under MPS NVML gives one sample, the MPS server's, with all its clients'
        use summed, so it is theirs only where every MPS client here is one of ``pids``. None
        otherwise (other clients share the server: no one's own share can be read). Only the
        ``servers`` their control daemon lists count: a process named like one proves nothing."""
        clients = {p.pid for p in self.processes if p.mps == "client" and p.gi_id is None}
        servers_here = [
            p.pid
            for p in self.processes
            if p.mps == "server" and p.gi_id is None and p.pid in servers
        ]
        if not clients or not servers_here or not clients <= pids:
            return None
        return min(100, sum(sm_by_pid.get(pid, 0) for pid in servers_here))

    @classmethod
    def lost(cls, index: int, *, simulated: bool = False) -> GpuState:
        """A GPU that fell off the bus: only its index is known."""
        return cls(
            uuid="unknown",
            index=index,
            name="unknown (GPU is lost)",
            model=None,
            pci_device_id="unknown",
            memory_total_mib=0,
            memory_used_mib=0,
            utilization_gpu=None,
            mig_current=MIG_UNSUPPORTED,
            mig_pending=MIG_UNSUPPORTED,
            simulated=simulated,
            health="lost",
        )

    @property
    def mig_enabled(self) -> bool:
        return self.mig_current == MIG_ENABLED

    @property
    def layout(self) -> tuple[MigPlacement, ...]:
        return tuple(sorted(i.placement for i in self.instances))

    def instance_at(self, placement: MigPlacement) -> MigInstanceState | None:
        """The MIG instance at ``placement`` (its profile and start), if it exists."""
        for inst in self.instances:
            if inst.start == placement.start and inst.profile == placement.profile:
                return inst
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "index": self.index,
            "model": self.model,
            "name": self.name,
            "pci_device_id": self.pci_device_id,
            "pci_subsystem_id": self.pci_subsystem_id,
            "memory_total_mib": self.memory_total_mib,
            "memory_used_mib": self.memory_used_mib,
            "utilization_gpu": self.utilization_gpu,
            "mig_mode": {"current": self.mig_current, "pending": self.mig_pending},
            "instances": [i.to_json() for i in self.instances],
            "processes": [p.to_json() for p in self.processes],
            "simulated": self.simulated,
            "health": self.health,
            "warnings": list(self.warnings),
            "readings": self.readings.to_json(),
        }
