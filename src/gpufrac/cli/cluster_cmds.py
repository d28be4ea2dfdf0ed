"""``gpufrac control`` and ``gpufrac node``: gpufrac on several machines (docs/cluster.md).

``control`` serves the control plane (the scheduler over every node's GPUs, desired state in its
store, the users' API) and, every half second, holds lost the nodes whose lease ran out. ``node``
runs one machine's agent under it: its GPUs, its processes, a heartbeat each second. Both take the
cluster token from a file (``--cluster-token``; ``control`` writes a new one there if it is
missing), which every call between them carries.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer

from gpufrac.cli.common import (
    DataDirOpt,
    SimulateOpt,
    console,
    err_console,
    handled_errors,
    note_preemption_default,
    serve_http,
)
from gpufrac.config import DEFAULT_GATEWAY_PORT
from gpufrac.config import data_dir as resolve_data_dir
from gpufrac.errors import InputError

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
    port: Annotated[
        int, typer.Option("--port", help="Port of the users' API (the CLI's --server).")
    ] = CONTROL_PORT,
    node_port: Annotated[
        int | None,
        typer.Option(
            "--node-port",
            help="Port node agents call (joins, heartbeats; on --host), apart from the users' "
            "API so no user request delays them. Default: --port + 1.",
        ),
    ] = None,
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
            help="The URL node agents reach this control plane's node port at (default: "
            "http://HOST:NODE_PORT; give it when listening on 0.0.0.0).",
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

    from gpufrac.api.tokens import load_tokens
    from gpufrac.cli.agent_cmds import _is_loopback
    from gpufrac.cluster.control import ControlPlane
    from gpufrac.cluster.control_api import create_control_app, create_node_listener_app
    from gpufrac.cluster.history import ClusterSampler
    from gpufrac.cluster.node_api import serve_in_thread
    from gpufrac.cluster.serving import ClusterServing
    from gpufrac.model.settings import load_settings
    from gpufrac.runtime.history import History

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
        node_port = port + 1 if node_port is None else node_port
        if node_port == port or not 0 < node_port < 65536:
            raise InputError(
                f"--node-port {node_port}",
                field="--node-port",
                fix=f"give a free port from 1 to 65535 other than --port {port}",
            )
        if not 0 <= local <= 16:
            raise InputError(f"--local {local}", field="--local", fix="give 0 to 16 nodes")
        cfg = load_settings(data)
        for line in cfg.warnings:
            err_console.print(f"[yellow]warning[/]: {line}", highlight=False)
        control = ControlPlane(data, cfg, lease_s=lease)
        known = [c.tenant for c in (tokens or {}).values()] + control.store.tenants()
        note_preemption_default(control.settings, known)
    serving = ClusterServing(
        control,
        gateway_port=gateway_port,
        gateway_host=host,
        url_host=urlsplit(advertise).hostname if advertise else None,
        tokens=None if tokens is None else {t: c.tenant for t, c in tokens.items()},
    )
    history = History(ClusterSampler(control, serving).read)  # the dashboard's plots
    history.start()
    app = create_control_app(
        control, tokens=tokens, serving=serving, history=history, node_port=node_port
    )
    with handled_errors():
        try:  # first: a restarted control plane answers its nodes before anything else
            node_listener, _ = serve_in_thread(
                create_node_listener_app(control, cluster_token=token),
                host,
                node_port,
                name="gpufrac-node-listener",
            )
        except OSError as e:
            raise InputError(
                f"cannot listen on {host}:{node_port} for nodes ({e.strerror or e})",
                field="--node-port",
                fix="give a free port (--node-port N), or stop what holds it",
            ) from None
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url = advertise or f"http://{shown_host}:{node_port}"
    nodes = LocalNodes(data, token, url, local, control.bootstrap)
    stop = threading.Event()

    def ticks() -> None:
        n = 0
        while not stop.wait(0.5):
            for m in control.tick():
                err_console.print(
                    f"node {m.lost} lost: {m.workload} "
                    + (f"moved to {m.to}" if m.to else f"waits ({m.reason})"),
                    highlight=False,
                )
            n += 1
            if n % 4 == 0:  # every 2 s: a local node that exited is started again
                for said in nodes.keep():
                    err_console.print(f"  {said}", highlight=False)

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
    on_ray: list[Any] = []  # the RayNodes, once connected: stopped with the control plane
    if ray_address is not None:
        from gpufrac.cluster.ray_nodes import RayNodes

        def ray_sync() -> None:
            """Connect to Ray off the main thread (the API answers meanwhile: a restarted control
            plane must answer its nodes within their fencing time), then keep an agent on each
            labelled node."""
            try:
                ray_nodes = RayNodes(ray_address, url, token, node_data_dir, control.bootstrap)
            except (ImportError, ConnectionError) as e:
                err_console.print(
                    f"[bold red]error:[/] --ray {ray_address}: {e} (pip install 'gpufrac[ray]', "
                    "and give a running Ray cluster's address)",
                    highlight=False,
                )
                return
            on_ray.append(ray_nodes)
            while True:
                for name in ray_nodes.sync():
                    console.print(f"  node agent started on Ray node {name}", highlight=False)
                if stop.wait(5.0):
                    return

        threading.Thread(target=ray_sync, daemon=True, name="gpufrac-ray-nodes").start()
    console.print(
        f"gpufrac control plane on http://{host}:{port} (data: {data}, lease {lease:g} s); "
        f"nodes join at {url}",
        highlight=False,
    )
    for said in nodes.said:
        console.print(f"  {said}", highlight=False)
    try:
        serve_http(app, host, port, name="gpufrac control")
    finally:
        stop.set()
        node_listener.should_exit = True
        history.stop()
        serving.wake()
        with control.lock:
            serving.close()
        nodes.stop()
        for ray_nodes in on_ray:  # not when killed (kill -9): they go on, fenced, taken over
            stopped = ray_nodes.stop()
            err_console.print(
                f"  node agents stopped on Ray nodes: {', '.join(sorted(stopped)) or 'none'}",
                highlight=False,
            )
        control.close()


RETRY_S = 0.2  # a node's heartbeat to a control plane it cannot reach, again, between steps

# what each local node simulates, in turn: (what it is, its GPUs, its labels)
LOCAL_KINDS = (
    ("one H200 in MIG mode", "h200:1:mig", "gpufrac.io/kind=mig"),
    ("one H200 for MPS shares", "h200:1", "gpufrac.io/kind=mps"),
    ("two H200s, time-sliced (and room for a replica)", "h200:2", "gpufrac.io/kind=timeslice"),
)


class LocalNodes:
    """The node agents ``--local`` runs on this machine, each under ``DATA/nodes/local-I`` (its
    log in ``node.log`` there), kept running: one that exits is started again, and one still
    running from before (the control plane was killed and started again) is taken over, not
    started twice, so a restart of the control plane restarts no workload. Stopped with the
    control plane (``stop``), unless that is killed (``kill -9``): they go on, fenced once the
    control plane has not answered for two thirds of their lease."""

    def __init__(
        self, data: Path, token: str, url: str, count: int, bootstrap: Callable[[str], str]
    ) -> None:
        self.data, self.token, self.url = data, token, url
        self.bootstrap = bootstrap  # a node's own credential, approved at once
        self.procs: dict[int, subprocess.Popen[bytes] | None] = {}  # None: taken over
        self.pids: dict[int, int] = {}
        self.said = [said for i in range(count) if (said := self._ensure(i)) is not None]

    def _where(self, i: int) -> Path:
        return self.data / "nodes" / f"local-{i}"

    def _running_pid(self, i: int) -> int | None:
        """The pid of a node agent already running in local-I's directory (its lock held)."""
        from gpufrac.devices.simfleet import pid_alive

        where = self._where(i)
        try:
            with open(where / "agent.lock", "a+") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pid = int((where / "node.pid").read_text())
                    return pid if pid_alive(pid) else None
                fcntl.flock(f, fcntl.LOCK_UN)
        except (OSError, ValueError):
            return None
        return None

    def _ensure(self, i: int) -> str | None:
        """Start local-I if it is not running; what happened, to say, or None."""
        from gpufrac.devices.simfleet import pid_alive

        proc = self.procs.get(i)
        if proc is not None and proc.poll() is None:
            return None
        if proc is None and i in self.pids and pid_alive(self.pids[i]):
            return None
        gone = (
            f"exited ({proc.returncode})"
            if proc is not None
            else "is gone"
            if i in self.pids
            else None
        )
        running = self._running_pid(i)
        if running is not None:
            self.procs[i], self.pids[i] = None, running
            return f"local node local-{i} (pid {running}): running from before, taken over"
        started = self._start(i)
        self.procs[i], self.pids[i] = started, started.pid
        what = LOCAL_KINDS[i % len(LOCAL_KINDS)][0]
        if gone is None:
            return f"local node local-{i} (pid {started.pid}): {what}"
        return f"local node local-{i} {gone}: started again (pid {started.pid})"

    def _start(self, i: int) -> subprocess.Popen[bytes]:
        where = self._where(i)
        where.mkdir(parents=True, exist_ok=True)
        token_file = where / TOKEN_FILE
        token_file.write_text(self.token + "\n")
        token_file.chmod(0o600)
        from gpufrac.cluster.node import CREDENTIAL_FILE

        fd = os.open(where / CREDENTIAL_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:  # its own credential, approved at once
            f.write(self.bootstrap(f"local-{i}") + "\n")
        _, gpus, label = LOCAL_KINDS[i % len(LOCAL_KINDS)]
        settings = where / "gpufrac.yaml"
        if not settings.exists():
            settings.write_text("workload_users: agent\n")
        args = [sys.executable, "-m", "gpufrac.cli", "node", "--control", self.url]
        args += ["--name", f"local-{i}", "--simulate", gpus, "--label", label]
        with open(where / "node.log", "ab") as log:
            proc = subprocess.Popen(
                [*args, "--data-dir", str(where)],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # stopped by the control plane, not by the terminal's ^C
            )
        (where / "node.pid").write_text(f"{proc.pid}\n")
        return proc

    def keep(self) -> list[str]:
        """Start again the nodes that exited; what was done, to say."""
        return [said for i in list(self.pids) if (said := self._ensure(i)) is not None]

    def stop(self) -> None:
        from gpufrac.devices.simfleet import pid_alive

        for i, pid in self.pids.items():
            proc = self.procs.get(i)
            with contextlib.suppress(ProcessLookupError):
                if proc is not None:
                    proc.terminate()
                elif pid_alive(pid):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for i, pid in self.pids.items():
            proc = self.procs.get(i)
            if proc is not None:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
            else:
                while pid_alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                with contextlib.suppress(ProcessLookupError):
                    if pid_alive(pid):
                        os.kill(pid, signal.SIGKILL)


def node_command(
    control: Annotated[
        str,
        typer.Option(
            "--control",
            help="The control plane's node listener (http://HOST:8471, its --node-port).",
        ),
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

    from gpufrac.cluster.node import CREDENTIAL_FILE, HttpLink, NodeAgent, Refused
    from gpufrac.cluster.node_api import create_node_app, serve_in_thread
    from gpufrac.config import simulate_spec
    from gpufrac.devices import open_devices
    from gpufrac.model.settings import load_settings
    from gpufrac.runtime.agent import Agent

    with handled_errors():
        data = resolve_data_dir(data_dir)
        token = read_cluster_token(cluster_token or data / TOKEN_FILE, create=False)
        settings = load_settings(data)
        for line in settings.warnings:
            err_console.print(f"[yellow]warning[/]: {line}", highlight=False)
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
            "[yellow]warning:[/] workloads run as this node agent's user (workload_users: agent "
            "in gpufrac.yaml, or an agent that is not root): any workload can read the cluster "
            "token and this node's credential in its data directory, join fake nodes and speak "
            "for this one; run it as root with workload_users auto or tenant (docs/cluster.md)",
            highlight=False,
        )
    elif agent.sandbox.python.problem is not None:
        err_console.print(
            f"[yellow]warning:[/] {sys.executable} cannot be run by other users"
            f" ({agent.sandbox.python.problem}): workloads that run it as their tenant's user"
            " (a model: deployment's replicas) cannot start; install Python and gpufrac where"
            " every user can run them (docs/cluster.md)",
            highlight=False,
        )
    link = HttpLink(control, token, data / CREDENTIAL_FILE)
    if listen not in ("0.0.0.0", "::"):  # where its deployments' replicas listen for the gateway
        agent.handover.listen_host = listen
    node = NodeAgent(
        agent, link, say=lambda m: console.print(f"{agent.node}: {m}", highlight=False)
    )
    app = create_node_app(agent, lambda: link.credential, lambda: node.last_states)
    server, port = serve_in_thread(app, listen, 0)
    link.address = f"http://{listen}:{port}"
    console.print(f"gpufrac node {agent.node} under {control} (data: {data})", highlight=False)
    failing = ""  # the last step's failure, said once
    try:
        while True:
            started = time.monotonic()
            try:
                node.step()
                # a control plane that cannot be reached (restarting, say) is called again every
                # RETRY_S until the next step: answered as soon as it listens, well within the
                # fencing time even where a pass is slow
                while node.unreachable and time.monotonic() - started < 1.0 - RETRY_S:
                    time.sleep(RETRY_S)
                    node.heartbeat(node.last_states)
                failing = ""
            except (KeyboardInterrupt, Refused):
                raise
            except Exception as e:  # a full disk, say: one bad step must not end the node (its
                # work would stop with its lease); said once, and the next step tried
                if str(e) != failing:
                    err_console.print(f"[yellow]warning:[/] node step: {e}", highlight=False)
                failing = str(e)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
    except Refused as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(2) from None
    finally:
        server.should_exit = True
        agent.close()
        sys.stdout.flush()
