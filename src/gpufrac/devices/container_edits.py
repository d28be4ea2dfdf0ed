"""What a container must be given to use a GPU or MIG device of this machine (the content of
gpufrac's CDI spec, ``runtime/cdi.py``): the device layer's answer, since only it knows whether
the GPUs are the driver's or simulated.

* On a real driver: a GPU's device node (``/dev/nvidia<minor>``); a MIG device's GPU node and its
  GPU and compute instance's capability nodes (``/dev/nvidia-caps/nvidia-cap<N>``, ``N`` read from
  ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/ci<C>/access``); common to all: the
  control nodes (``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``) and the
  driver's user-space libraries (``libcuda.so*``, ``libnvidia-ml.so*``, ...) and ``nvidia-smi``,
  bind-mounted read-only where they are.
* On simulated GPUs: each device's UUID in ``GPUFRAC_DEVICE_UUID``; common to all: the SDK's
  environment (``GPUFRAC_GPU_REPORTS``) and the simulation's drop box mounted read-write.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpufrac.devices.nvml import NvmlDevices
from gpufrac.model.gpu import GpuState

CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
DRIVER_LIBRARIES = (
    "libcuda.so*",
    "libnvidia-ml.so*",
    "libnvidia-ptxjitcompiler.so*",
    "libnvidia-nvvm.so*",
    "libcudadebugger.so*",
    "libnvidia-gpucomp.so*",
)
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
DRIVER_PROGRAMS = ("/usr/bin/nvidia-smi",)
CAPABILITIES = Path("/proc/driver/nvidia/capabilities")


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """Environment, device nodes and bind mounts ``(host, container, read_only)``."""

    env: Mapping[str, str] = field(default_factory=dict)
    device_nodes: tuple[str, ...] = ()
    mounts: tuple[tuple[str, str, bool], ...] = ()


def _cap_minor(access: Path) -> int | None:
    try:
        found = re.search(r"DeviceFileMinor:\s*(\d+)", access.read_text())
    except OSError:
        return None
    return None if found is None else int(found.group(1))


def driver_files() -> tuple[tuple[str, str, bool], ...]:
    """The driver's libraries and programs present here, as read-only mounts."""
    files: list[str] = []
    for d in LIBRARY_DIRS:
        for pattern in DRIVER_LIBRARIES:
            files += sorted(glob.glob(f"{d}/{pattern}"))
    files += [p for p in DRIVER_PROGRAMS if Path(p).exists()]
    return tuple((f, f, True) for f in dict.fromkeys(files))


def container_edits(
    dev: NvmlDevices, gpus: Iterable[GpuState]
) -> tuple[dict[tuple[str, int | None], ContainerEdits], ContainerEdits]:
    """Each device's edits, by (GPU UUID, GPU instance id or None for the whole GPU), and those
    common to all."""
    per: dict[tuple[str, int | None], ContainerEdits] = {}
    if dev.simulated:
        for gpu in gpus:
            per[(gpu.uuid, None)] = ContainerEdits({"GPUFRAC_DEVICE_UUID": gpu.uuid})
            for inst in gpu.instances:
                if inst.uuid:
                    per[(gpu.uuid, inst.gi_id)] = ContainerEdits({"GPUFRAC_DEVICE_UUID": inst.uuid})
        reports = dev.sdk_env.get("GPUFRAC_GPU_REPORTS")
        mounts = ((reports, reports, False),) if reports else ()
        return per, ContainerEdits(dict(dev.sdk_env), (), mounts)
    for gpu in gpus:
        minor = gpu.index  # the driver numbers its nodes as NVML indexes them, on one machine
        node = f"/dev/nvidia{minor}"
        per[(gpu.uuid, None)] = ContainerEdits({}, (node,))
        for inst in gpu.instances:
            if not inst.uuid:
                continue
            caps = [node]
            gi_dir = CAPABILITIES / f"gpu{minor}" / "mig" / f"gi{inst.gi_id}"
            for access in [gi_dir / "access"] + [
                gi_dir / f"ci{ci}" / "access" for ci in inst.ci_ids
            ]:
                cap = _cap_minor(access)
                if cap is not None:
                    caps.append(f"/dev/nvidia-caps/nvidia-cap{cap}")
            per[(gpu.uuid, inst.gi_id)] = ContainerEdits({}, tuple(caps))
    nodes = tuple(n for n in CONTROL_NODES if Path(n).exists())
    return per, ContainerEdits({}, nodes, driver_files())
