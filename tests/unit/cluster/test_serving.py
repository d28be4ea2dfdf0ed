"""Deployments through the control plane (``cluster.serving``), through FastAPI's test client: a
deployment is stored and shown in the agent's shapes, its replicas are placed over the nodes (one
per node where they fit) and given to the gateway at their node's address, a tenant sees only its
own, and a replica that fits on no node is said, not dropped."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufrac.api.tokens import Caller
from gpufrac.cluster import metrics_relay
from gpufrac.cluster.control import ControlPlane
from gpufrac.cluster.serving import ClusterServing
from gpufrac.runtime.shim import lease_ended, read_lease, write_lease
from gpufrac.serving.deployments import route_name_of
from gpufrac.serving.routing import LATENCY_BUCKETS
from tests.cluster_apps import Routed, control_client
from tests.integration.conftest import free_port
from tests.prom import samples, value

TOKEN = "cluster-token-0123456789"
NODE = {"authorization": f"Bearer {TOKEN}"}
ADMIN = {"authorization": "Bearer admin-token-0123456789"}
TEAM = {"authorization": "Bearer team-token-0123456789"}
OTHER = {"authorization": "Bearer other-token-0123456789"}


def deployment(name: str, memory: str = "10GiB", tenant: str = "team") -> str:
    return (
        f"apiVersion: gpufrac/v1\nkind: Deployment\nmetadata: {{name: {name}, tenant: {tenant}}}\n"
        f"spec:\n  template:\n    command: [sleep, '60']\n"
        f"    resources: {{gpu: {{memory: {memory}}}}}\n    sharing: timeslice\n  replicas: 2\n"
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Routed, ControlPlane, ClusterServing]]:
    control = ControlPlane(tmp_path)
    tokens = {
        "admin-token-0123456789": Caller(None, admin=True),
        "team-token-0123456789": Caller("team"),
        "other-token-0123456789": Caller("other"),
    }
    serving = ClusterServing(
        control,
        gateway_port=free_port(),
        tokens={t: c.tenant for t, c in tokens.items()},
    )
    http = control_client(control, cluster_token=TOKEN, tokens=tokens, serving=serving)
    for name, address in (("n1", "http://10.0.0.1:7000"), ("n2", "http://10.0.0.2:7000")):
        gpus = [{"uuid": f"GPU-{name}", "model": "H200-141GB", "mig": False}]
        body = {"gpus": gpus, "address": address}
        assert http.post(f"/cluster/v1/nodes/{name}/join", json=body, headers=NODE).is_success
        control.approve(name)
    yield http, control, serving
    serving.close()
    control.close()


def test_a_deployments_replicas_spread_over_nodes_and_reach_the_gateway_at_their_nodes(
    cluster: tuple[Routed, ControlPlane, ClusterServing],
) -> None:
    http, control, serving = cluster
    r = http.post("/api/v1/workloads", content=deployment("m"), headers=TEAM)
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["result"] == "created"
    assert r.json()["results"][0]["url"].endswith("/serve/team.m")
    serving.reconcile()  # the first pass: replicas applied, placed by the cluster's scheduler
    got = http.get("/api/v1/deployments/team/m", headers=TEAM).json()
    assert sorted(r["node"] for r in got["replicas"]) == ["n1", "n2"]
    assert sorted(r["host"] for r in got["replicas"]) == ["10.0.0.1", "10.0.0.2"]
    assert got["replicas_ready"] == 0  # no node has shown them running yet
    assert all(r["phase"] == "starting" for r in got["replicas"]), got["replicas"]
    # another tenant's deployment looks like none at all
    assert http.get("/api/v1/deployments/team/m", headers=OTHER).status_code == 404
    assert http.get("/api/v1/deployments", headers=OTHER).json() == {"deployments": []}
    assert http.post("/api/v1/workloads", content=deployment("x"), headers=OTHER).status_code == 403
    # the nodes show them running: the gateway gets both, each at its node's address
    for r in got["replicas"]:
        a = control.core.assigned[f"team/{r['name']}"]
        control.views[a.workload] = (a.epoch, {"phase": "running"})
    serving.reconcile()
    sent = serving.deployments._sent["team/m"]
    assert '"host": "10.0.0.1"' in sent and '"host": "10.0.0.2"' in sent, sent
    listed = http.get("/api/v1/deployments", headers=ADMIN).json()["deployments"]
    assert [(d["name"], d["replicas_ready"]) for d in listed] == [("m", 2)]
    # scaled to one, then deleted: the replicas go with it
    assert http.post(
        "/api/v1/deployments/team/m/scale", json={"replicas": 1}, headers=TEAM
    ).is_success
    assert http.delete("/api/v1/deployments/team/m", headers=TEAM).is_success
    assert [w.name for w in control.store.workloads()] == []


def test_a_replica_that_fits_on_no_node_is_said_and_tried_again_later(
    cluster: tuple[Routed, ControlPlane, ClusterServing],
) -> None:
    http, control, serving = cluster
    r = http.post("/api/v1/workloads", content=deployment("big", "200GiB"), headers=TEAM)
    assert r.status_code == 200, r.text
    serving.reconcile()
    assert control.store.workloads() == []  # nothing placed, nothing stored
    failed = [e for e in control.store.events(limit=20) if e.kind == "action_failed"]
    assert failed and "fits on no node" in failed[0].message, failed


def test_deployments_are_refused_by_a_control_plane_that_serves_none(tmp_path: Path) -> None:
    control = ControlPlane(tmp_path)
    http = control_client(control, cluster_token=TOKEN)
    r = http.post("/api/v1/workloads", content=deployment("m"))
    assert r.status_code == 501 and r.json()["capability"] == "deployments", r.text
    assert "runs no deployments" in r.json()["detail"]
    assert control.store.workloads() == [] and control.store.deployments() == []
    control.close()


def test_a_shim_whose_lease_file_is_gone_stops_at_the_last_lease_it_read(tmp_path: Path) -> None:
    path = tmp_path / "lease.json"
    write_lease(path, time.time() + 0.3, 1.0)
    last = read_lease(path)
    assert last is not None and lease_ended(path, last) is None  # it holds
    path.unlink()  # the node's data removed: the last lease read still holds until it ends
    assert lease_ended(path, last) is None and lease_ended(path) is None
    time.sleep(0.35)
    assert lease_ended(path, last) == last  # ran out, unrenewed: the workload stops
    assert lease_ended(path) is None  # never read at all: nothing to go by


def test_a_deployment_makes_no_more_replicas_than_its_tenant_may_store(tmp_path: Path) -> None:
    from gpufrac.model.settings import OperatorSettings

    control = ControlPlane(tmp_path, OperatorSettings(max_workloads=3))
    serving = ClusterServing(control, gateway_port=free_port())
    http = control_client(control, cluster_token=TOKEN, serving=serving)
    gpus = [{"uuid": "GPU-n1", "model": "H200-141GB", "mig": False}]
    http.post("/cluster/v1/nodes/n1/join", json={"gpus": gpus}, headers=NODE)
    control.approve("n1")
    five = deployment("m").replace("replicas: 2", "replicas: 5")
    assert http.post("/api/v1/workloads", content=five).status_code == 200
    for _ in range(2):  # the second pass is held back (backoff): still no more than 3
        serving.reconcile()
    assert len(control.store.workloads()) == 2  # the deployment itself counts, as in an apply
    said = [e.message for e in control.store.events(limit=20) if e.kind == "action_failed"]
    assert len(said) == 1 and "3 replica(s) of team/m not created" in said[0], said
    assert "max_workloads" in said[0]
    serving.close()
    control.close()


def test_the_gateways_per_replica_series_carry_the_replicas_node(
    cluster: tuple[Routed, ControlPlane, ClusterServing], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cluster a replica's series say which node it is on (``node``, as the relayed series
    do); the deployment's own series, and a replica placed nowhere now, have none."""
    http, _, serving = cluster
    assert http.post("/api/v1/workloads", content=deployment("m"), headers=TEAM).is_success
    serving.reconcile()
    replicas = http.get("/api/v1/deployments/team/m", headers=TEAM).json()["replicas"]
    on = {r["name"]: r["node"] for r in replicas}
    assert sorted(on.values()) == ["n1", "n2"]
    counts = {"codes": {"200": 3}, "latency": [0] * (len(LATENCY_BUCKETS) + 1), "latency_sum": 0}
    counts["latency"][0] = 3
    # the gateway's reading as the next pass would take it: one replica deleted since, still
    # counted
    serving.deployments.traffic[route_name_of("team", "m")] = {
        "queued": 0,
        "codes": {"503": 1},
        "replicas": {name: {"outstanding": 1} for name in on},
        "counts": {name: counts for name in [*on, "m-gone"]},
    }
    monkeypatch.setattr(metrics_relay, "NODE_TIMEOUT_S", 0.2)  # the nodes' addresses answer none
    text = http.get("/metrics", headers=ADMIN).text
    for name, node in on.items():
        at = {"tenant": "team", "deployment": "m", "replica": name}
        assert value(text, "gpufrac_gateway_requests_total", **at, code="200", node=node) == 3
        assert value(text, "gpufrac_gateway_requests_in_flight", **at, node=node) == 1
        (bucket,) = samples(text, "gpufrac_gateway_request_duration_seconds_count", **at)
        assert bucket[0]["node"] == node
    ((gone, _),) = samples(text, "gpufrac_gateway_requests_total", replica="m-gone")
    assert "node" not in gone
    ((mine, n),) = samples(text, "gpufrac_gateway_requests_total", code="503")
    assert "node" not in mine and "replica" not in mine and n == 1
