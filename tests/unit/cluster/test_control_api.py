"""The control plane's HTTP API against bad input, through FastAPI's test client (no server):
every bad node call or query is a 4xx naming the field, and changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufrac.cluster.control import ControlPlane
from tests.cluster_apps import control_client

TOKEN = "cluster-token-0123456789"
NODE = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(tmp_path: Path) -> Any:
    control = ControlPlane(tmp_path)
    yield control_client(control, cluster_token=TOKEN), control
    control.close()


def gpu(uuid: str, **more: Any) -> dict[str, Any]:
    return {"uuid": uuid, "model": "H200-141GB", "mig": False, **more}


def node_gpu(uuid: str, index: int = 0) -> dict[str, Any]:
    """A GPU as its node shows it in a heartbeat (what get gpus serves)."""
    return {
        "uuid": uuid,
        "index": index,
        "model": "H200-141GB",
        "name": "NVIDIA H200",
        "pci_device_id": "0x233510DE",
        "memory_total_mib": 143771,
        "memory_used_mib": 0,
        "utilization_gpu": 0,
        "mig_mode": {"current": "disabled", "pending": "disabled"},
        "instances": [],
        "processes": [],
        "simulated": True,
        "health": "ok",
        "warnings": [],
        "node": "",
        "mig_layout_pinned": False,
        "cordoned": None,
        "allocations": [],
        "reserved_memory_mib": 0,
        "reserved_compute_pct": 0,
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gpus": [gpu("GPU-a"), gpu("GPU-a")]}, "body"),
        (
            {"gpus": [gpu("GPU-a", mig=True, instances=[{"start": 99, "profile": "bogus"}])]},
            "gpus.instances",
        ),
        ({"gpus": [gpu("GPU-a", model="nope")]}, "gpus.model"),
        ({"gpus": [gpu("GPU-a", instances=[{"start": 0, "profile": "7g.141gb"}])]}, "body"),
        ({"gpus": [gpu("a/b")]}, "gpus.0.uuid"),
        ({"gpus": [gpu(f"GPU-{i}") for i in range(65)]}, "gpus"),
        ({"gpus": [], "labels": {"bad key!": "x"}}, "labels"),
        ({"gpus": [], "address": "file:///etc/passwd"}, "address"),
    ],
)
def test_a_bad_join_is_refused_and_registers_nothing(
    client: Any, body: dict[str, Any], field: str
) -> None:
    http, control = client
    r = http.post("/cluster/v1/nodes/n1/join", json=body, headers=NODE)
    assert r.status_code == 422, r.text
    assert ".".join(r.json()["detail"][0]["loc"]).startswith(field), r.json()
    assert control.core.nodes == {} and control.core.scheduler.state.gpus == []
    assert http.post("/cluster/v1/nodes/n1/join", json={"gpus": [gpu("GPU-a")]}, headers=NODE)
    control.approve("n1")
    assert [n.name for n in control.nodes()] == ["n1"]


def test_node_calls_need_the_cluster_token_and_a_bad_gpu_view_is_refused(client: Any) -> None:
    http, control = client
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": f"Basic {TOKEN}"}):
        r = http.post("/cluster/v1/nodes/n1/join", json={"gpus": []}, headers=headers)
        assert r.status_code == 401
    joined = http.post("/cluster/v1/nodes/n1/join", json={"gpus": [gpu("G")]}, headers=NODE)
    own = {"authorization": f"Bearer {joined.json()['credential']}"}
    bad = {"gpus": [{"uuid": "z", "allocations": [1]}]}
    r = http.post("/cluster/v1/nodes/n1/heartbeat", json=bad, headers=own)
    assert r.status_code == 422
    assert control.gpu_views == {}
    assert http.get("/api/v1/gpus").json() == {"gpus": []}


def test_each_node_speaks_only_for_itself_with_its_own_credential(tmp_path: Path) -> None:
    now = [0.0]
    control = ControlPlane(tmp_path, clock=lambda: now[0])
    http = control_client(control, cluster_token=TOKEN)

    def join(name: str, credential: str | None = None) -> Any:
        extra = {} if credential is None else {"x-gpufrac-node-credential": credential}
        body = {"gpus": [gpu(f"GPU-{name}")]}
        return http.post(f"/cluster/v1/nodes/{name}/join", json=body, headers={**NODE, **extra})

    def beat(name: str, credential: str) -> int:
        headers = {"authorization": f"Bearer {credential}"}
        r = http.post(f"/cluster/v1/nodes/{name}/heartbeat", json={}, headers=headers)
        return int(r.status_code)

    one, two = join("n1").json()["credential"], join("n2").json()["credential"]
    assert one and two and one != two
    assert (tmp_path / "control.db").stat().st_mode & 0o777 == 0o600  # where they are kept
    assert beat("n1", one) == 200
    assert beat("n1", TOKEN) == 401  # the cluster token speaks for no node
    assert beat("n1", two) == 401  # nor does another node's credential
    again = join("n1")  # its name taken while its lease holds: refused without its credential
    assert again.status_code == 409 and "alive under its own credential" in again.text
    assert join("n1", two).status_code == 409
    back = join("n1", one)  # the node itself, joining again: it keeps its credential
    assert back.status_code == 200 and back.json()["credential"] is None
    assert beat("n1", one) == 200
    now[0] = 7.0  # n1's lease has run out: a node that lost its credential may take the name
    control.tick()
    fresh = join("n1").json()["credential"]
    assert fresh not in (None, one) and beat("n1", one) == 401 and beat("n1", fresh) == 200
    restarted = ControlPlane(tmp_path, clock=lambda: now[0])  # kept across a restart
    assert restarted.credential_ok("n1", fresh) and restarted.credential_ok("n2", two)
    restarted.close()
    control.close()


def test_queries_are_bounded_and_what_is_not_here_says_so(client: Any) -> None:
    """A capability the control plane lacks answers 501 as RFC 9457's problem, naming it."""
    http, _ = client
    assert http.get("/api/v1/events", params={"after": 10**30}).status_code == 422
    assert http.get("/api/v1/events", params={"limit": -1}).status_code == 422
    for method, path, capability in (
        ("GET", "/api/v1/deployments", "deployments"),  # a control plane without serving
        ("POST", "/api/v1/gpus/n1/0/mig", "mig-layouts"),
        ("DELETE", "/api/v1/gpus/n1/0/mig/pin", "mig-layouts"),
        ("POST", "/api/v1/workloads/default/w/clear-unknown", "clear-unknown"),
    ):
        r = http.request(method, path, json={})
        assert r.status_code == 501, (path, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        problem = r.json()
        assert problem["status"] == 501 and problem["capability"] == capability, problem
        assert problem["title"] and problem["type"] and problem["detail"], problem


def test_a_tenant_cannot_store_more_workloads_than_its_bound(tmp_path: Path) -> None:
    from gpufrac.model.settings import OperatorSettings

    control = ControlPlane(tmp_path, OperatorSettings(max_workloads=2))
    http = control_client(control, cluster_token=TOKEN)
    doc = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: w{}}}\nspec:\n"
        "  command: [sleep, '1']\n  resources: {{gpu: {{count: 1}}}}\n"
    )
    text = "---\n".join(doc.format(i) for i in range(3))
    r = http.post("/api/v1/workloads", content=text)
    assert r.status_code == 409 and "max_workloads" in r.text
    assert control.store.workloads() == []  # nothing of it applied
    assert http.post("/api/v1/workloads", content=doc.format(0)).status_code == 200
    control.close()


def test_a_lease_nobody_keeps_alive_is_given_back(tmp_path: Path) -> None:
    now = [0.0]
    control = ControlPlane(tmp_path, clock=lambda: now[0])
    http = control_client(control, cluster_token=TOKEN)
    lease = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {}, labels: {{gpufrac.io/lease: "
        "ray, gpufrac.io/lease-ttl: '10'}}}}\nspec:\n  type: service\n  command: [sleep, '1']\n"
        "  resources: {{gpu: {{count: 1}}}}\n"
    )
    for name in ("kept", "dropped"):
        assert http.post("/api/v1/workloads", content=lease.format(name)).status_code == 200
    plain = lease.format("plain").replace(
        "labels: {gpufrac.io/lease: ray, gpufrac.io/lease-ttl: '10'}", "labels: {}"
    )
    assert http.post("/api/v1/workloads", content=plain).status_code == 200
    control.tick()  # the clock of each lease starts
    for t in (6.0, 12.0):
        now[0] = t
        assert http.post("/api/v1/workloads/default/kept/keepalive").status_code == 200
        control.tick()
    assert http.post("/api/v1/workloads/default/plain/keepalive").status_code == 404
    names = {w.name for w in control.store.workloads()}
    assert names == {"kept", "plain"}  # dropped: not kept alive for 10 s
    assert any(e.kind == "lease_expired" for e in control.store.events(limit=20))
    control.close()


@pytest.mark.parametrize("ttl", ["nan", "inf", "-1", "0", "soon", "1e9", "١٠", "１０", "1_0"])
def test_a_lease_time_to_live_that_is_no_time_is_refused(client: Any, ttl: str) -> None:
    http, control = client
    lease = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: l, labels: {gpufrac.io/lease: "
        f"ray, gpufrac.io/lease-ttl: '{ttl}'}}}}\nspec:\n  type: service\n  command: [sleep, '1']\n"
        "  resources: {gpu: {count: 1}}\n"
    )
    plain = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: first}\nspec:\n  type: service\n"
    )
    plain += "  command: [sleep, '1']\n  resources: {gpu: {count: 1}}\n---\n"
    r = http.post("/api/v1/workloads", content=plain + lease)
    assert r.status_code == 422, r.text
    assert "lease-ttl" in r.text and f"not '{ttl}'" in r.text, r.text
    assert control.store.workloads() == []  # nothing stored, not even the document before it


def test_metrics_say_what_the_control_plane_sees(client: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    http, control = client
    assert http.post("/cluster/v1/nodes/n1/join", json={"gpus": [gpu("G")]}, headers=NODE)
    control.approve("n1")
    doc = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {}}}\nspec:\n"
        "  command: [sleep, '1']\n  resources: {{gpu: {{count: 1}}}}\n"
    )
    for name in ("a", "b"):  # one GPU: a is placed, b waits
        assert http.post("/api/v1/workloads", content=doc.format(name)).status_code == 200
    r = http.get("/metrics")
    assert r.status_code == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }
    assert samples[("gpufrac_cluster_node_up", (("node", "n1"),))] == 1
    assert samples[("gpufrac_cluster_node_gpus", (("node", "n1"),))] == 1
    placed = (("node", "n1"), ("phase", "starting"), ("tenant", "default"))
    assert samples[("gpufrac_cluster_workloads", placed)] == 1
    waiting = (("phase", "pending"), ("tenant", "default"))
    assert samples[("gpufrac_cluster_workloads", waiting)] == 1
    assert samples[("gpufrac_cluster_nodes_lost_total", ())] == 0
    # how long b has waited, since it was applied: at the control plane, on no node
    pending = [k for k in samples if k[0] == "gpufrac_workload_pending_seconds"]
    assert pending == [
        ("gpufrac_workload_pending_seconds", (("tenant", "default"), ("workload", "b")))
    ]
    assert 0 <= samples[pending[0]] < 30


def test_only_the_admin_reads_the_metrics(tmp_path: Path) -> None:
    from gpufrac.api.tokens import Caller

    control = ControlPlane(tmp_path)
    tokens = {"t-token-0123456789": Caller("t"), "a-token-0123456789": Caller(None, admin=True)}
    http = control_client(control, cluster_token=TOKEN, tokens=tokens)
    assert http.get("/metrics").status_code == 401
    tenant = {"authorization": "Bearer t-token-0123456789"}
    assert http.get("/metrics", headers=tenant).status_code == 403
    admin = {"authorization": "Bearer a-token-0123456789"}
    assert http.get("/metrics", headers=admin).status_code == 200
    control.close()


def test_an_admin_cordons_and_drains_a_nodes_gpu_and_the_cordon_outlives_a_restart(
    tmp_path: Path,
) -> None:
    from gpufrac.api.tokens import Caller

    tokens = {"admin-token-0123456789": Caller(None, admin=True), "team-0123456789": Caller("a")}
    admin = {"authorization": "Bearer admin-token-0123456789"}
    control = ControlPlane(tmp_path)
    http = control_client(control, cluster_token=TOKEN, tokens=tokens)
    own: dict[str, dict[str, str]] = {}
    for name in ("n1", "n2"):
        r = http.post(
            f"/cluster/v1/nodes/{name}/join", json={"gpus": [gpu(f"G{name}")]}, headers=NODE
        )
        own[name] = {"authorization": f"Bearer {r.json()['credential']}"}
        control.approve(name)
        control.gpu_views[name] = [node_gpu(f"G{name}")]
    doc = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: w, tenant: a}\nspec:\n"
        "  command: [sleep, '60']\n  resources: {gpu: {count: 1}}\n"
    )
    assert http.post("/api/v1/workloads", content=doc, headers=admin).status_code == 200
    home = control.core.assigned["a/w"].node
    away = "n2" if home == "n1" else "n1"
    team = {"authorization": "Bearer team-0123456789"}
    assert http.post(f"/api/v1/gpus/{home}/0/drain", headers=team).status_code == 403
    assert http.post("/api/v1/gpus/n9/0/drain", headers=admin).status_code == 404
    r = http.post(f"/api/v1/gpus/{home}/0/drain", headers=admin)  # NODE/INDEX, as get gpus shows
    assert r.status_code == 200, r.text
    assert r.json()["drained"] == f"{home}/G{home}"
    assert control.core.assigned["a/w"].node == away
    # one copy at a time: its new node starts it once the old one has let it go
    beat = http.post(f"/cluster/v1/nodes/{away}/heartbeat", json={}, headers=own[away]).json()
    assert beat["run"] == []
    placed = control.store.placement("a", "w")
    assert placed is not None and placed.node == away
    http.post(f"/cluster/v1/nodes/{home}/heartbeat", json={}, headers=own[home])  # gone there
    beat = http.post(f"/cluster/v1/nodes/{away}/heartbeat", json={}, headers=own[away]).json()
    assert [a["decision"]["workload"] for a in beat["run"]] == ["a/w"]
    shown = {
        g["uuid"]: g["cordoned"] for g in http.get("/api/v1/gpus", headers=admin).json()["gpus"]
    }
    assert shown == {f"{home}/G{home}": "drained by hand", f"{away}/G{away}": None}
    control.close()
    # a restart: the cordon holds once the node joins again
    control = ControlPlane(tmp_path)
    http = control_client(control, cluster_token=TOKEN, tokens=tokens)
    cred = {"x-gpufrac-node-credential": own[home]["authorization"][7:]}
    r = http.post(
        f"/cluster/v1/nodes/{home}/join", json={"gpus": [gpu(f"G{home}")]}, headers={**NODE, **cred}
    )
    assert r.status_code == 200, r.text
    assert not control.core.scheduler.state.by_uuid[f"{home}/G{home}"].schedulable
    r = http.post(f"/api/v1/gpus/{home}/G{home}/uncordon", headers=admin)  # NODE/UUID
    assert r.status_code == 200 and r.json()["uncordoned"] == f"{home}/G{home}"
    assert control.core.scheduler.state.by_uuid[f"{home}/G{home}"].schedulable
    assert control.store.cordons() == {}
    control.close()


def test_hostile_calls_are_refused_whole_and_leave_nothing_behind(tmp_path: Path) -> None:
    """From the hostile review: a node call without its token is refused before its body is read;
    GPU names take ASCII digits only; a failed join issues no credential; a manifest is checked
    whole (a deployment's bounds, deployments counted against max_workloads) before anything of
    it is stored; node addresses are the admin's to see."""
    from gpufrac.api.tokens import Caller
    from gpufrac.cluster.serving import ClusterServing
    from gpufrac.model.settings import OperatorSettings, TenantQuota
    from tests.integration.conftest import free_port

    settings = OperatorSettings(tenants={"bob": TenantQuota(max_workloads=2)})
    control = ControlPlane(tmp_path, settings)
    tokens = {
        "admin-token-0123456789": Caller(None, admin=True),
        "bob-token-0123456789": Caller("bob"),
    }
    admin = {"authorization": "Bearer admin-token-0123456789"}
    bob = {"authorization": "Bearer bob-token-0123456789"}
    serving = ClusterServing(control, gateway_port=free_port())
    http = control_client(control, cluster_token=TOKEN, tokens=tokens, serving=serving)
    big = b"x" * (3 * 1024 * 1024)
    r = http.post("/cluster/v1/nodes/n1/heartbeat", content=big, headers=NODE)
    assert r.status_code == 401  # the cluster token is no node's credential: no body read
    r = http.post("/cluster/v1/nodes/n1/join", content=big, headers={"authorization": "Bearer x"})
    assert r.status_code == 401
    bad = http.post(
        "/cluster/v1/nodes/n1/join", json={"gpus": [gpu("GPU-a"), gpu("GPU-a")]}, headers=NODE
    )
    assert bad.status_code == 422 and control.credentials == {}  # no credential for a failed join
    r = http.post("/cluster/v1/nodes/n1/join", json={"gpus": [gpu("GPU-a")]}, headers=NODE)
    control.approve("n1")
    control.gpu_views["n1"] = [node_gpu("GPU-a"), node_gpu("GPU-zz", 1)]
    for name in ("n1/²", "n1/%E2%81%B0", "n1/０", "n1/1", "n1/99999", "../n1/0", "n1/"):
        assert http.post(f"/api/v1/gpus/{name}/cordon", headers=admin).status_code == 404, name
    assert control.core.cordoned == {}
    deployment = (
        "apiVersion: gpufrac/v1\nkind: Deployment\nmetadata: {{name: {name}, tenant: bob}}\n"
        "spec:\n  template:\n    command: [sleep, '60']\n    resources: {{gpu: {{memory: 1GiB}}}}\n"
        "    priority: {priority}\n  replicas: 0\n"
    )
    workload = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: atom, tenant: bob}\nspec:\n"
        "  command: [sleep, '60']\n  resources: {gpu: {memory: 1GiB}}\n"
    )
    mixed = workload + "---\n" + deployment.format(name="d0", priority=100000)
    r = http.post("/api/v1/workloads", content=mixed, headers=bob)
    assert r.status_code == 422 and "priority" in r.text
    assert control.store.workloads() == [] and control.store.deployments() == []
    three = "---\n".join(deployment.format(name=f"d{i}", priority=50) for i in range(3))
    r = http.post("/api/v1/deployments", content=three, headers=bob)
    assert r.status_code == 409 and "max_workloads" in r.text  # deployments count too
    assert control.store.deployments() == []
    assert http.get("/api/v1/nodes", headers=bob).json()["nodes"][0]["address"] is None
    serving.close()
    control.close()


def test_a_node_passes_on_its_own_events_within_bounds(tmp_path: Path) -> None:
    """A node's events are taken about its own work only, not of the control plane's kinds, and
    no more than the window allows (a flood would push every tenant's events out of the store)."""
    from gpufrac.cluster.control import RELAY_PER_WINDOW
    from gpufrac.cluster.core import NodeEvent, Report

    control = ControlPlane(tmp_path)
    http = control_client(control, cluster_token=TOKEN)
    for name in ("n1", "n2"):
        http.post(f"/cluster/v1/nodes/{name}/join", json={"gpus": [gpu(f"G{name}")]}, headers=NODE)
        control.approve(name)
    doc = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: w, tenant: a}\nspec:\n"
        "  command: [sleep, '60']\n  resources: {gpu: {count: 1}}\n"
    )
    assert http.post("/api/v1/workloads", content=doc).status_code == 200
    home = control.core.assigned["a/w"].node
    away = "n2" if home == "n1" else "n1"
    events = [
        NodeEvent("started", "a/w", "attempt 1"),
        NodeEvent("node_lost", home, "forged"),
        NodeEvent("xid", f"G{away}", "a GPU's"),
    ]
    control.heartbeat(away, Report(), {}, None, events)  # not its workload
    control.heartbeat(home, Report(), {}, None, events)
    taken = [(e.kind, e.subject, e.message) for e in control.store.events(limit=50)]
    assert ("started", "a/w", f"attempt 1 (node {home})") in taken
    assert ("started", "a/w", f"attempt 1 (node {away})") not in taken
    assert not any(k == "node_lost" for k, _, _ in taken)
    assert ("xid", away, f"G{away}: a GPU's") in taken
    flood = [NodeEvent("started", "a/w", f"flood {i}") for i in range(200)]
    for _ in range(RELAY_PER_WINDOW // 200 + 3):
        control.heartbeat(home, Report(), {}, None, flood)
    flooded = sum(1 for e in control.store.events(limit=10_000) if e.message.startswith("flood"))
    assert flooded <= RELAY_PER_WINDOW
    assert [e.kind for e in control.store.events(limit=10_000)].count("events_dropped") == 1
    control.close()


def test_the_control_plane_tells_every_displacement_and_keeps_where_a_job_ran(
    tmp_path: Path,
) -> None:
    """As on one machine: the apply answer's ``displaced`` and an event per displaced workload,
    each viewer seeing only the names it may; a move is no restart; a finished job keeps where it
    ran."""
    from gpufrac.api.tokens import Caller
    from gpufrac.cluster.core import Report
    from gpufrac.model.settings import OperatorSettings, TenantQuota

    other = "another tenant's workload"
    settings = OperatorSettings(tenants={"search": TenantQuota(preemption="lower-priority")})
    control = ControlPlane(tmp_path, settings)
    tokens = {"r": Caller("research"), "s": Caller("search"), "x": Caller(None, admin=True)}
    http = control_client(control, cluster_token=TOKEN, tokens=tokens)
    as_ = {k: {"authorization": f"Bearer {k}"} for k in tokens}
    http.post("/cluster/v1/nodes/n1/join", json={"gpus": [gpu("G1")]}, headers=NODE)
    control.approve("n1")
    doc = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}, tenant: {tenant}}}\n"
        "spec:\n  type: {type}\n  command: [sleep, '60']\n"
        "  resources: {{gpu: {{memory: {gib}GiB}}}}\n  sharing: timeslice\n  priority: {prio}\n"
    )
    for name in ("a", "b"):
        text = doc.format(name=name, tenant="research", type="service", gib=60, prio=10)
        assert http.post("/api/v1/workloads", content=text, headers=as_["r"]).status_code == 200
    bully = doc.format(name="bully", tenant="search", type="service", gib=140, prio=100)
    r = http.post("/api/v1/workloads", content=bully, headers=as_["s"])
    assert r.status_code == 200, r.text
    told = r.json()["results"][0]["displaced"]
    reason = "preempted by search/bully (priority 100)"
    assert told == [{"workload": other, "action": "evicted", "reason": reason}] * 2, told
    for who, cause in (("x", "search/bully"), ("r", other)):
        seen = http.get("/api/v1/workloads/research/a", headers=as_[who]).json()
        (evicted,) = [e for e in seen["events"] if e["kind"] == "evicted"]
        assert evicted["cause"] == cause and evicted["message"] == reason.replace(
            "search/bully", cause
        )
        assert seen["reason"].startswith(f"preempted by {cause}"), seen
        assert (seen["restarts"], seen["evictions"]) == (0, 1), seen  # a move, no restart
    mine = http.get("/api/v1/events", headers=as_["s"]).json()["events"]
    (summary,) = [e for e in mine if e["kind"] == "displaced"]
    assert (
        summary["subject"] == "search/bully"
        and summary["message"] == f"evicted 2: {other}, {other}"
    )
    assert "research/" not in http.get("/api/v1/events", headers=as_["s"]).text
    # a job that ends on its node keeps its GPU and node in the list
    job = doc.format(name="j", tenant="search", type="job", gib=1, prio=200)
    assert http.post("/api/v1/workloads", content=job, headers=as_["s"]).status_code == 200
    epoch = control.core.assigned["search/j"].epoch
    control.heartbeat("n1", Report(ended={"search/j": (epoch, "succeeded")}), {})
    (ended,) = [
        w
        for w in http.get("/api/v1/workloads", headers=as_["s"]).json()["workloads"]
        if w["name"] == "j"
    ]
    assert ended["phase"] == "succeeded" and ended["node"] == "n1", ended
    assert ended["placement"]["where"]["gpus"] == ["n1/G1"], ended
    control.close()


def test_a_manifest_that_is_not_utf8_is_refused_naming_the_offset(client: Any) -> None:
    """Never replaced without a word: a name or a secret would change."""
    http, control = client
    doc = (
        b"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: w}\nspec:\n  type: service\n"
        b"  command: [sleep, '1']\n  env: {SECRET: 'p\xe4ss'}\n  resources: {gpu: {count: 1}}\n"
    )
    r = http.post("/api/v1/workloads", content=doc)
    assert r.status_code == 422, r.text
    offset = doc.index(b"\xe4")
    assert f"byte 0xe4 at offset {offset} (line 7)" in r.text and "UTF-8" in r.text, r.text
    assert control.store.workloads() == []


def test_what_a_node_says_is_stored_as_text_and_buries_no_one(tmp_path: Path) -> None:
    """Terminal escapes in a node's events are stored escaped; one node's flood about a tenant's
    workload fills at most half of that tenant's newest-100 view."""
    from gpufrac.cluster.core import NodeEvent, Report

    control = ControlPlane(tmp_path)
    http = control_client(control, cluster_token=TOKEN)
    http.post("/cluster/v1/nodes/n1/join", json={"gpus": [gpu("G1")]}, headers=NODE)
    control.approve("n1")
    doc = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {}, tenant: a}}\nspec:\n"
        "  command: [sleep, '60']\n  resources: {{gpu: {{fraction: 0.1}}}}\n"
    )
    assert http.post("/api/v1/workloads", content=doc.format("w")).status_code == 200
    evil = "\x1b]0;pwned\x07\x1b[2J\rok\nfake line"
    control.heartbeat("n1", Report(), {}, None, [NodeEvent("started", "a/w", evil)])
    control.heartbeat("n1", Report(), {}, None, [NodeEvent("xid", "n1", evil)])
    said = [e.message for e in control.store.events(limit=50) if e.kind in ("started", "xid")]
    assert said and all("\x1b" not in m and "\r" not in m and "\n" not in m for m in said), said
    assert "\\x1b]0;pwned\\x07" in said[0], said
    shown = http.get("/api/v1/events").json()["events"]
    assert not any("\x1b" in e["message"] for e in shown)
    for name in ("x1", "x2", "x3"):  # the tenant's own events, from the control plane
        assert http.post("/api/v1/workloads", content=doc.format(name)).status_code == 200
    flood = [NodeEvent("started", "a/w", f"flood {i}") for i in range(150)]
    control.heartbeat("n1", Report(), {}, None, flood)
    view = http.get("/api/v1/events", params={"tenant": "a"}).json()["events"]
    assert sum(1 for e in view if e["message"].startswith("flood")) <= 50
    assert {"a/x1", "a/x2", "a/x3"} <= {e["subject"] for e in view if e["kind"] == "applied"}
    control.close()
