"""Deployments as values: a replicated model server (``kind: Deployment``), after validation.

A deployment is a replica template (a ``Workload`` spec of type service, where ``model:`` may stand
instead of ``command``) plus either a fixed ``replicas`` count or ``autoscale``. The agent turns it
into replica workloads (``replica_spec``), each listening on its own ``$PORT``, and the gateway
spreads ``/serve/{name}/...`` over the ready ones. ``docs/serving.md`` documents every field.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpufrac.model.workload import HealthCheck, WorkloadSpec, spec_from_json, spec_to_json

REPLICA_KEY_ENV = "GPUFRAC_REPLICA_KEY"  # the secret a replica knows its gateway by


def shown_spec(raw: dict[str, Any]) -> dict[str, Any]:
    """A stored workload spec as the API shows it: a replica's key left out (it is between the
    replica and its gateway)."""
    env = raw.get("env") or {}
    if REPLICA_KEY_ENV not in env:
        return raw
    return {**raw, "env": {k: v for k, v in env.items() if k != REPLICA_KEY_ENV}}


LABEL = "gpufrac.io/deployment"
TEMPLATE_LABEL = "gpufrac.io/template"


@dataclass(frozen=True, slots=True)
class Autoscale:
    """Field names as hosted platforms use them (Clarifai's autoscale_config, and the like)."""

    min_replicas: int = 1
    max_replicas: int = 4
    target_in_flight: int = 4  # requests in flight (and queued) per replica the autoscaler aims at
    scale_up_delay_seconds: float = 5.0
    scale_down_delay_seconds: float = 30.0
    scale_to_zero_delay_seconds: float = 60.0
    traffic_history_seconds: float = 10.0
    p99_latency_ms: float | None = None  # an objective: scale up while the p99 is above it


@dataclass(frozen=True, slots=True)
class DeploymentSpec:
    name: str
    template: WorkloadSpec  # type service; command set (from model: where given), health unset
    tenant: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    model: str | None = None  # package.module:factory, served by gpufrac's replica server
    max_batch_size: int = 1
    max_wait_ms: float = 5.0
    readiness_path: str | None = None  # None: /healthz for a model, a TCP connect for a command
    replicas: int | None = None  # fixed count, or None with autoscale
    autoscale: Autoscale | None = None
    max_concurrency: int = 8  # requests the gateway sends one replica at once
    queue_limit: int = 256  # requests that may wait for a free replica before 429
    timeout_seconds: float = 60.0
    public: bool = False  # with API tokens: answered without one (else only its tenant's tokens)

    def __hash__(self) -> int:
        return hash((self.tenant, self.name))

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.name}"

    @property
    def template_hash(self) -> str:
        """Changes exactly when a replica would change: a new hash rolls the replicas over."""
        raw = {
            "template": spec_to_json(self.template),
            "model": self.model,
            "batch": [self.max_batch_size, self.max_wait_ms],
            "ready": self.readiness_path,
        }
        return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:8]

    def replica_spec(self, index: int, port: int, key: str | None = None) -> WorkloadSpec:
        """Replica ``index`` of the current template, listening on ``port``; ``key``: the secret
        its gateway sends with each request (``$GPUFRAC_REPLICA_KEY``), so that the replica
        serves its gateway, not whoever else reaches its port."""
        t = self.template
        command = t.command
        if self.model is not None:
            command = (
                sys.executable,
                "-m",
                "gpufrac.serving.replica",
                self.model,
                "--max-batch-size",
                str(self.max_batch_size),
                "--max-wait-ms",
                f"{self.max_wait_ms:g}",
            )
        path = self.readiness_path or ("/healthz" if self.model is not None else None)
        health = HealthCheck("http", port, path, 1) if path else HealthCheck("tcp", port, "/", 1)
        return replace(
            t,
            name=f"{self.name}-{self.template_hash}-{index}",
            tenant=self.tenant,
            type="service",
            command=command,
            env={**t.env, "PORT": str(port), **({REPLICA_KEY_ENV: key} if key else {})},
            labels={**t.labels, LABEL: self.name, TEMPLATE_LABEL: self.template_hash},
            health=health,
            restart="always",
            # replicas beyond the minimum are the autoscaler's: they wait rather than evict anyone
            preemption="never"
            if self.autoscale is not None and index >= self.autoscale.min_replicas
            else t.preemption,
        )


def deployment_to_json(d: DeploymentSpec) -> dict[str, Any]:
    raw = asdict(d)
    raw["template"] = spec_to_json(d.template)
    return raw


def deployment_from_json(raw: dict[str, Any]) -> DeploymentSpec:
    fields = dict(raw)
    fields["template"] = spec_from_json(raw["template"])
    fields["autoscale"] = None if raw.get("autoscale") is None else Autoscale(**raw["autoscale"])
    return DeploymentSpec(**fields)
