"""``gpufrac nodes list|approve|deny|revoke``: the admin's word on the nodes of a cluster
(docs/cluster.md, Admission). A node that joins with the cluster token waits, ``pending``, until an
admin approves it; nodes the control plane starts itself are approved at once."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufrac.cli.agent_client import ServerOpt, call, read_as
from gpufrac.cli.common import JsonOpt, console, print_json
from gpufrac.cli.tables import node_rows, table_text

nodes_app = typer.Typer(
    help="The nodes of a cluster: list them, and approve, deny or revoke those that asked to join.",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="The node's name, as gpufrac nodes list shows it.")]


@nodes_app.command("list")
def list_command(server: ServerOpt = None, json: JsonOpt = False) -> None:
    """Every node, those that wait for an admin's approval (pending) and those denied too."""
    from gpufrac.api.schemas import NodeList

    got = call("GET", server, "/api/v1/nodes")
    nodes = read_as(NodeList, got).nodes
    if json:
        print_json(got)
        return
    headers, rows = node_rows([n.model_dump() for n in nodes], wide=True)
    headers.append("GPU-CAP")
    for row, n in zip(rows, nodes, strict=True):
        row.append("-" if n.gpu_cap is None else str(n.gpu_cap))
    console.print(table_text(headers, rows), highlight=False)
    waiting = [n.name for n in nodes if n.state == "pending"]
    if waiting:
        console.print(
            f"{len(waiting)} node(s) wait for approval: gpufrac nodes approve NAME (or deny NAME)",
            highlight=False,
        )


def _judge(verdict: str, name: str, server: str | None, json: bool, **query: Any) -> None:
    from gpufrac.api.schemas import NodeJudged

    params = {k: v for k, v in query.items() if v is not None}
    got = call("POST", server, f"/api/v1/nodes/{name}/{verdict}", params=params)
    judged = read_as(NodeJudged, got)
    if json:
        print_json(got)
        return
    now = judged.now
    if now is None:
        console.print(f"node {name}: revoked (its credential no longer works)", highlight=False)
        return
    cap = "" if now.gpu_cap is None else f", at most {now.gpu_cap} GPU(s)"
    console.print(f"node {name}: {now.state}{cap}", highlight=False)


@nodes_app.command("approve")
def approve_command(
    name: NameArg,
    gpus: Annotated[
        int | None,
        typer.Option(
            "--gpus", min=0, help="The most of its GPUs it may bring (default: as it declared)."
        ),
    ] = None,
    server: ServerOpt = None,
    json: JsonOpt = False,
) -> None:
    """Let a pending node take work, secrets and traffic."""
    _judge("approve", name, server, json, gpus=gpus)


@nodes_app.command("deny")
def deny_command(name: NameArg, server: ServerOpt = None, json: JsonOpt = False) -> None:
    """Refuse a node: its joins are refused until it is revoked."""
    _judge("deny", name, server, json)


@nodes_app.command("revoke")
def revoke_command(name: NameArg, server: ServerOpt = None, json: JsonOpt = False) -> None:
    """Forget a node: its credential is revoked, its work placed elsewhere; it may ask again."""
    _judge("revoke", name, server, json)
