"""``gpufrac mig plan``: target layouts from demand, for a fleet on paper or the live GPUs."""

from __future__ import annotations

import json as jsonlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpufrac.cli.common import (
    DataDirOpt,
    JsonOpt,
    SimulateOpt,
    console,
    devices,
    err_console,
    handled_errors,
    print_json,
)
from gpufrac.errors import InputError
from gpufrac.model.catalog import GpuModel, lookup_model
from gpufrac.model.gpu import GpuState, MigInstanceState
from gpufrac.model.mig import format_layout, layout_from_json
from gpufrac.model.numbers import digits_note, is_digits, read_decimal

if TYPE_CHECKING:  # the planner is imported by the commands that use it
    from gpufrac.model.migplan import MigPlan
    from gpufrac.planning.demand import DemandClass
    from gpufrac.planning.mig_planner import PlanGpu

DrainOpt = Annotated[bool, typer.Option("--drain", help="Allow destroying busy MIG instances.")]
ModeOpt = Annotated[
    bool,
    typer.Option("--allow-mode-change", help="Allow enabling/disabling MIG mode on idle GPUs."),
]


def plan_command(
    demand: Annotated[
        str | None,
        typer.Option(
            "--demand",
            help="Instances by profile: 1g.18gb=5,3g.71gb=2 (MODEL:PROFILE=N to pin a model).",
        ),
    ] = None,
    need: Annotated[
        str | None,
        typer.Option(
            "--need",
            help="Instances by need: 20GiB=6,60GiB/3c=2 (smallest fitting profile per GPU model).",
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus", help="Plan for GPUs on paper: MODEL[:COUNT],... e.g. h200:4,a100-80gb:2."
        ),
    ] = None,
    current: Annotated[
        Path | None,
        typer.Option(
            "--current",
            help="Current state: a file from `gpufrac gpus --json` (default: the live GPUs).",
        ),
    ] = None,
    cost: Annotated[
        str | None,
        typer.Option(
            "--cost",
            help="Cost of one GPU per model, e.g. h200=3,a100-80gb=1 (default: its memory).",
        ),
    ] = None,
    drain: DrainOpt = False,
    allow_mode_change: ModeOpt = False,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Also write the plan (JSON) here, for `gpufrac mig apply --plan`.",
        ),
    ] = None,
    simulate: SimulateOpt = None,
    data_dir: DataDirOpt = None,
    json: JsonOpt = False,
) -> None:
    """Plan MIG layouts from demand: where each instance goes, and the actions to get there."""
    from gpufrac.planning.demand import parse_need_demand, parse_profile_demand, resolve_demand
    from gpufrac.planning.mig_planner import PlanOptions, plan_mig

    with handled_errors():
        if demand is None and need is None:
            raise InputError(
                "nothing to plan",
                field="--demand",
                fix="give --demand 1g.18gb=5,... and/or --need 20GiB=6,...",
            )
        classes: list[DemandClass] = []
        if demand is not None:
            classes += parse_profile_demand(demand)
        if need is not None:
            classes += parse_need_demand(need)
        for c in classes:
            if c.warning is not None:
                err_console.print(f"[yellow]warning[/]: {c.warning}", highlight=False)
        fleet = _fleet(gpus, current, simulate, data_dir)
        models = list({g.model.key: g.model for g in fleet}.values())
        resolved = resolve_demand(
            classes, models, field="--demand" if demand is not None else "--need"
        )
        opts = PlanOptions(
            cost=_costs(cost, models), drain=drain, allow_mode_change=allow_mode_change
        )
        plan = plan_mig(fleet, resolved, opts)
    if output is not None:
        output.write_text(jsonlib.dumps(plan.to_json(), indent=2) + "\n")
    if json:
        print_json(plan.to_json())
    else:
        render_plan(plan)
        if output is not None:
            console.print(
                f"plan written to {output}; apply it with: gpufrac mig apply --plan {output}",
                highlight=False,
            )
    raise typer.Exit(1 if plan.unplaced else 0)


def _fleet(
    spec: str | None, current: Path | None, simulate: str | None, data: Path | None
) -> list[PlanGpu]:
    if spec is not None and current is not None:
        raise InputError("give --gpus or --current, not both", field="--gpus")
    if spec is not None:
        return _paper_fleet(spec)
    if current is not None:
        try:
            raw = jsonlib.loads(current.read_text())
        except (OSError, ValueError) as e:
            raise InputError(
                f"cannot read {current}: {e}",
                field="--current",
                fix="pass the output of gpufrac gpus --json",
            ) from None
        return fleet_from_json(raw, field="--current")
    with devices(simulate, data) as dev:
        return [plan_gpu(g, dev.model(g.uuid)) for g in dev.gpus() if g.health == "ok" and g.model]


def _paper_fleet(spec: str) -> list[PlanGpu]:
    from gpufrac.devices.simfleet import simulated_gpu_uuid
    from gpufrac.planning.mig_planner import PlanGpu

    fleet: list[PlanGpu] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, count = part.partition(":")
        if count and (not is_digits(count) or int(count) < 1):  # ASCII: '١'.isdigit() too
            raise InputError(
                f"count {count!r} in {part!r} is not a positive number{digits_note(count)}",
                field="--gpus",
                fix="MODEL[:COUNT]",
            )
        try:
            model = lookup_model(name)
        except InputError as e:
            raise e.at("--gpus") from None
        for _ in range(int(count or 1)):
            fleet.append(PlanGpu(simulated_gpu_uuid(model.key, len(fleet)), len(fleet), model))
    if not fleet:
        raise InputError("no GPUs given", field="--gpus", fix="MODEL[:COUNT],... e.g. h200:4")
    return fleet


def plan_gpu(g: GpuState, model: GpuModel) -> PlanGpu:
    from gpufrac.planning.mig_planner import PlanGpu

    return PlanGpu(
        uuid=g.uuid,
        index=g.index,
        model=model,
        instances=g.instances,
        mig_enabled=g.mig_enabled,
        idle=not any(p.gi_id is None for p in g.processes),
        healthy=g.health == "ok",
    )


def fleet_from_json(raw: Any, *, field: str) -> list[PlanGpu]:
    """PlanGpus from ``gpufrac gpus --json`` output."""
    from gpufrac.planning.mig_planner import PlanGpu

    if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), list):
        raise InputError(
            "must be an object with a 'gpus' list",
            field=field,
            fix="pass the output of gpufrac gpus --json",
        )
    fleet = []
    for i, g in enumerate(raw["gpus"]):
        where = f"{field}.gpus[{i}]"
        if not isinstance(g, dict) or not isinstance(g.get("uuid"), str):
            raise InputError("needs a 'uuid' string", field=where)
        if g.get("health", "ok") != "ok" or g.get("model") is None:
            continue  # a lost GPU, or one without MIG geometry: nothing to plan on it
        if not isinstance(g.get("model"), str):
            raise InputError("'model' must be a GPU model name", field=f"{where}.model")
        try:
            model = lookup_model(g["model"])
        except InputError as e:
            raise e.at(f"{where}.model") from None
        busy = {
            (x.get("profile"), x.get("start")): x
            for x in g.get("instances", [])
            if isinstance(x, dict)
        }
        insts = []
        for pl in layout_from_json(g.get("instances", []), field=f"{where}.instances"):
            x = busy[(pl.profile, pl.start)]
            insts.append(
                MigInstanceState(
                    pl.profile,
                    pl.start,
                    int(x.get("gi_id") or 0),
                    x.get("uuid"),
                    bool(x.get("busy")),
                    ci_ids=tuple(x.get("ci_ids") or (0,)),
                )
            )
        mode = g.get("mig_mode", {}) if isinstance(g.get("mig_mode"), dict) else {}
        procs = g.get("processes", []) if isinstance(g.get("processes"), list) else []
        fleet.append(
            PlanGpu(
                uuid=g["uuid"],
                index=int(g.get("index", i)),
                model=model,
                instances=tuple(insts),
                mig_enabled=mode.get("current", "enabled") == "enabled",
                idle=not any(isinstance(p, dict) and p.get("gi_id") is None for p in procs),
                healthy=g.get("health", "ok") == "ok",
            )
        )
    return fleet


def _costs(text: str | None, models: list[GpuModel]) -> dict[str, float] | None:
    if not text:
        return None
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        try:
            key = lookup_model(name).key
        except InputError as e:
            raise e.at("--cost") from None
        number = (
            float(read_decimal(value, field="--cost", what="a cost", fix="MODEL=NUMBER,..."))
            if sep
            else 0.0
        )
        if number <= 0:
            raise InputError(
                f"{part!r} needs a positive cost", field="--cost", fix="MODEL=NUMBER,..."
            )
        out[key] = number
    missing = [m.key for m in models if m.key not in out]
    if missing:
        raise InputError(
            f"no cost for {', '.join(missing)}",
            field="--cost",
            fix="give a cost for every GPU model in the fleet",
        )
    return out


def render_plan(plan: MigPlan) -> None:
    from rich.table import Table

    t = Table(title="MIG plan", title_justify="left")
    for col in ("GPU", "model", "layout", "kept", "created", "destroyed"):
        t.add_column(col, overflow="fold")
    for g in plan.gpus:
        if not (g.instances or g.destroyed):
            continue
        t.add_row(
            str(g.index),
            g.model,
            format_layout(g.instances) or "(empty)",
            str(len(g.kept)),
            str(len(g.created)),
            str(len(g.destroyed)),
        )
    console.print(t)
    s = plan.summary
    per_model = ", ".join(f"{k} {v}" for k, v in s["gpus_used_by_model"].items()) or "none"
    console.print(
        f"GPUs used: {s['gpus_used']} ({per_model}); instances {s['instances']}: "
        f"{s['kept']} kept, {s['created']} to create, {s['destroyed']} to destroy "
        f"({s['busy_destroyed']} busy); {len(plan.actions)} actions",
        highlight=False,
    )
    for u in plan.unplaced:
        console.print(f"[red]unplaced[/] {u.label} x{u.count}: {u.reason}", highlight=False)
