"""The control plane's ``/metrics``: the cluster as its control plane knows it, read at scrape time
(a collector of the control plane's own registry, every family built afresh on each scrape).

Per node: its state, GPUs and seconds since its last heartbeat. Workloads by tenant, phase (as their
node shows it) and node. Counters since the control plane started: nodes lost, workloads moved. The
GPUs' and workloads' device series (memory, SM use, QoS) are each node agent's: this page says what
the control plane decides and sees.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from gpufrac.cluster.control import ControlPlane
from gpufrac.runtime.metrics_family import Family


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
            yield state.metric
            yield gpus.metric
            yield age.metric
            phases: Counter[tuple[str, str, str]] = Counter()
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
            workloads = Family(
                "gpufrac_cluster_workloads",
                "gauge",
                "Workloads by tenant, phase and node (no node: waiting).",
            )
            for (tenant, phase, node), count in sorted(phases.items()):
                workloads.add({"tenant": tenant, "phase": phase, "node": node}, count)
            yield workloads.metric
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
