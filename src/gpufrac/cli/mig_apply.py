"""``gpufrac mig apply|assert|export|enable|disable``: change MIG on the GPUs, or check it."""

from __future__ import annotations

import json as jsonlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from gpufrac.cli.actions import print_actions
from gpufrac.cli.agent_client import ServerOpt, agent_holds, answer_detail, find_agent
from gpufrac.cli.agent_client import call as agent_call
from gpufrac.cli.agent_client import request as agent_request
from gpufrac.cli.common import (
    DataDirOpt,
    JsonOpt,
    SimulateOpt,
    console,
    devices,
    err_console,
    fail,
    handled_errors,
    print_json,
)
from gpufrac.cli.mig_plan import DrainOpt, ModeOpt
from gpufrac.config import data_dir as resolve_data_dir
from gpufrac.config import simulate_spec
from gpufrac.errors import InputError
from gpufrac.model.catalog import lookup_model
from gpufrac.model.mig import check_layout, format_layout
from gpufrac.model.migplan import MigAction, targets_from_json

if TYPE_CHECKING:  # the planner and the runtime are imported by the commands that use them
    from gpufrac.devices.nvml import NvmlDevices
    from gpufrac.model.gpu import GpuState
    from gpufrac.planning.migparted import MigPartedConfig, Resolution
    from gpufrac.runtime.mig_apply import GpuTarget

PlanFileOpt = Annotated[
    Path | None, typer.Option("--plan", help="A plan from `gpufrac mig plan -o FILE` (or --json).")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config-file", "-f", help="A mig-parted config file.")
]
ConfigNameOpt = Annotated[
    str | None,
    typer.Option(
        "--selected-config",
        "-c",
        help="Which config of the file (may be left out when the file holds one config).",
    ),
]


def _apply_through(
    url: str,
    targets: list[GpuTarget],
    *,
    drain: bool,
    allow_mode_change: bool,
    json: bool,
    dry_run: bool,
) -> NoReturn:
    """The whole plan checked against the agent's GPUs (bad input changes nothing), then each GPU
    through the agent; exits 0 when every GPU is as asked, 1 when one was refused or failed. A dry
    run asks the agent to make the same checks and list the actions, changing nothing: it is
    refused, and exits, as the change would be."""
    with handled_errors():
        if agent_call("GET", url, "/api/v1/health").get("role") == "control-plane":
            raise InputError(
                f"{url} is a cluster's control plane: MIG layouts are not applied through it "
                "yet (docs/cluster.md)",
                field="--server",
                fix="the scheduler cuts MIG instances on any node as workloads need them",
            )
        gpus = agent_call("GET", url, "/api/v1/gpus")["gpus"]
        _check_against(gpus, targets)
    outcomes = _through_agent(
        url, gpus, targets, drain=drain, allow_mode_change=allow_mode_change, dry_run=dry_run
    )
    _report_per_gpu(outcomes, json, dry=dry_run)
    raise typer.Exit(0 if all(o.ok for o in outcomes) else 1)


def _plan_targets(plan: Path) -> list[GpuTarget]:
    from gpufrac.model.manifest_fields import read_text_file
    from gpufrac.runtime.mig_apply import GpuTarget

    try:
        raw = jsonlib.loads(read_text_file(plan, field="--plan"))
    except ValueError as e:
        raise InputError(f"{plan} is not JSON: {e}", field="--plan") from None
    return [
        GpuTarget(u, enabled, layout)
        for u, _, enabled, layout in targets_from_json(raw, field="--plan")
    ]


def _check_against(gpus: list[dict[str, Any]], targets: list[GpuTarget]) -> None:
    """Bad input in a plan (a GPU the agent does not have, a layout no GPU of its model can hold)
    changes nothing on any GPU: it is found before the first one is touched."""
    known = {g["uuid"]: g for g in gpus}
    problems = []
    for i, t in enumerate(targets):
        g = known.get(t.uuid)
        where = f"--plan.gpus[{i}]"
        if g is None:
            problems.append(
                InputError(
                    f"the agent has no GPU {t.uuid}",
                    field=f"{where}.uuid",
                    fix="gpufrac get gpus lists its GPUs",
                )
            )
            continue
        if t.layout and g.get("model"):
            bad = check_layout(lookup_model(g["model"]), t.layout)
            if bad:
                problems.append(
                    InputError(
                        f"layout {format_layout(t.layout)} is not valid on GPU {g['index']}: "
                        + "; ".join(b.message for b in bad),
                        field=f"{where}.instances",
                    )
                )
    if problems:
        raise InputError.many(problems)


def _targets(
    dev: NvmlDevices, plan: Path | None, config: Path | None, name: str | None
) -> list[GpuTarget]:
    from gpufrac.runtime.mig_apply import GpuTarget

    if (plan is None) == (config is None):
        raise InputError("give exactly one of --plan FILE or -f CONFIG [-c NAME]", field="--plan")
    if plan is not None:
        return _plan_targets(plan)
    assert config is not None
    resolution = _resolve(dev, config, name)
    return [GpuTarget(t.uuid, t.mig_enabled, t.layout) for t in resolution.targets]


def _resolve(dev: NvmlDevices, config: Path, name: str | None) -> Resolution:
    """Config ``name`` of a mig-parted file (its only one when no name is given) on these GPUs;
    what it skips is told on stderr, one note a line."""
    from gpufrac.model.manifest_fields import read_text_file
    from gpufrac.planning.migparted import parse_migparted, resolve_config

    parsed = parse_migparted(read_text_file(config, field="--config-file"), source=str(config))
    gpus = dev.gpus()
    models = {g.uuid: dev.model(g.uuid) for g in gpus if g.health == "ok"}
    resolution = resolve_config(parsed, name, gpus, models)
    for note in resolution.notes:
        err_console.print(f"[yellow]note[/] {note}", highlight=False)
    return resolution


def mig_apply_command(
    plan: PlanFileOpt = None,
    config_file: ConfigOpt = None,
    selected_config: ConfigNameOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Make every check of the change (through the agent, when one runs) and print "
            "the actions and the nvidia-smi commands, changing nothing; refused, and exits, as "
            "the change would be.",
        ),
    ] = False,
    drain: DrainOpt = False,
    allow_mode_change: ModeOpt = False,
    simulate: SimulateOpt = None,
    data_dir: DataDirOpt = None,
    json: JsonOpt = False,
    server: ServerOpt = None,
) -> None:
    """Bring the GPUs to a plan or a mig-parted config: checked first, then changed; safe to re-run.

    When a node agent runs (``--server``, ``$GPUFRAC_SERVER``, the agent of the data directory, or
    one on the default port), the change goes through it, one GPU at a time."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from gpufrac.runtime.mig_apply import ApplyRefused, apply_targets, diff_actions

    data = resolve_data_dir(data_dir)
    # a dry run takes the very path of the change, so it is refused (and exits) as the change is
    flags = {
        "drain": drain,
        "allow_mode_change": allow_mode_change,
        "json": json,
        "dry_run": dry_run,
    }
    named = find_agent(server, probe=False, data=data)
    if named is not None and plan is not None:  # no local GPUs needed
        with handled_errors():
            targets = _plan_targets(plan)
        _apply_through(named, targets, **flags)
    with handled_errors(), devices(simulate, data_dir) as dev:
        targets = _targets(dev, plan, config_file, selected_config)
        field = "--plan" if plan is not None else "--config-file"
        # simulated GPUs are never handed to an agent found by chance on the default port
        agent = find_agent(server, probe=dev.simulated is False, data=data)
        if agent is not None:  # the agent owns MIG changes on its GPUs: it keeps its scheduler true
            _apply_through(agent, targets, **flags)
        if agent_holds(data):
            raise InputError(
                f"an agent runs on the data directory {data} but cannot be reached: it owns these "
                "GPUs' MIG layouts",
                field="--server",
                fix="pass --server URL (or set GPUFRAC_SERVER) so the change goes through it",
            )
        try:
            actions = diff_actions(
                dev, targets, drain=drain, allow_mode_change=allow_mode_change, field=field
            )
            if dry_run:
                _report(actions, json, dry=True)
                return
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                console=err_console,
                transient=True,
                disable=json,
            ) as bar:
                task = bar.add_task("applying MIG changes", total=len(actions))
                done = apply_targets(
                    dev,
                    targets,
                    drain=drain,
                    allow_mode_change=allow_mode_change,
                    on_action=lambda a: bar.update(task, advance=1, description=a.describe()),
                    field=field,
                )
        except ApplyRefused as e:
            raise fail(str(e), 1) from None
        _report(done, json, dry=False)


@dataclass(frozen=True, slots=True)
class GpuOutcome:
    """What the agent did with one GPU of a plan."""

    uuid: str
    index: int
    result: str  # changed | unchanged | planned (a dry run's) | refused | failed
    reason: str = ""
    pinned: bool = False
    actions: tuple[MigAction, ...] = ()
    # the workloads the change displaced, as the agent told them: {workload, action, reason}
    displaced: tuple[dict[str, Any], ...] = ()

    @property
    def ok(self) -> bool:
        return self.result in ("changed", "unchanged", "planned")


def _through_agent(
    server: str,
    gpus: list[dict[str, Any]],
    targets: list[GpuTarget],
    *,
    drain: bool,
    allow_mode_change: bool,
    dry_run: bool,
) -> list[GpuOutcome]:
    """Each GPU of the plan through the agent, one at a time: a GPU already as asked is left alone,
    a refusal or failure on one GPU is reported and the others still go (or, in a dry run, are
    still checked)."""
    index = {g["uuid"]: int(g["index"]) for g in gpus}
    out: list[GpuOutcome] = []
    for t in targets:
        body = {
            "mig_enabled": t.mig_enabled,
            "instances": [p.to_json() for p in t.layout],
            "drain": drain,
            "allow_mode_change": allow_mode_change,
            "pin": True,
            "dry_run": dry_run,
        }
        where = index.get(t.uuid, -1)
        r = agent_request("POST", server, f"/api/v1/gpus/{t.uuid}/mig", json=body)
        if r.status_code != 200:
            result = "refused" if r.status_code in (409, 422) else "failed"
            why = answer_detail(r).removeprefix(f"GPU {where}: ")
            out.append(
                GpuOutcome(t.uuid, where, result, why or f"the agent answered {r.status_code}")
            )
            continue
        got = r.json()
        actions = tuple(
            MigAction(**{k: v for k, v in a.items() if k != "nvidia_smi"}) for a in got["actions"]
        )
        displaced = tuple(x for x in got.get("displaced") or [] if isinstance(x, dict))
        out.append(
            GpuOutcome(
                t.uuid, where, got["result"], "", bool(got.get("pinned")), actions, displaced
            )
        )
    return out


def _report_per_gpu(outcomes: list[GpuOutcome], json: bool, *, dry: bool) -> None:
    if json:
        print_json(
            {
                "dry_run": dry,
                "changed": any(o.result == "changed" for o in outcomes),
                "gpus": [
                    {
                        "uuid": o.uuid,
                        "index": o.index,
                        "result": o.result,
                        "reason": o.reason,
                        "pinned": o.pinned,
                        "actions": [a.to_json() for a in o.actions],
                        "displaced": list(o.displaced),
                    }
                    for o in outcomes
                ],
                "actions": [a.to_json() for o in outcomes for a in o.actions],
            }
        )
        return
    style = {
        "changed": "green",
        "planned": "green",
        "unchanged": "dim",
        "refused": "yellow",
        "failed": "red",
    }
    for o in outcomes:
        extra = f" ({len(o.actions)} action(s))" if o.actions else ""
        pinned = o.pinned and not dry
        pin = "; layout pinned (gpufrac mig release lets the agent re-cut it)" if pinned else ""
        why = f": {o.reason}" if o.reason else ""
        shown = "would change (dry run)" if o.result == "planned" else o.result
        console.print(
            f"GPU {o.index}: [{style.get(o.result, 'red')}]{shown}[/]{extra}{pin}{why}",
            highlight=False,
        )
        print_actions(o.actions, dry=dry, commands=dry, indent="  ")
        for x in o.displaced:
            console.print(
                f"  [yellow]{x.get('action')}[/] {x.get('workload')}: {x.get('reason')}",
                highlight=False,
            )
    if dry:
        refused = sum(1 for o in outcomes if not o.ok)
        console.print(
            f"{sum(len(o.actions) for o in outcomes)} action(s) planned (dry run)"
            + (f"; {refused} GPU(s) refused, as the change would be" if refused else ""),
            highlight=False,
        )


def _report(actions: list[MigAction], json: bool, *, dry: bool) -> None:
    if json:
        print_json(
            {
                "dry_run": dry,
                "changed": bool(actions) and not dry,
                "actions": [a.to_json() for a in actions],
            }
        )
        return
    if not actions:
        console.print("nothing to do: the GPUs already match")
        return
    print_actions(actions, dry=dry, commands=dry)
    console.print(f"{len(actions)} action(s) {'planned (dry run)' if dry else 'done'}")


def assert_command(
    plan: PlanFileOpt = None,
    config_file: ConfigOpt = None,
    selected_config: ConfigNameOpt = None,
    simulate: SimulateOpt = None,
    data_dir: DataDirOpt = None,
    json: JsonOpt = False,
) -> None:
    """Check that the GPUs match a plan or a mig-parted config. Exit 0 match, 1 mismatch, 2 bad
    input."""
    with handled_errors(), devices(simulate, data_dir) as dev:
        if config_file is not None and plan is None:
            resolution = _resolve(dev, config_file, selected_config)
            mismatches = _config_mismatches(dev, resolution)
        else:
            targets = _targets(dev, plan, config_file, selected_config)
            mismatches = _plan_mismatches(dev, targets)
    if json:
        print_json({"match": not mismatches, "mismatches": mismatches})
    elif mismatches:
        for m in mismatches:
            console.print(f"[red]mismatch[/] {m}", highlight=False)
    else:
        console.print("[green]the GPUs match[/]")
    raise typer.Exit(1 if mismatches else 0)


def _config_mismatches(dev: NvmlDevices, resolution: Resolution) -> list[str]:
    from gpufrac.planning.migparted import target_mismatches

    return target_mismatches(resolution, dev.gpus())


def _plan_mismatches(dev: NvmlDevices, targets: list[GpuTarget]) -> list[str]:
    out = []
    for t in targets:
        g = dev.gpu(t.uuid)
        if g.mig_enabled != t.mig_enabled:
            out.append(
                f"GPU {g.index}: MIG mode {g.mig_current}, plan wants "
                f"{'enabled' if t.mig_enabled else 'disabled'}"
            )
        elif t.mig_enabled and g.layout != tuple(sorted(t.layout)):
            out.append(
                f"GPU {g.index}: layout {format_layout(g.layout) or '(empty)'}, plan "
                f"wants {format_layout(t.layout) or '(empty)'}"
            )
    return out


def export_command(
    name: Annotated[
        str, typer.Option("--selected-config", "-c", help="Name of the config written.")
    ] = "current",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
    simulate: SimulateOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Write the GPUs' MIG state as a mig-parted config (YAML)."""
    from gpufrac.planning.migparted import dump_migparted, export_config

    with handled_errors(), devices(simulate, data_dir) as dev:
        config: MigPartedConfig = export_config(dev.gpus(), name)
    text = dump_migparted(config)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text)
        console.print(f"wrote {output}")


GpuSelectOpt = Annotated[str, typer.Option("--gpu", help="GPU index, UUID, or 'all'.")]


def _select(gpus: list[GpuState], which: str) -> list[GpuState]:
    if which == "all":
        return [g for g in gpus if g.health == "ok"]
    for g in gpus:
        if which in (g.uuid, str(g.index)):
            return [g]
    raise InputError(
        f"no GPU {which!r}",
        field="--gpu",
        fix=f"use an index ({', '.join(str(g.index) for g in gpus)}), a UUID, or all",
    )


def _set_mode(
    which: str, enabled: bool, simulate: str | None, data: Path | None, json: bool
) -> None:
    verb = "enable" if enabled else "disable"
    results = []
    agent = find_agent(None, probe=not simulate_spec(simulate), data=resolve_data_dir(data))
    with handled_errors(), devices(simulate, data) as dev:
        for g in _select(dev.gpus(), which):
            if (
                agent is not None and g.mig_enabled != enabled
            ):  # through the agent, which keeps its view
                agent_call(
                    "POST",
                    agent,
                    f"/api/v1/gpus/{g.uuid}/mig",
                    json={
                        "mig_enabled": enabled,
                        "instances": [],
                        "allow_mode_change": True,
                        "pin": False,  # a mode alone: the agent may cut the GPU for its workloads
                    },
                )
            change = dev.set_mig_mode(g.uuid, enabled)  # a no-op when the agent already did it
            results.append((g, change))
    pending = [g for g, c in results if not c.activated]
    if json:
        print_json(
            {
                "gpus": [
                    {
                        "uuid": g.uuid,
                        "index": g.index,
                        "current": c.current,
                        "pending": c.pending,
                        "activated": c.activated,
                        "reason": c.reason,
                    }
                    for g, c in results
                ]
            }
        )
    else:
        for g, c in results:
            state = "done" if c.activated else f"PENDING: {c.reason}"
            console.print(
                f"GPU {g.index}: MIG {c.current} (pending {c.pending}) - {state}", highlight=False
            )
        if pending:
            console.print(
                f"To {verb} MIG mode a GPU must be idle: stop every process on it (and "
                "destroy its MIG "
                "instances to disable), then run this again. gpufrac never resets a GPU.",
                highlight=False,
            )
    raise typer.Exit(1 if pending else 0)


def enable_command(
    gpu: GpuSelectOpt,
    simulate: SimulateOpt = None,
    data_dir: DataDirOpt = None,
    json: JsonOpt = False,
) -> None:
    """Turn MIG mode on. The GPU must be idle (no processes)."""
    _set_mode(gpu, True, simulate, data_dir, json)


def disable_command(
    gpu: GpuSelectOpt,
    simulate: SimulateOpt = None,
    data_dir: DataDirOpt = None,
    json: JsonOpt = False,
) -> None:
    """Turn MIG mode off. The GPU must be idle, with its MIG instances destroyed."""
    _set_mode(gpu, False, simulate, data_dir, json)


def release_command(
    gpu: GpuSelectOpt,
    server: ServerOpt = None,
    json: JsonOpt = False,
) -> None:
    """Release a MIG layout an operator set (mig apply pins it): the agent may re-cut the GPU for
    waiting workloads again. Needs a running agent."""
    agent = find_agent(server)
    if agent is None:
        raise fail(
            "no agent is running: only an agent re-cuts MIG GPUs, and its layouts are pinned there",
            2,
            "start one with: gpufrac agent (or pass --server URL)",
        )
    gpus = agent_call("GET", agent, "/api/v1/gpus")["gpus"]
    if gpu == "all":
        chosen = [g for g in gpus if g.get("mig_mode", {}).get("current") == "enabled"]
    else:
        chosen = [g for g in gpus if gpu in (g["uuid"], str(g["index"]))]
        if not chosen:
            raise fail(
                f"--gpu: no GPU {gpu!r}",
                2,
                f"use an index ({', '.join(str(g['index']) for g in gpus)}), a UUID, or all",
            )
    results = []
    for g in chosen:
        r = agent_call("DELETE", agent, f"/api/v1/gpus/{g['uuid']}/mig/pin")
        results.append({"uuid": g["uuid"], "index": g["index"], "placed": r["placed"]})
    if json:
        print_json({"released": results})
        return
    for res in results:
        placed = f"; placed now: {', '.join(res['placed'])}" if res["placed"] else ""
        console.print(
            f"GPU {res['index']}: released; the agent may re-cut it for waiting workloads{placed}",
            highlight=False,
        )
