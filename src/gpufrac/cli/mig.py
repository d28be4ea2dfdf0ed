"""``gpufrac mig``: MIG profiles, layout checks (and, with the planner, plans and changes)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from gpufrac.cli.common import JsonOpt, console, handled_errors, print_json
from gpufrac.model.catalog import GpuModel, lookup_model
from gpufrac.model.mig import check_layout, format_layout, parse_layout

mig_app = typer.Typer(help="MIG profiles, layouts, plans and changes.", no_args_is_help=True)

GpuModelOpt = Annotated[
    str,
    typer.Option(
        "--gpu",
        help="GPU model: h200, h100, h100-nvl, h100-96gb, gh200, a100-80gb, a100-40gb, a30, "
        "b200, or a catalog key.",
    ),
]


@mig_app.command("profiles")
def profiles_command(gpu: GpuModelOpt, json: JsonOpt = False) -> None:
    """List a GPU model's MIG profiles: slices, memory, SMs, placements."""
    with handled_errors():
        model = _model(gpu)
    if json:
        # each profile says whether its values were read from a driver and whether the entry is
        # verified
        flags = {"from_driver": model.from_driver, "verified": model.verified}
        print_json([{**p.to_json(), **flags} for p in model.profiles])
        return
    console.print(profiles_table(model))
    if not model.from_driver:
        console.print(f"[yellow]source:[/] {model.source}", highlight=False)


def profiles_table(model: GpuModel) -> Table:
    t = Table(
        title=f"{model.key}: {model.compute_slices} compute slices, {model.memory_slots} memory "
        f"slots, {model.memory_total_mib:,} MiB"
    )
    for col in ("profile", "id", "compute", "memory slots", "max", "starts", "memory MiB", "SMs"):
        t.add_column(col, overflow="fold")
    for p in model.profiles:
        t.add_row(
            p.name,
            str(p.profile_id),
            str(p.compute_slices),
            str(p.memory_slots),
            str(p.max_instances),
            ",".join(map(str, p.placement_starts)),
            "unknown" if p.memory_mib is None else f"{p.memory_mib:,}",
            "unknown" if p.sm_count is None else str(p.sm_count),
        )
    return t


@mig_app.command("check")
def check_command(
    gpu: GpuModelOpt,
    layout: Annotated[
        str,
        typer.Option(
            "--layout", help="Instances as PROFILE@START,... e.g. 3g.71gb@0,2g.35gb@4,1g.18gb@6"
        ),
    ],
    json: JsonOpt = False,
) -> None:
    """Check a MIG layout against a GPU model. Exit 0 valid, 1 invalid, 2 bad input."""
    with handled_errors():
        model = _model(gpu)
        placements = parse_layout(layout)
    problems = check_layout(model, placements)
    if json:
        print_json(
            {
                "model": model.key,
                "layout": [p.to_json() for p in placements],
                "valid": not problems,
                "problems": [p.to_json() for p in problems],
            }
        )
    elif problems:
        console.print(
            f"[bold red]invalid[/] on {model.key}: {format_layout(placements)}", highlight=False
        )
        for p in problems:
            console.print(f"  - [red]{p.rule}[/]: {p.message}", highlight=False)
    else:
        console.print(
            f"[bold green]valid[/] on {model.key}: {format_layout(placements) or '(empty)'}",
            highlight=False,
        )
    raise typer.Exit(1 if problems else 0)


def _model(name: str) -> GpuModel:
    from gpufrac.errors import InputError

    try:
        return lookup_model(name)
    except InputError as e:
        raise e.at("--gpu") from None


def _register() -> None:
    from gpufrac.cli.mig_apply import (
        assert_command,
        disable_command,
        enable_command,
        export_command,
        mig_apply_command,
        release_command,
    )
    from gpufrac.cli.mig_plan import plan_command

    mig_app.command("plan")(plan_command)
    mig_app.command("apply")(mig_apply_command)
    mig_app.command("assert")(assert_command)
    mig_app.command("export")(export_command)
    mig_app.command("enable")(enable_command)
    mig_app.command("disable")(disable_command)
    mig_app.command("release")(release_command)


_register()
