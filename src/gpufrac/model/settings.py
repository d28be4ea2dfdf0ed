"""The operator's settings file, ``gpufrac.yaml`` in the data directory: tenant quotas and policies.

Read as strictly as a manifest (unknown fields and wrong types are errors naming the field and the
fix). A missing file means the defaults. ``docs/manifest.md`` documents every field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from gpufrac.errors import InputError
from gpufrac.model.manifest_fields import (
    join,
    kind_of,
    load_documents,
    read_bool,
    read_choice,
    read_dns_label,
    read_int,
    read_mapping,
    read_memory_mib,
    read_milli,
    read_share,
    read_str,
    read_text_file,
)
from gpufrac.model.workload import MAX_PRIORITY

SETTINGS_FILE = "gpufrac.yaml"
SETTINGS_FIELDS = (
    "tenants",
    "mps_share_tenants",
    "placement_policy",
    "qos_quantum_ms",
    "qos_preempt",
    "mig_reconfigure",
    "job_min_share",
    "api_max_body",
    "max_priority",
    "max_workloads",
    "workload_users",
    "tenant_uids",
)
QosPreempt = Literal["overlap", "drain"]  # how a higher QoS class takes the GPU over
PlacementPolicy = Literal["binpack", "spread"]
# when the agent may re-cut MIG GPUs for waiting workloads: never; idle instances and free space
# only; or also by evicting lower-priority MIG work (the preemption rules). MIG mode itself never
# changes.
MigReconfigure = Literal["never", "idle", "drain"]
QOS_PREEMPT: tuple[QosPreempt, ...] = get_args(QosPreempt)
PLACEMENT_POLICIES: tuple[PlacementPolicy, ...] = get_args(PlacementPolicy)
MIG_RECONFIGURE: tuple[MigReconfigure, ...] = get_args(MigReconfigure)
TENANT_FIELDS = ("gpu_memory", "gpus", "max_priority", "max_workloads", "preemption", "users")
DEFAULT_MAX_WORKLOADS = 1000  # workloads (replicas included) one tenant may have stored at once
# whom workloads run as: the agent's user, or each tenant's own unprivileged uid (root agents only);
# auto: the tenant's when the agent is root and has API tokens (several tenants), else the agent's
WorkloadUsers = Literal["auto", "agent", "tenant"]
WORKLOAD_USERS: tuple[WorkloadUsers, ...] = get_args(WorkloadUsers)
DEFAULT_TENANT_UIDS = (200_000, 299_999)
# how far a tenant's workloads may evict others: any lower-priority workload; only their own
# tenant's; none. It caps a workload's own ``spec.preemption``.
TenantPreemption = Literal["lower-priority", "own-tenant", "never"]
TENANT_PREEMPTION: tuple[TenantPreemption, ...] = get_args(TenantPreemption)
DEFAULT_MAX_PRIORITY = 1000


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """The most one tenant may hold at once; ``None`` is no limit."""

    gpu_memory_mib: int | None = None
    gpus_milli: int | None = None  # milli-GPU: 2500 is two and a half GPUs
    max_priority: int | None = None  # None: the operator's max_priority for every tenant
    max_workloads: int | None = None  # None: the operator's max_workloads for every tenant
    preemption: TenantPreemption = "lower-priority"
    users: tuple[str, ...] = ()  # the user names its workloads may ask for in spec.user


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    tenants: dict[str, TenantQuota] = field(default_factory=dict)
    mps_share_tenants: bool = False  # may workloads of different tenants share one GPU under MPS
    placement_policy: PlacementPolicy = "binpack"
    qos_quantum_ms: int = 10  # the QoS arbiter's quantum: longest turn while others of a class wait
    qos_preempt: QosPreempt = "overlap"
    mig_reconfigure: MigReconfigure = "idle"
    # the share of a shared GPU's busy time a job gets when it does not say (no job waits forever)
    job_min_share_milli: int = 100
    api_max_body_mib: int = 1  # the largest request body the control API reads
    # the highest spec.priority of a tenant with no bound of its own
    max_priority: int = DEFAULT_MAX_PRIORITY
    max_workloads: int = DEFAULT_MAX_WORKLOADS  # of a tenant with no bound of its own
    workload_users: WorkloadUsers = "auto"
    tenant_uids: tuple[int, int] = DEFAULT_TENANT_UIDS  # first and last uid given to tenants

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
        bound: TenantPreemption = q.preemption if q is not None else "lower-priority"
        return "never" if own == "never" else bound


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
    try:
        raw = read_mapping(documents[0], "", SETTINGS_FIELDS, what="a mapping of settings")
    except InputError as exc:
        raise exc.at(source) if not exc.field else exc from None
    tenants = raw.get("tenants", {})
    if not isinstance(tenants, dict):
        raise InputError(
            f"must be a mapping of tenant name to quota, not {kind_of(tenants)}",
            field="tenants",
            fix="write one 'NAME: {gpu_memory: 200GiB, gpus: 4}' per tenant",
        )
    return OperatorSettings(
        tenants={
            read_dns_label(name, join("tenants", name)): _quota(quota, join("tenants", name))
            for name, quota in tenants.items()
        },
        mps_share_tenants=read_bool(raw.get("mps_share_tenants", False), "mps_share_tenants"),
        placement_policy=read_choice(
            raw.get("placement_policy", "binpack"), "placement_policy", PLACEMENT_POLICIES
        ),
        qos_quantum_ms=read_int(
            raw.get("qos_quantum_ms", 10), "qos_quantum_ms", minimum=1, maximum=1000
        ),
        qos_preempt=read_choice(raw.get("qos_preempt", "overlap"), "qos_preempt", QOS_PREEMPT),
        mig_reconfigure=read_choice(
            raw.get("mig_reconfigure", "idle"), "mig_reconfigure", MIG_RECONFIGURE
        ),
        job_min_share_milli=read_share(raw["job_min_share"], "job_min_share")
        if "job_min_share" in raw
        else 100,
        api_max_body_mib=_body_limit(raw["api_max_body"]) if "api_max_body" in raw else 1,
        workload_users=read_choice(
            raw.get("workload_users", "auto"), "workload_users", WORKLOAD_USERS
        ),
        tenant_uids=_uid_range(raw["tenant_uids"]) if "tenant_uids" in raw else DEFAULT_TENANT_UIDS,
        max_priority=read_int(
            raw.get("max_priority", DEFAULT_MAX_PRIORITY),
            "max_priority",
            minimum=-MAX_PRIORITY,
            maximum=MAX_PRIORITY,
        ),
        max_workloads=read_int(
            raw.get("max_workloads", DEFAULT_MAX_WORKLOADS),
            "max_workloads",
            minimum=1,
            maximum=1_000_000,
        ),
    )


def _body_limit(value: object) -> int:
    mib = read_memory_mib(value, "api_max_body")
    if not 1 <= mib <= 1024:
        raise InputError(
            f"{mib} MiB is out of range", field="api_max_body", fix="give 1MiB to 1GiB"
        )
    return mib


def _quota(value: object, where: str) -> TenantQuota:
    raw = read_mapping(value, where, TENANT_FIELDS, what="a mapping of limits")
    memory = raw.get("gpu_memory")
    gpus = raw.get("gpus")
    return TenantQuota(
        gpu_memory_mib=None
        if "gpu_memory" not in raw
        else read_memory_mib(memory, join(where, "gpu_memory")),
        gpus_milli=None
        if "gpus" not in raw
        else read_milli(
            gpus,
            join(where, "gpus"),
            maximum=None,
            fix="write a positive number of GPUs, like 4 or 2.5",
        ),
        max_priority=None
        if "max_priority" not in raw
        else read_int(
            raw["max_priority"],
            join(where, "max_priority"),
            minimum=-MAX_PRIORITY,
            maximum=MAX_PRIORITY,
        ),
        max_workloads=None
        if "max_workloads" not in raw
        else read_int(
            raw["max_workloads"], join(where, "max_workloads"), minimum=1, maximum=1_000_000
        ),
        preemption=read_choice(
            raw.get("preemption", "lower-priority"), join(where, "preemption"), TENANT_PREEMPTION
        ),
        users=_users(raw.get("users", []), join(where, "users")),
    )


def _users(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise InputError(
            f"must be a list of user names, not {kind_of(value)}", field=where, fix="write [alice]"
        )
    return tuple(read_str(v, f"{where}[{i}]") for i, v in enumerate(value))


def _uid_range(value: object) -> tuple[int, int]:
    fix = "write [FIRST, LAST], like [200000, 299999] (uids no account on this machine uses)"
    if not isinstance(value, list) or len(value) != 2:
        raise InputError(
            f"must be [first, last], not {kind_of(value)}", field="tenant_uids", fix=fix
        )
    first = read_int(value[0], "tenant_uids[0]", minimum=1000, maximum=2**31 - 2)
    last = read_int(value[1], "tenant_uids[1]", minimum=first, maximum=2**31 - 2)
    return first, last
