"""What a workload got from the QoS arbiter, for ``describe`` and the API: its class and settings,
and the share of its GPU it actually got, measured, beside the share the arbiter gave it.

Measured means: NVML's per-process SM utilization of the workload's processes where the driver
reports it (a whole, time-sliced GPU); otherwise the GPU time the SDK timed with CUDA events and
reported with each turn (MPS, where NVML sums all clients into the server, and MIG, where it reports
no processes' use). Neither is guessed: without a reading the measured share is ``None``.
"""

from __future__ import annotations

import time
from typing import Any

from gpufrac.model.gpu import GpuState
from gpufrac.model.qos import min_share_of, qos_params
from gpufrac.model.workload import WorkloadSpec
from gpufrac.planning.scheduler import Decision
from gpufrac.runtime.agent import Agent, WorkloadState


class Readings:
    """One view's device readings, each GPU read once however many workloads ask (listing 200
    workloads on 8 GPUs reads 8 GPUs, not 200)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._gpus: dict[str, GpuState] | None = None
        self._util: dict[str, dict[int, int] | None] = {}

    @property
    def gpus(self) -> dict[str, GpuState]:
        if self._gpus is None:
            self._gpus = {g.uuid: g for g in self.agent.dev.gpus()}
        return self._gpus

    def utilization(self, uuid: str) -> dict[int, int] | None:
        if uuid not in self._util:
            self._util[uuid] = self.agent.health.process_utilization(uuid)
        return self._util[uuid]


def workload_qos(
    agent: Agent,
    spec: WorkloadSpec,
    decision: Decision | None,
    stats: dict[str, Any],
    readings: Readings | None = None,
    state: WorkloadState | None = None,
) -> dict[str, Any]:
    """``stats`` is the arbiter's, as the last reconcile pass read them (``agent.arbiter.latest``);
    ``readings``: the device readings of the view this is part of."""
    key = f"{spec.tenant}/{spec.name}"
    member = stats.get(key) or {}
    measured: float | None = None
    source: str | None = None
    if decision is not None and decision.gpus and decision.mode == "timeslice" and not decision.mig:
        read = readings or Readings(agent)
        use = agent.memory_use(spec.tenant, spec.name, read.gpus, state)
        by_pid = read.utilization(decision.gpus[0])
        if use is not None and use.pids and by_pid is not None:
            measured = sum(by_pid.get(pid, 0) for pid in use.pids) / 100
            source = "nvml"
    if measured is None and member.get("gpu_share") is not None:
        measured, source = float(member["gpu_share"]), "sdk"
    return {
        "class": qos_params(spec).rank,
        "priority": spec.priority,
        "qos": spec.qos,
        "weight": spec.weight,
        "min_share": min_share_of(spec, agent.settings.job_min_share_milli) / 1000,
        "mode": member.get("mode"),  # cooperative (SDK) | transparent (paused by signals) | None
        "paused": member.get("paused"),
        "paused_by": _named_to(spec.tenant, member.get("paused_by")),
        "paused_s": member.get("paused_s"),
        **agent.qos.pauses.view(key, time.monotonic()),
        "run_s": member.get("held_s"),
        "busy_s": member.get("busy_s"),
        "active": member.get("active"),
        "turns": member.get("turns"),
        "arbiter_share": member.get("share"),
        "measured_share": measured,
        "measured_by": source,
    }


def _named_to(tenant: str, key: str | None) -> str | None:
    """Another workload's key as ``tenant`` may see it: its own tenant's by name, others' not."""
    if key is None or key.split("/", 1)[0] == tenant:
        return key
    return "another tenant's workload"
