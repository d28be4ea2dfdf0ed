"""Quality of service as values: how a workload's ``priority`` and ``qos`` become an arbiter class,
and the MPS client priority that goes with it.

The arbiter (``runtime/arbiter.py``) serves classes in strict order (a higher ``rank`` first),
shares time within a class by ``weight``, and guarantees each workload its ``min_share`` of a GPU's
busy time even against higher classes. ``docs/qos.md`` documents the mapping; keep the two in step.

* rank = 2 x priority, plus 1 for ``qos: latency``. So a higher priority always wins, and between
  equal priorities a latency workload comes before a throughput one.
* MPS has two client priorities (``CUDA_MPS_CLIENT_PRIORITY``): 0 (normal) for ``qos: latency``, 1
  (below normal) for ``qos: throughput``. CUDA reads it when the process creates its context, so a
  change reaches MPS at the workload's next start; the arbiter applies every change at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufrac.model.workload import QOS_MODES, QosMode, WorkloadSpec, WorkloadType

__all__ = [
    "DEFAULT_QOS",
    "QOS_MODES",
    "QosParams",
    "min_share_of",
    "mps_client_priority",
    "qos_params",
]

DEFAULT_QOS: dict[WorkloadType, QosMode] = {"service": "latency", "job": "throughput"}
MAX_WEIGHT = 1000
MILLI = 1000


@dataclass(frozen=True, slots=True)
class QosParams:
    """What the arbiter needs to know about one workload."""

    rank: int
    weight: int = 1
    min_share_milli: int = 0  # thousandths of the GPU's busy time, guaranteed while it wants a turn

    def to_json(self) -> dict[str, int]:
        return {"rank": self.rank, "weight": self.weight, "min_share_milli": self.min_share_milli}

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> QosParams:
        def num(key: str, default: int) -> int:
            value = raw.get(key, default)
            return value if isinstance(value, int) and not isinstance(value, bool) else default

        return cls(
            rank=num("rank", 0),
            weight=max(1, min(MAX_WEIGHT, num("weight", 1))),
            min_share_milli=max(0, min(MILLI, num("min_share_milli", 0))),
        )


def arbiter_rank(priority: int, qos: str) -> int:
    """The arbiter class of a workload: higher is served first."""
    return 2 * priority + (1 if qos == "latency" else 0)


def mps_client_priority(qos: QosMode) -> int:
    """``CUDA_MPS_CLIENT_PRIORITY``: 0 is normal (latency), 1 is below normal (throughput)."""
    return 0 if qos == "latency" else 1


def min_share_of(spec: WorkloadSpec, job_min_share_milli: int = 0) -> int:
    """The share a workload is guaranteed: its own ``min_share``, else the operator's default for
    jobs (so a job never waits forever beside a busier class), else none."""
    if spec.min_share_milli is not None:
        return spec.min_share_milli
    return job_min_share_milli if spec.type == "job" else 0


def qos_params(spec: WorkloadSpec, job_min_share_milli: int = 0) -> QosParams:
    """What the arbiter is told about a workload."""
    return QosParams(
        rank=arbiter_rank(spec.priority, spec.qos),
        weight=spec.weight,
        min_share_milli=min_share_of(spec, job_min_share_milli),
    )
