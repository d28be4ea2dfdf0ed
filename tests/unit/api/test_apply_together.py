"""The new workloads of one manifest are placed together (``apply_new_workloads``): all waiting
before the first is tried, so two small ones share a new MIG instance (docs/mig.md), which one at
a time they never would; what is stored already is applied as before, each in its place."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from gpufrac.api.app import create_app
from gpufrac.devices import open_simulated
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.service import AgentService
from gpufrac.serving.agent_deployments import AgentDeployments


def doc(name: str, memory: str = "3GiB", sharing: str = "mps") -> str:
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}}}\n"
        f"spec: {{command: [sleep, '60'], sharing: {sharing}, "
        f"resources: {{gpu: {{memory: {memory}}}}}}}\n"
    )


def test_two_small_workloads_of_one_manifest_share_a_new_instance(tmp_path: Path) -> None:
    agent = Agent(tmp_path / "data", open_simulated("h100:1:mig", tmp_path / "data"))
    service = AgentService(agent)
    client = TestClient(create_app(service, AgentDeployments(service, gateway_port=0)))
    try:
        r = client.post("/api/v1/workloads", content="---\n".join([doc("a"), doc("b")]))
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["workload"] for x in results] == ["default/a", "default/b"]  # in order
        assert [x["result"] for x in results] == ["created", "created"]
        placed = [x["decision"] for x in results]
        assert placed[0]["mig"] == placed[1]["mig"] is not None  # one instance, shared
        assert all(d["mode"] == "mps" for d in placed)
        assert not any(x["warnings"] for x in results)  # a share is not an oversized slice
        # again, with one more: the two stored are unchanged, the new one joins them
        r = client.post("/api/v1/workloads", content="---\n".join([doc("a"), doc("b"), doc("c")]))
        results = r.json()["results"]
        assert [x["result"] for x in results] == ["unchanged", "unchanged", "created"]
        assert results[2]["decision"]["mig"] == placed[0]["mig"], results[2]
    finally:
        for name in ("a", "b", "c"):
            agent.delete("default", name)
        agent.reconcile()
        agent.close()
