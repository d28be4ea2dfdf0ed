"""The dashboard's plots for a cluster: one sample of every node's GPUs as their node agents last
showed them (memory used, utilization, reserved; per MIG instance and per workload what it uses),
and of the cluster's deployments as the control plane's gateway counts them. The same ring and the
same answer as one machine's (``api.history``), GPUs known by node and UUID. What a node measures
only for itself (QoS shares against entitlement) stays on the node: those series are empty here."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpufrac.cluster.control import ControlPlane
from gpufrac.cluster.serving import ClusterServing
from gpufrac.runtime.history import Reading, geometry, gpu_readings


class ClusterSampler:
    def __init__(self, control: ControlPlane, serving: ClusterServing | None) -> None:
        self.control = control
        self.serving = serving

    def read(self) -> tuple[list[Reading], dict[str, dict[str, Any]]]:
        control = self.control
        with control.lock:
            alive = {n.name for n in control.core.nodes.values() if n.state == "alive"}
            fleet = [
                {**g, "node": node, "uuid": f"{node}/{g['uuid']}"}
                for node, shown in sorted(control.gpu_views.items())
                if node in alive
                for g in shown
            ]
            models = {g.uuid: g.model for g in control.core.scheduler.state.gpus}
            deployments = (
                []
                if self.serving is None
                else self.serving.deployments.samples(self.serving.states)
            )
        node_of = {g["uuid"]: g["node"] for g in fleet}
        readings = [
            replace(r, meta={**r.meta, "node": node_of.get(r.key)}) if r.kind == "gpu" else r
            for r in gpu_readings(fleet, {})
        ]
        readings += deployments
        return readings, {uuid: geometry(m) for uuid, m in models.items() if uuid in node_of}
