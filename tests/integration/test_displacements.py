"""Every displacement told, per viewer, against a real agent on simulated GPUs: an event for each
workload that lost its place (naming its cause to the admin and the cause's tenant only), the
``displaced`` list in the apply answer and in the CLI, restarts apart from evictions, a finished
job that keeps where it ran, and cross-tenant preemption as the operator's decision."""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from tests.integration.conftest import TOKENS, RunningAgent
from tests.integration.test_agent_api import manifest, wait_for
from tests.integration.test_cli_contract import cli

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(60)"]
OTHER = "another tenant's workload"


def h(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[who]}"}


def service(name: str, tenant: str, gib: int, priority: int) -> str:
    return manifest(name, SLEEP, gpu=f"{{memory: {gib}GiB}}", tenant=tenant).replace(
        "  type: service\n", f"  type: service\n  priority: {priority}\n"
    )


def phases(agent: RunningAgent) -> dict[str, str]:
    ws = httpx.get(agent.url + "/api/v1/workloads", headers=h("admin"), timeout=10).json()
    return {f"{w['tenant']}/{w['name']}": w["phase"] for w in ws["workloads"]}


def events(agent: RunningAgent, key: str, who: str) -> list[dict[str, Any]]:
    r = httpx.get(agent.url + f"/api/v1/workloads/{key}", headers=h(who), timeout=10)
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["events"]
    return found


def settled(agent: RunningAgent, want: dict[str, str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (seen := phases(agent)) and any(seen.get(k) != v for k, v in want.items()):
        assert time.monotonic() < deadline, seen
        time.sleep(0.1)


def test_every_displaced_workload_is_told_each_viewer_what_it_may_see(
    tenant_agent: RunningAgent,
) -> None:
    url = tenant_agent.url + "/api/v1/workloads"
    # the first plain GPU: two of research's services and one of search's, 120 GiB of 140; the
    # second: research's big one (100 GiB, above search's priority), 40 GiB left
    for name, tenant, gib, prio in [
        ("a", "research", 40, 10),
        ("b", "research", 40, 10),
        ("low", "search", 40, 5),
        ("big", "research", 100, 200),
    ]:
        r = httpx.post(url, content=service(name, tenant, gib, prio), headers=h(tenant))
        assert r.status_code == 200, r.text
    running = {k: "running" for k in ("research/a", "research/b", "search/low", "research/big")}
    settled(tenant_agent, running)
    # search's 140 GiB service takes the first GPU: all three go; one fits beside big
    r = httpx.post(url, content=service("bully", "search", 140, 100), headers=h("search"))
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    assert result["decision"]["outcome"] == "placed"
    told = result["displaced"]
    assert Counter(x["action"] for x in told) == {"evicted": 2, "moved": 1}
    assert sorted(x["workload"] for x in told) == sorted([OTHER, OTHER, "search/low"])
    assert all(x["reason"] == "preempted by search/bully (priority 100)" for x in told)
    assert "research/" not in r.text
    moved = next(x["workload"] for x in told if x["action"] == "moved")
    settled(tenant_agent, {"search/bully": "running"})

    # one event per displaced workload, of its action's kind, with its cause
    for key in ("research/a", "research/b", "search/low"):
        kind = "moved" if key == moved else "evicted"
        mine = [e for e in events(tenant_agent, key, "admin") if e["kind"] == kind]
        assert len(mine) == 1, events(tenant_agent, key, "admin")
        assert mine[0]["cause"] == "search/bully"
        assert mine[0]["message"] == "preempted by search/bully (priority 100)"
    # research is not told who took its place; the admin is
    theirs = [e for e in events(tenant_agent, "research/a", "research") if e["kind"] == "evicted"]
    assert theirs[0]["cause"] == OTHER
    assert theirs[0]["message"] == f"preempted by {OTHER} (priority 100)"
    listed = httpx.get(tenant_agent.url + "/api/v1/events", headers=h("research")).text
    assert "bully" not in listed and not re.search(r"\bsearch/", listed), listed
    everything = httpx.get(tenant_agent.url + "/api/v1/events", headers=h("admin")).json()
    assert any(
        e["subject"] == "research/b" and e["cause"] == "search/bully" for e in everything["events"]
    )
    # the cause's own event lists them, another tenant's unnamed to its tenant
    (summary,) = [
        e for e in events(tenant_agent, "search/bully", "search") if e["kind"] == "displaced"
    ]
    assert summary["message"] == f"evicted 2: {OTHER}, {OTHER}; moved 1: search/low"
    (full,) = [e for e in events(tenant_agent, "search/bully", "admin") if e["kind"] == "displaced"]
    assert full["message"] == "evicted 2: research/a, research/b; moved 1: search/low"
    # a waiting victim's reason, as each may see it
    waiting = httpx.get(url + "/research/a", headers=h("research")).json()
    assert waiting["phase"] == "pending" and OTHER in waiting["reason"], waiting
    assert not re.search(r"\bsearch/", httpx.get(url + "/research/a", headers=h("research")).text)
    assert "search/bully" in httpx.get(url + "/research/a", headers=h("admin")).json()["reason"]
    assert httpx.get(url + "/research/a", headers=h("admin")).json()["placement"]["cause"] == (
        "search/bully"
    )

    # research has no preemption setting: at 500 it evicts none of search's work (own-tenant)
    r = httpx.post(url, content=service("boss", "research", 140, 500), headers=h("research"))
    result = r.json()["results"][0]
    assert result["decision"]["outcome"] == "pending" and result["displaced"] == [], r.text
    assert "may evict only its own tenant's work" in result["decision"]["reason"]
    assert phases(tenant_agent)["search/bully"] == "running"
    # said once at start: research's default changed, and how to keep the old one; search has its
    # own setting, so nothing is said of it
    log = (tenant_agent.data_dir.parent / "agent.log").read_text()
    assert log.count("tenant research: preemption is own-tenant by default") == 1, log
    assert "tenants.research.preemption: lower-priority in gpufrac.yaml" in log
    assert "tenant search:" not in log


def test_the_cli_prints_what_an_apply_displaced_and_an_eviction_is_no_restart(
    agent: RunningAgent, tmp_path: Path
) -> None:
    url = agent.url + "/api/v1/workloads"
    # a finished job keeps where it ran: its GPU, and its node
    done = manifest("done", [PY, "-c", "pass"], kind="job")
    assert httpx.post(url, content=done, timeout=10).status_code == 200
    wait_for(agent, lambda ws: any(w["name"] == "done" and w["phase"] == "succeeded" for w in ws))
    finished = httpx.get(url + "/default/done", timeout=10).json()
    gpus = httpx.get(agent.url + "/api/v1/gpus", timeout=10).json()["gpus"]
    ran = next(g for g in gpus if g["uuid"] == finished["placement"]["where"]["gpus"][0])
    assert finished["node"] == ran["node"], finished

    def whole(name: str, priority: str) -> str:  # both plain GPUs
        text = manifest(name, SLEEP, gpu="{count: 2}")
        return text.replace("  sharing: timeslice\n", f"  priority: {priority}\n")

    assert httpx.post(url, content=whole("low", "low"), timeout=10).status_code == 200
    settled(agent, {"default/low": "running"})
    high = tmp_path / "high.yaml"
    high.write_text(whole("high", "high"))
    r = cli(agent, "apply", "-f", str(high))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "default/high created (evicted 1: default/low): placed" in r.stdout, r.stdout
    assert "evicted default/low: preempted by default/high" in r.stdout
    settled(agent, {"default/low": "pending", "default/high": "running"})
    told = [e for e in events(agent, "default/low", "admin") if e["kind"] == "evicted"]
    assert [e["cause"] for e in told] == ["default/high"]
    assert httpx.delete(url + "/default/high", timeout=10).status_code == 200
    settled(agent, {"default/low": "running"})  # it runs again: an eviction, not a restart
    low = httpx.get(url + "/default/low", timeout=10).json()
    assert (low["attempts"], low["restarts"], low["evictions"]) == (2, 0, 1), low
    described = cli(agent, "describe", "workload", "default/low").stdout
    assert "Attempts:    2 (restarts 0, evictions 1, last exit -)" in described, described
    wide = cli(agent, "get", "workloads", "-o", "wide").stdout.splitlines()
    head = wide[0].split()
    rows = {x.split()[1]: x.split() for x in wide[1:]}
    assert rows["low"][head.index("RESTARTS")] == "0", wide
    assert rows["low"][head.index("EVICTIONS")] == "1", wide
    # the finished job's row still says where it ran
    assert rows["done"][head.index("NODE")] == ran["node"], wide
    assert rows["done"][head.index("GPU")] == str(ran["index"]), wide
