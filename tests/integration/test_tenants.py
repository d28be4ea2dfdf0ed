"""Tenant isolation on every endpoint, with API tokens."""

from __future__ import annotations

import sys

import httpx

from tests.integration.conftest import TOKENS, RunningAgent
from tests.integration.test_agent_api import manifest

PY = sys.executable


def h(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[who]}"}


def test_tenants_see_and_change_only_their_own(tenant_agent: RunningAgent) -> None:
    url = tenant_agent.url + "/api/v1"
    sleepy = [PY, "-c", "import time; time.sleep(60)"]
    assert httpx.get(url + "/workloads").status_code == 401
    assert (
        httpx.get(url + "/workloads", headers={"authorization": "Bearer nope"}).status_code == 401
    )
    # a manifest naming another tenant is refused, and nothing is stored
    r = httpx.post(
        url + "/workloads", content=manifest("x", sleepy, tenant="research"), headers=h("search")
    )
    assert r.status_code == 403
    assert httpx.get(url + "/workloads", headers=h("admin")).json()["workloads"] == []
    assert (
        httpx.post(
            url + "/workloads",
            content=manifest("web", sleepy, tenant="search"),
            headers=h("search"),
        ).status_code
        == 200
    )
    # research cannot see, read, log or delete search's workload; search can
    assert httpx.get(url + "/workloads", headers=h("research")).json()["workloads"] == []
    for method, path in [
        ("GET", "/workloads/search/web"),
        ("GET", "/workloads/search/web/logs"),
        ("DELETE", "/workloads/search/web"),
    ]:
        assert httpx.request(method, url + path, headers=h("research")).status_code == 404
    assert [
        w["name"] for w in httpx.get(url + "/workloads", headers=h("search")).json()["workloads"]
    ] == ["web"]
    assert httpx.get(url + "/workloads/search/web", headers=h("search")).status_code == 200
    assert all(
        e["subject"].startswith("search/")
        for e in httpx.get(url + "/events", headers=h("search")).json()["events"]
    )
    assert httpx.get(url + "/events", headers=h("research")).json()["events"] == []
    # GPUs: tenants read them, only the admin changes them or reads the metrics
    gpus = httpx.get(url + "/gpus", headers=h("research")).json()["gpus"]
    assert (
        httpx.post(url + f"/gpus/{gpus[0]['index']}/cordon", headers=h("search")).status_code == 403
    )
    assert (
        httpx.post(url + f"/gpus/{gpus[0]['index']}/cordon", headers=h("admin")).status_code == 200
    )
    assert httpx.get(tenant_agent.url + "/metrics", headers=h("search")).status_code == 403
    assert httpx.get(tenant_agent.url + "/metrics", headers=h("admin")).status_code == 200
    assert httpx.delete(url + "/workloads/search/web", headers=h("search")).status_code == 200
