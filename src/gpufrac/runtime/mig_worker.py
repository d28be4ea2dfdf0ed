"""MIG changes carried out in the background: one thread per GPU, never under the agent's lock.

Creating or destroying a MIG instance takes the driver a while (about half a second each on an
H100). The agent's reconcile pass queues a workload's MIG actions here and goes on; a thread per GPU
carries them out in order (a workload's destroys, then its create), through the device adapter
alone: it never touches the store or the scheduler, so it needs no lock but the GPU's own. What
happened is collected (``take``) by the next pass, which records it (events, failures with backoff)
and starts the workloads whose instances are ready. An action of a workload that failed is not
followed by the rest of its actions. ``gpu_lock`` is held for every change of a GPU's MIG layout,
also an operator's.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from gpufrac.devices.errors import DeviceError
from gpufrac.devices.nvml import NvmlDevices
from gpufrac.model.mig import MigPlacement
from gpufrac.planning.sched_decision import SchedAction


@dataclass(frozen=True, slots=True)
class MigOutcome:
    workload: str
    action: SchedAction
    error: str | None  # None: done (or nothing was left to do)
    changed: bool = False  # the device was changed (not so when it was as asked already)


class MigWorker:
    def __init__(self, dev: NvmlDevices) -> None:
        self.dev = dev
        self.notify: Callable[[], None] = lambda: None  # called when an outcome is ready
        self._mu = threading.Lock()
        self._gpu_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._queues: dict[str, deque[SchedAction]] = defaultdict(deque)
        self._threads: dict[str, threading.Thread] = {}
        self._queued: dict[str, int] = defaultdict(int)  # workload -> its actions not done yet
        self._open: list[SchedAction] = []  # queued or under way
        self._failed: set[str] = set()  # workloads whose queued actions are skipped
        self._outcomes: list[MigOutcome] = []

    def gpu_lock(self, uuid: str) -> threading.Lock:
        with self._mu:
            return self._gpu_locks[uuid]

    def submit(self, action: SchedAction) -> None:
        """Queue one MIG action; actions of one GPU are carried out in the order queued."""
        assert action.gpu_uuid is not None
        uuid = action.gpu_uuid
        with self._mu:
            self._queues[uuid].append(action)
            self._queued[action.workload] += 1
            self._open.append(action)
            thread = self._threads.get(uuid)
            if thread is None or not thread.is_alive():
                thread = threading.Thread(
                    target=self._run, args=(uuid,), name=f"gpufrac-mig-{uuid[:12]}", daemon=True
                )
                self._threads[uuid] = thread
                thread.start()

    def busy(self, workload: str) -> bool:
        """Whether MIG actions of ``workload`` are queued or under way."""
        with self._mu:
            return self._queued.get(workload, 0) > 0

    def destroying(self, uuid: str, placement: MigPlacement) -> bool:
        """Whether the instance at ``placement`` on GPU ``uuid`` is queued to be destroyed: until it
        is, an instance seen there is the old one, not one made anew for a later placement."""
        with self._mu:
            return any(
                a.mig_change == "destroy" and a.gpu_uuid == uuid and a.mig == placement
                for a in self._open
            )

    def wait_idle(self, uuid: str, timeout: float = 60.0) -> bool:
        """Wait until no MIG action of GPU ``uuid`` is queued or under way (False: timed out)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._mu:
                if not any(a.gpu_uuid == uuid for a in self._open):
                    return True
            time.sleep(0.01)
        return False

    def take(self) -> list[MigOutcome]:
        """What was done since the last call."""
        with self._mu:
            out, self._outcomes = self._outcomes, []
            return out

    def close(self, timeout: float = 30.0) -> None:
        """Wait for the changes under way (a GPU left half cut helps nobody)."""
        with self._mu:
            threads = list(self._threads.values())
        for t in threads:
            t.join(timeout)

    def _run(self, uuid: str) -> None:
        while True:
            with self._mu:
                queue = self._queues[uuid]
                if not queue:
                    self._threads.pop(uuid, None)
                    return
                action = queue.popleft()
                skip = action.workload in self._failed
            error: str | None = None
            changed = False
            if not skip:
                with self.gpu_lock(uuid):
                    error, changed = self._device(action)
            with self._mu:
                self._open.remove(action)
                self._queued[action.workload] -= 1
                if error is not None:
                    self._failed.add(action.workload)
                if self._queued[action.workload] <= 0:
                    del self._queued[action.workload]
                    self._failed.discard(action.workload)
                if not skip:
                    self._outcomes.append(MigOutcome(action.workload, action, error, changed))
            self.notify()

    def _device(self, a: SchedAction) -> tuple[str | None, bool]:
        """Carry one MIG action out on the device: (the error as text or None, whether it
        changed)."""
        assert a.gpu_uuid is not None and a.mig is not None
        try:
            inst = self.dev.gpu(a.gpu_uuid).instance_at(a.mig)
            match a.kind:
                case "destroy_mig_instance":
                    if inst is None:
                        return None, False  # already gone
                    if inst.busy:
                        return f"{a.mig} has processes on it; it is not destroyed", False
                    self.dev.destroy_instance(a.gpu_uuid, inst.gi_id)
                case "create_mig_instance":
                    if inst is not None:
                        return None, False  # already there
                    self.dev.create_instance(a.gpu_uuid, a.mig.profile, a.mig.start)
                case "evict" | "start" | "stop":
                    return f"{a.kind} is not a MIG action", False
                case _:
                    assert_never(a.kind)
        except DeviceError as e:
            return e.message, False
        return None, True
