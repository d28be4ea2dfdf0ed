"""Which workload is on which GPU (and MIG instance), with what it reserved and what it uses: the
shared view behind ``GET /api/v1/gpus``, ``gpufrac get gpus``, ``gpufrac top`` and the dashboard.

``fleet_view`` is a pure function from what was read (the GPUs as the driver reports them, the
scheduler's allocations, each placed workload's phase and which of the GPUs' processes are its, as
its runner tells: ``holders``) to the JSON shape; ``read_fleet`` reads those from a running agent
(the caller holds the agent's lock) and calls it.

Per GPU, beside ``GpuState.to_json()``: ``node``, ``mig_layout_pinned``, ``cordoned``,
``allocations`` (one per workload placed there) and the totals ``reserved_memory_mib`` and
``reserved_compute_pct``. A tenant sees another tenant's allocation only as an anonymous reserved
share (no name, no use, no processes); the admin sees everything. docs/json.md has the shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufrac.model.caller import Caller
from gpufrac.model.gpu import GpuState
from gpufrac.planning.sched_state import Allocation

if TYPE_CHECKING:
    from gpufrac.runtime.agent import Agent, WorkloadState
    from gpufrac.runtime.runs import Runs


@dataclass(frozen=True, slots=True)
class Holder:
    """A placed workload as the view shows it: its phase, which of the processes on its GPUs are
    its (None while none of it runs), and the GPU time the SDK timed for it (0-1, None without a
    reading)."""

    phase: str
    pids: frozenset[int] | None = None
    sdk_share: float | None = None


def holder_pids(
    runs: Runs,
    run: Path | None,
    gpus: Iterable[GpuState],
    allocations: Mapping[str, Sequence[Allocation]],
    workload: str,
) -> frozenset[int] | None:
    """Which processes on the GPUs ``workload`` has allocations on are its (``run``: its newest
    attempt, as its runner tells: ``Runs.members``); None where no process of it was started."""
    if run is None or runs.status(run).child_pid is None:
        return None
    on = {
        uuid for uuid, allocs in allocations.items() if any(a.workload == workload for a in allocs)
    }
    return runs.members(run, {p.pid for g in gpus if g.uuid in on for p in g.processes})


def fleet_view(
    gpus: Sequence[GpuState],
    allocations: Mapping[str, Sequence[Allocation]],
    holders: Mapping[str, Holder],
    sm_by_pid: Mapping[str, Mapping[int, int] | None],
    *,
    cordons: Mapping[str, str],
    pins: Iterable[str],
    node: str,
    viewer: Caller,
    mps_servers: Mapping[str, frozenset[int]] | None = None,
) -> list[dict[str, Any]]:
    """``allocations``: per GPU UUID, the scheduler's allocations there; ``holders``: per workload
    (tenant/name); ``sm_by_pid``: per GPU UUID, NVML's SM utilization per pid (None where the
    driver gives none: MIG); ``mps_servers``: per GPU UUID, the MPS servers its daemon lists."""
    servers = mps_servers or {}
    pinned = set(pins)
    out = []
    for g in gpus:
        own: set[int] = set()
        entries = []
        for a in sorted(allocations.get(g.uuid, ()), key=_order):
            entry, pids = _allocation(
                g, a, holders.get(a.workload), sm_by_pid, servers.get(g.uuid, frozenset())
            )
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
    sm_by_pid: Mapping[str, Mapping[int, int] | None],
    mps_servers: frozenset[int],
) -> tuple[dict[str, Any], set[int]]:
    """One allocation's entry, and the pids of its processes on this GPU."""
    tenant, name = a.workload.split("/", 1)
    mine = holder.pids if holder else None
    procs = [p for p in g.processes if mine is not None and p.pid in mine]
    used = None if mine is None else sum(p.used_memory_mib or 0 for p in procs)
    sm: int | None = None
    by_pid = sm_by_pid.get(g.uuid)
    # MIG: NVML gives no per-process SM use; MPS: only the server's, its clients' use summed
    # (the workload's where every client on the GPU is its own)
    if procs and by_pid is not None and a.mode == "mps" and a.mig is None:
        sm = g.mps_sm_of({p.pid for p in procs}, dict(by_pid), mps_servers)
    elif procs and by_pid is not None and a.mode not in ("mig", "mps"):
        sm = sum(by_pid.get(p.pid, 0) for p in procs)
    if sm is None and holder is not None and holder.sdk_share is not None:
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
        pids = None
        if st is not None and st.running and st.phase in ("running", "paused", "starting"):
            tenant, name = key.split("/", 1)
            run = agent.runs.latest(tenant, name, st.generation)
            pids = holder_pids(agent.runs, run, gpus, allocations, key)
        share = (stats.get(key) or {}).get("gpu_share")
        holders[key] = Holder(
            phase=st.phase if st is not None else "starting",
            pids=pids,
            sdk_share=None if share is None else float(share),
        )
    sm_by_pid = {
        g.uuid: agent.health.process_utilization(g.uuid)
        for g in gpus
        if g.health == "ok" and not g.mig_enabled and g.processes
    }
    clients = {g.uuid for g in gpus if any(p.mps == "client" for p in g.processes)}
    mps_servers = {
        uuid: agent.mps.server_pids(domain)
        for uuid, domain in agent.executor.mps_domains().items()
        if uuid in clients
    }
    return fleet_view(
        gpus,
        allocations,
        holders,
        sm_by_pid,
        cordons=agent.store.cordons(),
        pins=agent.store.mig_pins(),
        node=agent.node,
        viewer=viewer,
        mps_servers=mps_servers,
    )
