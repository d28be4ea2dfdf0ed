"""The agent's care of GPUs: cordon, uncordon, drain; Xid/ECC events and lost GPUs; idle MPS daemons."""

from __future__ import annotations

from gpufrac.devices.health import DeviceHealth
from gpufrac.devices.nvml import NvmlDevices
from gpufrac.errors import InputError
from gpufrac.model.mig import MigPlacement
from gpufrac.model.migplan import MigAction
from gpufrac.planning.sched_state import EXTERNAL
from gpufrac.planning.scheduler import Decision, Scheduler
from gpufrac.runtime.mig_apply import ApplyRefused, GpuTarget, apply_targets
from gpufrac.runtime.mps import MpsDaemons
from gpufrac.runtime.store import Store


class GpuCare:
    """Mixed into ``Agent``: what it does to GPUs as a whole."""

    store: Store
    scheduler: Scheduler
    dev: NvmlDevices
    health: DeviceHealth
    mps: MpsDaemons

    def _stop_runs(self, tenant: str, name: str) -> None:  # provided by Agent
        raise NotImplementedError

    def _record(self, decisions: list[Decision]) -> None:  # provided by Agent
        raise NotImplementedError

    def _stop_idle_mps(self) -> None:
        """An MPS daemon whose GPU has no MPS workload left is stopped."""
        if not self.mps.enabled:
            return
        for g in self.scheduler.state.gpus:
            if self.mps.running(g.uuid) and g.mode != "mps":
                self.mps.stop(g.uuid)
                self.store.record_event("mps_stopped", g.uuid, "no MPS workload left")

    # -- GPUs: cordon, drain, health -------------------------------------------------------------

    def cordon(self, uuid: str, reason: str = "cordoned by hand") -> None:
        """No new work on this GPU; what runs there stays."""
        g = self.scheduler.state.by_uuid.get(uuid)
        if g is None:
            raise InputError(
                f"no schedulable GPU {uuid}", field="gpu", fix="gpufrac get gpus lists them"
            )
        self.store.cordon(uuid, reason)
        self.scheduler.state.set_schedulable(g, False)

    def uncordon(self, uuid: str) -> list[Decision]:
        g = self.scheduler.state.by_uuid.get(uuid)
        if g is None:
            raise InputError(
                f"no schedulable GPU {uuid}", field="gpu", fix="gpufrac get gpus lists them"
            )
        self.store.uncordon(uuid)
        self.scheduler.state.set_schedulable(g, True)
        decisions = self.scheduler.retry_pending()
        self._record(decisions)
        return decisions

    def drain(self, uuid: str, reason: str = "drained by hand") -> list[Decision]:
        """Cordon the GPU and move its workloads elsewhere (stopped here, placed again, or pending)."""
        self.cordon(uuid, reason)
        g = self.scheduler.state.by_uuid[uuid]
        moved: list[Decision] = []
        for key in sorted(
            {a.workload for a in g.allocs.values()}
            | {o for o in g.instances.values() if o and "/" in o}
        ):
            spec = self.scheduler.specs.get(key)
            if spec is None:
                continue
            self._stop_runs(spec.tenant, spec.name)
            self.store.record_event("moved", key, f"off GPU {g.index}: {reason}")
            self._record(self.scheduler.delete(spec.tenant, spec.name))
            decisions = self.scheduler.submit(spec)
            self._record(decisions)
            moved.extend(decisions)
        return moved

    def _watch_health(self) -> None:
        """An Xid or ECC error, or a GPU that is lost, drains the GPU."""
        while (event := self.health.wait_event(0)) is not None:
            if event.gpu_uuid not in self.store.cordons():
                self.drain(event.gpu_uuid, f"{event.kind} {event.data}")
        lost = {g.uuid for g in self.scheduler.state.gpus} - {
            g.uuid for g in self.dev.gpus() if g.health == "ok"
        }
        for uuid in lost - set(self.store.cordons()):
            self.drain(uuid, "the GPU is lost")

    def apply_mig(
        self,
        uuid: str,
        mig_enabled: bool,
        layout: list[MigPlacement],
        *,
        drain: bool = False,
        allow_mode_change: bool = False,
    ) -> list[MigAction]:
        """Change a GPU's MIG mode or instances through the agent, so its scheduler stays true.

        Workloads on instances that go (or on a GPU whose mode changes) are moved elsewhere with
        ``drain``; without it the change is refused and nothing happens."""
        g = self.scheduler.state.by_uuid.get(uuid)
        if g is None:
            raise InputError(f"no GPU {uuid}", field="gpu", fix="gpufrac get gpus lists them")
        wanted = set(layout) if mig_enabled else set()
        owners = {o for pl, o in g.instances.items() if o and o != EXTERNAL and pl not in wanted}
        if mig_enabled != g.mig:
            owners |= {a.workload for a in g.allocs.values()}
        if owners and not drain:
            raise ApplyRefused(
                f"GPU {g.index}: the change would remove the GPU from under {', '.join(sorted(owners))} "
                "(pass drain to move them elsewhere first)"
            )
        moved = [self.scheduler.specs[k] for k in sorted(owners) if k in self.scheduler.specs]
        for spec in moved:
            self._stop_runs(spec.tenant, spec.name)
            self._record(self.scheduler.delete(spec.tenant, spec.name))
        done = apply_targets(
            self.dev,
            [GpuTarget(uuid, mig_enabled, tuple(sorted(layout)))],
            drain=drain,
            allow_mode_change=allow_mode_change,
        )
        now = self.dev.gpu(uuid)
        self.scheduler.relayout(uuid, now.mig_enabled, list(now.layout))
        self.store.record_event(
            "mig_changed", uuid, f"{len(done)} action(s); MIG {now.mig_current}"
        )
        for spec in moved:
            self._record(self.scheduler.submit(spec))
        self._record(self.scheduler.retry_pending())
        return done
