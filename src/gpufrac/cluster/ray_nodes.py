"""Node agents on a Ray cluster's nodes: Ray gives the membership and the process runtime, gpufrac
the fractions.

Every alive Ray node labelled ``gpufrac.io/node=NAME`` (``ray start --labels``) gets one node agent:
a detached Ray actor pinned to that node (``NodeAffinitySchedulingStrategy``, not soft) that runs
``gpufrac node --control URL --name NAME`` as its child, restarts it if it exits, and ends it when
the actor ends (the child gets SIGTERM when its parent dies: ``ray stop`` on that node, or the
node's end, ends its agent too). The control plane calls ``sync`` every few seconds, so a node
that joins Ray later, or comes back, gets its agent too. A control plane that stops cleanly (^C,
SIGTERM) stops them (``stop``), as it stops its ``--local`` nodes; one that is killed (``kill
-9``) leaves them running, fenced once it has not answered for two thirds of their lease, and
taken over (not started twice: the actor's name is the node's) when it is back. A node
labelled ``gpufrac.io/simulate=SPEC`` runs on simulated GPUs, for trying a cluster out on one
machine: SPEC is ``--simulate``'s with dots for colons, which Ray's label values cannot hold
(``h200.1.mig`` for ``h200:1:mig``). Its other labels (but Ray's own, ``ray.io/...``) become the
node's labels.

Leases, fencing and epochs are gpufrac's own (docs/cluster.md): Ray's node-death detection is not
waited for, and Ray's resources are not used for fractions.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NODE_LABEL = "gpufrac.io/node"
SIMULATE_LABEL = "gpufrac.io/simulate"
NAMESPACE = "gpufrac"


@dataclass(frozen=True, slots=True)
class RayNode:
    node_id: str
    name: str
    labels: dict[str, str]
    address: str = "127.0.0.1"  # the node's own address in Ray (its node agent listens there)


def labelled_nodes() -> list[RayNode]:
    """The alive Ray nodes labelled for gpufrac (``ray.init`` done by the caller)."""
    import ray

    out = []
    for n in ray.nodes():  # type: ignore[no-untyped-call]
        labels = n.get("Labels") or {}
        if n.get("Alive") and labels.get(NODE_LABEL):
            address = str(n.get("NodeManagerAddress") or "127.0.0.1")
            out.append(RayNode(n["NodeID"], labels[NODE_LABEL], dict(labels), address))
    return out


class AgentHost:
    """The actor on one Ray node: keeps ``gpufrac node`` running there as its child."""

    def __init__(
        self, args: list[str], data_dir: str, token: str, simulated: bool, credential: str
    ) -> None:
        self.args = args
        self.data = Path(data_dir)
        self.data.mkdir(parents=True, exist_ok=True)
        token_file = self.data / "cluster-token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        # its own credential, made by the control plane that starts it: approved at once
        fd = os.open(self.data / "node-credential", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(credential + "\n")
        settings = self.data / "gpufrac.yaml"
        if simulated and not settings.exists():  # trying it out: workloads run as this user
            settings.write_text("workload_users: agent\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.stopping = False
        self._start()
        threading.Thread(target=self._keep, daemon=True).start()

    def _start(self) -> None:
        from gpufrac.cluster.node import die_with_parent

        log = open(self.data / "node.log", "ab")  # noqa: SIM115 (the child writes to it)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpufrac.cli", "node", *self.args, "--data-dir", str(self.data)],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        self.starts += 1

    def _keep(self) -> None:
        while True:
            time.sleep(1.0)
            if not self.stopping and self.proc is not None and self.proc.poll() is not None:
                self._start()  # it exited: again, a second later

    def info(self) -> dict[str, Any]:
        return {"pid": None if self.proc is None else self.proc.pid, "starts": self.starts}

    def stop(self, timeout: float = 10.0) -> int | None:
        """Stop the node agent (SIGTERM, SIGKILL after ``timeout``) and start it no more: its
        exit status."""
        self.stopping = True
        if self.proc is None:
            return None
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class RayNodes:
    """One node agent on every labelled Ray node, under the control plane at ``control_url``."""

    def __init__(
        self,
        address: str,
        control_url: str,
        token: str,
        data_root: str,
        bootstrap: Callable[[str], str],
    ) -> None:
        # Ray's own handler of fatal signals (absl's) takes SIGTERM too, and aborts the process 3 s
        # later (an alarm): a control plane stopping its node agents would be cut short (-6)
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        import ray

        self.bootstrap = bootstrap  # each node's own credential, approved at once
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
        self.control_url, self.token, self.data_root = control_url, token, data_root
        self._remote = ray.remote(num_cpus=0)(AgentHost)
        self.hosts: dict[str, tuple[str, Any]] = {}  # node name -> (Ray node id, actor)
        self._lock = threading.Lock()
        self.stopped = False

    def sync(self) -> list[str]:
        """Start an agent on each labelled node that has none (new, or back with a new Ray node
        id); returns their names."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        with self._lock:
            return [] if self.stopped else self._sync(NodeAffinitySchedulingStrategy)

    def _sync(self, affinity: Any) -> list[str]:
        started = []
        for node in labelled_nodes():
            have = self.hosts.get(node.name)
            if have is not None and have[0] == node.node_id:
                continue
            args = ["--control", self.control_url, "--name", node.name, "--listen", node.address]
            simulate = node.labels.get(SIMULATE_LABEL)
            if simulate:
                args += ["--simulate", simulate.replace(".", ":")]
            for k, v in sorted(node.labels.items()):
                if not k.startswith("ray.io/") and k not in (NODE_LABEL, SIMULATE_LABEL):
                    args += ["--label", f"{k}={v}"]
            actor = self._remote.options(
                name=f"node-{node.name}-{node.node_id[:12]}",
                lifetime="detached",
                get_if_exists=True,
                scheduling_strategy=affinity(node.node_id, soft=False),
            ).remote(
                args,
                str(Path(self.data_root) / node.name),
                self.token,
                bool(simulate),
                self.bootstrap(node.name),
            )
            self.hosts[node.name] = (node.node_id, actor)
            started.append(node.name)
        return started

    def stop(self, timeout: float = 15.0) -> list[str]:
        """Stop every node agent started (or taken over) here, and end their actors: the names of
        the nodes whose agent said it stopped. The control plane's clean stop calls it."""
        import ray

        with self._lock:
            self.stopped = True
            hosts = dict(self.hosts)
            self.hosts.clear()
        asked = {actor.stop.remote(): name for name, (_, actor) in hosts.items()}
        # all at once, within one timeout (a lost node's actor may not answer at all)
        done, _ = ray.wait(list(asked), num_returns=len(asked), timeout=timeout)
        stopped = []
        for ref in done:
            try:
                ray.get(ref, timeout=1)
                stopped.append(asked[ref])
            except Exception:  # gone with its node, or an older actor: ended below all the same
                pass
        for _, actor in hosts.values():
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)  # its agent, if still there, gets SIGTERM
        return stopped
