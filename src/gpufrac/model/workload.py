"""Workloads as values: what a user asks for, after a manifest has been validated.

A ``WorkloadSpec`` is produced by ``model.manifest`` (which owns the field names, defaults, aliases
and error messages) and consumed by the scheduler and, later, the node agent. Fixed-point units
throughout: memory in MiB, GPU shares in milli-GPU (1000 = one whole GPU), compute in percent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

PRIORITY_NAMES = {"low": 0, "normal": 50, "high": 100}
MAX_PRIORITY = 1_000_000_000  # a priority is an integer from -MAX_PRIORITY to MAX_PRIORITY

# What the agent hands every workload itself (runtime/handover.py: its GPU, limits, QoS, MPS; the
# SDK's; the attempt; the engine's arguments): a manifest's ``env`` may not name them, since the
# workload would otherwise run with gpufrac's value and not the one its manifest says.
HANDED_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "GPUFRAC_WORKLOAD",
        "GPUFRAC_TENANT",
        "GPUFRAC_HOST",
        "GPUFRAC_SHARING",
        "GPUFRAC_GPU_MEMORY_LIMIT_MIB",
        "GPUFRAC_GPU_UUID",
        "GPUFRAC_GPU_REPORTS",
        "GPUFRAC_GI_ID",
        "GPUFRAC_ARBITER",
        "GPUFRAC_QOS_DOMAIN",
        "GPUFRAC_QOS_RANK",
        "GPUFRAC_QOS_WEIGHT",
        "GPUFRAC_QOS_MIN_SHARE_MILLI",
        "GPUFRAC_ATTEMPT",
        "GPUFRAC_ENGINE_ARGS",
        "GPUFRAC_DEVICE_UUID",  # a container's, from its CDI device (simulated GPUs)
        "GPUFRAC_REPLICA_KEY",  # a replica's secret with its gateway
    }
)
HANDED_ENV_PREFIXES = ("CUDA_MPS_",)  # MPS's: the pipe directory, the limits, the priority


def handed_env(name: str) -> bool:
    """Whether the agent sets ``name`` in every workload's environment itself."""
    return name in HANDED_ENV or name.startswith(HANDED_ENV_PREFIXES)


Mode = Literal["exclusive", "timeslice", "mps", "mig"]  # how a placed workload shares its GPU
Sharing = Literal["auto", "mig", "mps", "timeslice", "exclusive"]  # what a manifest may ask for
WorkloadType = Literal["job", "service"]
RestartPolicy = Literal["always", "on-failure", "never"]
ProbeKind = Literal["http", "tcp"]
QosMode = Literal["latency", "throughput"]
RequestKind = Literal["count", "fraction", "mig", "memory"]
# an inference engine or framework whose memory flags gpufrac sets from the workload's budget
# (model/engines.py)
Engine = Literal["vllm", "sglang", "tgi", "triton", "pytorch", "jax"]
ENGINES: tuple[Engine, ...] = get_args(Engine)
Preemption = Literal[
    "lower-priority", "never"
]  # may it evict others (Kubernetes' preemptionPolicy)
MODES: tuple[Mode, ...] = get_args(Mode)
SHARING_MODES: tuple[Sharing, ...] = get_args(Sharing)
WORKLOAD_TYPES: tuple[WorkloadType, ...] = get_args(WorkloadType)
RESTART_POLICIES: tuple[RestartPolicy, ...] = get_args(RestartPolicy)
QOS_MODES: tuple[QosMode, ...] = get_args(QosMode)
PREEMPTION_POLICIES: tuple[Preemption, ...] = get_args(Preemption)
MILLI = 1000


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """Exactly one of: whole GPUs (``count``), a share of one GPU (``fraction_milli``), an amount of
    memory (``memory_mib``, or ``memory_pct`` percent of the GPU's memory), optionally with a
    compute cap ``compute_pct``, a compute cap alone (with the GPU's whole memory, as HAMi gives),
    or a MIG profile. On a shared GPU memory and compute are two capacities, each checked on its
    own (``planning.sched_request.need_on``).

    ``devices``: the number of GPUs a share is on, one share on each of that many different GPUs
    of one node (a manifest's ``count`` beside a share: HAMi's ``nvidia.com/gpu: N`` with
    ``gpumem``, and with ``gpucores`` under MPS, one daemon serving them all; KAI's
    ``gpu-fraction-num-devices``); 1 for every other request."""

    count: int | None = None
    fraction_milli: int | None = None
    memory_mib: int | None = None
    compute_pct: int | None = None
    mig_profile: str | None = None
    mig_model: str | None = None  # catalog key, where the profile name alone is ambiguous
    memory_pct: int | None = None  # a share of the memory of whichever GPU it is placed on
    devices: int = 1  # GPUs a share is on, each with the share (never beside count or a profile)

    @property
    def gpus(self) -> int:
        """How many GPUs it takes: its whole GPUs, or the GPUs its share is on."""
        return self.count if self.count is not None else self.devices

    @property
    def kind(self) -> RequestKind:
        if self.count is not None:
            return "count"
        if self.fraction_milli is not None:
            return "fraction"
        if self.mig_profile is not None:
            return "mig"
        return "memory"


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """A service's readiness check: HTTP GET ``path`` on ``port`` (2xx/3xx), or a TCP connect to
    ``port``."""

    kind: ProbeKind
    port: int
    path: str = "/"
    period_seconds: int = 5
    initial_delay_seconds: int = 0


@dataclass(frozen=True, slots=True)
class VolumeMount:
    """A host path a container workload sees at ``target`` (within the operator's allowed
    paths: gpufrac.yaml ``containers.allowed_mounts``)."""

    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    gpu: GpuRequest
    command: tuple[str, ...]
    tenant: str = "default"
    type: WorkloadType = "job"
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    health: HealthCheck | None = None
    sharing: Sharing = "auto"
    priority: int = PRIORITY_NAMES["normal"]  # higher is more important
    preemption: Preemption = "lower-priority"  # never: it waits rather than evict anyone
    restart: RestartPolicy = "on-failure"
    backoff_limit: int = 6  # jobs: restarts before the job is failed
    deadline_seconds: int | None = None  # jobs: stopped and failed after this long
    qos: QosMode = "throughput"  # model/qos.py maps it, with priority, to an arbiter class
    weight: int = 1  # share of its GPU within its class, relative to the others'
    # thousandths of its GPU's busy time guaranteed while it wants a turn; None: the operator's
    # default for its type (settings.job_min_share for jobs, none for services)
    min_share_milli: int | None = None
    # node labels the workload's node must have, all of them (a cluster's nodes: docs/cluster.md;
    # one machine is one node, labelled in gpufrac.yaml)
    node_selector: dict[str, str] = field(default_factory=dict)
    # host limits, through the workload's cgroup (runtime/cgroups.py); None: not bounded
    host_memory_mib: int | None = None
    cpus_milli: int | None = None
    pids: int | None = None
    # a container image on this machine: the workload runs as an OCI container of it (its command
    # the container's), by the operator's engine (runtime/container_runner.py); None: a process
    image: str | None = None
    engine: Engine | None = None  # which engine's memory flags to set (model/engines.py)
    mounts: tuple[VolumeMount, ...] = ()  # a container's bind mounts
    # a service gpufrac may restart elsewhere to make room (a deployment's replica always may)
    movable: bool = False

    def __hash__(self) -> int:
        return hash((self.tenant, self.name))


def spec_to_json(spec: WorkloadSpec) -> dict[str, Any]:
    """A validated spec as plain JSON (what the store keeps)."""
    raw = asdict(spec)
    raw["command"] = list(spec.command)
    if not spec.node_selector:
        # left out when empty: stored specs and deployment template hashes from before it existed
        # stay the same
        del raw["node_selector"]
    if not spec.mounts:
        del raw["mounts"]
    else:
        raw["mounts"] = [asdict(m) for m in spec.mounts]
    if not spec.movable:
        del raw["movable"]  # specs stored before moves existed stay the same
    for key in ("host_memory_mib", "cpus_milli", "pids", "image", "engine"):
        if raw[key] is None:
            del raw[key]  # likewise: specs stored before host limits existed stay the same
    if raw["gpu"]["memory_pct"] is None:
        del raw["gpu"]["memory_pct"]  # likewise, for specs from before memory percentages
    if raw["gpu"]["devices"] == 1:
        del raw["gpu"]["devices"]  # likewise, for specs from before shares of several GPUs
    return raw


def spec_from_json(raw: dict[str, Any]) -> WorkloadSpec:
    """The inverse of ``spec_to_json``, for specs gpufrac stored itself (already validated)."""
    fields = dict(raw)
    fields["gpu"] = GpuRequest(**raw["gpu"])
    fields["health"] = None if raw.get("health") is None else HealthCheck(**raw["health"])
    fields["command"] = tuple(raw["command"])
    fields["mounts"] = tuple(VolumeMount(**m) for m in raw.get("mounts", ()))
    return WorkloadSpec(**fields)


def spec_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """What changed between two stored specs, one ``path: old -> new`` line per changed field."""
    out: list[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += spec_diff(a, b, path + ".")
        elif a != b:
            out.append(f"{path}: {a!r} -> {b!r}")
    return out
