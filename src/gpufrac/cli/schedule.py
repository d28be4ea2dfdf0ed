"""``gpufrac validate`` and ``gpufrac schedule``: check manifests, and see where they would run.

``schedule`` runs the real scheduler on a fleet (on paper, from a GPU listing, or the live GPUs) and
prints its decisions; it starts nothing (the agent carries decisions out). The fleet is one node:
this machine, named and labelled by the settings (``node``).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpufrac.cli.actions import changes_text
from gpufrac.cli.agent_client import call_as, find_agent
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
from gpufrac.config import data_dir as resolve_data_dir
from gpufrac.errors import InputError

if TYPE_CHECKING:
    from gpufrac.model.deployment import DeploymentSpec
    from gpufrac.model.settings import OperatorSettings
    from gpufrac.model.workload import WorkloadSpec
    from gpufrac.planning.sched_state import SchedGpu
    from gpufrac.planning.scheduler import Decision, Scheduler

FilesArg = Annotated[
    list[Path], typer.Argument(help="Manifest files (YAML or JSON; several documents each).")
]


def _load(files: list[Path]) -> list[WorkloadSpec | DeploymentSpec]:
    """Every object of the files; the warnings about how they are written go to stderr."""
    from gpufrac.model.manifest import load_manifest_files

    read = load_manifest_files(files)
    for line in (w for f in read for w in f.warnings):
        err_console.print(f"[yellow]warning[/]: {line}", highlight=False)
    return [o for f in read for o in f.objects]


def _workloads(objects: list[WorkloadSpec | DeploymentSpec]) -> list[WorkloadSpec]:
    """Workloads as they are, and each deployment as the replicas it starts with."""
    from gpufrac.model.workload import WorkloadSpec

    out: list[WorkloadSpec] = []
    for o in objects:
        if isinstance(o, WorkloadSpec):
            out.append(o)
            continue
        count = o.replicas if o.autoscale is None else o.autoscale.min_replicas
        out += [o.replica_spec(i, 0) for i in range(count or 0)]
    return out


def validate_command(files: FilesArg, json: JsonOpt = False) -> None:
    """Check manifests: strict schema, every error names the field. Exit 0 valid, 2 invalid."""
    from gpufrac.model.workload import WorkloadSpec

    with handled_errors():
        objects = _load(files)
    specs = [f"{s.tenant}/{s.name}" for s in objects if isinstance(s, WorkloadSpec)]
    deps = [f"{s.tenant}/{s.name}" for s in objects if not isinstance(s, WorkloadSpec)]
    if json:
        print_json({"valid": True, "workloads": specs, "deployments": deps})
    else:
        console.print(
            f"[green]valid[/]: {len(specs)} workload(s): "
            + ", ".join(specs)
            + (f"; {len(deps)} deployment(s): {', '.join(deps)}" if deps else ""),
            highlight=False,
        )


def schedule_command(
    files: FilesArg,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus", help="A fleet on paper: MODEL[:COUNT][:mig],... e.g. h200:4,h200:2:mig."
        ),
    ] = None,
    settings_file: Annotated[
        Path | None,
        typer.Option(
            "--settings",
            help="Operator settings (default: gpufrac.yaml in the data directory, if any).",
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy", help="binpack or spread (default: the settings' placement_policy)."
        ),
    ] = None,
    simulate: SimulateOpt = None,
    data_dir: DataDirOpt = None,
    json: JsonOpt = False,
) -> None:
    """Show where the scheduler would place each workload (a dry run: nothing is started)."""
    from rich.table import Table

    from gpufrac.model.manifest_fields import read_choice
    from gpufrac.model.settings import PLACEMENT_POLICIES
    from gpufrac.planning.scheduler import Scheduler, decision_to_json

    with handled_errors():
        specs = _workloads(_load(files))
        cfg = _settings(settings_file, data_dir)
        chosen = None if policy is None else read_choice(policy, "--policy", PLACEMENT_POLICIES)
        fleet = _fleet(gpus, simulate, data_dir, cfg)
        sched = Scheduler(fleet, cfg, policy=chosen)
        running = 0 if gpus is not None else _take_agent_placements(sched, data_dir)
        decisions: list[Decision] = []
        for spec in specs:
            decisions.extend(sched.submit(spec))
    final = {d.workload: d for d in decisions}  # a workload evicted later shows its last state
    if json:
        print_json(
            {
                "decisions": [decision_to_json(d) for d in final.values()],
                "gpus_used": sched.state.gpus_used(),
            }
        )
    else:
        beside = f", beside the agent's {running} placed workload(s)" if running else ""
        t = Table(
            title=f"scheduling {len(specs)} workload(s) on {len(fleet)} GPU(s) ({sched.policy})"
            + beside,
            title_justify="left",
        )
        for col in ("workload", "outcome", "mode", "where", "changes first", "reason"):
            t.add_column(col, overflow="fold")
        for d in final.values():
            where = ", ".join(f"GPU {sched.state.by_uuid[u].index}" for u in d.gpus) + (
                f" {d.mig}" if d.mig else ""
            )
            style = {"placed": "green", "pending": "yellow", "refused": "red"}[d.outcome]
            t.add_row(
                d.workload,
                f"[{style}]{d.outcome}[/]",
                d.mode or "",
                where,
                changes_text(d.actions),
                d.reason,
            )
        console.print(t)
        recuts = [d for d in final.values() if any(a.mig_change == "destroy" for a in d.actions)]
        if recuts:
            console.print(
                f"{len(recuts)} placement(s) re-cut a MIG GPU: idle instances in the way "
                "are destroyed "
                f"first (mig_reconfigure: {cfg.mig_reconfigure}).",
                highlight=False,
            )
    raise typer.Exit(0 if all(d.outcome == "placed" for d in final.values()) else 1)


def _take_agent_placements(sched: Scheduler, data: Path | None) -> int:
    """On the live GPUs of a data directory an agent runs on, the dry run starts from what the agent
    has placed (instances it gave out are taken, shares used): the same picture its scheduler
    has."""
    from gpufrac.api.schemas import DecisionJson, WorkloadList
    from gpufrac.model.workload import spec_from_json
    from gpufrac.planning.scheduler import decision_from_json

    url = find_agent(None, probe=False, data=resolve_data_dir(data))
    if url is None:
        return 0
    taken = 0
    for w in call_as(WorkloadList, "GET", url, "/api/v1/workloads").workloads:
        placed = w.placement
        if isinstance(placed, DecisionJson) and placed.outcome == "placed":
            sched.restore(spec_from_json(w.spec), decision_from_json(placed.model_dump()))
            taken += 1
    return taken


def _settings(path: Path | None, data: Path | None) -> OperatorSettings:
    """The operator's settings; the warnings about how the file is written go to stderr."""
    from gpufrac.model.manifest_fields import read_text_file
    from gpufrac.model.settings import load_settings, parse_settings

    if path is None:
        cfg = load_settings(resolve_data_dir(data))
    else:
        cfg = parse_settings(read_text_file(path, field="--settings"), source=str(path))
    for line in cfg.warnings:
        err_console.print(f"[yellow]warning[/]: {line}", highlight=False)
    return cfg


def _fleet(
    spec: str | None, simulate: str | None, data: Path | None, cfg: OperatorSettings
) -> list[SchedGpu]:
    """The GPUs of the dry run, as one node: this machine, named and labelled by the settings."""
    from gpufrac.planning.sched_state import SchedGpu, sched_gpus_from_states

    node = cfg.node_name or socket.gethostname()
    if spec is not None:
        from gpufrac.devices.simfleet import parse_simulate_spec, simulated_gpu_uuid

        try:
            parsed = parse_simulate_spec(spec, field="--gpus")
        except InputError as e:
            raise e from None
        return [
            SchedGpu(
                simulated_gpu_uuid(s.model.key, i),
                i,
                s.model,
                mig=s.mig,
                node=node,
                node_labels=cfg.node_labels,
            )
            for i, s in enumerate(parsed)
        ]
    with devices(simulate, data) as dev:
        states = dev.gpus()
        models = {g.uuid: dev.model(g.uuid) for g in states if g.health == "ok" and g.model}
    return sched_gpus_from_states(
        states,
        models,
        _pinned(resolve_data_dir(data)),
        node=node,
        node_labels=cfg.node_labels,
    )


def _pinned(data: Path) -> frozenset[str]:
    """The GPUs whose MIG layout an operator pinned through the agent of this data directory."""
    from gpufrac.runtime.store import Store

    if not (data / "state.db").exists():
        return frozenset()
    store = Store(data / "state.db")
    try:
        return store.mig_pins()
    finally:
        store.close()
