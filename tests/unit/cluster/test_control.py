"""The control plane as an object (``cluster.control.ControlPlane``): what it decides about nodes
and the work waiting for them, with its store on disk and a clock of the test's."""

from __future__ import annotations

import itertools
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
