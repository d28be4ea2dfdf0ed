"""``GET /api/v1/gpus`` shows which workload is on which GPU and MIG instance, through a real
agent."""

from __future__ import annotations

import sys
import time
from typing import Any

import httpx

from tests.integration.conftest import TOKENS, RunningAgent

PY = sys.executable
REPORT = "from gpufrac import sdk; import time; sdk.report_gpu_use(1500, 20); time.sleep(60)"


def h(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[who]}"}


def workload(name: str, tenant: str, gpu: str, sharing: str) -> str:
    return (
        "apiVersion: gpufrac/v1\nkind: Workload\n"
        f"metadata: {{name: {name}, tenant: {tenant}}}\n"
        f'spec:\n  type: service\n  command: ["{PY}", "-c", "{REPORT}"]\n'
        f"  resources: {{gpu: {gpu}}}\n  sharing: {sharing}\n"
    )


def fleet(agent: RunningAgent, who: str) -> list[dict[str, Any]]:
    r = httpx.get(agent.url + "/api/v1/gpus", headers=h(who), timeout=10)
    assert r.status_code == 200, r.text
    gpus: list[dict[str, Any]] = r.json()["gpus"]
    return gpus


def placed(gpus: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """name (or "?" for an anonymous share) -> (its GPU, its allocation)."""
    return {a["name"] or "?": (g, a) for g in gpus for a in g["allocations"]}


def test_gpus_show_each_workload_where_it_runs_and_anonymise_other_tenants(
    tenant_agent: RunningAgent,
) -> None:
    url = tenant_agent.url + "/api/v1/workloads"
    mps = workload("embed", "search", "{memory: 8GiB, compute: 30%}", "mps")
    mig = workload("train", "research", "{mig: 1g.18gb}", "mig")
    assert httpx.post(url, content=mps, headers=h("search"), timeout=10).status_code == 200
    assert httpx.post(url, content=mig, headers=h("research"), timeout=10).status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # both run and have reported their memory
        seen = placed(fleet(tenant_agent, "admin"))
        if all(
            seen.get(n, ({}, {}))[1].get("used_memory_mib") == 1500
            and seen[n][1]["phase"] == "running"
            and (n != "embed" or seen[n][1]["sm_percent"] == 20)
            for n in ("embed", "train")
        ):
            break
        time.sleep(0.2)
    seen = placed(fleet(tenant_agent, "admin"))
    gpu, embed = seen["embed"]
    assert gpu["instances"] == [] and gpu["mig_mode"]["current"] == "disabled"
    assert embed == {
        "tenant": "search",
        "name": "embed",
        "phase": "running",
        "mode": "mps",
        "mig": None,
        "memory_mib": 8192,
        "compute_pct": 30,
        "used_memory_mib": 1500,
        # NVML's sample under MPS is the server's; its one client here is embed's: it is embed's
        "sm_percent": 20,
    }
    assert gpu["reserved_memory_mib"] == 8192 and gpu["reserved_compute_pct"] == 30
    assert gpu["node"] and gpu["cordoned"] is None
    mig_gpu, train = seen["train"]
    assert mig_gpu["mig_mode"]["current"] == "enabled" and train["mode"] == "mig"
    inst = next(i for i in mig_gpu["instances"] if i["profile"] == "1g.18gb")
    assert train["mig"] == {"profile": "1g.18gb", "start": inst["start"], "gi_id": inst["gi_id"]}
    assert train["memory_mib"] == mig_gpu["reserved_memory_mib"] > 0
    assert train["tenant"] == "research" and train["used_memory_mib"] == 1500
    assert {p["pid"] for p in mig_gpu["processes"]}  # the admin sees every process

    # search sees its own by name, research's as an anonymous reserved share without processes
    own = placed(fleet(tenant_agent, "search"))
    assert own["embed"][1] == embed and own["embed"][0]["processes"]
    anon_gpu, anon = own["?"]
    assert anon_gpu["uuid"] == mig_gpu["uuid"]
    assert anon == {
        **train,
        "tenant": None,
        "name": None,
        "used_memory_mib": None,
        "sm_percent": None,
    }
    assert anon_gpu["processes"] == []
    assert "train" not in own and "research" not in str(own)

    # a cordon shows on its GPU
    admin = {**h("admin")}
    r = httpx.post(f"{tenant_agent.url}/api/v1/gpus/{gpu['index']}/cordon", headers=admin)
    assert r.status_code == 200
    again = {g["uuid"]: g for g in fleet(tenant_agent, "research")}
    assert again[gpu["uuid"]]["cordoned"]
    anon_embed = again[gpu["uuid"]]["allocations"][0]
    assert anon_embed["name"] is None and anon_embed["memory_mib"] == 8192
