"""``/metrics`` in the Prometheus text format: per GPU with the DCGM exporter's names, per workload
with gpufrac's. A value NVML does not give (utilization on a MIG instance, per-client SM use under
MPS) is left out, never reported as zero."""

from __future__ import annotations

import time
from collections.abc import Iterable

from gpufrac.devices.health import DeviceHealth
from gpufrac.runtime.agent import Agent, WorkloadState

MIB = 2**20


def _labels(**kv: object) -> str:
    inner = ",".join(
        f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in kv.items()
    )
    return "{" + inner + "}"


def _family(
    name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]
) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [
        f"{name}{labels} {int(value) if value.is_integer() else round(value, 3)}"
        for labels, value in samples
    ]
    return lines


def render(agent: Agent, states: dict[str, WorkloadState]) -> str:
    dev = agent.dev
    gpus = [g for g in dev.gpus() if g.health == "ok"]
    util, used, free = [], [], []
    for g in gpus:
        base = {"gpu": g.index, "UUID": g.uuid, "modelName": g.name}
        if g.utilization_gpu is not None:
            util.append((_labels(**base), float(g.utilization_gpu)))
        used.append((_labels(**base), float(g.memory_used_mib)))
        free.append((_labels(**base), float(g.memory_total_mib - g.memory_used_mib)))
        for inst in g.instances:
            mig = {**base, "GPU_I_ID": inst.gi_id, "GPU_I_PROFILE": inst.profile}
            inst_used = sum(p.used_memory_mib or 0 for p in g.processes if p.gi_id == inst.gi_id)
            used.append((_labels(**mig), float(inst_used)))
            if inst.memory_mib is not None:
                free.append((_labels(**mig), float(inst.memory_mib - inst_used)))
    lines = _family("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (%).", util)
    lines += _family("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (MiB).", used)
    lines += _family("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (MiB).", free)

    health = DeviceHealth(dev)
    sm_by_gpu = {g.uuid: health.process_utilization(g.uuid) for g in gpus if not g.mig_enabled}
    mem_used, mem_limit, sm, restarts, phase, pending = [], [], [], [], [], []
    given, measured_sdk, paused = [], [], []
    qos = agent.arbiter.latest  # read by the last reconcile pass
    now = time.time()
    for key, st in sorted(states.items()):
        tenant, name = key.split("/", 1)
        lab = {"tenant": tenant, "workload": name}
        restarts.append((_labels(**lab), float(max(0, st.attempts - 1))))
        phase.append((_labels(**lab, phase=st.phase), 1.0))
        if st.phase == "pending":
            since = next(
                (e.at for e in reversed(agent.store.events(key, limit=50)) if e.kind == "pending"),
                None,
            )
            if since is not None:
                pending.append((_labels(**lab), now - since))
        alloc = agent.scheduler.allocations(key)
        if alloc:
            mem_limit.append((_labels(**lab), float(alloc[0].memory_mib * MIB)))
        member = qos.get(key)
        if member is not None:
            given.append((_labels(**lab), float(member["share"])))
            paused.append((_labels(**lab), 1.0 if member["paused"] else 0.0))
            if member.get("gpu_share") is not None:
                measured_sdk.append((_labels(**lab), float(member["gpu_share"])))
        d = st.decision
        if st.phase != "running" or d is None or not d.gpus:
            continue
        use = agent.memory_use(tenant, name)
        if use is not None:
            source = (
                {"source": "simulated"} if dev.simulated else {}
            )  # reported through gpufrac.sdk
            mem_used.append((_labels(**lab, **source), float(use.mib * MIB)))
            by_pid = sm_by_gpu.get(d.gpus[0])
            # MIG: NVML gives no per-process SM use; MPS: only the server's, not each client's
            if by_pid is not None and d.mode not in ("mig", "mps"):
                sm.append((_labels(**lab), float(sum(by_pid.get(pid, 0) for pid in use.pids))))
    lines += _family(
        "gpufrac_workload_gpu_memory_used_bytes",
        "gauge",
        "GPU memory held by the workload's processes.",
        mem_used,
    )
    lines += _family(
        "gpufrac_workload_gpu_memory_limit_bytes",
        "gauge",
        "GPU memory the workload was given.",
        mem_limit,
    )
    lines += _family(
        "gpufrac_workload_sm_utilization_percent",
        "gauge",
        "SM utilization of the workload's processes, where NVML reports it.",
        sm,
    )
    lines += _family(
        "gpufrac_workload_qos_share",
        "gauge",
        "Part of its GPU's turn time the QoS arbiter gave the workload over the last window (0-1).",
        given,
    )
    lines += _family(
        "gpufrac_workload_qos_gpu_share",
        "gauge",
        "GPU time the SDK timed with CUDA events, as a part of the last window (0-1).",
        measured_sdk,
    )
    lines += _family(
        "gpufrac_workload_qos_paused",
        "gauge",
        "1 while the QoS arbiter holds the workload's process group stopped.",
        paused,
    )
    lines += _family(
        "gpufrac_workload_restarts",
        "gauge",
        "Restarts of the workload's current generation.",
        restarts,
    )
    lines += _family(
        "gpufrac_workload_state", "gauge", "1 for the workload's current phase.", phase
    )
    lines += _family(
        "gpufrac_workload_pending_seconds",
        "gauge",
        "How long a pending workload has waited.",
        pending,
    )
    lines += _family(
        "gpufrac_agent_failing_steps",
        "gauge",
        "The agent's own steps failing now (a reconcile pass, writing the store, watching GPUs);"
        " above 0, /api/v1/health says degraded.",
        [("", float(len(agent.failures.of("agent"))))],
    )
    return "\n".join(lines) + "\n"
