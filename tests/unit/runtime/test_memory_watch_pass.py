"""Each GPU is read once in a reconcile pass, whatever number of workloads share it (a full read
per workload held the agent's lock for seconds at 300 workloads: the hostile review); a share of
several GPUs is held to its limit on each."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpufrac.devices import open_simulated
from gpufrac.planning.sched_decision import Decision
from gpufrac.runtime.memory_watch import MemoryWatch


class Counting:
    def __init__(self, dev: Any) -> None:
        self.dev, self.reads = dev, 0

    def gpu(self, uuid: str) -> Any:
        self.reads += 1
        return self.dev.gpu(uuid)


def test_a_gpu_is_read_once_a_pass(tmp_path: Path) -> None:
    dev = open_simulated("h200:1", tmp_path)
    uuid = dev.gpus()[0].uuid
    counting = Counting(dev)
    watch = MemoryWatch(counting)  # type: ignore[arg-type]
    watch.new_pass()
    for _ in range(300):
        assert watch.use(uuid, lambda pids: frozenset()).mib == 0
    assert counting.reads == 1
    watch.new_pass()  # the next pass reads it afresh
    watch.use(uuid, lambda pids: frozenset())
    assert counting.reads == 2


class TwoGpus:
    """Two GPUs whose processes hold the given MiB (pid -> MiB, per GPU)."""

    def __init__(self, held: dict[str, dict[int, int]]) -> None:
        self.held = held

    def gpu(self, uuid: str) -> Any:
        procs = [SimpleNamespace(pid=p, used_memory_mib=m) for p, m in self.held[uuid].items()]
        return SimpleNamespace(processes=procs)


def test_a_share_of_several_gpus_is_held_to_its_limit_on_each(tmp_path: Path) -> None:
    """A share of each of two GPUs (10 GiB each): within its limit on both it runs, whatever
    the sum; over it on its second GPU it is stopped, naming that GPU."""
    decision = Decision("a/x", "placed", mode="timeslice", gpus=("GPU-0", "GPU-1"))
    mine = lambda pids: frozenset(p for p in pids if p < 100)  # noqa: E731
    within = MemoryWatch(TwoGpus({"GPU-0": {1: 10240, 500: 9000}, "GPU-1": {1: 10000}}))
    within.new_pass()
    assert within.over_limit(decision, 10240, tmp_path, mine) == ""
    over = MemoryWatch(TwoGpus({"GPU-0": {1: 100}, "GPU-1": {1: 6000, 2: 5000}}))
    over.new_pass()
    why = over.over_limit(decision, 10240, tmp_path, mine)
    assert why == (
        "stopped: it used 11000 MiB of GPU memory on GPU-1, over its 10240 MiB limit on each of "
        "its GPUs"
    )
