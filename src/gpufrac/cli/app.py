"""The ``gpufrac`` command."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufrac import __version__
from gpufrac.cli.common import DataDirOpt, SimulateOpt, console, err_console, handled_errors
from gpufrac.cli.gpus import gpus_command, render_gpu
from gpufrac.cli.mig import mig_app, profiles_table
from gpufrac.config import DEMO_FLEET, data_dir, simulate_spec
from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.devices.errors import DriverUnavailable
from gpufrac.devices.nvml import open_real_nvml
from gpufrac.model.catalog import lookup_model

app = typer.Typer(
    help="gpufrac: share NVIDIA GPUs between AI workloads (MIG, MPS, time-slices).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("gpus")(gpus_command)
app.add_typer(mig_app, name="mig")


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


def devices_or_simulated(simulate: str | None, data: DataDirOpt) -> NvmlDevices:
    """The real GPUs, or (for demo and up only) the demo's simulated fleet with a visible notice."""
    spec = simulate_spec(simulate)
    if spec:
        return open_simulated(spec, data_dir(data))
    try:
        return open_real_nvml()
    except DriverUnavailable as e:
        err_console.print(
            f"[bold yellow]notice:[/] {e.message}; using simulated GPUs ({DEMO_FLEET}).",
            highlight=False,
        )
        return open_simulated(DEMO_FLEET, data_dir(data))


@app.command("demo")
def demo_command(simulate: SimulateOpt = None, data_dir: DataDirOpt = None) -> None:
    """The main job on the embedded default: the GPUs (real, or simulated without a driver) and their MIG profiles."""
    with handled_errors():
        dev = devices_or_simulated(simulate, data_dir)
        try:
            states = dev.gpus()
            console.rule("[bold]GPUs")
            for gpu in states:
                console.print(render_gpu(gpu))
            console.rule("[bold]MIG profiles")
            for key in sorted({g.model for g in states if g.model}):
                uuid = next(g.uuid for g in states if g.model == key)
                console.print(profiles_table(dev.model(uuid)))
        finally:
            dev.close()
    _ = lookup_model  # the catalog is what profiles come from when no GPU is present


def main() -> None:
    app()
