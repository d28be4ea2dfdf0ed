"""The control plane as an object (``cluster.control.ControlPlane``): what it decides about nodes
and the work waiting for them, with its store on disk and a clock of the test's."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

from gpufrac.cluster.control import ControlPlane
from gpufrac.cluster.core import Report
from gpufrac.model.catalog import lookup_model
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.sched_state import SchedGpu

H200 = lookup_model("h200")
GIB = 1024
SERIAL = itertools.count()


def gpus(n: int) -> list[SchedGpu]:
    return [SchedGpu(f"GPU-{next(SERIAL)}", 0, H200, mig=False) for _ in range(n)]


def w(name: str, tenant: str = "a", **gpu: object) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        gpu=GpuRequest(**gpu),  # type: ignore[arg-type]
        command=("true",),
        tenant=tenant,
    )


def joined(control: ControlPlane, name: str, n: int) -> None:
    """A node the control plane started itself (approved at once) joins with ``n`` GPUs."""
    control.admitted_join(name, control.bootstrap(name), {}, gpus(n), None)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_work_applied_before_any_node_joins_waits_and_is_placed_when_one_that_fits_joins(
    tmp_path: Path,
) -> None:
    control = ControlPlane(tmp_path, clock=Clock())
    result, decision = control.apply_workload(w("early", memory_mib=20 * GIB))
    assert result == "created"
    assert decision.outcome == "pending"
    phase, reason, _ = control.status("a/early")
    assert phase == "pending"
    assert reason.startswith("no node that could hold it has joined yet")
    joined(control, "n1", 1)
    answer = control.heartbeat("n1", Report(), {})
    assert [a.workload for a in answer.run] == ["a/early"]
    # once nodes are there, what no GPU could ever hold is refused, as before
    result, decision = control.apply_workload(w("huge", memory_mib=4000 * GIB))
    assert (result, decision.outcome) == ("refused", "refused")


def test_a_fencing_that_replaced_a_process_in_place_counts_as_a_restart(tmp_path: Path) -> None:
    """Its node fenced it (went unanswered) and ran it again under the same placement: its process
    was replaced where it ran, so RESTARTS counts it; a move elsewhere stays an eviction."""
    control = ControlPlane(tmp_path, clock=Clock())
    joined(control, "n1", 1)
    control.apply_workload(w("svc", memory_mib=GIB))
    epoch = control.heartbeat("n1", Report(), {}).run[0].epoch
    ran = {"phase": "running", "attempts": 2, "restarts": 1, "evictions": 0}
    control.heartbeat("n1", Report(running={"a/svc": epoch}), {"a/svc": ran})
    again = {"phase": "running", "attempts": 1, "restarts": 0, "evictions": 0}
    control.heartbeat("n1", Report(running={"a/svc": epoch}), {"a/svc": again})
    assert control.counts("a/svc", again) == (2, 0)  # its failure before, and the fencing


def test_a_frozen_node_is_fenced_once_saying_it_was_stopped(tmp_path: Path) -> None:
    """A node agent that did not run for longer than its fencing time (frozen) fences itself on
    waking, saying so (not "the control plane has not answered"), and the control plane stores
    that fencing once, however many heartbeats the node needs to get back (the lost answer took
    its events: they are not sent again)."""
    from gpufrac.cluster.node import NodeAgent, ServiceLink
    from gpufrac.devices import open_simulated
    from gpufrac.model.settings import OperatorSettings
    from gpufrac.runtime.agent import Agent

    control_clock, node_clock = Clock(), Clock()
    control = ControlPlane(tmp_path / "control", clock=control_clock)
    data = tmp_path / "n1"
    data.mkdir()
    settings = OperatorSettings(node_name="n1", workload_users="agent")
    agent = Agent(data, open_simulated("h200:1", data), settings)
    node = NodeAgent(agent, ServiceLink(control), fence_s=1.0, clock=node_clock)
    try:
        node.step()
        assert control.core.nodes["n1"].state == "alive"
        node_clock.now = 30.0  # frozen: no step, no heartbeat for 30 s
        control_clock.now = control.core.lease_s + 30.0
        control.tick()
        assert control.core.nodes["n1"].state == "lost"
        for _ in range(4):  # it wakes: fences, is told it was lost, joins again, goes on
            node.step()
            node_clock.now += 0.2
            control_clock.now += 0.2
        assert control.core.nodes["n1"].state == "alive"
        fenced = [e for e in control.store.events(limit=1000) if e.kind == "fenced"]
        assert len(fenced) == 1, [e.message for e in fenced]
        assert "this node was stopped (frozen?) for 30.0 s" in fenced[0].message, fenced[0]
        assert "has not answered" not in fenced[0].message
    finally:
        agent.close()
        control.close()


def test_a_nodes_view_of_a_workload_is_kept_only_as_the_control_plane_reads_it() -> None:
    """From the hostile review: a node's ``restarts: "lots"`` made every listing a 500, its
    escapes reached users' terminals, and a QoS view without a class broke describe."""
    from gpufrac.cluster.control import node_view

    kept = node_view(
        {
            "phase": "running",
            "reason": "\x1b]0;owned\x07paused while beta/db uses the GPU",
            "attempts": 2,
            "restarts": "lots",
            "evictions": -5,
            "exit_code": None,
            "env": {"A": "1", "B": 2},
            "qos": {"pauses": 10**30},
            "extra": {"anything": True},
        }
    )
    assert kept["attempts"] == 2 and "restarts" not in kept and "evictions" not in kept
    assert "\x1b" not in kept["reason"] and "\x07" not in kept["reason"]
    assert kept["env"] == {"A": "1"} and "qos" not in kept and "extra" not in kept
    env = node_view({"env": {"\x1b[2J": "x"}})["env"]
    assert env == {"\\x1b[2J": "x"}  # a key is text too


def test_a_nodes_view_of_its_gpus_is_kept_as_printable_text() -> None:
    """From the second hostile review: a GPU name with escape codes in a node's heartbeat set
    the terminal's title and cleared the screen of whoever ran gpufrac get gpus -o wide."""
    from gpufrac.cluster.control import printable_tree

    gpu = {
        "uuid": "GPU-1",
        "name": "\x1b]0;owned\x07NVIDIA H200\x1b[2J",
        "warnings": ["\x9b31m red"],
        "memory_total_mib": 143771,
        "instances": [{"profile": "1g.18gb\r", "busy": True}],
        "\x1b": 1,
    }
    kept = printable_tree(gpu)
    text = json.dumps(kept)
    assert not any(c in "".join(map(str, _strings(kept))) for c in "\x1b\x07\x9b\r")
    assert kept["memory_total_mib"] == 143771 and kept["instances"][0]["busy"] is True
    assert kept["name"] == "\\x1b]0;owned\\x07NVIDIA H200\\x1b[2J" and "owned" in text


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value.keys(), *(s for v in value.values() for s in _strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_the_control_plane_checks_the_operators_bounds_at_apply(tmp_path: Path) -> None:
    """A mount outside containers.allowed_mounts (and a priority or user over the tenant's bounds)
    is refused at the control plane's apply, naming the field, with nothing stored: it was stored
    and placed before, and only the node could refuse it."""
    from dataclasses import replace

    import pytest

    from gpufrac.errors import InputError
    from gpufrac.model.settings import ContainerSettings, OperatorSettings
    from gpufrac.model.workload import VolumeMount

    settings = OperatorSettings(containers=ContainerSettings(allowed_mounts=("/data",)))
    control = ControlPlane(tmp_path, settings, clock=Clock())
    outside = replace(w("m"), image="localhost/x:1", mounts=(VolumeMount("/root", "/r"),))
    with pytest.raises(InputError) as e:
        control.apply_workload(outside)
    assert e.value.field == "spec.mounts[0].source"
    assert control.store.workload("a", "m") is None
    inside = replace(outside, mounts=(VolumeMount("/data/models", "/m"),))
    assert control.apply_workload(inside)[0] == "created"


def test_new_workloads_applied_together_share_a_mig_instance_on_a_node(tmp_path: Path) -> None:
    """A manifest's new small workloads are placed together on a cluster too, so they share a
    new MIG instance (docs/mig.md, the nesting rule); one by one, the first takes a whole one."""
    control = ControlPlane(tmp_path, clock=Clock())
    control.admitted_join(
        "m1", control.bootstrap("m1"), {}, [SchedGpu("GPU-m", 0, H200, mig=True)], None
    )
    small = [replace(w(n, memory_mib=3 * GIB), sharing="timeslice") for n in ("s1", "s2")]
    answers = control.apply_new_workloads(small)
    assert [r for r, _ in answers] == ["created", "created"]
    placed = [d for _, d in answers]
    assert all(d.outcome == "placed" and d.mode == "timeslice" for d in placed), placed
    assert placed[0].mig is not None and placed[0].mig == placed[1].mig  # one instance, shared
    assert {a.workload for a in control.heartbeat("m1", Report(), {}).run} == {"a/s1", "a/s2"}
    # stored already: applied one by one, as before (unchanged here)
    again = control.apply_new_workloads(small)
    assert [r for r, _ in again] == ["unchanged", "unchanged"]
