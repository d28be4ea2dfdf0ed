"""gpufrac's CDI spec: nvidia-ctk's device names, written only when it changed."""

from __future__ import annotations

import json
from pathlib import Path

from gpufrac.devices.container_edits import ContainerEdits
from gpufrac.model.gpu import GpuState, MigInstanceState
from gpufrac.runtime.cdi import CdiSpecs, build_spec, device_names


def gpu() -> GpuState:
    inst = MigInstanceState("1g.18gb", 0, 1, "MIG-aaa", False, 16_384, (0,))
    half = MigInstanceState("3g.71gb", 4, 2, None, False, 70_000)  # no compute instance yet
    return GpuState(
        "GPU-123", 0, "NVIDIA H200", "h200", "0x2335", 143_771, 0, 0, "enabled", "enabled",
        (inst, half),
    )  # fmt: skip


def test_names_follow_nvidia_ctk() -> None:
    assert device_names(gpu()) == [("0", None), ("GPU-123", None), ("0:1", 1), ("MIG-aaa", 1)]


def test_spec_holds_each_devices_edits(tmp_path: Path) -> None:
    edits = {
        ("GPU-123", None): ContainerEdits({}, ("/dev/nvidia0",)),
        ("GPU-123", 1): ContainerEdits({"GPUFRAC_DEVICE_UUID": "MIG-aaa"}),
    }
    spec = build_spec("gpufrac.io/gpu", [gpu()], edits, ContainerEdits({}, ("/dev/nvidiactl",)))
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}  # type: ignore[union-attr,index]
    assert by_name["0"] == {"deviceNodes": [{"path": "/dev/nvidia0"}]}
    assert by_name["MIG-aaa"] == {"env": ["GPUFRAC_DEVICE_UUID=MIG-aaa"]}
    assert set(by_name) == {"0", "GPU-123", "0:1", "MIG-aaa"}
    specs = CdiSpecs(tmp_path, "gpufrac.io/gpu")
    assert specs.refresh(spec) and not specs.refresh(spec)
    assert json.loads(specs.path.read_text())["kind"] == "gpufrac.io/gpu"
    assert specs.qualified("MIG-aaa") == "gpufrac.io/gpu=MIG-aaa"
    specs.remove()
    assert not specs.path.exists()
