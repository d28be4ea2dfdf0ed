"""Which workload is on which GPU (and MIG instance), with what it reserved and what it uses: the
shared view behind ``GET /api/v1/gpus``, ``gpufrac get gpus``, ``gpufrac top`` and the dashboard.

``fleet_view`` is a pure function from what was read (the GPUs as the driver reports them, the
scheduler's allocations, each placed workload's process group and phase) to the JSON shape;
``read_fleet`` reads those from a running agent (the caller holds the agent's lock) and calls it.

Per GPU, beside ``GpuState.to_json()``: ``node``, ``mig_layout_pinned``, ``cordoned``,
``allocations`` (one per workload placed there) and the totals ``reserved_memory_mib`` and
``reserved_compute_pct``. A tenant sees another tenant's allocation only as an anonymous reserved
share (no name, no use, no processes); the admin sees everything. docs/json.md has the shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpufrac.model.caller import Caller
from gpufrac.model.gpu import GpuState
from gpufrac.planning.sched_state import Allocation
from gpufrac.runtime.runs import process_group

if TYPE_CHECKING:
    from gpufrac.runtime.agent import Agent, WorkloadState


@dataclass(frozen=True, slots=True)
class Holder:
    """A placed workload as the view shows it: its phase, the process group its processes run in
    (None while none runs), and the GPU time the SDK timed for it (0-1, None without a reading)."""

    phase: str
    group: int | None = None
    sdk_share: float | None = None


def fleet_view(
    gpus: Sequence[GpuState],
    allocations: Mapping[str, Sequence[Allocation]],
    holders: Mapping[str, Holder],
    groups: Mapping[int, int | None],
    sm_by_pid: Mapping[str, Mapping[int, int] | None],
    *,
    cordons: Mapping[str, str],
    pins: Iterable[str],
    node: str,
    viewer: Caller,
) -> list[dict[str, Any]]:
    """``allocations``: per GPU UUID, the scheduler's allocations there; ``holders``: per workload
    (tenant/name); ``groups``: the process group of each pid on the GPUs; ``sm_by_pid``: per GPU
    UUID, NVML's SM utilization per pid (None where the driver gives none: MIG)."""
    pinned = set(pins)
    out = []
    for g in gpus:
        own: set[int] = set()
        entries = []
        for a in sorted(allocations.get(g.uuid, ()), key=_order):
            entry, pids = _allocation(g, a, holders.get(a.workload), groups, sm_by_pid)
            if viewer.may_see(a.tenant):
                own |= pids
            else:
                entry = {
                    **entry,
                    "tenant": None,
                    "name": None,
                    "used_memory_mib": None,
                    "sm_percent": None,
                }
            entries.append(entry)
        gpu = g.to_json()
        if not viewer.admin:  # another tenant's processes (and those of nobody's) are not shown
            gpu["processes"] = [p.to_json() for p in g.processes if p.pid in own]
        out.append(
            {
                **gpu,
                "node": node,
                "mig_layout_pinned": g.uuid in pinned,
                "cordoned": cordons.get(g.uuid),
                "allocations": entries,
                "reserved_memory_mib": sum(e["memory_mib"] for e in entries),
                "reserved_compute_pct": sum(e["compute_pct"] or 0 for e in entries),
            }
        )
    return out


def _order(a: Allocation) -> tuple[int, str]:
    return (-1 if a.mig is None else a.mig.start, a.workload)


def _allocation(
    g: GpuState,
    a: Allocation,
    holder: Holder | None,
    groups: Mapping[int, int | None],
    sm_by_pid: Mapping[str, Mapping[int, int] | None],
) -> tuple[dict[str, Any], set[int]]:
    """One allocation's entry, and the pids of its processes on this GPU."""
    tenant, name = a.workload.split("/", 1)
    group = holder.group if holder else None
    procs = [p for p in g.processes if group is not None and groups.get(p.pid) == group]
    used = None if group is None else sum(p.used_memory_mib or 0 for p in procs)
    sm: int | None = None
    by_pid = sm_by_pid.get(g.uuid)
    # MIG: NVML gives no per-process SM use; MPS: only the server's, not each client's
    if procs and by_pid is not None and a.mode not in ("mig", "mps"):
        sm = sum(by_pid.get(p.pid, 0) for p in procs)
    elif holder is not None and holder.sdk_share is not None:
        sm = round(holder.sdk_share * 100)
    mig = None
    if a.mig is not None:
        inst = g.instance_at(a.mig)
        mig = {
            "profile": a.mig.profile,
            "start": a.mig.start,
            "gi_id": None if inst is None else inst.gi_id,
        }
    entry = {
        "tenant": tenant,
        "name": name,
        "phase": holder.phase if holder else "starting",
        "mode": a.mode,
        "mig": mig,
        "memory_mib": a.memory_mib,
        "compute_pct": a.compute_pct,
        "used_memory_mib": used,
        "sm_percent": sm,
    }
    return entry, {p.pid for p in procs}


def read_fleet(
    agent: Agent, states: Mapping[str, WorkloadState], viewer: Caller
) -> list[dict[str, Any]]:
    """The fleet view of a running agent (call with the agent's lock held)."""
    gpus = agent.dev.gpus()
    allocations = {g.uuid: list(g.allocs.values()) for g in agent.scheduler.state.gpus}
    stats = agent.arbiter.latest
    holders: dict[str, Holder] = {}
    for key in {a.workload for allocs in allocations.values() for a in allocs}:
        st = states.get(key)
        group = (
            st.group if st is not None and st.phase in ("running", "paused", "starting") else None
        )
        share = (stats.get(key) or {}).get("gpu_share")
        holders[key] = Holder(
            phase=st.phase if st is not None else "starting",
            group=group,
            sdk_share=None if share is None else float(share),
        )
    groups = {p.pid: process_group(p.pid) for g in gpus for p in g.processes}
    sm_by_pid = {
        g.uuid: agent.health.process_utilization(g.uuid)
        for g in gpus
        if g.health == "ok" and not g.mig_enabled and g.processes
    }
    return fleet_view(
        gpus,
        allocations,
        holders,
        groups,
        sm_by_pid,
        cordons=agent.store.cordons(),
        pins=agent.store.mig_pins(),
        node=agent.node,
        viewer=viewer,
    )
