"""``gpufrac agent`` (the server) and the kubectl-style client commands that talk to it.

Client commands find the agent at ``--server``, else ``$GPUFRAC_SERVER``, else http://127.0.0.1:8470.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json as jsonlib
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpufrac.cli.actions import print_actions
from gpufrac.cli.agent_client import (
    AGENT_FILE,
    DEFAULT_PORT,
    ServerOpt,
    answer,
    answer_detail,
    call,
    call_as,
    read_as,
    request,
)
from gpufrac.cli.common import (
    DataDirOpt,
    JsonOpt,
    SimulateOpt,
    console,
    err_console,
    fail,
    handled_errors,
    note_preemption_default,
    print_json,
    serve_http,
)
from gpufrac.cli.describe import describe_lines
from gpufrac.cli.tables import OutputOpt, kind_of, output_format, render
from gpufrac.cli.watch import IntervalOpt, WatchOpt, out, watch
from gpufrac.config import data_dir as resolve_data_dir
from gpufrac.errors import InputError

if TYPE_CHECKING:
    import httpx
    from pydantic import BaseModel

    from gpufrac.api.schemas import DeploymentResult, WorkloadResult

TenantOpt = Annotated[
    str | None,
    typer.Option(
        "--tenant", "-t", help="The tenant (default: default; or write the name as TENANT/NAME)."
    ),
]
FilterTenantOpt = Annotated[
    str | None, typer.Option("--tenant", "-t", help="Only this tenant's (default: all you see).")
]


def list_model(kind: str) -> type[BaseModel]:
    """The API's model of the list of ``kind`` (workloads, deployments, gpus)."""
    from gpufrac.api.schemas import DeploymentList, GpuList, NodeList, WorkloadList

    models: dict[str, type[BaseModel]] = {
        "workloads": WorkloadList,
        "deployments": DeploymentList,
        "gpus": GpuList,
        "nodes": NodeList,
    }
    return models[kind]


def qualified(name: str, tenant: str | None, server: str | None = None) -> tuple[str, str]:
    """(tenant, name) from NAME with -t TENANT, or from TENANT/NAME (the form gpufrac prints); a
    bare NAME is the token's tenant's (``$GPUFRAC_TOKEN`` of a tenant), else tenant ``default``."""
    if "/" in name:
        left, _, right = name.partition("/")
        if not left or not right or "/" in right:
            raise fail(f"{name!r} is not NAME or TENANT/NAME", 2)
        if tenant is not None and tenant != left:
            raise fail(f"{name!r} names tenant {left!r}, but -t says {tenant!r}: give one", 2)
        return left, right
    return tenant or _token_tenant(server), name


def _token_tenant(server: str | None) -> str:
    """The tenant of ``$GPUFRAC_TOKEN`` (the agent says), or ``default`` (no token, the admin's)."""
    if not os.environ.get("GPUFRAC_TOKEN"):
        return "default"
    r = request("GET", server, "/api/v1/whoami")
    if r.status_code != 200:
        return "default"
    got = r.json()
    tenant = got.get("tenant") if isinstance(got, dict) else None
    if not isinstance(tenant, str | None):  # read with the model only to say what is wrong
        from gpufrac.api.schemas import WhoAmI

        tenant = read_as(WhoAmI, got).tenant
    return tenant or "default"


def _find(server: str | None, kind: str, tenant: str, name: str) -> Any:
    """GET one workload or deployment; a 404 says where that name does exist, if anywhere."""
    r = request("GET", server, f"/api/v1/{kind}s/{tenant}/{name}")
    if r.status_code != 404:
        return answer(r)
    raise fail(f"no {kind} {tenant}/{name}", 1, _elsewhere(server, kind, tenant, name))


def _elsewhere(server: str | None, kind: str, tenant: str, name: str) -> str | None:
    """A hint naming the tenants (that the caller may see) where ``name`` exists."""
    from gpufrac.api.schemas import DeploymentList, WorkloadList

    r = request("GET", server, f"/api/v1/{kind}s")
    if r.status_code != 200:
        return None
    listed = (
        read_as(WorkloadList, r.json()).workloads
        if kind == "workload"
        else read_as(DeploymentList, r.json()).deployments
    )
    found = [f"{x.tenant}/{x.name}" for x in listed if x.name == name and x.tenant != tenant]
    if found:
        return f"did you mean {' or '.join(found)}? (write TENANT/NAME, or pass -t TENANT)"
    if kind == "workload":
        other = request("GET", server, f"/api/v1/deployments/{tenant}/{name}")
        if other.status_code == 200:
            return (
                f"{tenant}/{name} is a deployment: gpufrac describe deployment {tenant}/{name}, "
                f"gpufrac logs {tenant}/{name}, gpufrac delete {tenant}/{name} --deployment"
            )
    return None


def agent_command(
    host: Annotated[
        str,
        typer.Option("--host", help="Address to listen on (beyond loopback only with API tokens)."),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = DEFAULT_PORT,
    tokens_file: Annotated[
        Path | None,
        typer.Option(
            "--tokens", help="API tokens file (default: tokens.yaml in the data directory, if any)."
        ),
    ] = None,
    settings_file: Annotated[
        Path | None,
        typer.Option(
            "--settings", help="Operator settings (default: gpufrac.yaml in the data directory)."
        ),
    ] = None,
    gateway_port: Annotated[
        int,
        typer.Option("--gateway-port", help="Port of the request gateway (/serve/DEPLOYMENT/...)."),
    ] = 8480,
    gateway_host: Annotated[
        str, typer.Option("--gateway-host", help="Address the request gateway listens on.")
    ] = "127.0.0.1",
    simulate: SimulateOpt = None,
    data_dir: DataDirOpt = None,
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format",
            envvar="GPUFRAC_LOG_FORMAT",
            help="The decision log on stderr: text (for a terminal) or json (one object a line).",
        ),
    ] = "text",
) -> None:
    """Run the node agent in the foreground: the control API, the scheduler, the reconcile loop,
    and (once there is a deployment) the request gateway. Each decision it makes (placed, evicted,
    paused, resumed, restarted, MIG changed, scaled ...) is one line on stderr."""

    from gpufrac.api.app import create_app
    from gpufrac.api.tokens import load_tokens
    from gpufrac.cli.schedule import _settings
    from gpufrac.config import simulate_spec
    from gpufrac.devices import open_devices
    from gpufrac.runtime.agent import Agent
    from gpufrac.runtime.decision_log import LOG_FORMATS, DecisionLog
    from gpufrac.runtime.service import AgentService
    from gpufrac.serving.agent_deployments import AgentDeployments

    with handled_errors():
        fmt = next((f for f in LOG_FORMATS if f == log_format), None)
        if fmt is None:
            raise InputError(
                f"unknown log format {log_format!r}",
                field="--log-format",
                fix=f"use one of: {', '.join(LOG_FORMATS)} (or set $GPUFRAC_LOG_FORMAT)",
            )
        data = resolve_data_dir(data_dir)
        tokens = load_tokens(tokens_file or data / "tokens.yaml")
        if tokens_file is not None and tokens is None:
            raise InputError(f"no tokens file {tokens_file}", field="--tokens")
        for field, listen in (("--host", host), ("--gateway-host", gateway_host)):
            if not _is_loopback(listen) and not tokens:
                raise InputError(
                    f"refusing to listen on {listen} without API tokens",
                    field=field,
                    fix="give --tokens FILE, or listen on 127.0.0.1",
                )
        dev = open_devices(simulate_spec(simulate), data)
        agent = Agent(data, dev, _settings(settings_file, data_dir), tokens_in_use=bool(tokens))
        agent.store.listeners.append(DecisionLog(sys.stderr, fmt))
        known = [c.tenant for c in (tokens or {}).values()] + agent.store.tenants()
        note_preemption_default(agent.settings, known)
    service = AgentService(agent)
    serving = AgentDeployments(
        service,
        gateway_port=gateway_port,
        gateway_host=gateway_host,
        tokens=None if tokens is None else {t: c.tenant for t, c in tokens.items()},
    )
    auth = f", {len(tokens)} API token(s)" if tokens else ", no API tokens: loopback only"
    console.print(f"gpufrac agent on http://{host}:{port} (data: {data}{auth})", highlight=False)
    if agent.sandbox.mode == "tenant":
        console.print("workloads run as their tenant's own user (workload_users: tenant)")
        python = agent.sandbox.python
        if python.problem is not None:
            err_console.print(
                f"[yellow]warning:[/] {sys.executable} cannot be run by other users"
                f" ({python.problem}), so workloads that run it as their tenant's user cannot"
                " start: model: deployments (their replicas run gpufrac's server with it), and"
                " manifests whose command is this venv's python (the examples): install Python and"
                " gpufrac where every user can run them, or set workload_users: agent (no"
                " separation of tenants) (docs/agent.md)",
                highlight=False,
            )
        elif python.view.covers:
            console.print(
                f"their workloads see this agent's Python through a read-only view of it over"
                f" {', '.join(python.view.tops())}, closed to them (docs/agent.md)",
                highlight=False,
            )
    elif tokens:
        fix = (
            "set workload_users: tenant (or auto) in gpufrac.yaml"
            if os.geteuid() == 0
            else "run the agent as root"
        )
        err_console.print(
            "[yellow]warning:[/] workloads run as this agent's user, so tenants are not separated"
            f" from each other or from the agent (a workload can read the API tokens); {fix} to"
            " give each tenant its own user (docs/agent.md)",
            highlight=False,
        )
    here = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    address = data / AGENT_FILE  # how commands on this data directory find this agent
    address.write_text(jsonlib.dumps({"url": f"http://{here}:{port}", "pid": os.getpid()}))
    try:
        app = create_app(
            service,
            serving,
            loop=service,
            tokens=tokens,
            max_body=agent.settings.api_max_body_mib << 20,
        )
        serve_http(
            app,
            host,
            port,
            name="gpufrac agent",
            after=f" (its workloads keep running; an agent started on {data} takes them back)",
        )
    finally:
        address.unlink(missing_ok=True)


def apply_command(
    file: Annotated[list[Path], typer.Option("--filename", "-f", help="Manifest file(s).")],
    server: ServerOpt = None,
    json: JsonOpt = False,
) -> None:
    """Apply manifests: create, replace (when changed) or leave unchanged.

    Every file is checked first: bad input (not UTF-8, not YAML, a field wrong) applies nothing and
    exits 2, listing every problem. A valid document the agent refuses (no GPU here could ever hold
    it) is reported with why while the others are applied, and the command exits 1."""
    from gpufrac.api.schemas import ApplyAnswer
    from gpufrac.model.manifest import load_manifest_files

    with handled_errors():  # all or nothing: every file is valid first
        # the agent reads them again, and answers each document with its warnings
        files = load_manifest_files(file)
    results: list[dict[str, Any]] = []  # as the agent answered (--json prints them)
    read: list[WorkloadResult | DeploymentResult] = []
    for f in files:
        sent = request(
            "POST",
            server,
            "/api/v1/workloads",
            content=f.text.encode(),
            headers={"content-type": "application/yaml"},
            wait_busy=True,  # a tenant's applies are limited a second: wait as the server says
        )
        if sent.status_code == 422:  # what only the agent can tell (an image, where a mount leads)
            lines = (answer_detail(sent, sep="\n") or sent.text).splitlines()
            raise fail("\n".join(f"{f.path}: {line}" for line in lines), 2)
        got = answer(sent)
        read += read_as(ApplyAnswer, got).results
        results += got["results"]
    refused = [r for r in read if r.result == "refused"]
    if json:
        print_json({"results": results})
        raise typer.Exit(1 if refused else 0)
    for r in read:
        _print_result(r)
    if refused:
        err_console.print(refused_summary(len(refused), len(results)), highlight=False)
        raise typer.Exit(1)


def refused_summary(refused: int, total: int) -> str:
    """What ``apply`` says when the agent refused ``refused`` of ``total`` documents: how many, and
    how many of the others were applied (only when there are some)."""
    applied = total - refused
    if total == 1:
        return "[bold red]the document was refused[/]; nothing was applied"
    if applied == 0:
        return f"[bold red]all {total} documents were refused[/]; nothing was applied"
    return (
        f"[bold red]{refused} of {total} documents refused[/]; the other {applied} "
        f"{'was' if applied == 1 else 'were'} applied"
    )


def _print_result(r: WorkloadResult | DeploymentResult) -> None:
    from gpufrac.api.schemas import DeploymentResult
    from gpufrac.planning.sched_decision import decision_from_json, displaced_summary

    if isinstance(r, DeploymentResult):
        console.print(f"deployment {r.deployment} {r.result}: {r.url}", highlight=False)
        for line in r.warnings:
            err_console.print(f"    [yellow]warning[/]: {line}", highlight=False)
        return
    d = r.decision
    if r.result == "refused":
        why = d.reason if d is not None else ""
        console.print(f"[red]{r.workload} refused[/]: {why or 'no reason given'}", highlight=False)
        return
    outcome = ""
    if d is not None:
        detail = d.reason or (f"{d.mode} on {', '.join(d.gpus)}" if d.gpus else "")
        if d.mig is not None:
            detail += f" ({d.mig.profile}@{d.mig.start})"
        outcome = f": {d.outcome} {detail}"
    told = f" ({displaced_summary(r.displaced)})" if r.displaced else ""
    console.print(f"{r.workload} {r.result}{told}{outcome}", highlight=False)
    if d is not None:  # the MIG changes its placement makes first (the displaced are told below)
        print_actions(decision_from_json(d.model_dump()).mig_actions(), indent="    ")
    for x in r.displaced:
        console.print(f"    [yellow]{x.action}[/] {x.workload}: {x.reason}", highlight=False)
    for line in r.diff:
        console.print(f"    [yellow]~[/] {line}", highlight=False)
    for line in r.warnings:
        err_console.print(f"    [yellow]warning[/]: {line}", highlight=False)


def get_command(
    what: Annotated[str, typer.Argument(help="workloads, deployments, gpus or nodes")],
    tenant: FilterTenantOpt = None,
    output: OutputOpt = None,
    watch_: WatchOpt = False,
    interval: IntervalOpt = 1.0,
    server: ServerOpt = None,
    json: JsonOpt = False,
) -> None:
    """List workloads (with the GPU, node and slice each runs on), deployments, GPUs (each with
    its MIG instances or shares, the workloads on them, reserved against used memory and compute,
    and cordons), or nodes (one machine's agent is its own). One line per row, so it can be piped
    to grep; -w prints again on each change."""
    kind = kind_of(what)
    fmt = output_format(output, json)
    if interval <= 0:
        raise fail("--interval: give a number of seconds above 0", 2)

    def text(get: Callable[[str], Any]) -> str:
        data = get(f"/api/v1/{kind}")  # -o json prints it as it came
        gpus: Any = []
        try:
            if kind == "gpus":
                gpus = data["gpus"]
            elif kind == "workloads" and fmt in ("table", "wide"):
                gpus = get("/api/v1/gpus")["gpus"]  # where each runs: GPU index, node, its share
            if tenant is not None and kind in ("workloads", "deployments"):
                data = {kind: [x for x in data[kind] if x["tenant"] == tenant]}
            return render(kind, data, gpus, fmt)
        except (KeyError, TypeError, ValueError, AttributeError):
            # read straight from the answers (a command run in loops starts without the API's
            # models); one that cannot be read so is read with the models, which say where it is
            # not what this gpufrac reads (exit 1)
            read_as(list_model(kind), data)
            if kind == "workloads" and fmt in ("table", "wide"):
                read_as(list_model("gpus"), {"gpus": gpus})
            raise

    if watch_:
        watch(lambda poller: text(poller.get), server, interval)
        return
    out(text(lambda path: call("GET", server, path)))


def describe_command(
    kind: Annotated[str, typer.Argument(help="workload, deployment or node")],
    name: Annotated[str, typer.Argument(help="The workload's (deployment's, node's) name.")],
    tenant: TenantOpt = None,
    server: ServerOpt = None,
    json: JsonOpt = False,
    output: OutputOpt = None,
) -> None:
    """Everything about one workload: status, placement (where a finished one ran), QoS,
    environment handed over, and its events; or one deployment; or one node: its state, labels,
    GPUs, version, the workloads on it and its events."""
    from gpufrac.api.schemas import DeploymentDetail, GpuList, WorkloadDetail

    if kind not in ("workload", "deployment", "node"):
        raise fail(f"cannot describe {kind!r}: use workload, deployment or node", 2)
    json = output_format(output, json, ("table", "json")) == "json"
    if kind == "node":
        _describe_node(name, server, json)
        return
    tenant_, name = qualified(name, tenant, server)
    w = _find(server, kind, tenant_, name)
    read_as(DeploymentDetail if kind == "deployment" else WorkloadDetail, w)
    if kind == "deployment":
        from gpufrac.cli.serve_cmds import print_deployment

        print_json(w) if json else print_deployment(w)
        return
    if json:
        print_json(w)
        return
    gpus = call("GET", server, "/api/v1/gpus")
    read_as(GpuList, gpus)
    out("\n".join(describe_lines(w, gpus["gpus"])))


def _describe_node(name: str, server: str | None, json: bool) -> None:
    from gpufrac.api.schemas import GpuList, NodeDetail, NodeList
    from gpufrac.cli.describe import node_lines

    r = request("GET", server, f"/api/v1/nodes/{name}")
    if r.status_code == 404:
        known = read_as(NodeList, call("GET", server, "/api/v1/nodes")).nodes
        names = ", ".join(n.name for n in known) or "none"
        raise fail(f"no node {name}", 1, f"the nodes are: {names} (gpufrac get nodes)")
    got = answer(r)
    read_as(NodeDetail, got)
    if json:
        print_json(got)
        return
    gpus = call("GET", server, "/api/v1/gpus")
    read_as(GpuList, gpus)
    out("\n".join(node_lines(got, gpus["gpus"])))


def delete_command(
    name: Annotated[str, typer.Argument(help="The workload's (or deployment's) name.")],
    tenant: TenantOpt = None,
    deployment: Annotated[
        bool, typer.Option("--deployment", help="Delete the deployment NAME and its replicas.")
    ] = False,
    server: ServerOpt = None,
) -> None:
    """Delete a workload (its processes are stopped), or with --deployment a deployment."""
    kind = "deployment" if deployment else "workload"
    tenant_, name = qualified(name, tenant, server)
    r = request("DELETE", server, f"/api/v1/{kind}s/{tenant_}/{name}")
    if r.status_code == 404:
        raise fail(f"no {kind} {tenant_}/{name}", 1, _elsewhere(server, kind, tenant_, name))
    answer(r)
    console.print(f"{tenant_}/{name} deleted", highlight=False)


def clear_unknown_command(
    name: Annotated[str, typer.Argument(help="The workload's name (or TENANT/NAME).")],
    tenant: TenantOpt = None,
    server: ServerOpt = None,
) -> None:
    """Admin: let a workload whose last attempt's outcome is unknown (its shim died without a
    record) count that attempt as failed, so its restart policy applies again (until then a job or
    an on-failure workload is not run again: it may have exited 0)."""
    tenant_, name = qualified(name, tenant, server)
    r = request("POST", server, f"/api/v1/workloads/{tenant_}/{name}/clear-unknown")
    if r.status_code == 404:
        raise fail(
            f"no workload {tenant_}/{name}", 1, _elsewhere(server, "workload", tenant_, name)
        )
    answer(r)
    console.print(
        f"{tenant_}/{name}: its unknown outcome counts as a failed attempt", highlight=False
    )


def logs_command(
    name: Annotated[str, typer.Argument(help="The workload's (or deployment's) name.")],
    tenant: TenantOpt = None,
    tail: Annotated[int, typer.Option("--tail", help="Last N lines (0: all).")] = 200,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new output until the workload ends."),
    ] = False,
    server: ServerOpt = None,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Pass control characters through to a terminal (by default they are shown as "
            "\\xNN there, so a workload's output cannot move the cursor or retitle the window).",
        ),
    ] = False,
) -> None:
    """Print a workload's output (its newest attempt); with -f, follow it across restarts. For a
    deployment, its replicas' output, each line prefixed with the replica's name."""
    show = _shown_as_is if raw or not sys.stdout.isatty() else _shown_escaped
    tenant_, name = qualified(name, tenant, server)
    r = request("GET", server, f"/api/v1/workloads/{tenant_}/{name}")
    if r.status_code == 404:
        d = request("GET", server, f"/api/v1/deployments/{tenant_}/{name}")
        if d.status_code != 200:
            hint = _elsewhere(server, "workload", tenant_, name)
            raise fail(f"no workload or deployment {tenant_}/{name}", 1, hint)
        _deployment_logs(server, tenant_, name, tail, follow, show)
        return
    answer(r)
    with contextlib.suppress(KeyboardInterrupt):
        _follow_logs(server, tenant_, name, tail, follow, prefix="", show=show)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _shown_escaped(line: str) -> str:
    """A workload's line made safe for a terminal: control characters (but tab) as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)


def _shown_as_is(line: str) -> str:
    return line


def _follow_logs(
    server: str | None,
    tenant: str,
    name: str,
    tail: int,
    follow: bool,
    *,
    prefix: str,
    show: Callable[[str], str] = _shown_as_is,
) -> None:
    from gpufrac.api.schemas import LogsAnswer, WorkloadDetail

    path = f"/api/v1/workloads/{tenant}/{name}"
    data = call_as(
        LogsAnswer, "GET", server, path + "/logs", params={"tail": 0 if follow else tail}
    )
    lines = data.lines
    if data.truncated:
        err_console.print(
            f"{prefix}(older output left out: the server answers the newest lines that fit its "
            "log_relay_max)",
            highlight=False,
            markup=False,
        )
    for line in lines[-tail:] if tail > 0 else lines:
        typer.echo(prefix + show(line))
    run, seen = data.run, len(lines)
    while follow:
        time.sleep(0.5)
        r = request("GET", server, path + "/logs", params={"tail": 0})
        if r.status_code in (429, 503, 504):  # busy, or its node slow: followed on after a wait
            time.sleep(_retry_after(r))
            continue
        latest = read_as(LogsAnswer, answer(r))
        lines = latest.lines
        if latest.run != run:  # a new attempt
            typer.echo(f"{prefix}--- {latest.run} ---")
            run, seen = latest.run, 0
        if seen > len(lines):  # the log rotated
            seen = 0
        for line in lines[seen:]:
            typer.echo(prefix + show(line))
        seen = len(lines)
        if call_as(WorkloadDetail, "GET", server, path).phase in ("succeeded", "failed"):
            break


def _retry_after(r: httpx.Response) -> float:
    """How long to wait before calling again: the answer's Retry-After (seconds), at most 5."""
    after = r.headers.get("retry-after", "")
    return min(5.0, float(after)) if after.isdigit() else 1.0


def _deployment_logs(
    server: str | None,
    tenant: str,
    name: str,
    tail: int,
    follow: bool,
    show: Callable[[str], str] = _shown_as_is,
) -> None:
    """The replicas' output; with ``follow``, replicas that come later are followed too."""
    from gpufrac.api.schemas import DeploymentDetail, LogsAnswer

    seen: dict[str, int] = {}
    runs: dict[str, str | None] = {}
    try:
        while True:
            dep = call_as(DeploymentDetail, "GET", server, f"/api/v1/deployments/{tenant}/{name}")
            replicas = [r.name for r in dep.replicas]
            if not replicas and not seen:
                err_console.print(
                    f"{tenant}/{name} has no replica now"
                    + (" (waiting for one)" if follow else ""),
                    highlight=False,
                )
            for replica in replicas:
                r = request(
                    "GET", server, f"/api/v1/workloads/{tenant}/{replica}/logs", params={"tail": 0}
                )
                if r.status_code in (429, 503, 504):  # busy, or its node slow: said, not fatal
                    said = f"[{replica}] {answer_detail(r)}"
                    err_console.print(said, highlight=False, markup=False)
                    continue
                if r.status_code != 200:
                    continue  # it went away meanwhile
                data = read_as(LogsAnswer, r.json())
                lines = data.lines
                if replica not in seen:
                    start = max(0, len(lines) - tail) if tail > 0 else 0
                elif runs.get(replica) != data.run or seen[replica] > len(lines):
                    start = 0
                else:
                    start = seen[replica]
                for line in lines[start:]:
                    typer.echo(f"[{replica}] {show(line)}")
                seen[replica], runs[replica] = len(lines), data.run
            if not follow:
                return
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass


GpuArg = Annotated[
    str, typer.Argument(help="GPU index or UUID (on a cluster: NODE/INDEX or NODE/UUID).")
]


def cordon_command(gpu: GpuArg, server: ServerOpt = None) -> None:
    """Stop placing new work on a GPU (what runs there stays)."""
    from gpufrac.api.schemas import Cordoned

    done = call_as(Cordoned, "POST", server, f"/api/v1/gpus/{gpu}/cordon")
    console.print(f"cordoned {done.cordoned}", highlight=False)


def uncordon_command(gpu: GpuArg, server: ServerOpt = None) -> None:
    """Let a GPU take new work again."""
    from gpufrac.api.schemas import Uncordoned

    r = call_as(Uncordoned, "POST", server, f"/api/v1/gpus/{gpu}/uncordon")
    console.print(
        f"uncordoned {r.uncordoned}; placed now: {', '.join(r.placed) or 'none'}", highlight=False
    )


def drain_command(gpu: GpuArg, server: ServerOpt = None, json: JsonOpt = False) -> None:
    """Cordon a GPU and move its workloads elsewhere."""
    from gpufrac.api.schemas import Drained

    got = call("POST", server, f"/api/v1/gpus/{gpu}/drain")
    r = read_as(Drained, got)
    if json:
        print_json(got)
        return
    for d in r.decisions:
        console.print(f"{d.workload}: {d.outcome} {d.reason or ' '.join(d.gpus)}", highlight=False)
    for x in r.displaced:  # what became of each workload it ran: moved, evicted, requeued
        console.print(f"  [yellow]{x.action}[/] {x.workload}: {x.reason}", highlight=False)
    console.print(f"drained {r.drained}", highlight=False)


def scale_command(
    name: Annotated[str, typer.Argument(help="The deployment's name.")],
    replicas: Annotated[int, typer.Option("--replicas", help="Replicas wanted (0 and up).")],
    tenant: TenantOpt = None,
    server: ServerOpt = None,
) -> None:
    """Set a deployment's replica count (with autoscale, the autoscaler goes on from there)."""
    from gpufrac.api.schemas import ScaleAnswer

    if replicas < 0:
        raise fail("--replicas: give 0 or more", 2)
    tenant_, name = qualified(name, tenant, server)
    r = request(
        "POST", server, f"/api/v1/deployments/{tenant_}/{name}/scale", json={"replicas": replicas}
    )
    if r.status_code == 404:
        raise fail(
            f"no deployment {tenant_}/{name}", 1, _elsewhere(server, "deployment", tenant_, name)
        )
    got = read_as(ScaleAnswer, answer(r))
    console.print(f"{tenant_}/{name}: {replicas} replica(s) wanted", highlight=False)
    for line in got.warnings or []:
        err_console.print(f"[yellow]warning[/]: {line}", highlight=False)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
