"""A tenant's bound on what it stores (``max_workloads``), checked before a manifest is stored, the
same way on one machine and on a cluster's control plane."""

from __future__ import annotations

from collections.abc import Sequence

from gpufrac.errors import Refused
from gpufrac.model.deployment import DeploymentSpec
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import WorkloadSpec
from gpufrac.runtime.store import Store


def check_workload_caps(
    store: Store,
    settings: OperatorSettings,
    specs: Sequence[WorkloadSpec],
    deployments: Sequence[DeploymentSpec] = (),
) -> None:
    """Refuse (``Refused``, nothing applied) a manifest that would take a tenant above its
    operator bound on stored workloads (``max_workloads``: replicas included, and each deployment
    counts as one too): no tenant fills the node with processes, or the store with deployments."""
    new: dict[str, set[str]] = {}
    for spec in specs:  # counted in SQL: an apply costs the same however many are stored
        if not store.has_workload(spec.tenant, spec.name):
            new.setdefault(spec.tenant, set()).add(spec.name)
    for d in deployments:
        if store.deployment(d.tenant, d.name) is None:
            new.setdefault(d.tenant, set()).add(f"deployment {d.name}")
    for tenant, names in new.items():
        cap, setting = settings.workload_cap(tenant)
        have = store.workload_count(tenant) + store.deployment_count(tenant)
        if have + len(names) > cap:
            raise Refused(
                f"tenant {tenant} has {have} workloads and deployments and this adds "
                f"{len(names)}: above its "
                f"maximum of {cap}; delete some first, or ask the operator to raise {setting} in "
                "gpufrac.yaml"
            )
