"""Every node's series on the control plane's ``/metrics``: at scrape time the control plane reads
each alive node's ``/cluster/v1/metrics`` (``cluster.node_api``: its GPUs with DCGM's names and
labels, its MIG instances, its workloads) with that node's own credential, all nodes at once, and
serves their series with a ``node`` label (the name the control plane knows the node by, whatever
the node wrote) beside its own.

Relayed rather than scraped by Prometheus from each node: a node's API answers the control plane
only (its credential), so one scrape target (the control plane, with the admin's token) is all a
Prometheus server needs, whatever nodes join, leave or move, with no service discovery to keep.

Bounded: a node is given ``NODE_TIMEOUT_S`` and at most ``MAX_BYTES``; one that does not answer in
time, or answers what is not its metrics, is left out of that scrape, and
``gpufrac_cluster_node_metrics_up`` says so (0) for it. The lock is held only to read which nodes
to ask, never while they are asked.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpufrac.cluster.control import ControlPlane
from gpufrac.cluster.metrics import STATE_HELP, waiting_here
from gpufrac.runtime.metrics_family import Family

NODE_TIMEOUT_S = 3.0
MAX_BYTES = 16 * 2**20
# series the control plane serves itself: a node's of these names are not taken
OWN_PREFIXES = (
    "gpufrac_cluster_",
    "gpufrac_gateway_",
    "gpufrac_deployment_",
    "gpufrac_autoscaler_",
    "gpufrac_workload_pending_seconds",  # what waits in a cluster waits here (cluster.metrics)
    "gpufrac_scheduler_moves",  # the control plane moves work in a cluster; a node never does
)

Target = tuple[str, str, str]  # node, its API's address, its credential


class NodeMetricsRelay:
    def __init__(self, control: ControlPlane) -> None:
        self.control = control

    def targets(self) -> list[Target]:
        control = self.control
        with control.lock:
            out = []
            for n in control.nodes():
                address, credential = control.addresses.get(n.name), control.credentials.get(n.name)
                if n.state == "alive" and address and credential:
                    out.append((n.name, address, credential))
            return out

    def collect(self) -> Iterator[Metric]:
        targets = self.targets()
        up = Family(
            "gpufrac_cluster_node_metrics_up",
            "gauge",
            "1 for an alive node whose series this scrape relayed, 0 for one that did not answer"
            " them in time.",
        )
        merged: dict[str, Metric] = {}
        if targets:
            with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
                answers = list(pool.map(_read, targets))
            for (node, _, _), families in zip(targets, answers, strict=True):
                up.add({"node": node}, families is not None)
                for family in families or []:
                    if family.name.startswith(OWN_PREFIXES):
                        continue
                    into = merged.setdefault(
                        family.name, Metric(family.name, family.documentation, family.type)
                    )
                    if into.type != family.type:
                        continue  # a node of another version: its series of this name left out
                    into.samples.extend(
                        Sample(s.name, {**s.labels, "node": node}, s.value, s.timestamp)
                        for s in family.samples
                    )
        # what waits at the control plane is on no node: its phase is the control plane's to say,
        # in the same family as the nodes' (no Hostname, no node label)
        waiting = waiting_here(self.control)
        if waiting:
            state = merged.setdefault(
                "gpufrac_workload_state", Metric("gpufrac_workload_state", STATE_HELP, "gauge")
            )
            state.samples.extend(
                Sample(
                    "gpufrac_workload_state",
                    {"tenant": tenant, "workload": name, "phase": "pending"},
                    1.0,
                )
                for tenant, name in waiting
            )
        yield up.metric
        yield from merged.values()


def _read(target: Target) -> list[Metric] | None:
    """The node's metric families, or None where it did not answer them whole in time."""
    _, address, credential = target
    deadline = time.monotonic() + NODE_TIMEOUT_S
    try:
        with (
            httpx.Client(timeout=NODE_TIMEOUT_S) as client,
            client.stream(
                "GET",
                f"{address}/cluster/v1/metrics",
                headers={"authorization": f"Bearer {credential}", "accept-encoding": "identity"},
            ) as r,
        ):
            if r.status_code != 200:
                return None
            body = bytearray()
            for chunk in r.iter_raw():
                body += chunk
                if len(body) > MAX_BYTES or time.monotonic() > deadline:
                    return None
        return list(text_string_to_metric_families(body.decode("utf-8")))
    except (httpx.HTTPError, UnicodeDecodeError, ValueError):
        return None
