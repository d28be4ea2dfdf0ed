"""What a workload is handed of this machine: its GPU or MIG device, its limits, its QoS, MPS.

``Handover.grant`` gives it as a ``runtime.runner.Grant``, which the runner's ``Launch`` carries:

* ``env``: ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES`` name the GPU (or the MIG device,
  once its instance exists); ``GPUFRAC_*`` variables carry the memory limit and the QoS arbiter's
  address and class for the SDK; on MPS the ``CUDA_MPS_*`` variables carry the pipe directory, the
  pinned memory limit, the active-thread percentage and the client priority. docs/design.md lists
  them. The daemon it reaches is its MPS domain's (``mps_domain``; runtime/mps.py): its GPU's; a
  workload sharing a MIG instance under MPS gets that instance's own daemon (its pipe directory
  is keyed by the MIG device UUID, the daemon started with ``CUDA_VISIBLE_DEVICES`` set to it); a
  share of each of several GPUs under MPS gets one daemon serving all its GPUs, with its pinned
  memory limit on each (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=XM,1=XM``) and its thread percentage
  (which MPS applies to each).
* a share of each of several GPUs (HAMi's ``nvidia.com/gpu: N`` with ``gpumem``):
  ``CUDA_VISIBLE_DEVICES`` lists its GPUs in the decision's order (GPU index order);
  ``GPUFRAC_GPU_MEMORY_LIMIT_MIB`` is its limit on each of them (as for one GPU's share; the
  memory watch holds it to that limit on each); ``GPUFRAC_GPU_UUID`` and the QoS domain are its
  first GPU's: the arbiter holds a member in one domain (``runtime/arbiter.py``: one ``Member``
  per workload, with one ``domain``), so it is arbitrated on its first GPU only, and on the others
  only time-sliced by the driver (or, under MPS, run beside their MPS clients), without turns;
* ``devices``: the same GPU or MIG device UUIDs, for a runner that must make them visible itself
  (a container's CDI names or ``--device``);
* ``mounts``: on MPS, the pipe directory (a container must see it to reach the MPS server).

A host process needs only the env (it sees every device and file already).

``Handover.engine`` is what a workload's engine (``spec.engine``) is told of its slice: its memory
flags and environment from its budget over the device it sees (``model/engines.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

from gpufrac.devices.nvml import NvmlDevices
from gpufrac.model.engines import EngineArgs, engine_args
from gpufrac.model.qos import mps_client_priority, qos_params
from gpufrac.model.workload import WorkloadSpec
from gpufrac.planning.sched_decision import Decision
from gpufrac.planning.sched_state import Allocation
from gpufrac.runtime.mps import MpsDaemons, MpsDomain
from gpufrac.runtime.runner import BindMount, Grant


def qos_domain(d: Decision, env: dict[str, str]) -> str:
    """What the arbiter arbitrates: the MIG instance, else the (first) GPU: a share of several
    GPUs is a member of its first GPU's domain only (the arbiter holds a member in one)."""
    if d.mig is not None and env.get("CUDA_VISIBLE_DEVICES"):
        return env["CUDA_VISIBLE_DEVICES"].split(",")[0]
    return d.gpus[0] if d.gpus else ""


def mps_domain(d: Decision, devices: list[str]) -> MpsDomain | None:
    """The MPS domain whose daemon an MPS workload uses: the MIG instance it shares (its MIG
    device UUID, once the instance exists), else its GPUs (one, or each of several, served
    together). None where there is none yet."""
    if d.mig is not None:
        return MpsDomain((devices[0],)) if devices else None
    return MpsDomain(d.gpus) if d.gpus else None


# the agent's own variables a workload gets (where programs are, language and time zone); nothing
# else of the agent's environment (tokens, its data directory, credentials) reaches a workload
PASSED_THROUGH = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "HOME", "TMPDIR")


def base_env() -> dict[str, str]:
    """What a workload's environment starts from, before its manifest's ``env`` and gpufrac's."""
    env = {k: os.environ[k] for k in PASSED_THROUGH if k in os.environ}
    env.setdefault("PATH", os.defpath)
    return env


class Handover:
    def __init__(
        self, dev: NvmlDevices, mps: MpsDaemons, arbiter_address: str, job_min_share_milli: int
    ) -> None:
        self.dev = dev
        self.mps = mps
        self.arbiter_address = arbiter_address
        self.job_min_share_milli = job_min_share_milli
        # the address a workload listens at to be reached by others (a deployment's replica, by
        # the gateway): this machine's loopback, or a cluster node's own address
        self.listen_host = "127.0.0.1"

    def grant(self, spec: WorkloadSpec, decision: Decision, allocs: list[Allocation]) -> Grant:
        """What the workload placed by ``decision`` (with its ``allocs``) is handed."""
        devices = list(decision.gpus)
        gi_id: int | None = None
        if decision.mig is not None and decision.gpus:
            inst = self.dev.gpu(decision.gpus[0]).instance_at(decision.mig)
            devices = [inst.uuid] if inst is not None and inst.uuid else []
            gi_id = None if inst is None else inst.gi_id
        visible = ",".join(devices)
        env = {
            "CUDA_VISIBLE_DEVICES": visible,
            "NVIDIA_VISIBLE_DEVICES": visible,
            "GPUFRAC_WORKLOAD": spec.name,
            "GPUFRAC_TENANT": spec.tenant,
            "GPUFRAC_HOST": self.listen_host,
            "GPUFRAC_SHARING": decision.mode or "",
            "GPUFRAC_GPU_MEMORY_LIMIT_MIB": str(allocs[0].memory_mib) if allocs else "",
            "GPUFRAC_GPU_UUID": decision.gpus[0] if decision.gpus else "",
            **self.dev.sdk_env,
        }
        qos = qos_params(spec, self.job_min_share_milli)
        env.update(
            {
                "GPUFRAC_ARBITER": self.arbiter_address,
                "GPUFRAC_QOS_DOMAIN": qos_domain(decision, env),
                "GPUFRAC_QOS_RANK": str(qos.rank),
                "GPUFRAC_QOS_WEIGHT": str(qos.weight),
                "GPUFRAC_QOS_MIN_SHARE_MILLI": str(qos.min_share_milli),
            }
        )
        if gi_id is not None:
            env["GPUFRAC_GI_ID"] = str(gi_id)
        # the arbiter's directory (its socket and the yield flags the SDK maps), read-only: a
        # container's SDK asks for turns as a process's does (the arbiter knows its processes
        # by their host pids, which the kernel reports across PID namespaces)
        arbiter = os.path.dirname(self.arbiter_address)
        mounts: tuple[BindMount, ...] = (BindMount(Path(arbiter), arbiter, read_only=True),)
        domain = mps_domain(decision, devices)
        if decision.mode == "mps" and domain is not None and allocs:
            env.update(self.mps.client_env(domain, allocs[0].memory_mib, allocs[0].compute_pct))
            env["CUDA_MPS_CLIENT_PRIORITY"] = str(mps_client_priority(spec.qos))
            pipe = self.mps.pipe_dir(domain)
            mounts += (BindMount(pipe, str(pipe)),)
            # a container reaches the MPS daemon through its pipe directory, and shares memory
            # with its server in the host's IPC namespace (as MPS clients in containers must:
            # Kubernetes pods on MPS run with hostIPC); a host process has both already
            return Grant(env, tuple(devices), mounts, host_ipc=True)
        return Grant(env, tuple(devices), mounts)

    def engine(
        self, spec: WorkloadSpec, decision: Decision, allocs: list[Allocation]
    ) -> EngineArgs | None:
        """What the workload's engine is told (None without ``spec.engine``): its budget over
        the memory of the device it sees (its MIG instance on MIG, else the whole GPU)."""
        if spec.engine is None or not decision.gpus or not allocs:
            return None
        gpu = self.dev.gpu(decision.gpus[0])
        visible = gpu.memory_total_mib
        if decision.mig is not None:
            inst = gpu.instance_at(decision.mig)
            visible = inst.memory_mib if inst is not None and inst.memory_mib else visible
        return engine_args(spec.engine, spec.command, allocs[0].memory_mib, visible)
