"""Mixed into ``Agent``: GPU memory limits where nothing else enforces them, and what workloads use.

On time-sliced and MPS GPUs (a MIG instance is a hard limit by itself) each reconcile pass sums the
GPU memory NVML reports for the processes of a workload's process group, records the peak, and stops
the workload when it is over its limit. ``workload_memory_mib`` is the same reading for metrics and
views.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpufrac.devices.nvml import NvmlDevices
from gpufrac.model.workload import WorkloadSpec
from gpufrac.planning.scheduler import Decision, Scheduler, workload_key
from gpufrac.runtime.runs import process_group, read_json, write_json
from gpufrac.runtime.shim import read_status, stop
from gpufrac.runtime.store import Store

if TYPE_CHECKING:
    from gpufrac.runtime.agent import Agent


class MemoryWatch:
    store: Store
    scheduler: Scheduler
    dev: NvmlDevices
    stop_grace: float

    def _memory_watchdog(self, spec: WorkloadSpec, decision: Decision, run_dir: Path) -> str:
        """Stop a workload whose processes hold more GPU memory than it was given (where nothing else
        enforces it: MIG instances are hard limits). Returns the reason if it was stopped."""
        if decision.mode not in ("timeslice", "mps") or not decision.gpus:
            return ""
        alloc = self.scheduler.allocations(workload_key(spec))
        child = read_status(run_dir).child_pid
        if not alloc or child is None:
            return ""
        limit = alloc[0].memory_mib
        used = sum(
            p.used_memory_mib or 0
            for p in self.dev.gpu(decision.gpus[0]).processes
            if process_group(p.pid) == child
        )
        usage = read_json(run_dir / "usage.json")
        if used > int(str(usage.get("peak_mib", 0))):
            write_json(run_dir / "usage.json", {"peak_mib": used, "limit_mib": limit})
        if used <= limit:
            return ""
        why = f"stopped: it used {used} MiB of GPU memory, over its {limit} MiB limit"
        write_json(run_dir / "killed.json", {"reason": why})
        self.store.record_event("memory_limit", workload_key(spec), why)
        stop(run_dir, grace=self.stop_grace)
        return why


@dataclass(frozen=True, slots=True)
class MemoryUse:
    mib: int
    pids: tuple[int, ...]


def workload_memory_mib(agent: Agent, tenant: str, name: str) -> MemoryUse | None:
    """GPU memory held now by a running workload's processes (its process group), as NVML reports it."""
    stored = agent.store.workload(tenant, name)
    placed = agent.store.placement(tenant, name)
    if stored is None or placed is None or not placed[1].get("gpus"):
        return None
    run = agent.latest_run(tenant, name, stored.generation)
    child = read_status(run).child_pid if run else None
    if child is None:
        return None
    procs = [
        p
        for p in agent.dev.gpu(str(placed[1]["gpus"][0])).processes
        if process_group(p.pid) == child
    ]
    return MemoryUse(sum(p.used_memory_mib or 0 for p in procs), tuple(p.pid for p in procs))
