"""A MIG plan: the target layout per GPU, the ordered actions that reach it, and what could not be
placed.

The JSON shape reuses ``gpufrac gpus --json``: ``gpus`` is a list with ``uuid``, ``index``,
``model`` and ``instances`` (``{"profile", "start"}`` each), plus ``unplaced``, ``actions`` and
``summary``. See docs/json.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, assert_never, get_args

from gpufrac.errors import InputError
from gpufrac.model.catalog import GpuModel
from gpufrac.model.gpu import MigInstanceState
from gpufrac.model.mig import MigPlacement, layout_from_json

MigActionKind = Literal[
    "enable_mig", "destroy_ci", "destroy_gi", "create_gi", "create_ci", "disable_mig"
]
ACTION_KINDS: tuple[MigActionKind, ...] = get_args(MigActionKind)


@dataclass(frozen=True, slots=True)
class MigAction:
    """One step. GPU and instance identity: ``gpu_uuid`` plus (``profile``, ``start``)."""

    kind: MigActionKind
    gpu_uuid: str
    gpu_index: int
    profile: str | None = None
    start: int | None = None
    profile_id: int | None = None
    gi_id: int | None = None  # for destroy actions: the instance as read when planning
    ci_id: int | None = None

    def nvidia_smi(self) -> str:
        """The equivalent nvidia-smi command."""
        i = self.gpu_index
        match self.kind:
            case "enable_mig":
                return f"nvidia-smi -i {i} -mig 1"
            case "disable_mig":
                return f"nvidia-smi -i {i} -mig 0"
            case "destroy_ci":
                return f"nvidia-smi mig -i {i} -gi {self.gi_id} -ci {self.ci_id} -dci"
            case "destroy_gi":
                return f"nvidia-smi mig -i {i} -gi {self.gi_id} -dgi"
            case "create_gi":
                return f"nvidia-smi mig -i {i} -cgi {self.profile_id}:{self.start} -C"
            case "create_ci":
                if self.gi_id is None:
                    return "# made by -C above"
                return (
                    f"nvidia-smi mig -i {i} -gi {self.gi_id} -cci  # the compute instance "
                    "filling it"
                )
            case _:
                assert_never(self.kind)

    def describe(self) -> str:
        where = f"GPU {self.gpu_index}"
        what = f"{self.profile}@{self.start}"
        match self.kind:
            case "enable_mig" | "disable_mig":
                return f"{where}: {self.kind.split('_')[0]} MIG mode"
            case "destroy_ci":
                return f"{where}: destroy compute instance {self.ci_id} of {what} (GI {self.gi_id})"
            case "destroy_gi":
                return f"{where}: destroy GPU instance {what} (GI {self.gi_id})"
            case "create_gi":
                return f"{where}: create GPU instance {what}"
            case "create_ci":
                return f"{where}: create compute instance in {what}"
            case _:
                assert_never(self.kind)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "gpu_uuid": self.gpu_uuid,
            "gpu_index": self.gpu_index,
            "profile": self.profile,
            "start": self.start,
            "profile_id": self.profile_id,
            "gi_id": self.gi_id,
            "ci_id": self.ci_id,
            "nvidia_smi": self.nvidia_smi(),
        }


def actions_between(
    uuid: str,
    index: int,
    model: GpuModel,
    instances: tuple[MigInstanceState, ...],
    mig_enabled: bool,
    target: tuple[MigPlacement, ...],
    target_enabled: bool = True,
) -> list[MigAction]:
    """The ordered actions from a GPU as it is to a target: mode on, destroys, creates, mode off.

    An instance is identified by (profile, start). One left without a compute instance (an apply
    killed between the two creates) gets its compute instance if wanted, and is destroyed if not.
    """

    def act(
        kind: MigActionKind,
        pl: MigPlacement | MigInstanceState,
        gi: int | None = None,
        ci: int | None = None,
    ) -> MigAction:
        pid = model.profile(pl.profile).profile_id if model.has_profile(pl.profile) else None
        return MigAction(kind, uuid, index, pl.profile, pl.start, pid, gi, ci)

    wanted = set(target) if target_enabled else set()
    out: list[MigAction] = []
    if target_enabled and not mig_enabled:
        out.append(MigAction("enable_mig", uuid, index))
    for inst in instances:
        if inst.placement in wanted:
            if not inst.ci_ids:
                out.append(act("create_ci", inst, inst.gi_id))
            continue
        out += [act("destroy_ci", inst, inst.gi_id, ci) for ci in inst.ci_ids]
        out.append(act("destroy_gi", inst, inst.gi_id))
    have = {i.placement for i in instances}
    for pl in sorted(wanted - have):
        out += [act("create_gi", pl), act("create_ci", pl)]
    if not target_enabled and mig_enabled:
        out.append(MigAction("disable_mig", uuid, index))
    return out


@dataclass(frozen=True, slots=True)
class PlannedGpu:
    uuid: str
    index: int
    model: str
    instances: tuple[MigPlacement, ...]
    mig_enabled: bool = True
    kept: tuple[MigPlacement, ...] = ()
    created: tuple[MigPlacement, ...] = ()
    destroyed: tuple[MigPlacement, ...] = ()
    busy_kept: tuple[MigPlacement, ...] = ()  # busy instances kept though not asked for

    def to_json(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "index": self.index,
            "model": self.model,
            "mig_enabled": self.mig_enabled,
            "instances": [p.to_json() for p in self.instances],
            "kept": [str(p) for p in self.kept],
            "created": [str(p) for p in self.created],
            "destroyed": [str(p) for p in self.destroyed],
            "busy_kept": [str(p) for p in self.busy_kept],
        }


@dataclass(frozen=True, slots=True)
class Unplaced:
    label: str
    count: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"demand": self.label, "count": self.count, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class MigPlan:
    gpus: tuple[PlannedGpu, ...]
    actions: tuple[MigAction, ...]
    unplaced: tuple[Unplaced, ...] = ()
    summary: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": [g.to_json() for g in self.gpus],
            "unplaced": [u.to_json() for u in self.unplaced],
            "actions": [a.to_json() for a in self.actions],
            "summary": self.summary,
        }


def targets_from_json(
    raw: Any, *, field: str = "plan"
) -> list[tuple[str, int, bool, tuple[MigPlacement, ...]]]:
    """(uuid, index, mig_enabled, target layout) per GPU from a plan file (or ``gpufrac gpus
    --json``)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), list):
        raise InputError(
            "must be an object with a 'gpus' list",
            field=field,
            fix="pass the output of gpufrac mig plan --json",
        )
    out = []
    for i, g in enumerate(raw["gpus"]):
        where = f"{field}.gpus[{i}]"
        if not isinstance(g, dict) or not isinstance(g.get("uuid"), str):
            raise InputError("needs a 'uuid' string", field=where)
        index = g.get("index", i)
        if not isinstance(index, int):
            raise InputError("'index' must be a number", field=f"{where}.index")
        enabled = g.get("mig_enabled", True)
        if "mig_mode" in g and isinstance(g["mig_mode"], dict):
            enabled = g["mig_mode"].get("current") == "enabled"
        out.append(
            (
                g["uuid"],
                index,
                bool(enabled),
                layout_from_json(g.get("instances", []), field=f"{where}.instances"),
            )
        )
    return out
