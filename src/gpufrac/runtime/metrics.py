"""One machine's ``/metrics`` through prometheus-client: a collector that reads the agent at scrape
time (the API's ``/metrics`` route registers it, with the gateway's collector,
``api.metrics_serving``, in a registry of its own).

Per GPU, the DCGM exporter's names and labels (``gpu``, ``UUID``, ``pci_bus_id``, ``device``,
``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``; ``GPU_I_ID`` and ``GPU_I_PROFILE`` per MIG
instance). Every series carries ``Hostname`` (the agent's node name), so several machines' series
stay apart on one dashboard. Per workload, gpufrac's names, labelled ``tenant`` and
``workload``; the series about its share of a GPU (memory used and given, SM use, QoS, and
``gpufrac_workload_gpu_info``) also carry the GPU's DCGM labels, so they join with the DCGM
exporter's series. A value NVML does not give
(utilization rates on a MIG instance, per-client SM use under MPS) is left out, never reported as
zero; a MIG workload's SM use is its instance's engine activity (GPM), where the instance is its
alone. A MIG instance shared inside by MPS or time-slices (docs/mig.md) has
``gpufrac_mig_instance_workloads`` (how many share it, labelled with its mode), and each of its
workloads' series carry its ``GPU_I_ID`` and ``GPU_I_PROFILE``.

Each app has its own registry, and every family is built afresh on each
scrape, so nothing of a workload that is gone lingers and no global state is shared between agents.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.metrics_core import Metric

from gpufrac.devices.nvml import text
from gpufrac.model.gpu import GpuState
from gpufrac.planning.sched_decision import Decision
from gpufrac.runtime.agent import Agent, WorkloadState
from gpufrac.runtime.metrics_family import Family

MIB = 2**20


class AgentCollector:
    """The agent's series, read at scrape time under the agent's lock (the caller holds it);
    ``states``: the workloads as the last reconcile pass saw them."""

    def __init__(self, agent: Agent, states: Callable[[], Mapping[str, WorkloadState]]) -> None:
        self.agent = agent
        self.states = states

    def collect(self) -> Iterator[Metric]:
        agent = self.agent
        gpus = {g.uuid: g for g in agent.dev.gpus()}
        driver = agent.dev.reading("nvmlSystemGetDriverVersion")
        yield from gpu_families(
            [g for g in gpus.values() if g.health == "ok"],
            agent.node,
            None if driver is None else text(driver),
        )
        yield from workload_families(agent, self.states(), gpus)
        failing = Family(
            "gpufrac_agent_failing_steps",
            "gauge",
            "The agent's own steps failing now (a reconcile pass, writing the store, "
            "watching GPUs);"
            " above 0, /api/v1/health says degraded.",
        )
        failing.add({"Hostname": agent.node}, len(agent.failures.of("agent")))
        yield failing.metric


def gpu_families(gpus: list[GpuState], host: str, driver: str | None) -> Iterator[Metric]:
    """DCGM's fields, with the DCGM exporter's names, units and labels, for what NVML reads. A
    reading the driver does not give (utilization on a GPU in MIG mode, GPM before Hopper) has no
    series: never a made-up 0."""
    f = {
        "util": Family("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
        "copy": Family("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
        "used": Family("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
        "free": Family("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
        "power": Family("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
        "clock": Family("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
        "temp": Family("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
        "active": Family(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "gauge",
            "Ratio of time the graphics engine is active (NVML's GPM: Hopper and newer).",
        ),
        "tensor": Family(
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "gauge",
            "Ratio of time any tensor pipe is active (NVML's GPM: Hopper and newer).",
        ),
        "dram": Family(
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "gauge",
            "Ratio of the device memory's bandwidth used (NVML's GPM: Hopper and newer).",
        ),
    }
    for g in gpus:
        r = g.readings
        base = {
            "gpu": g.index,
            "UUID": g.uuid,
            "pci_bus_id": r.pci_bus_id,
            "device": None if r.minor_number is None else f"nvidia{r.minor_number}",
            "modelName": g.name,
            "Hostname": host,
            "DCGM_FI_DRIVER_VERSION": driver,
        }
        for family, reading in (
            ("util", g.utilization_gpu),
            ("copy", r.memory_util),
            ("power", r.power_w),
            ("clock", r.sm_clock_mhz),
            ("temp", r.temperature_c),
            ("active", r.gr_engine_active),
            ("tensor", r.tensor_active),
            ("dram", r.dram_active),
        ):
            if reading is not None:
                f[family].add(base, reading)
        f["used"].add(base, g.memory_used_mib)
        f["free"].add(base, g.memory_total_mib - g.memory_used_mib)
        for inst in g.instances:
            mig = {**base, "GPU_I_PROFILE": inst.profile, "GPU_I_ID": inst.gi_id}
            inst_used = sum(p.used_memory_mib or 0 for p in g.processes if p.gi_id == inst.gi_id)
            f["used"].add(mig, inst_used)
            if inst.memory_mib is not None:
                f["free"].add(mig, inst.memory_mib - inst_used)
            if inst.gr_engine_active is not None:
                f["active"].add(mig, inst.gr_engine_active)
            if inst.tensor_active is not None:
                f["tensor"].add(mig, inst.tensor_active)
            if inst.dram_active is not None:
                f["dram"].add(mig, inst.dram_active)
    yield from (family.metric for family in f.values())


def where(gpus: dict[str, GpuState], uuid: str, d: Decision | None, host: str) -> dict[str, object]:
    """The DCGM labels of the GPU (and MIG instance) a workload holds: ``gpu``, ``UUID`` (the
    GPU's, as DCGM gives it for MIG instances too), ``Hostname``, ``GPU_I_ID`` and
    ``GPU_I_PROFILE``."""
    g = gpus.get(uuid)
    out: dict[str, object] = {"gpu": g.index if g else None, "UUID": uuid, "Hostname": host}
    if d is not None and d.mig is not None and d.gpus[:1] == (uuid,):
        inst = g.instance_at(d.mig) if g else None
        out.update(GPU_I_ID=inst.gi_id if inst else None, GPU_I_PROFILE=d.mig.profile)
    return out


def workload_families(
    agent: Agent, states: Mapping[str, WorkloadState], gpus: dict[str, GpuState]
) -> Iterator[Metric]:
    dev = agent.dev
    f = {
        "info": Family(
            "gpufrac_workload_gpu_info",
            "gauge",
            "1 per GPU (and MIG instance) a workload holds, with how it shares it (mode).",
        ),
        "used": Family(
            "gpufrac_workload_gpu_memory_used_bytes",
            "gauge",
            "GPU memory held by the workload's processes.",
        ),
        "limit": Family(
            "gpufrac_workload_gpu_memory_limit_bytes",
            "gauge",
            "GPU memory the workload was given, per GPU.",
        ),
        "sm": Family(
            "gpufrac_workload_sm_utilization_percent",
            "gauge",
            "SM utilization of the workload's processes (%), where NVML reports it; on a MIG"
            " instance, the instance's graphics engine activity (GPM), the instance being the"
            " workload's alone.",
        ),
        "given": Family(
            "gpufrac_workload_qos_share",
            "gauge",
            "Part of its GPU's turn time the QoS arbiter gave the workload over the last window"
            " (0-1).",
        ),
        "measured": Family(
            "gpufrac_workload_qos_gpu_share",
            "gauge",
            "GPU time the SDK timed with CUDA events, as a part of the last window (0-1).",
        ),
        "paused": Family(
            "gpufrac_workload_qos_paused",
            "gauge",
            "1 while the QoS arbiter holds the workload's process group stopped.",
        ),
        "pauses": Family(
            "gpufrac_workload_pauses",
            "counter",
            "Pauses of the workload's processes by the QoS arbiter, however short, since the agent"
            " started.",
        ),
        "paused_seconds": Family(
            "gpufrac_workload_paused_seconds",
            "counter",
            "Time the QoS arbiter held the workload's processes stopped, since the agent started.",
        ),
        "restarts": Family(
            "gpufrac_workload_restarts",
            "gauge",
            "Restarts of the workload's current generation after a failure or an exit.",
        ),
        "evictions": Family(
            "gpufrac_workload_evictions",
            "gauge",
            "Times the workload's current generation was stopped to make room (not failures).",
        ),
        "state": Family("gpufrac_workload_state", "gauge", "1 for the workload's current phase."),
        "pending": Family(
            "gpufrac_workload_pending_seconds", "gauge", "How long a pending workload has waited."
        ),
        "nested": Family(
            "gpufrac_mig_instance_workloads",
            "gauge",
            "Workloads sharing one MIG instance inside (by MPS or time-slices, the mode label).",
        ),
        "moves": Family(
            "gpufrac_scheduler_moves",
            "counter",
            "Moves begun to make room for waiting MIG requests (replicas replaced, movable"
            " services restarted) since the agent started (docs/scheduler.md, Moves).",
        ),
    }
    f["moves"].add({"Hostname": agent.node}, agent.scheduler.move_budget.begun)
    for sg in agent.scheduler.state.gpus:
        dg = gpus.get(sg.uuid)
        for pl, nest in sorted(sg.nests.items()):
            inst = dg.instance_at(pl) if dg is not None else None
            shared: dict[str, object] = {
                "gpu": dg.index if dg is not None else None,
                "UUID": sg.uuid,
                "Hostname": agent.node,
                "GPU_I_ID": inst.gi_id if inst is not None else None,
                "GPU_I_PROFILE": pl.profile,
                "mode": nest.mode,
            }
            f["nested"].add(shared, len(nest.workloads))
    sm_by_gpu = {
        u: agent.health.process_utilization(u)
        for u, g in gpus.items()
        if g.health == "ok" and not g.mig_enabled
    }
    sched_gpus = agent.scheduler.state.gpus
    qos = agent.arbiter.latest  # read by the last reconcile pass
    now = time.time()
    for key, st in sorted(states.items()):
        tenant, name = key.split("/", 1)
        lab = {"tenant": tenant, "workload": name, "Hostname": agent.node}
        f["restarts"].add(lab, st.restarts)
        f["evictions"].add(lab, st.evictions)
        f["state"].add({**lab, "phase": st.phase}, 1)
        if st.phase == "pending":
            since = next(
                (e.at for e in reversed(agent.store.events(key, limit=50)) if e.kind == "pending"),
                None,
            )
            if since is not None:
                f["pending"].add(lab, now - since)
        d = st.decision
        for alloc in agent.scheduler.allocations(key):
            at = {**lab, **where(gpus, sched_gpus[alloc.gpu].uuid, d, agent.node)}
            f["limit"].add(at, alloc.memory_mib * MIB)
            f["info"].add({**at, "mode": alloc.mode}, 1)
        placed = d is not None and bool(d.gpus)
        first = (
            {**lab, **where(gpus, d.gpus[0], d, agent.node)} if d is not None and placed else lab
        )
        member = qos.get(key)
        counted = agent.qos.pauses.counts.get(key)
        if counted is not None:
            n, seconds = counted.total(time.monotonic())
            f["pauses"].add(lab, n)
            f["paused_seconds"].add(lab, seconds)
        if member is not None:
            f["given"].add(first, member["share"])
            f["paused"].add(first, 1 if member["paused"] else 0)
            if member.get("gpu_share") is not None:
                f["measured"].add(first, member["gpu_share"])
        if st.phase != "running" or d is None or not placed:
            continue
        use = agent.memory_use(tenant, name, gpus, st)
        if use is not None:
            # reported through gpufrac.sdk on simulated GPUs
            f["used"].add(
                {**first, "source": "simulated" if dev.simulated else None}, use.mib * MIB
            )
            by_pid = sm_by_gpu.get(d.gpus[0])
            if d.mig is not None and d.mode == "mig":
                # NVML gives no per-process SM use on MIG; an instance held whole is the
                # workload's alone, so its engine activity (GPM, per instance) is the workload's
                # (one shared inside has no per-workload reading: left out)
                g = gpus.get(d.gpus[0])
                inst = g.instance_at(d.mig) if g is not None else None
                if inst is not None and inst.gr_engine_active is not None:
                    f["sm"].add(first, round(100 * inst.gr_engine_active, 3))
            elif by_pid is not None and d.mode == "mps" and d.mig is None:
                # NVML's sample under MPS is the server's, all its clients' use summed: this
                # workload's only where every client on the GPU is its own
                g = gpus.get(d.gpus[0])
                servers = agent.executor.mps_servers(d.gpus[0])
                sm = None if g is None else g.mps_sm_of(set(use.pids), dict(by_pid), servers)
                if sm is not None:
                    f["sm"].add(first, sm)
            elif by_pid is not None and d.mig is None:
                f["sm"].add(first, sum(by_pid.get(pid, 0) for pid in use.pids))
    yield from (family.metric for family in f.values())
