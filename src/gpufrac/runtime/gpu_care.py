"""The agent's care of GPUs as a whole: cordon, uncordon, drain; Xid/ECC events and lost GPUs; idle
MPS daemons; MIG layouts an operator sets (pinned until released)."""

from __future__ import annotations

from gpufrac.devices.health import DeviceHealth
from gpufrac.devices.nvml import NvmlDevices
from gpufrac.errors import InputError
from gpufrac.model.mig import MigPlacement
from gpufrac.model.migplan import MigAction
from gpufrac.planning.sched_decision import Decision, displacement_of
from gpufrac.planning.sched_state import CORDONED, SchedGpu
from gpufrac.planning.scheduler import Scheduler
from gpufrac.runtime.executor import Executor
from gpufrac.runtime.mig_apply import ApplyRefused, GpuTarget, apply_targets, diff_actions
from gpufrac.runtime.mps import MpsDaemons, MpsDomain
from gpufrac.runtime.store import Store


class GpuCare:
    def __init__(
        self,
        store: Store,
        scheduler: Scheduler,
        dev: NvmlDevices,
        health: DeviceHealth,
        mps: MpsDaemons,
        executor: Executor,
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self.dev = dev
        self.health = health
        self.mps = mps
        self.executor = executor

    def gpu(self, uuid: str) -> SchedGpu:
        g = self.scheduler.state.by_uuid.get(uuid)
        if g is None:
            raise InputError(
                f"no schedulable GPU {uuid}", field="gpu", fix="gpufrac get gpus lists them"
            )
        return g

    def stop_idle_mps(self) -> None:
        """An MPS daemon whose domain has no MPS workload left is stopped: a GPU's, where no MPS
        workload is on that GPU alone; a MIG instance's shared inside, where none shares it
        under MPS; one serving several GPUs together, where no MPS workload is on exactly those
        (runtime/mps.py, MPS domains). One that still has workloads gets its server-side limits
        set again to the largest of those left (lowered once a larger workload has gone: the
        next client of a server the daemon runs can then raise its own no further; the bounds
        are only sent where they change)."""
        if not self.mps.enabled:
            return
        st = self.scheduler.state
        busy = {frozenset(st.gpus[i].uuid for i in g.mps_domain) for g in st.gpus if g.mps_domain}
        for g in st.gpus:
            alone = MpsDomain((g.uuid,))
            if self.mps.running(alone) and frozenset(alone.devices) not in busy:
                self.mps.stop(alone)
                self.store.record_event("mps_stopped", g.uuid, "no MPS workload left")
            elif self.mps.running(alone):
                self.executor.bound_mps(alone, g.uuid, None)
            if not g.mig:
                continue
            for inst in self.dev.gpu(g.uuid).instances:
                nest = g.nests.get(inst.placement)
                if not inst.uuid or not self.mps.running(MpsDomain((inst.uuid,))):
                    continue
                if nest is None or nest.mode != "mps":
                    self.mps.stop(MpsDomain((inst.uuid,)))
                    self.store.record_event(
                        "mps_stopped", inst.uuid, f"no MPS workload left on MIG {inst.placement}"
                    )
                else:
                    self.executor.bound_mps(MpsDomain((inst.uuid,)), g.uuid, inst.placement)
        for domain in self.mps.domains():
            if frozenset(domain.devices) not in busy:
                self.mps.stop(domain)
                self.store.record_event(
                    "mps_stopped",
                    domain.devices[0],
                    f"no MPS workload left on {domain.describe()}",
                )
            else:
                self.executor.bound_mps(domain, domain.devices[0], None)

    # -- cordon, drain, health ------------------------------------------------------------------

    def cordon(self, uuid: str, reason: str = "cordoned by hand") -> None:
        """No new work on this GPU; what runs there stays."""
        g = self.gpu(uuid)
        self.store.cordon(uuid, reason)
        self.scheduler.state.set_closed(g, CORDONED)

    def uncordon(self, uuid: str) -> list[Decision]:
        g = self.gpu(uuid)
        self.store.uncordon(uuid)
        self.scheduler.state.set_closed(g, None)
        decisions = self.scheduler.retry_pending()
        self.executor.record(decisions)
        return decisions

    def drain(self, uuid: str, reason: str = "drained by hand") -> list[Decision]:
        """Cordon the GPU and move its workloads elsewhere (stopped here, placed again, or
        pending)."""
        self.cordon(uuid, reason)
        g = self.scheduler.state.by_uuid[uuid]
        owners = {a.workload for a in g.allocs.values()}
        owners |= {o for pl in g.instances for o in g.holders(pl)}
        return self._move(sorted(owners), f"moved off GPU {g.index}: {reason}")

    def _move(self, keys: list[str], why: str) -> list[Decision]:
        """Evict each workload and place it again (elsewhere, or it waits); each is told as
        displaced (moved, evicted or requeued), by the operator or the GPU (no workload's cause)."""
        moved: list[Decision] = []
        for key in keys:
            spec = self.scheduler.spec(key)
            if spec is None:
                continue
            was_running = self.executor.evict(key, why)
            self.executor.record(self.scheduler.delete(spec.tenant, spec.name))
            decisions = self.scheduler.submit(spec)
            self.executor.record(decisions)
            self.executor.tell([displacement_of(key, decisions[0], was_running, why, None)])
            moved.extend(decisions)
        return moved

    def watch_health(self) -> None:
        """An Xid or ECC error, or a GPU that is lost, drains the GPU."""
        while (event := self.health.wait_event(0)) is not None:
            if event.gpu_uuid not in self.store.cordons():
                self.drain(event.gpu_uuid, f"{event.kind} {event.data}")
        lost = {g.uuid for g in self.scheduler.state.gpus} - {
            g.uuid for g in self.dev.gpus() if g.health == "ok"
        }
        for uuid in lost - set(self.store.cordons()):
            self.drain(uuid, "the GPU is lost")

    # -- MIG layouts set by an operator ------------------------------------------------------------

    def set_mig_layout(
        self,
        uuid: str,
        mig_enabled: bool,
        layout: list[MigPlacement],
        *,
        drain: bool = False,
        allow_mode_change: bool = False,
        pin: bool = True,
        dry_run: bool = False,
    ) -> list[MigAction]:
        """Change a GPU's MIG mode or instances for an operator, so the scheduler stays true. With
        ``pin`` the layout is kept as set (also across restarts) until ``release_mig``; without it
        (a mode change alone) the agent may cut the GPU for its workloads.

        A GPU already as asked is left alone (only pinned). Workloads on instances that go (or on a
        GPU whose mode changes) are moved elsewhere with ``drain``; without it the change is refused
        and nothing happens. With ``dry_run`` every check is made as for the change, and the
        actions it would take are returned; nothing is changed, moved or pinned."""
        g = self.gpu(uuid)
        self.executor.mig.wait_idle(uuid)  # MIG changes decided before this one are made first
        now = self.dev.gpu(uuid)
        wanted = tuple(sorted(layout)) if mig_enabled else ()
        if now.mig_enabled == mig_enabled and (not mig_enabled or now.layout == wanted):
            if mig_enabled and pin and not dry_run:
                self.store.pin_mig(uuid)
                self.scheduler.set_pinned(uuid, True)
            return []
        owners = {o for pl in g.instances if pl not in wanted for o in g.holders(pl)}
        if mig_enabled != g.mig:
            owners |= {a.workload for a in g.allocs.values()}
        if owners and not drain:
            raise ApplyRefused(
                f"GPU {g.index}: the change would take the MIG instances (or the GPU) of "
                f'{", ".join(sorted(owners))}; drain them first (--drain, or "drain": true '
                "in the API), and they are placed elsewhere"
            )
        # everything is checked before anything is touched: a bad or refused layout moves no one
        planned = diff_actions(
            self.dev,
            [GpuTarget(uuid, mig_enabled, wanted)],
            drain=drain,
            allow_mode_change=allow_mode_change,
            field="instances",
        )
        if dry_run:
            return planned
        moved = [s for k in sorted(owners) if (s := self.scheduler.spec(k)) is not None]
        why = f"moved off GPU {g.index}: its MIG layout is changed by the operator"
        was_running: dict[str, bool] = {}
        for spec in moved:
            key = f"{spec.tenant}/{spec.name}"
            was_running[key] = self.executor.evict(key, why)
            self.executor.record(self.scheduler.delete(spec.tenant, spec.name))
        try:
            with self.executor.mig.gpu_lock(uuid):
                done = apply_targets(
                    self.dev,
                    [GpuTarget(uuid, mig_enabled, wanted)],
                    drain=drain,
                    allow_mode_change=allow_mode_change,
                )
        finally:  # changed or rolled back: the scheduler takes what the GPU is now
            after = self.dev.gpu(uuid)
            self.executor.refresh_cdi(create=False)  # and gpufrac's CDI spec, where it is used
            pinned = pin and after.mig_enabled and after.layout == wanted
            self.scheduler.relayout(uuid, after.mig_enabled, list(after.layout), pinned=pinned)
            for spec in moved:
                key = f"{spec.tenant}/{spec.name}"
                decisions = self.scheduler.submit(spec)
                self.executor.record(decisions)
                self.executor.tell(
                    [displacement_of(key, decisions[0], was_running[key], why, None)]
                )
        if pinned:
            self.store.pin_mig(uuid)
        else:
            self.store.unpin_mig(uuid)
        self.store.record_event(
            "mig_changed",
            uuid,
            f"{len(done)} action(s); MIG {after.mig_current}"
            + ("; layout pinned" if pinned else ""),
            {"gpu": str(after.index), "UUID": uuid},
        )
        self.executor.record(self.scheduler.retry_pending())
        return done

    def release_mig(self, uuid: str) -> list[Decision]:
        """Let the agent re-cut this GPU's MIG layout for waiting workloads again."""
        g = self.gpu(uuid)
        if not g.mig:
            raise InputError(
                f"GPU {g.index} is not in MIG mode: it has no MIG layout to release",
                field="gpu",
                fix="gpufrac get gpus shows which GPUs are in MIG mode",
            )
        self.store.unpin_mig(uuid)
        decisions = self.scheduler.set_pinned(g.uuid, False)
        self.executor.record(decisions)
        return decisions
