"""``kind: Deployment`` documents to ``DeploymentSpec`` values, as strictly as workloads.

The template is read by the workload reader (so every workload field means the same here), with
``model``, ``max_batch_size`` and ``max_wait_ms`` beside it; errors are located under
``spec.template``. docs/serving.md lists every field.
"""

from __future__ import annotations

import re
from typing import Any

from gpufrac.errors import InputError, Problems
from gpufrac.model.deployment import Autoscale, DeploymentSpec
from gpufrac.model.manifest_fields import (
    is_number,
    join,
    kind_of,
    read_bool,
    read_int,
    read_mapping,
    read_str,
    require,
)
from gpufrac.model.workload import WorkloadSpec

DEPLOYMENT_FIELDS = (
    "template",
    "replicas",
    "autoscale",
    "readiness_path",
    "max_concurrency",
    "queue_limit",
    "timeout_seconds",
    "public",
)
MODEL_FIELDS = ("model", "max_batch_size", "max_wait_ms")
# A replica is always a service that the agent health-checks on $PORT: these workload fields do not
# apply.
NOT_IN_TEMPLATE = ("type", "health", "backoff_limit", "deadline_seconds", "restart")
AUTOSCALE_FIELDS = (
    "min_replicas",
    "max_replicas",
    "target_in_flight",
    "scale_up_delay_seconds",
    "scale_down_delay_seconds",
    "scale_to_zero_delay_seconds",
    "traffic_history_seconds",
    "p99_latency_ms",
)
MAX_NAME = 50  # replica names add "-<8 hex>-<index>" and must stay DNS labels (63)
_MODEL_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_PLACEHOLDER = ("python", "-m", "gpufrac.serving.replica")


def parse_deployment(
    name: str,
    tenant: str,
    labels: dict[str, str],
    spec: dict[str, Any],
    workload_spec: Any,
    template_fields: tuple[str, ...],
) -> DeploymentSpec:
    """``spec`` is the document's validated mapping; ``workload_spec`` reads a workload's spec.
    Every field's problem is reported, not only the first."""
    p = Problems()
    if len(name) > MAX_NAME:
        p.found.append(
            InputError(
                f"is {len(name)} characters long",
                field="metadata.name",
                fix=f"use at most {MAX_NAME}: replica names add a template hash and an index",
            )
        )
    allowed = tuple(f for f in template_fields if f not in NOT_IN_TEMPLATE) + MODEL_FIELDS
    where = "spec.template"
    raw = read_mapping(
        require(
            spec, "template", "spec", fix="write template: {model: pkg.mod:make, resources: ...}"
        ),
        where,
        allowed,
    )
    model = p.check(lambda: _model(raw, where), None)
    for key in ("max_batch_size", "max_wait_ms"):
        if key in raw and "model" not in raw:
            p.found.append(
                InputError(
                    f"{key} is for model: templates",
                    field=join(where, key),
                    fix="batch inside your own server, or use model:",
                )
            )
    if isinstance(raw.get("env"), dict) and "PORT" in raw["env"]:
        p.found.append(
            InputError(
                "sets PORT",
                field=join(join(where, "env"), "PORT"),
                fix="remove it: gpufrac gives each replica its own $PORT",
            )
        )
    workload = {k: v for k, v in raw.items() if k not in MODEL_FIELDS}
    workload["type"] = "service"
    if "model" in raw:
        workload["command"] = list(_PLACEHOLDER)  # the replica server's, set per replica
    template: WorkloadSpec | None = None
    try:
        template = workload_spec(name, tenant, labels, workload)
    except InputError as exc:
        p.found.extend(
            InputError(
                e.message,
                field=where + e.field[4:] if e.field and e.field.startswith("spec") else where,
                fix=e.fix,
            )
            for e in exc.errors
        )
    replicas = autoscale = None
    if "replicas" in spec and "autoscale" in spec:
        p.found.append(
            InputError(
                "has both replicas and autoscale",
                field="spec",
                fix="give a fixed replicas: N, or autoscale: {min_replicas, max_replicas, ...}",
            )
        )
    elif "autoscale" in spec:
        autoscale = p.check(lambda: _autoscale(spec["autoscale"]), None)
    else:
        replicas = p.check(
            lambda: read_int(spec.get("replicas", 1), "spec.replicas", minimum=0, maximum=1000), 1
        )
    path = p.check(lambda: _readiness_path(spec), None)
    batch = p.check(
        lambda: read_int(
            raw.get("max_batch_size", 1), join(where, "max_batch_size"), minimum=1, maximum=4096
        ),
        1,
    )
    wait = p.check(
        lambda: _number(raw.get("max_wait_ms", 5), join(where, "max_wait_ms"), maximum=10_000), 5.0
    )
    concurrency = p.check(
        lambda: read_int(
            spec.get("max_concurrency", 8), "spec.max_concurrency", minimum=1, maximum=10_000
        ),
        8,
    )
    queue = p.check(
        lambda: read_int(
            spec.get("queue_limit", 256), "spec.queue_limit", minimum=0, maximum=1_000_000
        ),
        256,
    )
    public = p.check(lambda: read_bool(spec.get("public", False), "spec.public"), False)
    timeout = p.check(
        lambda: _number(
            spec.get("timeout_seconds", 60), "spec.timeout_seconds", maximum=86_400, positive=True
        ),
        60.0,
    )  # fmt: skip
    p.raise_any()
    assert template is not None
    return DeploymentSpec(
        name=name,
        tenant=tenant,
        labels=labels,
        template=template,
        model=model,
        max_batch_size=batch,
        max_wait_ms=wait,
        readiness_path=path,
        replicas=replicas,
        autoscale=autoscale,
        max_concurrency=concurrency,
        queue_limit=queue,
        timeout_seconds=timeout,
        public=public,
    )


def _model(raw: dict[str, Any], where: str) -> str | None:
    """The template's ``model:`` reference (None for a ``command:`` template)."""
    if "model" not in raw:
        if "command" not in raw:
            raise InputError(
                "has neither model nor command",
                field=where,
                fix="give model: package.module:factory, or command: [...] for a server on $PORT",
            )
        return None
    if "command" in raw:
        raise InputError(
            "has both model and command",
            field=where,
            fix="give model: (gpufrac serves it) or command: (your server on $PORT), not both",
        )
    model = read_str(raw["model"], join(where, "model"))
    if not _MODEL_REF.match(model):
        raise InputError(
            f"{model!r} is not package.module:factory",
            field=join(where, "model"),
            fix="write it like my_models.text:make (a function that returns the model)",
        )
    return model


def _readiness_path(spec: dict[str, Any]) -> str | None:
    if "readiness_path" not in spec:
        return None
    path = read_str(spec["readiness_path"], "spec.readiness_path")
    if not path.startswith("/"):
        raise InputError(
            f"{path!r} does not start with '/'",
            field="spec.readiness_path",
            fix=f"write /{path}",
        )
    return path


def _number(value: object, field: str, *, maximum: float, positive: bool = False) -> float:
    if not is_number(value):
        raise InputError(
            f"must be a number, not {kind_of(value)}",
            field=field,
            fix="write a number like 5 or 0.5",
        )
    number = float(value)  # type: ignore[arg-type]
    if number < 0 or (positive and number == 0) or number > maximum:
        low = "above 0" if positive else "at least 0"
        raise InputError(
            f"{value} is out of range",
            field=field,
            fix=f"write a number {low} and at most {maximum:g}",
        )
    return number  # fmt: skip


def _autoscale(value: object) -> Autoscale:
    where = "spec.autoscale"
    raw = read_mapping(value, where, AUTOSCALE_FIELDS)
    lo = read_int(raw.get("min_replicas", 1), join(where, "min_replicas"), minimum=0, maximum=1000)
    hi = read_int(
        raw.get("max_replicas", max(lo, 4)),
        join(where, "max_replicas"),
        minimum=max(1, lo),
        maximum=1000,
    )
    seconds = {
        k: _number(raw[k], join(where, k), maximum=86_400)
        for k in AUTOSCALE_FIELDS
        if k.endswith("_seconds") and k in raw
    }
    if seconds.get("traffic_history_seconds") == 0:
        raise InputError(
            "0 is out of range",
            field=join(where, "traffic_history_seconds"),
            fix="write a number above 0",
        )
    p99 = (
        _number(
            raw["p99_latency_ms"], join(where, "p99_latency_ms"), maximum=3_600_000, positive=True
        )
        if "p99_latency_ms" in raw
        else None
    )
    return Autoscale(
        min_replicas=lo,
        max_replicas=hi,
        target_in_flight=read_int(
            raw.get("target_in_flight", 4), join(where, "target_in_flight"),
            minimum=1, maximum=10_000,
        ),
        p99_latency_ms=p99,
        **seconds,
    )  # fmt: skip
