"""Each GPU is read once in a reconcile pass, whatever number of workloads share it (a full read
per workload held the agent's lock for seconds at 300 workloads: the hostile review)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufrac.devices import open_simulated
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
