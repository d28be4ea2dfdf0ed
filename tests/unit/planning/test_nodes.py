"""Nodes in the scheduler: a workload's ``spec.node_selector`` picks the nodes it may run on, and a
request for several whole GPUs takes them from one node."""

from __future__ import annotations

import dataclasses

from gpufrac.model.catalog import lookup_model
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.sched_state import SchedGpu
from gpufrac.planning.scheduler import Scheduler

H200 = lookup_model("h200")
GIB = 1024
LABELS = {"gpu-a": {"zone": "eu", "gpufrac.io/pool": "train"}, "gpu-b": {"zone": "us"}}


def two_nodes(per_node: int = 2, mig: bool = False) -> list[SchedGpu]:
    out = []
    for node in ("gpu-a", "gpu-b"):
        for _ in range(per_node):
            i = len(out)
            out.append(SchedGpu(f"GPU-{i}", i, H200, mig=mig, node=node, node_labels=LABELS[node]))
    return out


def w(
    name: str, priority: int = 50, selector: dict[str, str] | None = None, **gpu: object
) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        gpu=GpuRequest(**gpu),  # type: ignore[arg-type]
        command=("true",),
        tenant="a",
        priority=priority,
        node_selector=selector or {},
    )


def node_of(s: Scheduler, key: str) -> set[str]:
    return {s.state.gpus[a.gpu].node for a in s.allocations(key)}


def test_a_selector_places_only_on_a_node_with_every_label() -> None:
    s = Scheduler(two_nodes())
    for i in range(3):
        d = s.submit(w(f"us{i}", selector={"zone": "us"}, memory_mib=60 * GIB))[0]
        assert d.outcome == "placed"
        assert node_of(s, f"a/us{i}") == {"gpu-b"}
    both = {"zone": "eu", "gpufrac.io/pool": "train"}
    assert s.submit(w("eu", selector=both, count=1))[0].outcome == "placed"
    assert node_of(s, "a/eu") == {"gpu-a"}


def test_no_node_with_the_labels_leaves_it_pending_and_says_which_label_is_missing() -> None:
    s = Scheduler(two_nodes())
    d = s.submit(w("x", selector={"zone": "eu", "gpufrac.io/pool": "infer"}, count=1))[0]
    assert d.outcome == "pending"
    assert d.reason == (
        "no node has its spec.node_selector labels: node gpu-a lacks gpufrac.io/pool=infer; "
        "node gpu-b lacks gpufrac.io/pool=infer, zone=eu"
    )
    # a twin of the same shape but no selector is not held back by the first one's failure
    assert s.submit(w("y", count=1))[0].outcome == "placed"
    assert s.retry_pending() == []


def test_a_full_node_with_the_labels_is_named_beside_those_without() -> None:
    s = Scheduler(two_nodes())
    for i in range(2):
        assert s.submit(w(f"b{i}", count=1, selector={"zone": "us"}))[0].outcome == "placed"
    d = s.submit(w("more", count=1, selector={"zone": "us"}))[0]
    assert d.outcome == "pending"
    assert "node gpu-a lacks label zone=us" in d.reason
    assert "needs 1 whole GPU(s); 0 free on nodes with its labels now" in d.reason


def test_several_whole_gpus_come_from_one_node() -> None:
    s = Scheduler(two_nodes())
    assert s.submit(w("one-a", count=1, selector={"zone": "eu"}))[0].outcome == "placed"
    assert s.submit(w("one-b", count=1, selector={"zone": "us"}))[0].outcome == "placed"
    # one GPU is free on each node: two GPUs exist, but not on one node
    d = s.submit(w("pair", count=2))[0]
    assert d.outcome == "pending"
    assert "needs 2 whole GPU(s) on one node; 2 free now" in d.reason
    s.delete("a", "one-b")
    assert node_of(s, "a/pair") == {"gpu-b"}
    assert len(s.allocations("a/pair")) == 2


def test_preemption_for_whole_gpus_takes_them_from_one_node_with_the_labels() -> None:
    s = Scheduler(two_nodes())
    for name, zone in (("a0", "eu"), ("a1", "eu"), ("b0", "us"), ("b1", "us")):
        s.submit(w(name, priority=0, count=1, selector={"zone": zone}))
    d = s.submit(w("big", priority=100, count=2, selector={"zone": "us"}))
    assert d[0].outcome == "placed"
    assert sorted(x.workload for x in d[1:]) == ["a/b0", "a/b1"]
    assert node_of(s, "a/big") == {"gpu-b"}


def test_mig_requests_follow_the_selector_and_a_held_one_keeps_a_gpu_on_its_node() -> None:
    s = Scheduler(two_nodes(per_node=1, mig=True))
    d = s.submit(w("m", selector={"zone": "us"}, mig_profile="7g.141gb"))[0]
    assert (d.outcome, node_of(s, "a/m")) == ("placed", {"gpu-b"})
    d = s.submit(w("m2", selector={"zone": "us"}, mig_profile="1g.18gb"))[0]
    assert d.outcome == "pending" and "node gpu-a lacks label zone=us" in d.reason


def test_the_selector_is_part_of_the_stored_spec_only_when_set() -> None:
    from gpufrac.model.workload import spec_from_json, spec_to_json

    plain = w("p", count=1)
    assert "node_selector" not in spec_to_json(plain)  # old stores and template hashes unchanged
    chosen = dataclasses.replace(plain, node_selector={"zone": "eu"})
    assert spec_from_json(spec_to_json(chosen)) == chosen
    assert spec_from_json(spec_to_json(plain)) == plain


def test_a_recut_decided_elsewhere_is_restored_with_its_destroys() -> None:
    """A node's scheduler takes a placement made by another scheduler over the same GPU, re-cut
    included: the idle instances it destroys go, the new one comes, the layouts agree."""
    from gpufrac.model.mig import MigPlacement

    def one_mig_gpu() -> SchedGpu:
        g = SchedGpu("GPU-m", 0, H200, mig=True, node="gpu-a")
        g.instances = {MigPlacement(i, "1g.18gb"): None for i in range(7)}
        return g

    decider, node = Scheduler([one_mig_gpu()]), Scheduler([one_mig_gpu()])
    d = decider.submit(w("big", mig_profile="7g.141gb"))[0]
    assert d.outcome == "placed"
    assert [a.kind for a in d.actions].count("destroy_mig_instance") == 7
    node.restore(decider.spec("a/big"), d)  # type: ignore[arg-type]
    assert "a/big" not in node.pending
    assert node.state.gpus[0].instances == decider.state.gpus[0].instances
    assert not node.state.violations(False, {})


def test_more_whole_gpus_than_any_node_has_is_refused_at_once() -> None:
    s = Scheduler(two_nodes())  # two nodes of two GPUs
    d = s.submit(w("big", count=3))[0]
    assert d.outcome == "refused"
    assert d.reason == "asks for 3 whole GPUs on one node; no node has more than 2 without MIG"
    assert s.submit(w("fits", count=2))[0].outcome == "placed"


def test_the_operator_keeps_a_tenant_to_its_nodes_with_a_reason_of_its_own() -> None:
    """``tenants.NAME.nodes``: a filter of the scheduler, whatever the workload's own selector
    asks; once those nodes are full it waits, saying why, and does not spill elsewhere (nor
    evict there)."""
    from gpufrac.model.settings import parse_settings

    settings = parse_settings("tenants:\n  a:\n    nodes: {zone: us}\n")
    assert settings.kept_to("a") == {"zone": "us"}
    s = Scheduler(two_nodes(), settings)
    for i in range(2):
        assert s.submit(w(f"u{i}", count=1))[0].outcome == "placed"
        assert node_of(s, f"a/u{i}") == {"gpu-b"}
    d = s.submit(w("more", count=1))[0]
    assert d.outcome == "pending"
    assert "tenant a is kept to nodes labelled zone=us (tenants.a.nodes in gpufrac.yaml)" in (
        d.reason
    )
    # its own selector cannot take it elsewhere
    eu = s.submit(w("eu", count=1, selector={"zone": "eu"}))[0]
    assert eu.outcome == "pending"
    assert node_of(s, "a/eu") == set()
    # another tenant is not kept
    other = dataclasses.replace(w("free", count=1), tenant="b")
    assert s.submit(other)[0].outcome == "placed"
    assert node_of(s, "b/free") == {"gpu-a"}
    nowhere = parse_settings("tenants:\n  a:\n    nodes: {zone: mars}\n")
    d = Scheduler(two_nodes(), nowhere).submit(w("m", count=1))[0]
    assert d.outcome == "pending"
    assert d.reason.startswith("tenant a is kept to nodes labelled zone=mars")
