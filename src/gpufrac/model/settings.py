"""The operator's settings file, ``gpufrac.yaml`` in the data directory: tenant quotas and policies.

Read as strictly as a manifest (unknown fields and wrong types are errors naming the field and the
fix): the file is a pydantic model, ``SettingsDocument``, whose JSON Schema editors use
(``model.schema``); it gives the ``OperatorSettings`` value the rest of gpufrac reads. A missing
file means the defaults. ``docs/manifest.md`` documents every field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal, Self, get_args

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from gpufrac.errors import InputError
from gpufrac.model.manifest_errors import input_error, noted
from gpufrac.model.manifest_fields import kind_of, load_documents, read_text_file
from gpufrac.model.manifest_types import (
    NOTES,
    BodyLimitMiB,
    DnsLabel,
    GpusMilli,
    Hint,
    MemoryMiB,
    NodeLabelKey,
    NodeLabelValue,
    ShareMilli,
    Strict,
    Text,
    Word,
    problem,
    report,
)
from gpufrac.model.numbers import digits_note, is_digits
from gpufrac.model.workload import MAX_PRIORITY, VolumeMount

SETTINGS_FILE = "gpufrac.yaml"
QosPreempt = Literal["overlap", "drain"]  # how a higher QoS class takes the GPU over
PlacementPolicy = Literal["binpack", "spread"]
# when the agent may re-cut MIG GPUs for waiting workloads: never; idle instances and free space
# only; or also by evicting lower-priority MIG work (the preemption rules). MIG mode itself never
# changes.
MigReconfigure = Literal["never", "idle", "drain"]
QOS_PREEMPT: tuple[QosPreempt, ...] = get_args(QosPreempt)
PLACEMENT_POLICIES: tuple[PlacementPolicy, ...] = get_args(PlacementPolicy)
MIG_RECONFIGURE: tuple[MigReconfigure, ...] = get_args(MigReconfigure)
DEFAULT_MAX_WORKLOADS = 1000  # workloads (replicas included) one tenant may have stored at once
# whom workloads run as: the agent's user, or each tenant's own unprivileged uid (root agents only);
# auto: the tenant's when the agent is root and has API tokens (several tenants), else the agent's
WorkloadUsers = Literal["auto", "agent", "tenant"]
WORKLOAD_USERS: tuple[WorkloadUsers, ...] = get_args(WorkloadUsers)
DEFAULT_TENANT_UIDS = (200_000, 299_999)
# how far a tenant's workloads may evict others: any lower-priority workload; only their own
# tenant's; none. It caps a workload's own ``spec.preemption``. Evicting another tenant's work is
# the operator's decision: a tenant without a setting of its own evicts only its own tenant's.
TenantPreemption = Literal["lower-priority", "own-tenant", "never"]
TENANT_PREEMPTION: tuple[TenantPreemption, ...] = get_args(TenantPreemption)
DEFAULT_TENANT_PREEMPTION: TenantPreemption = "own-tenant"
DEFAULT_MAX_PRIORITY = 1000
DEFAULT_NODE_PRUNE_AFTER_S = 24 * 3600.0
DEFAULT_MAX_MANIFEST_BYTES = 1 << 20
DEFAULT_MAX_MANIFEST_NODES = 20_000
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DEFAULT_LOG_RELAY_DEADLINE_S = 10.0
DEFAULT_LOG_RELAY_MAX_MIB = 16
DEFAULT_LOG_RELAY_PER_TENANT = 4
DEFAULT_LOG_RELAY_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """The most one tenant may hold at once; ``None`` is no limit."""

    gpu_memory_mib: int | None = None
    gpus_milli: int | None = None  # milli-GPU: 2500 is two and a half GPUs
    max_priority: int | None = None  # None: the operator's max_priority for every tenant
    max_workloads: int | None = None  # None: the operator's max_workloads for every tenant
    preemption: TenantPreemption | None = None  # None: not set (DEFAULT_TENANT_PREEMPTION)
    users: tuple[str, ...] = ()  # the user names its workloads may ask for in spec.user
    # the node labels its workloads are kept to (every one must match), by the operator
    nodes: tuple[tuple[str, str], ...] = ()


ContainerEngine = Literal["auto", "podman", "docker"]
DEFAULT_CDI_KIND = "gpufrac.io/gpu"


@dataclass(frozen=True, slots=True)
class ContainerSettings:
    """How workloads with ``spec.image`` run: the engine (``auto``: podman, else docker, the
    first that works), the host paths tenants may mount, and gpufrac's CDI specs (their kind
    and the directory the engine reads them from)."""

    engine: ContainerEngine = "auto"
    allowed_mounts: tuple[str, ...] = ()
    cdi_kind: str = DEFAULT_CDI_KIND
    cdi_dir: str = "/etc/cdi"


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    tenants: dict[str, TenantQuota] = field(default_factory=dict)
    mps_share_tenants: bool = False  # may workloads of different tenants share one GPU under MPS
    placement_policy: PlacementPolicy = "binpack"
    qos_quantum_ms: int = 10  # the QoS arbiter's quantum: longest turn while others of a class wait
    qos_preempt: QosPreempt = "overlap"
    mig_reconfigure: MigReconfigure = "idle"
    # may small workloads share one MIG instance (by MPS or time-slices) inside it (docs/mig.md)
    mig_nesting: bool = True
    # may running deployment replicas and movable services be moved (make-before-break) to make
    # room for a MIG request that fragmentation keeps out (docs/scheduler.md, "Moves"), and how
    # many: moves begun in any minute, and of one workload in any hour
    mig_moves: bool = True
    max_moves_per_minute: int = 6
    max_moves_per_workload_per_hour: int = 2
    # the share of a shared GPU's busy time a job gets when it does not say (no job waits forever)
    job_min_share_milli: int = 100
    api_max_body_mib: int = 1  # the largest request body the control API reads
    # what one manifest sent to the API may hold (bytes; values: scalars, lists, mappings), counted
    # before it is parsed; and each tenant's applies at once and a second (bursts of apply_burst)
    max_manifest_bytes: int = DEFAULT_MAX_MANIFEST_BYTES
    max_manifest_nodes: int = DEFAULT_MAX_MANIFEST_NODES
    max_concurrent_applies: int = 2
    apply_rate: float = 10.0
    apply_burst: int = 20
    # the highest spec.priority of a tenant with no bound of its own
    max_priority: int = DEFAULT_MAX_PRIORITY
    max_workloads: int = DEFAULT_MAX_WORKLOADS  # of a tenant with no bound of its own
    workload_users: WorkloadUsers = "auto"
    # a cluster node lost this long is forgotten (its credential revoked): it asks to join again
    node_prune_after_s: float = DEFAULT_NODE_PRUNE_AFTER_S
    tenant_uids: tuple[int, int] = DEFAULT_TENANT_UIDS  # first and last uid given to tenants
    # this machine as a node: its name (None: the host's name) and labels, which workloads' spec.
    # node_selector match
    node_name: str | None = None
    node_labels: dict[str, str] = field(default_factory=dict)
    # how the file is written that deserves a word (``PATH: warning``: an old unit spelling); what
    # reads the file for a user (the agent, the control plane, gpufrac schedule) shows them
    warnings: tuple[str, ...] = field(default=(), compare=False)
    # a workload's logs read through the user API (on a cluster relayed from its node), bounded:
    # the whole of one relay, the most output one answer holds (its newest lines that fit), and
    # the reads under way at once per tenant and per node (one more is answered 429)
    log_relay_deadline_s: float = DEFAULT_LOG_RELAY_DEADLINE_S
    log_relay_max_mib: int = DEFAULT_LOG_RELAY_MAX_MIB
    log_relay_per_tenant: int = DEFAULT_LOG_RELAY_PER_TENANT
    log_relay_per_node: int = DEFAULT_LOG_RELAY_PER_NODE
    containers: ContainerSettings = field(default_factory=ContainerSettings)

    def check_mounts(
        self, mounts: tuple[VolumeMount, ...], resolve: Callable[[str], str] = str
    ) -> tuple[str, ...]:
        """Refuse a container mount outside the operator's ``containers.allowed_mounts``; the
        sources as checked. ``resolve`` is where a path leads (the agent's ``os.path.realpath``):
        a source and the allowed paths are compared where they lead, so a symbolic link under an
        allowed path that points out of it is refused, and the source mounted is the one checked."""
        allowed = self.containers.allowed_mounts
        bounds = [resolve(a).rstrip("/") or "/" for a in allowed]
        sources: list[str] = []
        for i, m in enumerate(mounts):
            source = resolve(m.source).rstrip("/") or "/"
            sources.append(source)
            if not any(source == a or source.startswith(a.rstrip("/") + "/") for a in bounds):
                led = "" if source == (m.source.rstrip("/") or "/") else f" (it leads to {source})"
                raise InputError(
                    f"{m.source}{led} is outside the paths the operator allows containers to mount"
                    f" ({', '.join(allowed) or 'none'})",
                    field=f"spec.mounts[{i}].source",
                    fix="mount a path under one of them, or ask the operator to add it to "
                    "containers.allowed_mounts in gpufrac.yaml",
                )
        return tuple(sources)

    def check_user(self, tenant: str, user: str | None) -> None:
        """Refuse a ``spec.user`` its tenant may not ask for."""
        if user is None:
            return
        q = self.tenants.get(tenant)
        allowed = q.users if q is not None else ()
        if user not in allowed:
            raise InputError(
                f"user {user!r} is not one tenant {tenant!r} may run as",
                field="spec.user",
                fix=f"leave it out, or ask the operator to add it to tenants.{tenant}.users"
                " in gpufrac.yaml",
            )

    def kept_to(self, tenant: str) -> dict[str, str]:
        """The node labels ``tenant``'s workloads are kept to (``tenants.NAME.nodes``)."""
        q = self.tenants.get(tenant)
        return {} if q is None else dict(q.nodes)

    def priority_cap(self, tenant: str) -> int:
        q = self.tenants.get(tenant)
        return q.max_priority if q is not None and q.max_priority is not None else self.max_priority

    def check_priority(self, tenant: str, priority: int) -> None:
        """Refuse a workload whose priority is above its tenant's bound."""
        cap = self.priority_cap(tenant)
        if priority > cap:
            own = tenant in self.tenants and self.tenants[tenant].max_priority is not None
            setting = f"tenants.{tenant}.max_priority" if own else "max_priority"
            raise InputError(
                f"{priority} is above the maximum of {cap} for tenant {tenant}",
                field="spec.priority",
                fix=f"use at most {cap}, or ask the operator to raise {setting} in gpufrac.yaml",
            )

    def workload_cap(self, tenant: str) -> tuple[int, str]:
        """The most workloads ``tenant`` may have stored, and the setting that says so."""
        q = self.tenants.get(tenant)
        if q is not None and q.max_workloads is not None:
            return q.max_workloads, f"tenants.{tenant}.max_workloads"
        return self.max_workloads, "max_workloads"

    def preemption(self, tenant: str, own: str) -> TenantPreemption:
        """Whom a workload of ``tenant`` whose ``spec.preemption`` is ``own`` may evict: the
        stricter of its own setting and its tenant's."""
        q = self.tenants.get(tenant)
        bound = q.preemption if q is not None and q.preemption is not None else None
        return "never" if own == "never" else bound or DEFAULT_TENANT_PREEMPTION

    def preemption_defaulted(self, tenants: Iterable[str]) -> list[str]:
        """Those of ``tenants`` (and of the tenants the settings list) with no preemption setting
        of their own: they take ``DEFAULT_TENANT_PREEMPTION`` (until issue 23 the default was
        ``lower-priority``: any tenant's lower-priority work). Sorted, each once."""
        named = set(tenants) | set(self.tenants)
        return sorted(
            t for t in named if (q := self.tenants.get(t)) is None or q.preemption is None
        )


def preemption_notes(settings: OperatorSettings, tenants: Iterable[str]) -> list[str]:
    """What ``gpufrac agent`` and ``gpufrac control`` say once at start: for each tenant whose
    behaviour the default changed (no preemption setting of its own), that it evicts only its own
    tenant's work now, and how to keep the old behaviour."""
    return [
        f"tenant {t}: preemption is {DEFAULT_TENANT_PREEMPTION} by default (its workloads evict "
        "only its own lower-priority work, never another tenant's); to let it evict any tenant's "
        f"lower-priority work as before, set tenants.{t}.preemption: lower-priority in "
        f"{SETTINGS_FILE}"
        for t in settings.preemption_defaulted(tenants)
    ]


def load_settings(data_dir: Path) -> OperatorSettings:
    """``data_dir / gpufrac.yaml``, or the defaults when there is no such file."""
    path = data_dir / SETTINGS_FILE
    if not path.exists():
        return OperatorSettings()
    text = read_text_file(
        path,
        field=str(path),
        what="the settings file",
        fix="make it a readable UTF-8 text file, or remove it to use the defaults",
    )
    return parse_settings(text, source=path.name)


def parse_settings(text: str, *, source: str = SETTINGS_FILE) -> OperatorSettings:
    """Parse the settings file; an empty file means the defaults."""
    documents = [doc for doc in load_documents(text, source=source) if doc is not None]
    if not documents:
        return OperatorSettings()
    if len(documents) > 1:
        raise InputError(
            f"holds {len(documents)} documents",
            field=source,
            fix="write the settings as one document",
        )
    notes: list[tuple[str, str, str]] = []
    try:
        document = SettingsDocument.model_validate(documents[0], context={NOTES: notes})
    except ValidationError as exc:
        errors = input_error(exc, SettingsDocument).errors  # the document's own: the file's
        raise InputError.many([e if e.field else e.at(source) for e in errors]) from None
    found = tuple(f"{source}: {w}" for w in noted(documents[0], notes))
    return replace(document.settings(), warnings=found)


_PRIORITY = Annotated[int, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)]
_WORKLOADS = Annotated[int, Field(ge=1, le=1_000_000)]
_UID = Annotated[int, Field(ge=1000, le=2**31 - 2)]


def _pair(value: object) -> object:
    if not isinstance(value, list) or len(value) != 2:
        raise problem(
            f"must be [first, last], not {kind_of(value)}",
            "write [FIRST, LAST], like [200000, 299999] (uids no account on this machine uses)",
        )
    return value


def _duration_s(value: object) -> object:
    """Seconds, from a number of seconds or ``90s``, ``30m``, ``24h``, ``7d``."""
    if isinstance(value, bool):
        raise problem(f"must be a duration, not {kind_of(value)}", "write 24h, 30m or 7d")
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        number, unit = value.strip()[:-1], value.strip()[-1:]
        if unit in DURATION_UNITS and is_digits(number):  # ASCII: "١٢h".isdigit() is true
            return int(number) * DURATION_UNITS[unit]
    raise problem(
        f"{value!r} is not a duration{digits_note(value)}"
        if isinstance(value, str)
        else f"must be a duration, not {kind_of(value)}",
        "write a whole number with s, m, h or d after it, like 24h",
    )


_PRUNE_AFTER = Annotated[
    int,
    BeforeValidator(_duration_s),
    Field(ge=60, le=365 * 86400),
    WithJsonSchema({"type": ["string", "integer"], "pattern": "^[0-9]+[smhd]$"}),
]


_RELAY_DEADLINE = Annotated[
    int,
    BeforeValidator(_duration_s),
    Field(ge=1, le=600),
    WithJsonSchema({"type": ["string", "integer"], "pattern": "^[0-9]+[smhd]$"}),
]
_RELAYS = Annotated[int, Field(ge=1, le=10_000)]


class TenantFields(Strict):
    """One tenant's limits; a limit left out is no limit."""

    gpu_memory: MemoryMiB | None = Field(
        None,
        description="The most GPU memory its workloads may hold at once (200Gi, or an integer "
        "meaning MiB).",
    )
    gpus: GpusMilli | None = Field(
        None, description="The most GPUs it may hold at once; may be fractional (2.5)."
    )
    max_priority: _PRIORITY | None = Field(
        None, description="The highest spec.priority its workloads may have."
    )
    max_workloads: _WORKLOADS | None = Field(
        None, description="The most workloads it may have stored at once (replicas count)."
    )
    preemption: Annotated[TenantPreemption | None, Word] = Field(
        None,
        description="Whom its workloads may evict to get placed: any lower-priority workload "
        "(lower-priority), only its own tenant's (own-tenant, the default), or none (never).",
    )
    users: Annotated[list[Text], Hint(fix="write [alice]")] = Field(
        [], description="The spec.user values its workloads may ask for."
    )
    nodes: Annotated[
        dict[NodeLabelKey, NodeLabelValue], Hint(fix="write one LABEL: value per line")
    ] = Field(
        {},
        description="The node labels its workloads are kept to: only nodes with every one of "
        "them run its work (a label selector, as spec.node_selector).",
    )

    def quota(self) -> TenantQuota:
        return TenantQuota(
            gpu_memory_mib=self.gpu_memory,
            gpus_milli=self.gpus,
            max_priority=self.max_priority,
            max_workloads=self.max_workloads,
            preemption=self.preemption,
            users=tuple(self.users),
            nodes=tuple(sorted(self.nodes.items())),
        )


class NodeFields(Strict):
    """This machine as a node of the fleet."""

    name: DnsLabel | None = Field(
        None, description="The node's name (a DNS label); default: the host's name."
    )
    labels: Annotated[
        dict[NodeLabelKey, NodeLabelValue], Hint(fix="write one LABEL: value per line")
    ] = Field({}, description="The node's labels, which workloads' spec.node_selector match.")


def _allowed_mount(value: str) -> str:
    if not value.startswith("/") or any(p == ".." for p in value.split("/")):
        raise problem("is not an absolute path without ..", "write an absolute path: /data")
    return value


class ContainerFields(Strict):
    engine: Annotated[ContainerEngine, Word] = Field(
        "auto", description="podman, docker, or auto (podman, else docker: the first that runs)."
    )
    allowed_mounts: list[Annotated[str, AfterValidator(_allowed_mount)]] = Field(
        [], description="Host paths (and what is below them) tenants' containers may mount."
    )
    cdi_kind: Annotated[str, StringConstraints(pattern=r"^[a-z0-9.-]+/[a-zA-Z0-9_.-]+$")] = Field(
        DEFAULT_CDI_KIND, description="The kind (vendor/class) of gpufrac's CDI devices."
    )
    cdi_dir: Annotated[str, AfterValidator(_allowed_mount)] = Field(
        "/etc/cdi", description="Where gpufrac writes its CDI spec (one the engine reads)."
    )

    def settings(self) -> ContainerSettings:
        return ContainerSettings(
            self.engine, tuple(self.allowed_mounts), self.cdi_kind, self.cdi_dir
        )


class SettingsDocument(Strict):
    """The operator's settings: gpufrac.yaml in the data directory."""

    tenants: Annotated[
        dict[DnsLabel, TenantFields],
        Hint(fix="write one 'NAME: {gpu_memory: 200GiB, gpus: 4}' per tenant"),
    ] = Field({}, description="Per-tenant quotas; a tenant not listed has no quota.")
    mps_share_tenants: bool = Field(
        False, description="Whether workloads of different tenants may share one GPU under MPS."
    )
    placement_policy: Annotated[PlacementPolicy, Word] = Field(
        "binpack", description="binpack fills GPUs before using new ones; spread spreads."
    )
    qos_quantum_ms: Annotated[int, Field(ge=1, le=1000)] = Field(
        10, description="The QoS arbiter's quantum in milliseconds."
    )
    qos_preempt: Annotated[QosPreempt, Word] = Field(
        "overlap", description="How a higher QoS class takes the GPU from a cooperative workload."
    )
    mig_reconfigure: Annotated[MigReconfigure, Word] = Field(
        "idle", description="When workloads waiting for MIG slices may re-cut GPUs."
    )
    mig_nesting: bool = Field(
        True,
        description="Whether small workloads may share one MIG instance by MPS or time-slices.",
    )
    mig_moves: bool = Field(
        True,
        description="Whether running replicas and movable services may be moved to make room for "
        "a MIG request that fragmentation keeps out (docs/scheduler.md, Moves).",
    )
    max_moves_per_minute: Annotated[int, Field(ge=0, le=1000)] = Field(
        6,
        description="The most moves begun in any minute for one tenant's requests (0 to 1000; "
        "0: none).",
    )
    max_moves_per_workload_per_hour: Annotated[int, Field(ge=0, le=1000)] = Field(
        2,
        description="The most moves of one workload in any hour for one tenant's requests (0 to "
        "1000; 0: none).",
    )
    job_min_share: ShareMilli | None = Field(
        None, description="The min_share of a job that sets none (10% or 0.1; default 10%)."
    )
    api_max_body: BodyLimitMiB | None = Field(
        None, description="The largest request body the control API reads (1MiB to 1GiB)."
    )
    max_manifest_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = Field(
        DEFAULT_MAX_MANIFEST_BYTES,
        description="The largest manifest the API reads, in bytes (1024 to 1073741824; a body is "
        "bounded by api_max_body too).",
    )
    max_manifest_nodes: Annotated[int, Field(ge=100, le=1_000_000)] = Field(
        DEFAULT_MAX_MANIFEST_NODES,
        description="The most values (scalars, lists, mappings) one manifest sent to the API may "
        "hold, counted as it is scanned, before it is parsed.",
    )
    max_concurrent_applies: Annotated[int, Field(ge=1, le=64)] = Field(
        2, description="Applies one tenant may have in progress at once (more: 429)."
    )
    apply_rate: Annotated[float, Field(gt=0, le=10_000)] = Field(
        10.0, description="Applies a second one tenant may make, on average (more: 429)."
    )
    apply_burst: Annotated[int, Field(ge=1, le=10_000)] = Field(
        20, description="Applies one tenant may make at once above apply_rate."
    )
    max_priority: _PRIORITY = Field(
        DEFAULT_MAX_PRIORITY,
        description="The highest spec.priority of a tenant with no max_priority of its own.",
    )
    max_workloads: _WORKLOADS = Field(
        DEFAULT_MAX_WORKLOADS,
        description="The most workloads a tenant with no max_workloads of its own may store.",
    )
    workload_users: Annotated[WorkloadUsers, Word] = Field(
        "auto", description="Whom workloads run as: the agent's user, or each tenant's own uid."
    )
    node_prune_after: _PRUNE_AFTER = Field(
        int(DEFAULT_NODE_PRUNE_AFTER_S),
        description="How long a cluster node may stay lost (or wait unapproved, silent) before "
        "the control plane forgets it and revokes its credential: 24h, 30m, 7d, or seconds.",
    )
    tenant_uids: Annotated[
        list[_UID], Field(min_length=2, max_length=2), BeforeValidator(_pair)
    ] = Field(list(DEFAULT_TENANT_UIDS), description="[FIRST, LAST]: the uids given to tenants.")
    node: NodeFields = Field(
        NodeFields.model_validate({}),
        description="This machine as a node: its name and labels.",
    )
    log_relay_deadline: _RELAY_DEADLINE = Field(
        int(DEFAULT_LOG_RELAY_DEADLINE_S),
        description="How long the control plane relays one call for a workload's logs from its "
        "node, all of it, before answering 504: 10s, 1m, or seconds (1 s to 10 min).",
    )
    log_relay_max: BodyLimitMiB = Field(
        DEFAULT_LOG_RELAY_MAX_MIB,
        description="The most output one call for a workload's logs answers (its newest lines "
        "that fit; 1MiB to 1GiB): what a node is asked for, and the most it may send.",
    )
    log_relay_per_tenant: _RELAYS = Field(
        DEFAULT_LOG_RELAY_PER_TENANT,
        description="Calls for one tenant's workloads' logs under way at once; one more is "
        "answered 429 with Retry-After.",
    )
    log_relay_per_node: _RELAYS = Field(
        DEFAULT_LOG_RELAY_PER_NODE,
        description="Calls for logs relayed from one node (on one machine: read by its agent) "
        "under way at once; one more is answered 429 with Retry-After.",
    )

    containers: ContainerFields = Field(
        ContainerFields.model_validate({}),
        description="Workloads run as containers (spec.image): engine, mounts allowed, CDI.",
    )

    @model_validator(mode="after")
    def _uid_order(self) -> Self:
        first, last = self.tenant_uids
        if last < first:
            report(
                "Settings",
                [
                    (
                        ("tenant_uids", 1),
                        f"{last} is out of range",
                        f"write a whole number from {first} to {2**31 - 2}",
                    )
                ],
            )
        return self

    def settings(self) -> OperatorSettings:
        first, last = self.tenant_uids
        return OperatorSettings(
            tenants={name: quota.quota() for name, quota in self.tenants.items()},
            mps_share_tenants=self.mps_share_tenants,
            placement_policy=self.placement_policy,
            qos_quantum_ms=self.qos_quantum_ms,
            qos_preempt=self.qos_preempt,
            mig_reconfigure=self.mig_reconfigure,
            mig_nesting=self.mig_nesting,
            mig_moves=self.mig_moves,
            max_moves_per_minute=self.max_moves_per_minute,
            max_moves_per_workload_per_hour=self.max_moves_per_workload_per_hour,
            job_min_share_milli=100 if self.job_min_share is None else self.job_min_share,
            api_max_body_mib=1 if self.api_max_body is None else self.api_max_body,
            max_manifest_bytes=self.max_manifest_bytes,
            max_manifest_nodes=self.max_manifest_nodes,
            max_concurrent_applies=self.max_concurrent_applies,
            apply_rate=self.apply_rate,
            apply_burst=self.apply_burst,
            max_priority=self.max_priority,
            max_workloads=self.max_workloads,
            workload_users=self.workload_users,
            node_prune_after_s=float(self.node_prune_after),
            tenant_uids=(first, last),
            node_name=self.node.name,
            node_labels=dict(self.node.labels),
            log_relay_deadline_s=float(self.log_relay_deadline),
            log_relay_max_mib=self.log_relay_max,
            log_relay_per_tenant=self.log_relay_per_tenant,
            log_relay_per_node=self.log_relay_per_node,
            containers=self.containers.settings(),
        )
