"""The ``gpufrac`` command.

Every call imports every command's module (Typer reads their signatures), so those modules import
only what is cheap at their top; each command imports what it uses when it runs (``cli/common.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from gpufrac import __version__
from gpufrac.cli.actions import print_actions
from gpufrac.cli.agent_cmds import (
    agent_command,
    apply_command,
    clear_unknown_command,
    cordon_command,
    delete_command,
    describe_command,
    drain_command,
    get_command,
    logs_command,
    scale_command,
    uncordon_command,
)
from gpufrac.cli.cluster_cmds import control_command, node_command
from gpufrac.cli.common import (
    DataDirOpt,
    SimulateOpt,
    console,
    devices_or_simulated,
    handled_errors,
)
from gpufrac.cli.gpus import gpus_command, render_gpu
from gpufrac.cli.mig import mig_app, profiles_table
from gpufrac.cli.mig_plan import plan_gpu, render_plan
from gpufrac.cli.nodes_cmds import nodes_app
from gpufrac.cli.schedule import schedule_command, validate_command
from gpufrac.cli.schema import schema_command
from gpufrac.cli.serve_cmds import load_command
from gpufrac.cli.top import top_command
from gpufrac.cli.up import up_command
from gpufrac.cli.watch import events_command

if TYPE_CHECKING:
    from gpufrac.devices import NvmlDevices

app = typer.Typer(
    help="gpufrac: share NVIDIA GPUs between AI workloads (MIG, MPS, time-slices).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("gpus")(gpus_command)
app.command("validate")(validate_command)
app.command("agent")(agent_command)
app.command("apply")(apply_command)
app.command("get")(get_command)
app.command("describe")(describe_command)
app.command("delete")(delete_command)
app.command("clear-unknown")(clear_unknown_command)
app.command("logs")(logs_command)
app.command("events")(events_command)
app.command("up")(up_command)
app.command("cordon")(cordon_command)
app.command("uncordon")(uncordon_command)
app.command("drain")(drain_command)
app.command("schedule")(schedule_command)
app.command("scale")(scale_command)
app.command("load")(load_command)
app.command("top")(top_command)
app.command("schema")(schema_command)
app.command("control")(control_command)
app.command("node")(node_command)
app.add_typer(mig_app, name="mig")
app.add_typer(nodes_app, name="nodes")


def _version(value: bool) -> None:
    if value:
        console.print(f"gpufrac {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    pass


DEMO_DEMAND = "1g.18gb=2,2g.35gb=1,3g.71gb=1"


@app.command("demo")
def demo_command(simulate: SimulateOpt = None, data_dir: DataDirOpt = None) -> None:
    """The main job on the embedded default: the GPUs, their MIG profiles, and a MIG plan for a
    demand.

    On the demo's own simulated GPUs the plan is applied; on real GPUs it is only shown (a dry run):
    the demo never changes real hardware.
    """
    with handled_errors():
        dev = devices_or_simulated(simulate, data_dir)
        try:
            _demo(dev)
        finally:
            dev.close()


def _demo(dev: NvmlDevices) -> None:
    from gpufrac.planning.demand import parse_profile_demand, resolve_demand
    from gpufrac.planning.mig_planner import plan_mig
    from gpufrac.runtime.mig_apply import GpuTarget, apply_targets, diff_actions

    states = dev.gpus()
    console.rule("[bold]GPUs")
    for gpu in states:
        console.print(render_gpu(gpu))
    console.rule("[bold]MIG profiles")
    for key in sorted({g.model for g in states if g.model}):
        uuid = next(g.uuid for g in states if g.model == key)
        console.print(profiles_table(dev.model(uuid)))
    fleet = [plan_gpu(g, dev.model(g.uuid)) for g in states if g.health == "ok" and g.model]
    if not any(g.mig_enabled for g in fleet):
        console.print(
            "no GPU has MIG enabled: nothing to plan (gpufrac mig enable --gpu N turns it on)"
        )
        return
    console.rule(f"[bold]MIG plan for {DEMO_DEMAND}")
    models = list({g.model.key: g.model for g in fleet}.values())
    usable = [
        m for m in models if all(m.has_profile(p.split("=")[0]) for p in DEMO_DEMAND.split(","))
    ]
    if not usable:
        console.print("the demo demand uses H200 profiles; this machine has none")
        return
    plan = plan_mig(fleet, resolve_demand(parse_profile_demand(DEMO_DEMAND), usable))
    render_plan(plan)
    targets = [GpuTarget(g.uuid, g.mig_enabled, g.instances) for g in plan.gpus if g.mig_enabled]
    if not dev.simulated:
        print_actions(diff_actions(dev, targets), dry=True, commands=True)
        console.print(
            "real GPUs: shown only; apply with gpufrac mig plan ... -o plan.json and "
            "gpufrac mig apply --plan plan.json"
        )
        return
    done = apply_targets(dev, targets)
    console.print(
        f"applied to the simulated GPUs: {len(done)} action(s)"
        if done
        else "the simulated GPUs already match the plan"
    )
    console.rule("[bold]After")
    for gpu in dev.gpus():
        if gpu.mig_enabled:
            console.print(render_gpu(gpu))


def main() -> None:
    app()
