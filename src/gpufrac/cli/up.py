"""``gpufrac up FILE...``: the agent in the foreground with a live view, then a summary.

It applies the manifests, reconciles twice a second while showing GPUs and workloads, and stops at
Ctrl-C, when every job is done (``--until-done``), or after ``--duration`` seconds. On the way out
it stops the workloads it started (unless ``--keep``), so nothing is left behind, and prints what
happened: placements, restarts, limits enforced and the memory each workload was measured to use.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpufrac.cli.actions import print_actions
from gpufrac.cli.common import (
    DataDirOpt,
    SimulateOpt,
    console,
    devices_or_simulated,
    err_console,
    handled_errors,
)
from gpufrac.config import data_dir as resolve_data_dir
from gpufrac.errors import InputError
from gpufrac.model.numbers import digits_note, is_digits

if TYPE_CHECKING:
    from rich.console import Console, Group
    from rich.live import Live

    from gpufrac.devices.nvml import NvmlDevices
    from gpufrac.model.deployment import DeploymentSpec
    from gpufrac.model.workload import WorkloadSpec
    from gpufrac.runtime.agent import Agent, WorkloadState

TERMINAL = ("succeeded", "failed")


def up_command(
    files: Annotated[list[Path], typer.Argument(help="Manifest files.")],
    until_done: Annotated[
        bool, typer.Option("--until-done", help="Stop once every job has finished.")
    ] = False,
    duration: Annotated[
        float | None, typer.Option("--duration", help="Stop after this many seconds.")
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Leave the workloads running on exit.")
    ] = False,
    settings_file: Annotated[
        Path | None, typer.Option("--settings", help="Operator settings file.")
    ] = None,
    load: Annotated[
        str | None,
        typer.Option(
            "--load",
            help="Send traffic to the (first) deployment: concurrent clients per step, e.g. "
            "1,12,1.",
        ),
    ] = None,
    load_step: Annotated[float, typer.Option("--load-step", help="Seconds per load step.")] = 5.0,
    gateway_port: Annotated[
        int, typer.Option("--gateway-port", help="Port of the request gateway for deployments.")
    ] = 8480,
    simulate: SimulateOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Run manifests on this machine with a live view (the agent in the foreground). Deployments get
    the request gateway and the autoscaler; --load drives traffic to show them working."""
    from rich.console import Group

    from gpufrac.cli.schedule import _load, _settings
    from gpufrac.cli.up_serving import ServingRun
    from gpufrac.model.deployment import DeploymentSpec
    from gpufrac.model.workload import WorkloadSpec
    from gpufrac.planning.sched_decision import displaced_summary
    from gpufrac.runtime.agent import Agent

    with handled_errors():
        objects = _load(files)
        specs = [o for o in objects if isinstance(o, WorkloadSpec)]
        deployments = [o for o in objects if isinstance(o, DeploymentSpec)]
        steps = _load_steps(load, deployments)
        cfg = _settings(settings_file, data_dir)
        dev = devices_or_simulated(simulate, data_dir)
        agent = Agent(resolve_data_dir(data_dir), dev, cfg, stop_grace=5)
    serving = (
        ServingRun(
            agent, deployments, gateway_port=gateway_port, load=steps, step_seconds=load_step
        )
        if deployments
        else None
    )
    started = time.monotonic()
    since = time.time()  # the summary counts this run's events, not an earlier run's
    states: dict[str, WorkloadState] = {}
    # a SIGTERM stops `up` the way Ctrl-C does: its workloads are stopped on the way out
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        for spec in specs:
            with agent.displacements() as told:
                what, decision = agent.apply_workload(spec)
            where = f" ({decision.outcome}: {decision.reason or decision.mode})" if decision else ""
            shown = f" ({displaced_summary(told)})" if told else ""
            console.print(f"{spec.tenant}/{spec.name}: {what}{shown}{where}", highlight=False)
            if decision is not None:  # the MIG changes its placement makes first
                print_actions(decision.mig_actions(), indent="    ")
            for x in told:
                console.print(
                    f"    [yellow]{x.action}[/] {x.workload}: {x.reason}", highlight=False
                )
            for line in agent.warnings(spec, decision):
                err_console.print(f"    [yellow]warning[/]: {line}", highlight=False)
        keys = {f"{s.tenant}/{s.name}" for s in specs}
        newest = agent.store.events(limit=1)
        seen = newest[-1].id if newest else 0  # displacements after this one are told as they come
        with live_view(console) as live:
            while True:
                every = {s.key: s for s in agent.reconcile()}
                states = {k: s for k, s in every.items() if k in keys}
                view = _view(dev, specs, states, time.monotonic() - started)
                if serving is not None:
                    serving.reconcile(every)
                    view = Group(view, serving.table())
                seen = _tell_displaced(agent, seen, live.console)
                live.update(view)
                if duration is not None and time.monotonic() - started >= duration:
                    break
                if until_done and _done(specs, states) and (serving is None or serving.done):
                    break
                time.sleep(0.5)
    except KeyboardInterrupt:
        console.print("interrupted")
    finally:
        _summary(agent, specs, states, since)
        if serving is not None:
            serving.summary()
            serving.close(keep=keep)
        if not keep:
            for spec in specs:
                agent.delete(spec.tenant, spec.name)
            if not agent.runs.wait_stopped(agent.runs.stop_grace + 5):
                console.print("[yellow]some workloads did not end within their grace[/]")
            console.print("stopped the workloads it started (--keep leaves them running)")
        agent.close()
        dev.close()
        signal.signal(signal.SIGTERM, previous)


def _tell_displaced(agent: Agent, after: int, out: Console) -> int:
    """Print each workload displaced since event ``after`` (by the autoscaler's replicas, say) with
    its cause, and each ``displaced`` event of a cause; returns the newest event's id seen."""
    from gpufrac.planning.sched_decision import DISPLACE_ACTIONS

    newest = after
    while True:
        events = agent.store.events(after=newest, limit=500)
        for e in events:
            if e.kind == "displaced" and e.cause is None:  # the cause's own (not its deployment's)
                out.print(f"{e.subject} displaced ({e.message})", highlight=False)
            elif e.kind in DISPLACE_ACTIONS:
                out.print(
                    f"    [yellow]{e.kind}[/] {e.subject} at {_clock(e.at)}: {e.message}",
                    highlight=False,
                )
        if not events:
            return newest
        newest = events[-1].id


@contextmanager
def live_view(out: Console) -> Iterator[Live]:
    """The live view, ending on a line of its own: its last frame stays, and what is printed next
    (the summary's heading) starts below it, not after its last border (on a pipe, Rich leaves the
    cursor there: ``...┘summary``)."""
    from rich.live import Live

    try:
        with Live(console=out, refresh_per_second=4, transient=False) as live:
            yield live
    finally:
        out.print()


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _load_steps(text: str | None, deployments: list[DeploymentSpec]) -> list[int]:
    if text is None:
        return []
    if not deployments:
        raise InputError("there is no deployment to send traffic to", field="--load")
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts or not all(is_digits(x) for x in parts):  # ASCII: int() also reads '١٢'
        raise InputError(
            f"{text!r} is not a list of client counts{digits_note(text)}",
            field="--load",
            fix="like 1,12,1",
        )
    return [int(x) for x in parts]


def _done(specs: list[WorkloadSpec], states: dict[str, WorkloadState]) -> bool:
    """Every job has finished, or none can make progress (what is left waits; services do not
    count)."""
    jobs = [states.get(f"{s.tenant}/{s.name}") for s in specs if s.type == "job"]
    if any(j is None for j in jobs):
        return False
    return not any(
        j.phase in ("running", "paused", "starting", "backoff") for j in jobs if j is not None
    )


def _view(
    dev: NvmlDevices, specs: list[WorkloadSpec], states: dict[str, WorkloadState], elapsed: float
) -> Group:
    from rich.console import Group
    from rich.table import Table

    gpus = Table(title=f"GPUs ({'simulated' if dev.simulated else 'local'})", title_justify="left")
    for col in ("GPU", "name", "MIG", "memory used", "instances"):
        gpus.add_column(col)
    for g in dev.gpus():
        gpus.add_row(
            str(g.index),
            g.name,
            g.mig_current,
            f"{g.memory_used_mib:,} / {g.memory_total_mib:,} MiB",
            ", ".join(str(i.placement) for i in g.instances) or "-",
        )
    t = Table(title=f"workloads, {elapsed:.0f}s", title_justify="left")
    for col in ("workload", "type", "priority", "phase", "where", "attempts", "reason"):
        t.add_column(col, overflow="fold")
    for s in specs:
        st = states.get(f"{s.tenant}/{s.name}")
        d = st.decision if st else None
        where = ""
        if d is not None:
            where = d.mode or ""
            if d.gpus:
                where += f" GPU {', '.join(g[:12] for g in d.gpus)}"
            if d.mig:
                where += f" {d.mig}"
        style = {
            "running": "green",
            "succeeded": "green",
            "failed": "red",
            "backoff": "yellow",
            "unknown": "red",
            "pending": "yellow",
        }.get(st.phase if st else "", "")
        phase = f"[{style}]{st.phase}[/]" if st and style else (st.phase if st else "")
        t.add_row(
            f"{s.tenant}/{s.name}",
            s.type,
            str(s.priority),
            phase,
            where,
            str(st.attempts if st else 0),
            st.reason if st else "",
        )
    return Group(gpus, t)


def _summary(
    agent: Agent, specs: list[WorkloadSpec], states: dict[str, WorkloadState], since: float
) -> None:
    from rich.table import Table

    from gpufrac.planning.sched_decision import DISPLACE_ACTIONS
    from gpufrac.runtime.runs import read_note

    if not specs:
        return  # deployments only: their own summary follows
    t = Table(title="summary", title_justify="left")
    cols = (
        "workload",
        "placed on",
        "phase",
        "restarts",
        "limit",
        "peak use",
        "GPU turns",
        "events",
    )
    for col in cols:
        t.add_column(col, overflow="fold")
    limits = 0
    told: list[str] = []  # evictions and pauses, named after the table
    index = {g.uuid: f"GPU {g.index}" for g in agent.dev.gpus()}
    for s in specs:
        key = f"{s.tenant}/{s.name}"
        st = states.get(key)
        events = [e for e in agent.store.events(key, limit=200) if e.at >= since]
        kinds = [e.kind for e in events]
        limits += kinds.count("memory_limit")
        placed = next((e.message for e in reversed(events) if e.kind == "started"), "")
        for uuid, name in index.items():
            placed = placed.replace(uuid, name)
        stored = agent.store.workload(s.tenant, s.name)
        usage: dict[str, object] = {}
        run = None
        if stored is not None:
            attempts = agent.runs.attempts(s.tenant, s.name, stored.generation)
            run = attempts[-1] if attempts else None
            for r in attempts:
                u = read_note(r, "usage")
                if int(str(u.get("peak_mib", 0))) >= int(str(usage.get("peak_mib", 0))):
                    usage = u
        peak = (
            f"{usage['peak_mib']} MiB" + (" (simulated)" if agent.dev.simulated else "")
            if usage
            else "-"
        )
        limit = f"{usage.get('limit_mib')} MiB" if usage.get("limit_mib") else "-"
        qos = read_note(run, "qos") if run is not None else {}
        turns = (
            f"{qos.get('mode')}, {float(str(qos.get('held_s', 0))):.1f}s in "
            f"{qos.get('turns')} turns"
            if qos
            else "-"
        )
        notes = ", ".join(
            sorted(
                {
                    k
                    for k in kinds
                    if k
                    in ("restarted", "memory_limit", "paused", "action_failed", *DISPLACE_ACTIONS)
                }
            )
        )
        for e in events:
            if e.kind in DISPLACE_ACTIONS:
                told.append(f"{key} was {e.kind} at {_clock(e.at)}: {e.message}")
        # the arbiter counts every pause (its qos.json); events tell those of a second or more
        pauses = int(str(qos.get("pauses") or 0)) if qos else kinds.count("paused")
        if pauses:
            held = float(str(qos.get("paused_s") or 0)) if qos else 0.0
            by = next((e.message for e in events if e.kind == "paused"), "")
            told.append(
                f"{key} was paused {pauses} time(s)"
                + (f", {held:.1f}s in all" if held else "")
                + (f" ({by})" if by else "")
            )
        t.add_row(
            key,
            placed.split(" on ", 1)[-1] if placed else (st.reason if st else ""),
            st.phase if st else "-",
            str(st.restarts if st else 0)
            + (f" (+{st.evictions} evicted)" if st and st.evictions else ""),
            limit,
            peak,
            turns,
            notes,
        )
    console.print(t)
    for line in told:
        console.print(f"  [yellow]note[/]: {line}", highlight=False)
    done = sum(1 for s in states.values() if s.phase == "succeeded")
    console.print(
        f"{len(specs)} workloads: {done} succeeded, "
        f"{sum(1 for s in states.values() if s.phase == 'failed')} failed; memory limits "
        f"enforced: {limits}",
        highlight=False,
    )
