"""The serving series of ``/metrics``: the request gateway's counters per deployment and replica, as
the agent last read them over the gateway's admin link (its ``T`` statistics, every reconcile pass),
the replicas wanted, ready and draining, and the autoscaler's decisions. Labels: ``tenant``,
``deployment``, and ``replica`` (the replica workload's name) where a series is per replica, with,
on a cluster, ``node``: the node the replica is placed on now (absent on one machine, and for a
replica placed nowhere). A replica is on one node at a time, so ``node`` adds no series but where a
replica is placed again elsewhere (one more each time)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufrac.runtime.metrics_family import Family
from gpufrac.serving.deployments import Deployments, route_name
from gpufrac.serving.routing import LATENCY_BUCKETS


class LockedCollectors:
    """``collectors`` read together with ``lock`` held (their families taken whole, then
    served)."""

    def __init__(self, lock: AbstractContextManager[Any], collectors: Sequence[Collector]) -> None:
        self.lock = lock
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            families = [m for c in self.collectors for m in c.collect()]
        yield from families


class ServingCollector:
    """The deployments' series, read at scrape time (under their host's lock: the caller's)."""

    def __init__(self, deployments: Deployments) -> None:
        self.deployments = deployments

    def collect(self) -> Iterator[Metric]:
        yield from serving_families(self.deployments)


def serving_families(deployments: Deployments) -> Iterator[Metric]:
    f = {
        "requests": Family(
            "gpufrac_gateway_requests",
            "counter",
            "Requests the gateway answered, by status code; replica is absent for answers the"
            " gateway gave itself (401 no valid token, 404 no such deployment for the caller,"
            " 429 queue full, 503 no replica in time), and deployment and tenant too for"
            " refusals of a name the gateway has no deployment of.",
        ),
        "latency": Family(
            "gpufrac_gateway_request_duration_seconds",
            "histogram",
            "Time from a request's arrival at the gateway to the end of its answer (queueing"
            " included), per replica that answered.",
        ),
        "in_flight": Family(
            "gpufrac_gateway_requests_in_flight",
            "gauge",
            "Requests sent to a replica and not answered yet.",
        ),
        "queued": Family(
            "gpufrac_gateway_queue_depth",
            "gauge",
            "Requests waiting in the gateway for a free replica slot.",
        ),
        "rejected": Family(
            "gpufrac_gateway_rejected",
            "counter",
            "Requests answered 429 because the deployment's queue was full.",
        ),
        "retries": Family(
            "gpufrac_gateway_retries",
            "counter",
            "Requests tried again on another replica after one gave no response.",
        ),
        "errors": Family(
            "gpufrac_gateway_errors",
            "counter",
            "Requests no replica answered whole (502, 504, or an answer that broke off).",
        ),
        "cold": Family(
            "gpufrac_gateway_cold_starts",
            "counter",
            "Requests that came while the deployment had no replica and waited for one to start.",
        ),
        "replicas": Family(
            "gpufrac_deployment_replicas",
            "gauge",
            "Replicas by state: wanted (the count asked or the autoscaler's), ready (serving),"
            " draining (taken out, finishing their requests).",
        ),
        "scaled": Family(
            "gpufrac_autoscaler_decisions",
            "counter",
            "The autoscaler's decisions: up and down (replicas), boost and unboost (QoS weight).",
        ),
        "moved": Family(
            "gpufrac_deployment_replica_moves",
            "counter",
            "Replicas moved to make room for a waiting MIG request (a replacement ready, the"
            " replica drained): moves, not restarts (docs/scheduler.md, Moves).",
        ),
    }
    for d, _ in deployments.specs():
        lab = {"tenant": d.tenant, "deployment": d.name}
        counts = deployments.replica_counts.get(d.key)
        if counts is not None:
            for state, n in zip(("wanted", "ready", "draining"), counts, strict=True):
                f["replicas"].add({**lab, "state": state}, n)
        f["moved"].add(lab, deployments.moves_done.get(d.key, 0))
        for direction, n in deployments.scale_counts.get(d.key, {}).items():
            f["scaled"].add({**lab, "direction": direction}, n)
        traffic: dict[str, Any] = deployments.traffic.get(route_name(d), {})
        if not traffic:
            continue
        f["queued"].add(lab, traffic.get("queued", 0))
        for family, key in (
            ("rejected", "rejected"),
            ("retries", "retries"),
            ("errors", "errors"),
            ("cold", "cold_starts"),
        ):
            f[family].add(lab, traffic.get(key, 0))
        for code, n in traffic.get("codes", {}).items():
            f["requests"].add({**lab, "code": code}, n)
        outstanding = {**traffic.get("retiring", {}), **traffic.get("replicas", {})}
        for rid, seen in outstanding.items():
            f["in_flight"].add(replica_labels(deployments, lab, rid), seen.get("outstanding", 0))
        for rid, c in traffic.get("counts", {}).items():
            at = replica_labels(deployments, lab, rid)
            for code, n in c.get("codes", {}).items():
                f["requests"].add({**at, "code": code}, n)
            buckets = c.get("latency", [])
            if len(buckets) == len(LATENCY_BUCKETS) + 1:
                f["latency"].add_histogram(at, LATENCY_BUCKETS, buckets, c.get("latency_sum", 0.0))
    for code, n in sorted(deployments.refused.items()):
        f["requests"].add({"code": code}, n)
    yield from (family.metric for family in f.values())


def replica_labels(
    deployments: Deployments, deployment: dict[str, str], replica: str
) -> dict[str, str | None]:
    """A per-replica series' labels: the deployment's, ``replica``, and ``node`` where the host
    places replicas on nodes (a cluster's control plane: None on one machine)."""
    _, node = deployments.runner.where(f"{deployment['tenant']}/{replica}")
    return {**deployment, "replica": replica, "node": node}
