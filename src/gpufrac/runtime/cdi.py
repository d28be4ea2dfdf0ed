"""gpufrac's CDI spec: every GPU and MIG instance of this machine as a Container Device Interface
device, so a container engine hands a workload its device the way NVIDIA's Container Toolkit does.

Devices are named as ``nvidia-ctk cdi generate`` names them: ``0`` (a GPU by index), ``0:1`` (MIG
instance 1 of GPU 0, by GPU instance id), ``GPU-<uuid>`` and ``MIG-<uuid>``. Their kind is
gpufrac's own (``gpufrac.io/gpu`` by default, gpufrac.yaml ``containers.cdi_kind``), so the spec
never clashes with ``nvidia.com/gpu`` devices of a spec the Toolkit wrote (two specs naming one
device are refused by the engines). The spec is JSON (which CDI accepts beside YAML) in
``containers.cdi_dir`` (``/etc/cdi``: podman 4.3 reads only there and ``/var/run/cdi``).

What each device holds comes from the device layer (``devices.container_edits``): on a real
driver its device nodes (``/dev/nvidiaN``, the MIG instance's ``/dev/nvidia-caps`` entries) and,
common to all, the control nodes and the driver's libraries; on simulated GPUs the environment and
the simulation's drop box. ``CdiSpecs.refresh`` writes it when it changed (the executor calls it
before every container start, and after every MIG change, so a re-cut is in the spec before the
next start); ``remove`` deletes it (the container runner, once no container of gpufrac is left).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from gpufrac.devices.container_edits import ContainerEdits, container_edits
from gpufrac.devices.nvml import NvmlDevices
from gpufrac.model.gpu import GpuState

CDI_VERSION = "0.5.0"


def device_names(gpu: GpuState) -> list[tuple[str, int | None]]:
    """The CDI names of a GPU and of its MIG instances with a device, each with the GPU
    instance id it stands for (None: the whole GPU)."""
    names: list[tuple[str, int | None]] = [(str(gpu.index), None), (gpu.uuid, None)]
    for inst in gpu.instances:
        if inst.uuid:
            names += [(f"{gpu.index}:{inst.gi_id}", inst.gi_id), (inst.uuid, inst.gi_id)]
    return names


def _edits_json(edits: ContainerEdits) -> dict[str, object]:
    out: dict[str, object] = {}
    if edits.env:
        out["env"] = [f"{k}={v}" for k, v in sorted(edits.env.items())]
    if edits.device_nodes:
        out["deviceNodes"] = [{"path": p} for p in edits.device_nodes]
    if edits.mounts:
        out["mounts"] = [
            {
                "hostPath": src,
                "containerPath": dst,
                "options": ["rbind", "ro" if ro else "rw", "nosuid", "nodev"],
            }
            for src, dst, ro in edits.mounts
        ]
    return out


def build_spec(
    kind: str,
    gpus: Iterable[GpuState],
    edits: Mapping[tuple[str, int | None], ContainerEdits],
    common: ContainerEdits,
) -> dict[str, object]:
    """The spec (pure): ``edits`` by (GPU UUID, GPU instance id or None)."""
    devices: list[dict[str, object]] = []
    for gpu in gpus:
        for name, gi in device_names(gpu):
            device_edits = edits.get((gpu.uuid, gi))
            if device_edits is None:
                continue
            devices.append({"name": name, "containerEdits": _edits_json(device_edits)})
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": devices,
        "containerEdits": _edits_json(common),
    }


def machine_spec(dev: NvmlDevices, kind: str) -> dict[str, object]:
    """The spec of every GPU and MIG device this machine has now (as the device layer reads it:
    after a re-cut, the new instances' names and UUIDs)."""
    gpus = [g for g in dev.gpus() if g.uuid and g.health == "ok"]
    edits, common = container_edits(dev, gpus)
    return build_spec(kind, gpus, edits, common)


def spec_file(directory: Path, kind: str) -> Path:
    """Where the spec of ``kind`` lives (``gpufrac.io/gpu`` -> ``gpufrac.io_gpu.json``)."""
    return directory / (kind.replace("/", "_") + ".json")


class CdiSpecs:
    """gpufrac's CDI spec file for one kind."""

    def __init__(self, directory: Path, kind: str) -> None:
        self.directory = directory
        self.kind = kind
        self.path = spec_file(directory, kind)

    def qualified(self, device: str) -> str:
        """The device's fully qualified name (``gpufrac.io/gpu=MIG-...``)."""
        return f"{self.kind}={device}"

    def refresh(self, spec: Mapping[str, object]) -> bool:
        """Write ``spec`` if the file does not hold it already; True if it was written."""
        text = json.dumps(spec, indent=1, sort_keys=True)
        try:
            if self.path.read_text() == text:
                return False
        except OSError:
            pass
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.path)
        return True

    def exists(self) -> bool:
        return self.path.exists()

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
