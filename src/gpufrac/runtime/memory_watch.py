"""GPU memory limits where nothing else enforces them, and what workloads use.

On time-sliced and MPS GPUs (a MIG instance is a hard limit by itself) each reconcile pass sums the
GPU memory NVML reports for the processes of a workload (its runner says which are: its cgroup and
its process group, ``Runs.members``), records the peak with the run (its ``usage`` note), and says
when the workload is over its limit; the agent then stops it. A workload with a share of each of
several GPUs has its limit on each: each of its GPUs is read and checked on its own (the peak kept
is the most it held on one). ``use`` is the same reading for metrics and views (of one GPU: a
workload's first, where it has several, as its metrics' labels say).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpufrac.devices.nvml import NvmlDevices
from gpufrac.model.gpu import GpuState
from gpufrac.planning.sched_decision import Decision
from gpufrac.runtime.runs import read_note, write_note

# of the pids given, those that are the workload's processes (its runner tells: ``Runs.members``)
Members = Callable[[Iterable[int]], frozenset[int]]


@dataclass(frozen=True, slots=True)
class MemoryUse:
    mib: int
    pids: tuple[int, ...]


class MemoryWatch:
    def __init__(self, dev: NvmlDevices) -> None:
        self.dev = dev
        # each GPU as read once in a pass: a full read (its instances, processes, GPM) for each
        # of 300 workloads on one GPU held the agent's lock for seconds (the hostile review)
        self._read: dict[str, GpuState] = {}

    def new_pass(self) -> None:
        """What was read belongs to the pass before: read each GPU afresh when next asked."""
        self._read.clear()

    def use(self, gpu_uuid: str, members: Members, gpu: GpuState | None = None) -> MemoryUse:
        """GPU memory held now by the workload's processes (``members``: which of the GPU's are
        its), as NVML reports it (``gpu``: the GPU as just read, where the caller has it; else as
        read once in this pass)."""
        state = gpu if gpu is not None else self._read.get(gpu_uuid)
        if state is None:
            state = self._read[gpu_uuid] = self.dev.gpu(gpu_uuid)
        mine = members(p.pid for p in state.processes) if state.processes else frozenset()
        procs = [p for p in state.processes if p.pid in mine]
        return MemoryUse(sum(p.used_memory_mib or 0 for p in procs), tuple(p.pid for p in procs))

    def over_limit(
        self,
        decision: Decision,
        limit_mib: int | None,
        run_dir: Path,
        members: Members,
    ) -> str:
        """Why the workload must be stopped for its memory, or "" (also where nothing is enforced
        here: a MIG instance is a hard limit by itself). Keeps the peak in the run."""
        if decision.mode not in ("timeslice", "mps") or not decision.gpus or limit_mib is None:
            return ""
        used_on = {uuid: self.use(uuid, members).mib for uuid in decision.gpus}
        used = max(used_on.values())  # the limit is each GPU's
        usage = read_note(run_dir, "usage")
        if used > int(str(usage.get("peak_mib", 0))):
            write_note(run_dir, "usage", {"peak_mib": used, "limit_mib": limit_mib})
        if used <= limit_mib:
            return ""
        if len(used_on) == 1:
            return f"stopped: it used {used} MiB of GPU memory, over its {limit_mib} MiB limit"
        over = next(uuid for uuid, mib in used_on.items() if mib == used)
        return (
            f"stopped: it used {used} MiB of GPU memory on {over}, over its {limit_mib} MiB "
            "limit on each of its GPUs"
        )
