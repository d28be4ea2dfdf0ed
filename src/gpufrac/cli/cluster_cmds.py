"""``gpufrac control`` and ``gpufrac node``: gpufrac on several machines (docs/cluster.md).

``control`` serves the control plane (the scheduler over every node's GPUs, desired state in its
store, the users' API) and, every half second, holds lost the nodes whose lease ran out. ``node``
runs one machine's agent under it: its GPUs, its processes, a heartbeat each second. Both take the
cluster token from a file (``--cluster-token``; ``control`` writes a new one there if it is
missing), which every call between them carries.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from gpufrac.cli.common import (
    DataDirOpt,
    SimulateOpt,
    console,
    err_console,
    handled_errors,
)
from gpufrac.cluster.node import die_with_parent
from gpufrac.config import data_dir as resolve_data_dir
from gpufrac.errors import InputError
from gpufrac.serving.deployments import DEFAULT_GATEWAY_PORT

TOKEN_FILE = "cluster-token"
CONTROL_PORT = 8470

TokenOpt = Annotated[
    Path | None,
    typer.Option(
        "--cluster-token",
        help="File holding the cluster token (default: cluster-token in the data directory).",
    ),
]


def read_cluster_token(path: Path, *, create: bool) -> str:
    """The token in ``path``; ``create``: write a new one (mode 0600) if there is none."""
    if not path.exists():
        if not create:
            raise InputError(
                f"no cluster token file {path}",
                field="--cluster-token",
                fix="copy the control plane's cluster-token file here (it writes one when it "
                "first starts)",
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    token = path.read_text().strip()
    if len(token) < 16:
        raise InputError(
            f"the cluster token in {path} is too short ({len(token)} characters)",
            field="--cluster-token",
            fix="use at least 16 random characters (remove the file to have one made)"
            if create
            else "copy the control plane's cluster-token file here",
        )
    return token


def control_command(
    host: Annotated[
        str,
        typer.Option("--host", help="Address to listen on (beyond loopback only with API tokens)."),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = CONTROL_PORT,
    gateway_port: Annotated[
        int,
        typer.Option(
            "--gateway-port",
            help="Port of the request gateway for the cluster's deployments (on --host).",
        ),
    ] = DEFAULT_GATEWAY_PORT,
    cluster_token: TokenOpt = None,
    lease: Annotated[
        float, typer.Option("--lease", help="Seconds a node's lease lasts (at least 3).")
    ] = 6.0,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="A Ray cluster's address (HOST:PORT): a node agent is started on each of its "
            "nodes labelled gpufrac.io/node=NAME (docs/cluster.md).",
        ),
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(
            "--advertise",
            help="The URL node agents reach this control plane at (default: http://HOST:PORT; "
            "give it when listening on 0.0.0.0).",
        ),
    ] = None,
    node_data_dir: Annotated[
        str,
        typer.Option(
            "--node-data-dir",
            help="With --ray: where each node agent keeps its state, on its own machine "
            "(a directory per node name under it).",
        ),
    ] = "/var/lib/gpufrac/nodes",
    local: Annotated[
        int,
        typer.Option(
            "--local",
            help="Also start this many node agents on this machine, each with its own simulated "
            "GPUs (for trying a cluster out): a MIG node, a time-sliced node, ...",
        ),
    ] = 0,
    data_dir: DataDirOpt = None,
) -> None:
    """Run the control plane of a cluster in the foreground: node agents (`gpufrac node`) join
    it, and the usual commands (`apply`, `get`, `delete`, with --server) work against it."""
    import uvicorn

    from gpufrac.api.head_timeout import HeadTimeoutProtocol
    from gpufrac.api.history import History
    from gpufrac.api.tokens import load_tokens
    from gpufrac.cli.agent_cmds import _is_loopback
    from gpufrac.cluster.control import ControlPlane
    from gpufrac.cluster.control_api import create_control_app
    from gpufrac.cluster.history import ClusterSampler
    from gpufrac.cluster.serving import ClusterServing
    from gpufrac.model.settings import load_settings

    with handled_errors():
        if lease < 3:
            raise InputError(
                f"a lease of {lease:g} s is too short", field="--lease", fix="give 3 or more"
            )
        data = resolve_data_dir(data_dir)
        token = read_cluster_token(cluster_token or data / TOKEN_FILE, create=True)
        tokens = load_tokens(data / "tokens.yaml")
        if not _is_loopback(host) and not tokens:
            raise InputError(
                f"refusing to listen on {host} without API tokens",
                field="--host",
                fix="put a tokens.yaml in the data directory, or listen on 127.0.0.1",
            )
        if not 0 <= local <= 16:
            raise InputError(f"--local {local}", field="--local", fix="give 0 to 16 nodes")
        control = ControlPlane(data, load_settings(data), lease_s=lease)
    serving = ClusterServing(
        control,
        gateway_port=gateway_port,
        gateway_host=host,
        tokens=None if tokens is None else {t: c.tenant for t, c in tokens.items()},
    )
    history = History(ClusterSampler(control, serving).read)  # the dashboard's plots
    history.start()
    app = create_control_app(
        control, cluster_token=token, tokens=tokens, serving=serving, history=history
    )
    url = advertise or f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    nodes = [_local_node(data, token, url, i) for i in range(local)]
    stop = threading.Event()

    def ticks() -> None:
        while not stop.wait(0.5):
            for m in control.tick():
                err_console.print(
                    f"node {m.lost} lost: {m.workload} "
                    + (f"moved to {m.to}" if m.to else f"waits ({m.reason})"),
                    highlight=False,
                )

    def serve() -> None:
        """Keep the deployments' replicas and the gateway in step with the cluster."""
        while not stop.is_set():
            try:
                serving.reconcile()
            except Exception as e:  # one bad pass is said, and the next one tried
                err_console.print(f"[yellow]warning:[/] deployments pass: {e}", highlight=False)
            serving.wait(0.5)

    threading.Thread(target=ticks, daemon=True, name="gpufrac-control-ticks").start()
    threading.Thread(target=serve, daemon=True, name="gpufrac-control-serving").start()
    if ray_address is not None:
        from gpufrac.cluster.ray_nodes import RayNodes

        def ray_sync() -> None:
            """Connect to Ray off the main thread (the API answers meanwhile: a restarted control
            plane must answer its nodes within their fencing time), then keep an agent on each
            labelled node."""
            try:
                on_ray = RayNodes(ray_address, url, token, node_data_dir)
            except (ImportError, ConnectionError) as e:
                err_console.print(
                    f"[bold red]error:[/] --ray {ray_address}: {e} (pip install 'gpufrac[ray]', "
                    "and give a running Ray cluster's address)",
                    highlight=False,
                )
                return
            while True:
                for name in on_ray.sync():
                    console.print(f"  node agent started on Ray node {name}", highlight=False)
                if stop.wait(5.0):
                    return

        threading.Thread(target=ray_sync, daemon=True, name="gpufrac-ray-nodes").start()
    console.print(
        f"gpufrac control plane on http://{host}:{port} (data: {data}, lease {lease:g} s)",
        highlight=False,
    )
    for i, proc in enumerate(nodes):
        console.print(f"  local node local-{i} (pid {proc.pid}): {LOCAL_KINDS[i % 3][0]}")
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", http=HeadTimeoutProtocol)
    finally:
        stop.set()
        history.stop()
        serving.wake()
        with control.lock:
            serving.close()
        for proc in nodes:
            proc.terminate()
        for proc in nodes:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        control.close()


# what each local node simulates, in turn: (what it is, its GPUs, its labels)
LOCAL_KINDS = (
    ("one H200 in MIG mode", "h200:1:mig", "gpufrac.io/kind=mig"),
    ("one H200 for MPS shares", "h200:1", "gpufrac.io/kind=mps"),
    ("two H200s, time-sliced (and room for a replica)", "h200:2", "gpufrac.io/kind=timeslice"),
)


def _local_node(data: Path, token: str, url: str, i: int) -> subprocess.Popen[bytes]:
    """Start node ``local-i`` under ``data/nodes/local-i`` with the cluster token (its log is
    ``node.log`` there); it stops when the control plane does."""
    where = data / "nodes" / f"local-{i}"
    where.mkdir(parents=True, exist_ok=True)
    token_file = where / TOKEN_FILE
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    _, gpus, label = LOCAL_KINDS[i % len(LOCAL_KINDS)]
    settings = where / "gpufrac.yaml"
    if not settings.exists():
        settings.write_text("workload_users: agent\n")
    args = [sys.executable, "-m", "gpufrac.cli", "node", "--control", url]
    args += ["--name", f"local-{i}", "--simulate", gpus, "--label", label]
    with open(where / "node.log", "ab") as log:
        return subprocess.Popen(
            [*args, "--data-dir", str(where)],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )


def node_command(
    control: Annotated[
        str, typer.Option("--control", help="The control plane's URL (http://HOST:8470).")
    ],
    cluster_token: TokenOpt = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="This node's name (default: node.name in gpufrac.yaml)."),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option("--label", help="A label KEY=VALUE for this node (repeatable)."),
    ] = None,
    listen: Annotated[
        str,
        typer.Option(
            "--listen",
            help="Address of this node's own small API (workload logs, for the control plane "
            "only); a free port is taken.",
        ),
    ] = "127.0.0.1",
    simulate: SimulateOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Run this machine's agent as a node of a cluster, in the foreground: it joins the control
    plane, runs what it is given on this machine's GPUs, and stops everything if the control plane
    goes unanswered for longer than its lease allows (docs/cluster.md)."""
    from dataclasses import replace

    from gpufrac.cluster.node import CREDENTIAL_FILE, HttpLink, NodeAgent
    from gpufrac.cluster.node_api import create_node_app, serve_in_thread
    from gpufrac.config import simulate_spec
    from gpufrac.devices import open_devices
    from gpufrac.model.settings import load_settings
    from gpufrac.runtime.agent import Agent

    with handled_errors():
        data = resolve_data_dir(data_dir)
        token = read_cluster_token(cluster_token or data / TOKEN_FILE, create=False)
        settings = load_settings(data)
        labels = dict(settings.node_labels)
        for item in label or []:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise InputError(f"{item!r} is not KEY=VALUE", field="--label", fix="zone=eu")
            labels[key] = value
        settings = replace(settings, node_name=name or settings.node_name, node_labels=labels)
        dev = open_devices(simulate_spec(simulate), data)
        # a cluster is shared by tenants: workload_users auto runs them as their tenants' own users
        # (when root), never as this agent, which holds the cluster token
        agent = Agent(data, dev, settings, tokens_in_use=True)
    if agent.sandbox.mode == "agent":
        err_console.print(
            "[yellow]warning:[/] workloads run as this node agent's user (workload_users: agent, "
            "or not root): any workload can read the cluster token in the data directory and "
            "speak for any node; run the node agent as root with workload_users auto or tenant "
            "(docs/cluster.md)",
            highlight=False,
        )
    link = HttpLink(control, token, data / CREDENTIAL_FILE)
    if listen not in ("0.0.0.0", "::"):  # where its deployments' replicas listen for the gateway
        agent.handover.listen_host = listen
    server, port = serve_in_thread(create_node_app(agent, lambda: link.credential), listen, 0)
    link.address = f"http://{listen}:{port}"
    node = NodeAgent(
        agent, link, say=lambda m: console.print(f"{agent.node}: {m}", highlight=False)
    )
    console.print(f"gpufrac node {agent.node} under {control} (data: {data})", highlight=False)
    try:
        while True:
            started = time.monotonic()
            node.step()
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
    finally:
        server.should_exit = True
        agent.close()
        sys.stdout.flush()
