"""Mixed into ``Agent``: keeping the QoS arbiter told which workloads share which GPU.

Each reconcile pass sends the arbiter (``runtime/arbiter_link.py``) the workloads running on each
domain (a GPU, or a MIG instance) with their class, weight, min share and process group, and keeps
what the arbiter gave each one in its run directory (``qos.json``, for summaries after the run). A
starting agent resumes every workload's process group, so nothing a crashed agent's arbiter paused
stays paused.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufrac.model.qos import qos_params
from gpufrac.model.workload import spec_from_json
from gpufrac.planning.scheduler import Decision
from gpufrac.runtime.arbiter_link import ArbiterLink, MemberSpec
from gpufrac.runtime.runs import write_json
from gpufrac.runtime.shim import read_status
from gpufrac.runtime.store import Store

if TYPE_CHECKING:
    from gpufrac.runtime.agent import WorkloadState


class QosCare:
    store: Store
    arbiter: ArbiterLink
    _qos_written: dict[str, Any]  # what each run's qos.json holds, so it is written on change only

    def _latest(self, tenant: str, name: str, generation: int) -> Path | None:  # by Agent
        raise NotImplementedError

    def _attempts(self, tenant: str, name: str, generation: int) -> list[Path]:  # by Agent
        raise NotImplementedError

    def _sync_arbiter(self, states: list[WorkloadState]) -> None:
        """Tell the arbiter which workloads share which GPU (or MIG instance), with their class."""
        members: dict[str, MemberSpec] = {}
        runs: dict[str, Path] = {}
        for st in states:
            d = st.decision
            if d is None or d.outcome != "placed" or st.phase not in ("starting", "running"):
                continue
            tenant, name = st.key.split("/", 1)
            stored = self.store.workload(tenant, name)
            run = self._latest(tenant, name, st.generation)
            if stored is None or run is None:
                continue
            status = read_status(run)
            if status.done or not status.shim_alive or status.child_pid is None:
                continue
            spec = spec_from_json(stored.spec)
            members[st.key] = MemberSpec(qos_domain(d, st.env), qos_params(spec), status.child_pid)
            runs[st.key] = run
        try:
            self.arbiter.sync(members)
        except (RuntimeError, OSError) as e:
            self.store.record_event("qos_error", "arbiter", str(e))
        written = self._qos_written
        for key, got in self.arbiter.stats().items():  # kept with the run, for summaries after it
            if key in runs and written.get(key) != got:
                write_json(runs[key] / "qos.json", got)
                written[key] = got
        for key in [k for k in written if k not in runs]:
            del written[key]

    def _resume_all(self) -> None:
        """SIGCONT every workload's process group (harmless for one that runs)."""
        for w in self.store.workloads():
            for run in self._attempts(w.tenant, w.name, w.generation):
                status = read_status(run)
                if status.child_pid is not None and not status.done:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(status.child_pid, signal.SIGCONT)


def qos_domain(d: Decision, env: dict[str, str]) -> str:
    """What the arbiter arbitrates: the MIG instance, else the (first) GPU."""
    if d.mig is not None and env.get("CUDA_VISIBLE_DEVICES"):
        return env["CUDA_VISIBLE_DEVICES"].split(",")[0]
    return d.gpus[0] if d.gpus else ""
