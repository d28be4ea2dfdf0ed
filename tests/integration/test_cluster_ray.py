"""gpufrac on a real multi-node Ray cluster (a head and three raylets on this machine, each node
with its own simulated GPU), all inside a network namespace with only loopback: placement by
label, the lease's environment in workloads and Ray actors (and Ray's own GPU ids there), gpufrac
leases against Ray's plain ``num_gpus`` fractions, a pool of leases serving many tasks, a control
plane killed and restarted (its node agents go on), a node killed (its whole PID namespace) while a
deployment with a replica on it and one on another node serves traffic, and the control plane
stopped cleanly (its node agents stop). The scenario is
``ray_scenario.py``; this test runs it (as root, which CI is: ``unshare -n`` needs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCENARIO = Path(__file__).with_name("ray_scenario.py")


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("the Ray cluster test runs as root, in its own network namespace (unshare -n)")
    out = tmp_path_factory.mktemp("ray")
    done = subprocess.run(
        ["unshare", "-n",
         sys.executable, str(SCENARIO), "--lo-up", str(out)],
        capture_output=True, text=True, timeout=420, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    (out / "seen.json").write_text(lines[-1] if lines else "")  # beside the logs, to read after
    assert done.returncode == 0 and lines, (done.stdout[-3000:], done.stderr[-3000:])
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def test_placement_follows_labels_and_the_lease_env_reaches_the_workload(
    seen: dict[str, Any],
) -> None:
    assert seen["nodes_of"]["embed"] == "n0" and seen["nodes_of"]["rank"] == "n1"
    assert seen["embed_env"].startswith("MIG-")  # its MIG device, from its node's agent


def test_a_ray_actor_runs_on_its_lease_and_gpufrac_queues_what_ray_would_oversubscribe(
    seen: dict[str, Any],
) -> None:
    env, node_id = seen["actor_a"]
    assert env == seen["lease_a"]["env"] and env.startswith("GPU-")
    assert node_id == seen["lease_a_ray_node"]
    assert seen["lease_b"].startswith("waits: ")  # 100GiB more fits on no GPU: it waits
    (env1, node1), (env2, node2) = seen["plain_ray"]  # num_gpus=0.5 twice: one GPU, shared
    assert node1 == node2 and env1 == env2 == "0"
    assert seen["lease_a_released"]
    assert seen["orphan_lease_given_back_s"] < 10  # a dead driver's lease: back within its ttl


def test_ray_sees_the_leases_device_in_a_leased_actor_and_task(seen: dict[str, Any]) -> None:
    device = seen["lease_a"]["env"]
    gpus = seen["actor_a_gpus"]  # before: ray.get_gpu_ids() == [] (no GPU of Ray's asked for)
    assert gpus["gpu_ids"] == gpus["accelerator_ids"] == [device] and gpus["env"] == device
    assert gpus["made_with"] == ["a", "leased"]  # the constructor's args and kwargs
    task = seen["task_a"]
    assert task["gpu_ids"] == [device] and task["env"] == device
    assert task["node"] == seen["lease_a_ray_node"]
    # plain Ray, for comparison: its own GPU index, and that index as CUDA_VISIBLE_DEVICES
    assert [g["gpu_ids"] for g in seen["plain_ray_gpus"]] == [["0"], ["0"]]


def test_a_pool_of_two_leases_serves_many_tasks(seen: dict[str, Any]) -> None:
    tasks = seen["pool_tasks"]
    assert len(tasks) == 16
    assert all(t["gpu_ids"] == [t["env"]] and t["env"] in seen["pool_devices"] for t in tasks)
    assert all(t["node"] in seen["pool_ray_nodes"] for t in tasks)
    # two leases served all 16 tasks (each task ran with one of them), from few Ray workers
    assert len(seen["leases_while_pooled"]) == 2
    assert {t["lease"] for t in tasks} == set(seen["leases_while_pooled"])
    assert len({t["pid"] for t in tasks}) <= len(tasks) / 2  # Ray workers reused, not one a task
    # a task on a lease of its own costs a lease and a Ray worker's start; pooled (the leases and
    # the workers' start shared by the 16 tasks), far less
    pooled = seen["pool_leases_s"] + seen["pool_16_s"]
    assert pooled / len(tasks) < seen["task_on_own_lease_s"] / 4, seen
    assert seen["pool_released"] == [404, 404]


def test_a_control_plane_restart_restarts_nothing(seen: dict[str, Any]) -> None:
    assert seen["restart_kept"] is True, (
        seen["restart_epochs"],
        seen["control_restart_to_ready_s"],
    )
    before, after = seen["agents_through_kill"]  # kill -9: its node agents went on, taken over
    assert len(before) == 3 and after == before


def test_a_cleanly_stopped_control_plane_stops_the_node_agents_it_started(
    seen: dict[str, Any],
) -> None:
    assert seen["agent_left_after_its_actor"] is False  # its Ray worker gone: the agent too
    assert seen["agents_before_stop"] >= 1  # the nodes left after one was killed, less that one
    assert seen["control_stop_rc"] == 128 + 15  # SIGTERM, handled: through its clean-up
    assert seen["agents_left_after_stop"] == [] and seen["agent_hosts_left"] == []
    assert seen["control_stop_to_agents_gone_s"] < 20


def test_a_frozen_agents_work_is_stopped_before_it_runs_once_elsewhere(
    seen: dict[str, Any],
) -> None:
    assert seen["frozen_old_pids"]  # it ran there before the freeze
    assert seen["frozen_old_copy_alive_when_moved"] == []  # stopped by its shim first
    assert seen["mover_after_freeze"] != seen["nodes_of"]["mover"]
    assert seen["thawed_runs_mover"] is False  # woken, it runs nothing it used to


def test_a_lost_nodes_work_runs_once_elsewhere(seen: dict[str, Any]) -> None:
    assert seen["nodes_after"][seen["lost"]] == "lost"
    assert seen["mover_after"] != seen["lost"]
    assert seen["old_copies_alive"] == []
    if seen["pid_namespaces"]:  # where the machine allows one per node (this one does)
        assert seen["killed_node_processes_left"] == []  # its raylet, agent, shims, workloads
    assert seen["node_loss_to_replaced_s"] < 15


def test_a_deployment_on_two_nodes_answers_every_request_while_one_dies(
    seen: dict[str, Any],
) -> None:
    assert seen["replica_nodes"] == ["n1", "n2"]  # spread over the nodes that take MPS work
    assert seen["served"] == [200, {"outputs": 6}]
    codes = seen["traffic_through_node_loss"]
    assert set(codes) == {"200"} and codes["200"] > 100, codes  # not one failed request
    survivor = ({"n1", "n2"} - {seen["lost"]}).pop()
    assert seen["replica_nodes_after"] == [survivor, survivor]  # the lost one's replaced there
    assert seen["replica_loss_to_replaced_s"] < 15
