"""``gpufrac agent`` (the server) and the kubectl-style client commands that talk to it.

Client commands find the agent at ``--server``, else ``$GPUFRAC_SERVER``, else http://127.0.0.1:8470.
"""

from __future__ import annotations

import ipaddress
import json as jsonlib
import os
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.table import Table

from gpufrac.cli.common import (
    DataDirOpt,
    JsonOpt,
    SimulateOpt,
    console,
    fail,
    handled_errors,
    print_json,
)
from gpufrac.config import data_dir as resolve_data_dir
from gpufrac.errors import InputError

DEFAULT_PORT = 8470
ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server", help="The agent's address (default: $GPUFRAC_SERVER or http://127.0.0.1:8470)."
    ),
]
TenantOpt = Annotated[str, typer.Option("--tenant", "-t", help="The workload's tenant.")]


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
) -> None:
    """Run the node agent in the foreground: the control API, the scheduler, the reconcile loop,
    and (once there is a deployment) the request gateway."""
    import uvicorn

    from gpufrac.api.app import create_app
    from gpufrac.api.service import AgentService
    from gpufrac.api.tokens import load_tokens
    from gpufrac.cli.schedule import _settings
    from gpufrac.config import simulate_spec
    from gpufrac.devices import open_devices
    from gpufrac.runtime.agent import Agent

    with handled_errors():
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        data = resolve_data_dir(data_dir)
        tokens = load_tokens(tokens_file or data / "tokens.yaml")
        if tokens_file is not None and tokens is None:
            raise InputError(f"no tokens file {tokens_file}", field="--tokens")
        if not loopback and not tokens:
            raise InputError(
                f"refusing to listen on {host} without API tokens",
                field="--host",
                fix="give --tokens FILE, or listen on 127.0.0.1",
            )
        dev = open_devices(simulate_spec(simulate), data)
        agent = Agent(data, dev, _settings(settings_file, data_dir))
    service = AgentService(agent, gateway_port=gateway_port, gateway_host=gateway_host)
    auth = f", {len(tokens)} API token(s)" if tokens else ", no API tokens: loopback only"
    console.print(f"gpufrac agent on http://{host}:{port} (data: {data}{auth})", highlight=False)
    uvicorn.run(create_app(service, tokens=tokens), host=host, port=port, log_level="warning")


def find_agent(server: str | None, *, probe: bool = True) -> str | None:
    """The address of a running agent: the one named, else (with ``probe``) one answering on the
    default port."""
    named = server or os.environ.get("GPUFRAC_SERVER")
    if named:
        return named.rstrip("/")
    if not probe:
        return None
    url = f"http://127.0.0.1:{DEFAULT_PORT}"
    try:
        if httpx.get(url + "/api/v1/health", timeout=0.3).status_code == 200:
            return url
    except httpx.HTTPError:
        return None
    return None


def _server(server: str | None) -> str:
    return (
        server or os.environ.get("GPUFRAC_SERVER") or f"http://127.0.0.1:{DEFAULT_PORT}"
    ).rstrip("/")


def request(method: str, server: str | None, path: str, **kw: Any) -> httpx.Response:
    """One call to the agent, with the caller's token; an agent that cannot be reached is exit 2."""
    url = _server(server) + path
    token = os.environ.get("GPUFRAC_TOKEN")
    headers = {**kw.pop("headers", {}), **({"authorization": f"Bearer {token}"} if token else {})}
    try:
        return httpx.request(method, url, timeout=30, headers=headers, **kw)
    except httpx.HTTPError as e:
        raise fail(
            f"cannot reach the agent at {_server(server)} ({e})", 2, "start it with: gpufrac agent"
        ) from None


def answer_detail(r: httpx.Response) -> str:
    """The agent's explanation of a refusal, as one line."""
    try:
        detail = r.json().get("detail", r.text)
    except ValueError:
        return r.text
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}"
            + (f" ({d['fix']})" if d.get("fix") else "")
            for d in detail
            if isinstance(d, dict)
        )
    return str(detail)


def _call(method: str, server: str | None, path: str, **kw: Any) -> Any:
    r = request(method, server, path, **kw)
    if r.status_code == 422:
        detail = r.json().get("detail", [])
        msgs = [
            f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}"
            + (f" ({d['fix']})" if d.get("fix") else "")
            for d in detail
        ]
        raise fail("; ".join(msgs) or r.text, 2)
    if r.status_code == 409:
        raise fail(r.json().get("detail", "refused"), 1)
    if r.status_code in (401, 403, 404):
        raise fail(r.json().get("detail", "not found"), 1)
    if r.status_code >= 400:
        raise fail(f"the agent answered {r.status_code}: {r.text}", 1)
    return r.json()


def apply_command(
    file: Annotated[list[Path], typer.Option("--filename", "-f", help="Manifest file(s).")],
    server: ServerOpt = None,
    json: JsonOpt = False,
) -> None:
    """Apply manifests: create, replace (when changed) or leave unchanged."""
    results = []
    for path in file:
        try:
            text = path.read_text()
        except OSError as e:
            raise fail(f"-f: cannot read {path}: {e.strerror}", 2) from None
        results += _call(
            "POST",
            server,
            "/api/v1/workloads",
            content=text.encode(),
            headers={"content-type": "application/yaml"},
        )["results"]
    if json:
        print_json({"results": results})
        return
    for r in results:
        if r.get("kind") == "Deployment":
            console.print(
                f"deployment {r['deployment']} {r['result']}: {r['url']}", highlight=False
            )
            continue
        d = r["decision"] or {}
        detail = d.get("reason") or (
            f"{d.get('mode')} on {', '.join(d.get('gpus', []))}" if d.get("gpus") else ""
        )
        console.print(
            f"{r['workload']} {r['result']}" + (f": {d.get('outcome')} {detail}" if d else ""),
            highlight=False,
        )
        for line in r.get("diff", []):
            console.print(f"    [yellow]~[/] {line}", highlight=False)


def get_command(
    what: Annotated[str, typer.Argument(help="workloads, deployments or gpus")],
    server: ServerOpt = None,
    json: JsonOpt = False,
) -> None:
    """List workloads, deployments or GPUs."""
    if what not in ("workloads", "deployments", "gpus"):
        raise fail(f"cannot get {what!r}: use workloads, deployments or gpus", 2)
    data = _call("GET", server, f"/api/v1/{what}")
    if json:
        print_json(data)
        return
    if what == "deployments":
        from gpufrac.cli.serve_cmds import print_deployments

        print_deployments(data)
        return
    if what == "gpus":
        from gpufrac.cli.gpus import render_gpu
        from gpufrac.model.gpu import GpuState

        for g in data["gpus"]:
            console.print(render_gpu(_gpu_from_json(g, GpuState)))
        return
    t = Table()
    for col in ("tenant", "name", "phase", "restarts", "where", "reason"):
        t.add_column(col, overflow="fold")
    for w in data["workloads"]:
        p = w.get("placement") or {}
        where = f"{p.get('mode')} {' '.join(p.get('gpus', []))}".strip() if p.get("gpus") else ""
        t.add_row(w["tenant"], w["name"], w["phase"], str(w["restarts"]), where, w["reason"])
    console.print(t)


def _gpu_from_json(g: dict[str, Any], cls: Any) -> Any:
    from gpufrac.model.gpu import MigInstanceState, ProcessState

    return cls(
        uuid=g["uuid"], index=g["index"], name=g["name"], model=g["model"], pci_device_id=g["pci_device_id"],
        memory_total_mib=g["memory_total_mib"], memory_used_mib=g["memory_used_mib"], utilization_gpu=g.get("utilization_gpu"),
        mig_current=g["mig_mode"]["current"], mig_pending=g["mig_mode"]["pending"],
        instances=tuple(MigInstanceState(i["profile"], i["start"], i["gi_id"], i["uuid"], i["busy"], i.get("memory_mib"), tuple(i.get("ci_ids", ()))) for i in g["instances"]),
        processes=tuple(ProcessState(p["pid"], p["used_memory_mib"], p.get("gi_id")) for p in g["processes"]),
        simulated=g.get("simulated", False), health=g.get("health", "ok"),
    )  # fmt: skip


def describe_command(
    kind: Annotated[str, typer.Argument(help="workload or deployment")],
    name: Annotated[str, typer.Argument(help="The workload's name.")],
    tenant: TenantOpt = "default",
    server: ServerOpt = None,
    json: JsonOpt = False,
) -> None:
    """Everything about one workload: placement, environment handed over, attempts, events."""
    if kind not in ("workload", "deployment"):
        raise fail(f"cannot describe {kind!r}: use workload or deployment", 2)
    w = _call("GET", server, f"/api/v1/{kind}s/{tenant}/{name}")
    if kind == "deployment":
        from gpufrac.cli.serve_cmds import print_deployment

        print_json(w) if json else print_deployment(w)
        return
    if json:
        print_json(w)
        return
    console.print(
        f"[bold]{w['tenant']}/{w['name']}[/] generation {w['generation']}: {w['phase']} {w['reason']}",
        highlight=False,
    )
    console.print(
        f"attempts {w['attempts']}, restarts {w['restarts']}, last exit {w['exit_code']}",
        highlight=False,
    )
    console.print("placement: " + jsonlib.dumps(w["placement"]), highlight=False)
    q = w.get("qos") or {}
    if q:
        console.print(
            f"qos: class {q['class']} (priority {q['priority']}, {q['qos']}), weight {q['weight']}, "
            f"min share {q['min_share']:.0%}, {q.get('mode') or 'not arbitrated (alone on its GPU)'}"
            + (", paused now" if q.get("paused") else ""),
            highlight=False,
        )
        console.print(f"share of its GPU: {_share_text(q)}", highlight=False)
    for k, v in sorted(w["env"].items()):
        console.print(f"  {k}={v}", highlight=False)
    for e in w.get("events", []):
        console.print(f"  event {e['kind']}: {e['message']}", highlight=False)


def _share_text(q: dict[str, Any]) -> str:
    measured = q.get("measured_share")
    by = {"nvml": "NVML per-process SM use", "sdk": "the SDK's CUDA-event timings"}
    text = (
        f"measured {measured:.0%} ({by.get(q.get('measured_by') or '', q.get('measured_by'))})"
        if measured is not None
        else "not measured (no NVML per-process reading and no SDK timings)"
    )
    if q.get("arbiter_share") is not None:
        text += f"; the arbiter gave it {q['arbiter_share']:.0%} of the turns' time"
    return text


def delete_command(
    name: Annotated[str, typer.Argument(help="The workload's (or deployment's) name.")],
    tenant: TenantOpt = "default",
    deployment: Annotated[
        bool, typer.Option("--deployment", help="Delete the deployment NAME and its replicas.")
    ] = False,
    server: ServerOpt = None,
) -> None:
    """Delete a workload (its processes are stopped), or with --deployment a deployment."""
    kind = "deployments" if deployment else "workloads"
    _call("DELETE", server, f"/api/v1/{kind}/{tenant}/{name}")
    console.print(f"{tenant}/{name} deleted")


def logs_command(
    name: Annotated[str, typer.Argument(help="The workload's name.")],
    tenant: TenantOpt = "default",
    tail: Annotated[int, typer.Option("--tail", help="Last N lines (0: all).")] = 200,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new output until the workload ends."),
    ] = False,
    server: ServerOpt = None,
) -> None:
    """Print a workload's output (its newest attempt); with -f, follow it across restarts."""
    path = f"/api/v1/workloads/{tenant}/{name}"
    data = _call("GET", server, path + "/logs", params={"tail": 0 if follow else tail})
    lines = data["lines"]
    for line in lines[-tail:] if tail > 0 else lines:
        typer.echo(line)
    run, seen = data["run"], len(lines)
    try:
        while follow:
            time.sleep(0.5)
            latest = _call("GET", server, path + "/logs", params={"tail": 0})
            lines = latest["lines"]
            if latest["run"] != run:  # a new attempt
                typer.echo(f"--- {latest['run']} ---")
                run, seen = latest["run"], 0
            if seen > len(lines):  # the log rotated
                seen = 0
            for line in lines[seen:]:
                typer.echo(line)
            seen = len(lines)
            if _call("GET", server, path)["phase"] in ("succeeded", "failed"):
                break
    except KeyboardInterrupt:
        pass


GpuArg = Annotated[str, typer.Argument(help="GPU index or UUID.")]


def cordon_command(gpu: GpuArg, server: ServerOpt = None) -> None:
    """Stop placing new work on a GPU (what runs there stays)."""
    console.print(
        f"cordoned {_call('POST', server, f'/api/v1/gpus/{gpu}/cordon')['cordoned']}",
        highlight=False,
    )


def uncordon_command(gpu: GpuArg, server: ServerOpt = None) -> None:
    """Let a GPU take new work again."""
    r = _call("POST", server, f"/api/v1/gpus/{gpu}/uncordon")
    console.print(
        f"uncordoned {r['uncordoned']}; placed now: {', '.join(r['placed']) or 'none'}",
        highlight=False,
    )


def drain_command(gpu: GpuArg, server: ServerOpt = None, json: JsonOpt = False) -> None:
    """Cordon a GPU and move its workloads elsewhere."""
    r = _call("POST", server, f"/api/v1/gpus/{gpu}/drain")
    if json:
        print_json(r)
        return
    for d in r["decisions"]:
        console.print(
            f"{d['workload']}: {d['outcome']} {d['reason'] or ' '.join(d['gpus'])}", highlight=False
        )
    console.print(f"drained {r['drained']}", highlight=False)


def scale_command(
    name: Annotated[str, typer.Argument(help="The deployment's name.")],
    replicas: Annotated[int, typer.Option("--replicas", help="Replicas wanted (0 and up).")],
    tenant: TenantOpt = "default",
    server: ServerOpt = None,
) -> None:
    """Set a deployment's replica count (with autoscale, the autoscaler goes on from there)."""
    if replicas < 0:
        raise fail("--replicas: give 0 or more", 2)
    _call(
        "POST",
        server,
        f"/api/v1/deployments/{tenant}/{name}/scale",
        json={"replicas": replicas},
    )
    console.print(f"{tenant}/{name}: {replicas} replica(s) wanted", highlight=False)
