"""The control plane's ``/metrics``: the cluster as its control plane knows it, read at scrape time
(a collector of the control plane's own registry, every family built afresh on each scrape).

Per node: its state, GPUs and seconds since its last heartbeat. Workloads by tenant, phase (as their
node shows it) and node. How long each waiting workload has waited
(``gpufrac_workload_pending_seconds``, the name one machine's agent gives it): a workload that waits
in a cluster waits here, on no node (no ``Hostname``), until the control plane places it; one its
node shows as waiting carries that node. Counters since the control plane started: nodes lost,
workloads moved. The GPUs' and workloads' device series (memory, SM use, QoS) are each node agent's:
this page says what the control plane decides and sees.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from gpufrac.cluster.control import ControlPlane
from gpufrac.runtime.metrics_family import Family

STATE_HELP = "1 for the workload's current phase."  # as a node's agent gives it (runtime.metrics)


def waiting_here(control: ControlPlane) -> list[tuple[str, str]]:
    """(tenant, name) of each workload the control plane holds waiting: placed on no node and not
    ended. Its ``gpufrac_workload_state`` is the control plane's to give (no node has it), beside
    the nodes' relayed series of that name (``cluster.metrics_relay``)."""
    with control.lock:
        core = control.core
        return [
            (w.tenant, w.name)
            for w in control.store.workloads()
            if w.key not in core.assigned and w.key not in core.ended
        ]


class ControlCollector:
    def __init__(self, control: ControlPlane) -> None:
        self.control = control

    def collect(self) -> Iterator[Metric]:
        control = self.control
        with control.lock:
            nodes = control.nodes()
            state = Family("gpufrac_cluster_node_up", "gauge", "1 for a node that holds its lease.")
            gpus = Family("gpufrac_cluster_node_gpus", "gauge", "GPUs a node joined with.")
            age = Family(
                "gpufrac_cluster_node_heartbeat_age_seconds",
                "gauge",
                "Seconds since a node's last answered heartbeat.",
            )
            for n in nodes:
                state.add({"node": n.name}, n.state == "alive")
                gpus.add({"node": n.name}, n.gpus)
                age.add({"node": n.name}, round(n.last_heartbeat_s or 0.0, 3))
            moves = Family(
                "gpufrac_scheduler_moves",
                "counter",
                "Moves begun to make room for waiting MIG requests since the control plane"
                " started (docs/scheduler.md, Moves).",
            )
            moves.add({}, control.core.scheduler.move_budget.begun)
            yield state.metric
            yield gpus.metric
            yield age.metric
            yield moves.metric
            phases: Counter[tuple[str, str, str]] = Counter()
            pending = Family(
                "gpufrac_workload_pending_seconds",
                "gauge",
                "How long a pending workload has waited (no Hostname: it waits for the control"
                " plane to place it, on no node).",
            )
            now = time.time()
            for w in control.store.workloads():
                key = w.key
                a = control.core.assigned.get(key)
                shown = control.views.get(key)
                phase: str
                if key in control.core.ended:
                    phase = control.core.ended[key]
                elif a is not None and shown is not None and shown[0] == a.epoch:
                    phase = str(shown[1].get("phase", "starting"))
                elif a is not None:
                    phase = "starting"
                else:
                    phase = "pending"
                node = a.node if a is not None else control.core.ended_on.get(key, "")
                phases[(w.tenant, phase, node)] += 1
                if phase == "pending":
                    # waiting since its newest event: applied, its node lost, displaced, ...
                    said = control.store.events(key, limit=1)
                    since = max([w.updated, *(e.at for e in said)])
                    where = {"Hostname": node, "node": node} if node else {}
                    pending.add({"tenant": w.tenant, "workload": w.name, **where}, now - since)
            workloads = Family(
                "gpufrac_cluster_workloads",
                "gauge",
                "Workloads by tenant, phase and node (no node: waiting).",
            )
            for (tenant, phase, node), count in sorted(phases.items()):
                workloads.add({"tenant": tenant, "phase": phase, "node": node}, count)
            yield workloads.metric
            yield pending.metric
            lost = Family("gpufrac_cluster_nodes_lost", "counter", "Nodes held lost.")
            lost.add({}, control.lost_count)
            yield lost.metric
            moved = Family(
                "gpufrac_cluster_workloads_moved",
                "counter",
                "Workloads of a lost node placed again on another.",
            )
            moved.add({}, control.moved_count)
            yield moved.metric
