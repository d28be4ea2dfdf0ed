"""Apply target MIG layouts through the device adapter: checked first, idempotent, resumable.

``apply_targets`` never replays a stored action list. It reads the GPUs, works out the actions from
what is there to what should be (identity of an instance = its profile and start), checks all of
them before touching anything, then carries them out. So applying twice changes nothing the second
time, and an apply killed part-way is finished by running it again: a GPU instance left without its
compute instance is given one (or destroyed, if it is not wanted).

If an action fails part-way, the GPUs touched so far are taken back to the layouts they had (with
new MIG device UUIDs for re-created instances) and the error is raised.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from gpufrac.devices.errors import DeviceError
from gpufrac.devices.nvml import NvmlDevices
from gpufrac.errors import GpufracError, InputError
from gpufrac.model.gpu import GpuState, MigInstanceState
from gpufrac.model.mig import MigPlacement, check_layout, format_layout
from gpufrac.model.migplan import MigAction, actions_between


@dataclass(frozen=True, slots=True)
class GpuTarget:
    """What one GPU should look like: MIG on or off, and its GPU instances."""

    uuid: str
    mig_enabled: bool
    layout: tuple[MigPlacement, ...]


class ApplyRefused(GpufracError):
    """The change is possible but not allowed without a flag (``--drain``,
    ``--allow-mode-change``)."""


def diff_actions(
    dev: NvmlDevices,
    targets: list[GpuTarget],
    *,
    drain: bool = False,
    allow_mode_change: bool = False,
    field: str = "plan",
) -> list[MigAction]:
    """Every action from the GPUs as they are now to ``targets``; raises before any change if not
    allowed."""
    actions: list[MigAction] = []
    refusals: list[str] = []
    seen: set[str] = set()
    for i, t in enumerate(targets):
        where = f"{field}.gpus[{i}]"
        if t.uuid in seen:
            raise InputError(f"GPU {t.uuid} appears twice", field=where)
        seen.add(t.uuid)
        try:
            gpu = dev.gpu(t.uuid)
        except DeviceError as e:
            raise InputError(
                e.message,
                field=f"{where}.uuid",
                fix="gpufrac gpus lists this machine's GPUs",
            ) from None
        if t.layout:
            problems = check_layout(dev.model(t.uuid), t.layout)
            if problems:
                raise InputError(
                    f"layout {format_layout(t.layout)} is not valid on GPU {gpu.index} "
                    f"({gpu.name}): " + "; ".join(p.message for p in problems),
                    field=f"{where}.instances",
                )
        refusals += _refusals(gpu, t, drain=drain, allow_mode_change=allow_mode_change)
        actions += _gpu_actions(dev, gpu, t)
    if refusals:
        raise ApplyRefused("refusing to change the GPUs:\n  - " + "\n  - ".join(refusals))
    return actions


def _refusals(gpu: GpuState, t: GpuTarget, *, drain: bool, allow_mode_change: bool) -> list[str]:
    out = []
    wanted = set(t.layout) if t.mig_enabled else set()
    busy = [i for i in gpu.instances if i.busy and i.placement not in wanted]
    if busy and not drain:
        out.append(
            f"GPU {gpu.index}: would destroy busy instance(s) "
            f"{', '.join(str(i.placement) for i in busy)} "
            f"(stop their processes {', '.join(str(p) for p in _holders(gpu, busy))}, or "
            "pass --drain to "
            "have gpufrac stop them: SIGTERM, then SIGKILL after the grace period)"
        )
    if t.mig_enabled != gpu.mig_enabled and not allow_mode_change:
        verb = "enable" if t.mig_enabled else "disable"
        out.append(
            f"GPU {gpu.index}: would {verb} MIG mode (pass --allow-mode-change; or run "
            f"gpufrac mig {verb} --gpu {gpu.index}: it needs an idle GPU)"
        )
    if t.mig_enabled != gpu.mig_enabled and gpu.processes and not gpu.mig_enabled:
        out.append(
            f"GPU {gpu.index}: MIG mode cannot change while processes use the GPU "
            f"({len(gpu.processes)} running)"
        )
    return out


def _gpu_actions(dev: NvmlDevices, gpu: GpuState, t: GpuTarget) -> list[MigAction]:
    return actions_between(
        gpu.uuid,
        gpu.index,
        dev.model(gpu.uuid),
        gpu.instances,
        gpu.mig_enabled,
        t.layout,
        t.mig_enabled,
    )


def run_action(
    dev: NvmlDevices, action: MigAction, created: dict[tuple[str, int, str], int]
) -> None:
    """Carry out one action. ``created`` maps (GPU, start, profile) to the GI id of instances made
    here."""
    a = action
    match a.kind:
        case "enable_mig" | "disable_mig":
            change = dev.set_mig_mode(a.gpu_uuid, a.kind == "enable_mig")
            if not change.activated:
                raise ApplyRefused(
                    f"GPU {a.gpu_index}: MIG mode change is pending ({change.reason}); "
                    "idle the GPU and run this again"
                )
        case "destroy_ci":
            assert a.gi_id is not None
            dev.destroy_compute_instances(a.gpu_uuid, a.gi_id)
        case "destroy_gi":
            assert a.gi_id is not None
            dev.destroy_gpu_instance(a.gpu_uuid, a.gi_id)
        case "create_gi":
            assert a.profile is not None and a.start is not None
            created[(a.gpu_uuid, a.start, a.profile)] = dev.create_gpu_instance(
                a.gpu_uuid, a.profile, a.start
            )
        case "create_ci":
            assert a.profile is not None and a.start is not None
            gi_id = a.gi_id if a.gi_id is not None else created[(a.gpu_uuid, a.start, a.profile)]
            dev.create_compute_instance(a.gpu_uuid, gi_id)
        case _:
            assert_never(a.kind)


def _holders(gpu: GpuState, instances: list[MigInstanceState]) -> list[int]:
    """The pids of processes running in ``instances``."""
    ids = {i.gi_id for i in instances}
    return sorted(p.pid for p in gpu.processes if p.gi_id in ids)


def drain_instances(
    dev: NvmlDevices, targets: list[GpuTarget], *, grace: float = 30.0
) -> list[int]:
    """Stop the processes holding busy instances the targets do not keep: SIGTERM, then SIGKILL
    after ``grace`` seconds. Returns the pids signalled."""
    pids: list[int] = []
    for t in targets:
        gpu = dev.gpu(t.uuid)
        wanted = set(t.layout) if t.mig_enabled else set()
        pids += _holders(gpu, [i for i in gpu.instances if i.busy and i.placement not in wanted])
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        alive = [p for p in pids if _signal(p, sig)]
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [p for p in alive if _signal(p, 0)]
        if not alive:
            break
    return pids


def _signal(pid: int, sig: int) -> bool:
    """Send ``sig``; False if the process is gone (a zombie counts as gone: it holds no GPU)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[-1].split()[0] == b"Z":
                return False
    except OSError:
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def apply_targets(
    dev: NvmlDevices,
    targets: list[GpuTarget],
    *,
    drain: bool = False,
    allow_mode_change: bool = False,
    on_action: Callable[[MigAction], None] | None = None,
    field: str = "plan",
    drain_grace: float = 30.0,
) -> list[MigAction]:
    """Bring the GPUs to ``targets``; returns the actions carried out (empty when already there).

    With ``drain``, processes in busy instances that must go are stopped first (after every
    check)."""
    actions = diff_actions(
        dev, targets, drain=drain, allow_mode_change=allow_mode_change, field=field
    )
    if not actions:
        return []
    if drain:
        drain_instances(dev, targets, grace=drain_grace)
    before = [
        GpuTarget(g.uuid, g.mig_enabled, g.layout) for g in (dev.gpu(t.uuid) for t in targets)
    ]
    created: dict[tuple[str, int, str], int] = {}
    done: list[MigAction] = []
    try:
        for action in actions:
            run_action(dev, action, created)
            done.append(action)
            if on_action is not None:
                on_action(action)
    except (DeviceError, ApplyRefused) as e:
        touched = {a.gpu_uuid for a in [*done, action]}
        _roll_back(dev, [b for b in before if b.uuid in touched])
        raise ApplyRefused(
            f"{action.describe()} failed: {e}; the GPUs were taken back to their layouts"
        ) from e
    return done


def _roll_back(dev: NvmlDevices, before: list[GpuTarget]) -> None:
    """Best effort: put touched GPUs back as they were (never changing MIG mode back on its own)."""
    for target in before:
        try:
            gpu = dev.gpu(target.uuid)
            restore = GpuTarget(
                target.uuid, gpu.mig_enabled, target.layout if gpu.mig_enabled else ()
            )
            created: dict[tuple[str, int, str], int] = {}
            for action in _gpu_actions(dev, gpu, restore):
                run_action(dev, action, created)
        except (DeviceError, ApplyRefused):
            continue
