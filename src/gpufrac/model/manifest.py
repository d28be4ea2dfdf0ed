"""Workload manifests (``apiVersion: gpufrac/v1``, ``kind: Workload``) to ``WorkloadSpec`` values.

One strict schema: unknown fields are errors, types are never coerced, and cross-field rules are
checked once here. A file is accepted whole or not at all; the first problem raises an
``InputError`` whose ``field`` is the path of the offending field
(``doc[2].spec.resources.gpu.memory`` when the file holds several documents). ``docs/manifest.md``
is the reference for every field; keep the two in step.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpufrac.errors import InputError, Problems
from gpufrac.model.catalog import lookup_model
from gpufrac.model.deployment import DeploymentSpec
from gpufrac.model.deployment_manifest import DEPLOYMENT_FIELDS, parse_deployment
from gpufrac.model.manifest_fields import (
    join,
    kind_of,
    load_documents,
    read_choice,
    read_dns_label,
    read_int,
    read_mapping,
    read_memory_mib,
    read_milli,
    read_share,
    read_str,
    read_str_map,
    read_text_file,
    require,
    shown,
)
from gpufrac.model.mig import parse_profile_name
from gpufrac.model.qos import DEFAULT_QOS, MAX_WEIGHT, QOS_MODES
from gpufrac.model.workload import (
    MAX_PRIORITY,
    MILLI,
    PREEMPTION_POLICIES,
    PRIORITY_NAMES,
    RESTART_POLICIES,
    SHARING_MODES,
    WORKLOAD_TYPES,
    GpuRequest,
    HealthCheck,
    Preemption,
    RestartPolicy,
    Sharing,
    WorkloadSpec,
    WorkloadType,
)

API_VERSION = "gpufrac/v1"
KIND = "Workload"
KINDS = ("Workload", "Deployment")
DOCUMENT_FIELDS = ("apiVersion", "kind", "metadata", "spec")
METADATA_FIELDS = ("name", "tenant", "labels")
SPEC_FIELDS = (
    "type",
    "command",
    "env",
    "workdir",
    "user",
    "health",
    "resources",
    "sharing",
    "priority",
    "preemption",
    "restart",
    "backoff_limit",
    "deadline_seconds",
    "qos",
    "weight",
    "min_share",
)
HEALTH_FIELDS = ("http", "tcp", "period_seconds", "initial_delay_seconds")
REQUEST_KINDS = ("count", "fraction", "memory", "mig")
# Names other schedulers use, each meaning exactly one gpufrac field (HAMi, then KAI-Scheduler).
GPU_ALIASES = {
    "gpumem": "memory",
    "gpucores": "compute",
    "gpu-fraction": "fraction",
    "gpu-memory": "memory",
}
GPU_FIELDS = (*REQUEST_KINDS, "compute", *GPU_ALIASES)
DEFAULT_RESTART: dict[WorkloadType, RestartPolicy] = {"service": "always", "job": "on-failure"}
DEFAULT_BACKOFF_LIMIT = 6
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PERCENT = re.compile(r"^\s*(\d+)\s*%\s*$")
_EXAMPLE = "see docs/manifest.md for an example"


def load_manifest_file(path: Path) -> list[WorkloadSpec | DeploymentSpec]:
    """Read and parse a manifest file (YAML or JSON, one or more documents of either kind)."""
    text = read_text_file(path, field=str(path), what="the manifest")
    return parse_objects(text, source=path.name)


def load_manifest_files(paths: list[Path]) -> list[tuple[str, list[WorkloadSpec | DeploymentSpec]]]:
    """Every file's text and objects. Every problem of every file is reported at once, each named
    by its file (``FILE: field: ...``), and so is a workload or deployment two files both define."""
    problems = Problems()
    out: list[tuple[str, list[WorkloadSpec | DeploymentSpec]]] = []
    seen: dict[tuple[str, str, str], Path] = {}
    for path in paths:
        try:
            text = read_text_file(path, field=str(path), what="the manifest")
            objects = parse_objects(text, source=str(path))
        except InputError as exc:
            problems.found.extend(
                e
                if (e.field or "").startswith(str(path))
                else InputError(
                    e.message, field=f"{path}: {e.field}" if e.field else str(path), fix=e.fix
                )
                for e in exc.errors
            )
            continue
        for o in objects:
            kind = "workload" if isinstance(o, WorkloadSpec) else "deployment"
            key = (kind, o.tenant, o.name)
            if key in seen and seen[key] != path:
                problems.found.append(
                    InputError(
                        f"{kind} {o.tenant}/{o.name} is also in {seen[key]}",
                        field=str(path),
                        fix=f"give each {kind} one name per tenant",
                    )
                )
            seen.setdefault(key, path)
        out.append((text, objects))
    problems.raise_any()
    return out


def parse_manifests(text: str, *, source: str = "manifest") -> list[WorkloadSpec]:
    """Every workload of a manifest text, in order; a Deployment is an error here."""
    out: list[WorkloadSpec] = []
    for obj in parse_objects(text, source=source):
        if not isinstance(obj, WorkloadSpec):
            raise InputError(
                f"deployment {obj.name!r} is not a workload",
                field=source,
                fix="give deployments to gpufrac apply (or the /api/v1/deployments API)",
            )
        out.append(obj)
    return out


def parse_objects(
    text: str, *, source: str = "manifest", default_tenant: str = "default"
) -> list[WorkloadSpec | DeploymentSpec]:
    """Every workload and deployment of a manifest text, in order; the first problem raises
    ``InputError`` (so a text is accepted whole or not at all). A document that names no tenant is
    ``default_tenant``'s (the caller's, for a tenant's API token)."""
    documents = load_documents(text, source=source)
    present = [(i, doc) for i, doc in enumerate(documents, start=1) if doc is not None]
    if not present:
        raise InputError(
            "holds no workload",
            field=source,
            fix=f"write a document with apiVersion: {API_VERSION} and kind: {KIND}",
        )
    several = len(present) > 1
    specs: list[WorkloadSpec | DeploymentSpec] = []
    seen: dict[tuple[str, str, str], int] = {}
    problems = Problems()  # every document's problems, reported together
    for position, doc in present:
        prefix = f"doc[{position}]" if several else ""
        try:
            spec = parse_document(doc, default_tenant)
        except InputError as exc:
            problems.found.extend(
                (exc.at(prefix or source) if prefix or not exc.field else exc).errors
            )
            continue
        kind = "workload" if isinstance(spec, WorkloadSpec) else "deployment"
        first = seen.setdefault((kind, spec.tenant, spec.name), position)
        if first != position:
            problems.found.append(
                InputError(
                    f"{kind} {spec.name!r} of tenant {spec.tenant!r} is already defined "
                    f"in doc[{first}]",
                    field=join(join(prefix, "metadata"), "name"),
                    fix=f"give each {kind} of a tenant its own name",
                )
            )
        specs.append(spec)
    problems.raise_any()
    return specs


def parse_workload(raw: Any) -> WorkloadSpec:
    """One ``kind: Workload`` document, already loaded; errors are located from the document
    root."""
    spec = parse_document(raw)
    if not isinstance(spec, WorkloadSpec):
        raise InputError("is a Deployment", field="kind", fix=f"write kind: {KIND}")
    return spec


def parse_document(raw: Any, default_tenant: str = "default") -> WorkloadSpec | DeploymentSpec:
    """One document, already loaded, of either kind; errors are located from the document root."""
    doc = read_mapping(
        raw, "", DOCUMENT_FIELDS, what="a mapping with apiVersion, kind, metadata, spec"
    )
    fix_version = f"write apiVersion: {API_VERSION}"
    if require(doc, "apiVersion", "", fix=fix_version) != API_VERSION:
        raise InputError(
            f"unsupported apiVersion: {kind_of(doc['apiVersion'])}",
            field="apiVersion",
            fix=fix_version,
        )
    kind = require(doc, "kind", "", fix=f"write kind: {KIND}")
    if kind not in KINDS:
        raise InputError(
            f"unsupported kind: {kind_of(doc['kind'])}",
            field="kind",
            fix=f"write kind: {' or '.join(KINDS)}",
        )
    p = Problems()  # the metadata's problems and the spec's, reported together
    meta = read_mapping(
        require(doc, "metadata", "", fix="write metadata: {name: my-workload}"),
        "metadata",
        METADATA_FIELDS,
        problems=p,
    )
    name = p.check(
        lambda: read_dns_label(
            require(meta, "name", "metadata", fix="name the workload"), "metadata.name"
        ),
        "unnamed",
    )
    tenant = p.check(
        lambda: read_dns_label(meta.get("tenant", default_tenant), "metadata.tenant"), ""
    )
    labels: dict[str, str] = p.check(
        lambda: read_str_map(meta.get("labels", {}), "metadata.labels"), {}
    )
    parsed: WorkloadSpec | DeploymentSpec | None
    if kind == "Deployment":
        raw_spec = read_mapping(
            require(
                doc, "spec", "", fix="write spec: with template and replicas (docs/serving.md)"
            ),
            "spec",
            DEPLOYMENT_FIELDS,
            problems=p,
        )
        parsed = p.check(
            lambda: parse_deployment(name, tenant, labels, raw_spec, _workload_spec, SPEC_FIELDS),
            None,
        )
    else:
        spec = read_mapping(
            require(doc, "spec", "", fix=f"write spec: with command and resources ({_EXAMPLE})"),
            "spec",
            SPEC_FIELDS,
            problems=p,
        )
        parsed = p.check(lambda: _workload_spec(name, tenant, labels, spec), None)
    p.raise_any()
    assert parsed is not None
    return parsed


def _workload_spec(
    name: str, tenant: str, labels: dict[str, str], spec: dict[str, Any]
) -> WorkloadSpec:
    """The spec of a workload; every field's problem is reported, not only the first."""
    p = Problems()
    kind: WorkloadType = p.check(
        lambda: read_choice(spec.get("type", "job"), "spec.type", WORKLOAD_TYPES), "job"
    )
    command: tuple[str, ...] = p.check(
        lambda: _command(
            require(spec, "command", "spec", fix='write command: ["python", "app.py"]')
        ),
        ("true",),
    )
    env: dict[str, str] = p.check(
        lambda: read_str_map(spec.get("env", {}), "spec.env", key_pattern=_ENV_NAME), {}
    )
    workdir = p.check(
        lambda: read_str(spec["workdir"], "spec.workdir") if "workdir" in spec else None, None
    )
    user = p.check(lambda: read_str(spec["user"], "spec.user") if "user" in spec else None, None)
    health = p.check(lambda: _health_of(kind, spec), None)
    resources: tuple[GpuRequest, str | None] = (GpuRequest(count=1), None)
    gpu, compute_key = p.check(lambda: _resources(spec), resources)
    sharing: Sharing = p.check(
        lambda: read_choice(spec.get("sharing", "auto"), "spec.sharing", SHARING_MODES), "auto"
    )
    p.check(lambda: _check_sharing(gpu, sharing, compute_key), None)
    restart = p.check(
        lambda: read_choice(
            spec.get("restart", DEFAULT_RESTART[kind]), "spec.restart", RESTART_POLICIES
        ),
        DEFAULT_RESTART[kind],
    )
    for job_only in ("backoff_limit", "deadline_seconds"):
        if kind != "job" and job_only in spec:
            p.found.append(
                InputError(
                    f"{job_only} is for jobs only",
                    field=f"spec.{job_only}",
                    fix=f"remove {job_only}: a service runs until deleted and is restarted "
                    "per spec.restart",
                )
            )
    backoff = p.check(
        lambda: read_int(
            spec.get("backoff_limit", DEFAULT_BACKOFF_LIMIT), "spec.backoff_limit", minimum=0
        ),
        DEFAULT_BACKOFF_LIMIT,
    )
    deadline = p.check(
        lambda: (
            read_int(spec["deadline_seconds"], "spec.deadline_seconds", minimum=1)
            if "deadline_seconds" in spec
            else None
        ),
        None,
    )
    priority = p.check(lambda: _priority(spec.get("priority", "normal"), "spec.priority"), 0)
    preemption: Preemption = p.check(
        lambda: read_choice(
            spec.get("preemption", "lower-priority"), "spec.preemption", PREEMPTION_POLICIES
        ),
        "lower-priority",
    )
    qos = p.check(
        lambda: read_choice(spec.get("qos", DEFAULT_QOS[kind]), "spec.qos", QOS_MODES),
        DEFAULT_QOS[kind],
    )
    weight = p.check(
        lambda: read_int(spec.get("weight", 1), "spec.weight", minimum=1, maximum=MAX_WEIGHT), 1
    )
    min_share: int | None = p.check(
        lambda: read_share(spec["min_share"], "spec.min_share") if "min_share" in spec else None,
        None,
    )
    p.raise_any()
    return WorkloadSpec(
        name=name,
        tenant=tenant,
        labels=labels,
        type=kind,
        command=command,
        env=env,
        workdir=workdir,
        user=user,
        health=health,
        gpu=gpu,
        sharing=sharing,
        priority=priority,
        preemption=preemption,
        restart=restart,
        backoff_limit=backoff,
        deadline_seconds=deadline,
        qos=qos,
        weight=weight,
        min_share_milli=min_share,
    )


def _health_of(kind: WorkloadType, spec: dict[str, Any]) -> HealthCheck | None:
    if "health" not in spec:
        return None
    if kind != "service":
        raise InputError(
            "a health check is for services only",
            field="spec.health",
            fix="remove health, or set type: service",
        )
    return _health(spec["health"], "spec.health")


def _resources(spec: dict[str, Any]) -> tuple[GpuRequest, str | None]:
    resources = read_mapping(
        require(spec, "resources", "spec", fix="write resources: {gpu: {count: 1}}"),
        "spec.resources",
        ("gpu",),
    )
    return _gpu_request(
        require(resources, "gpu", "spec.resources", fix="write gpu: {count: 1}"),
        "spec.resources.gpu",
    )


def _command(value: object) -> tuple[str, ...]:
    fix = 'write a list of strings, program first: ["python", "-m", "app"] (no shell is used)'
    if isinstance(value, str):
        raise InputError("must be a list, not a string", field="spec.command", fix=fix)
    if not isinstance(value, list) or not value:
        raise InputError(
            f"must be a non-empty list, not {kind_of(value)}", field="spec.command", fix=fix
        )
    for i, arg in enumerate(value):
        if not isinstance(arg, str):
            raise InputError(
                f"must be a string, not {kind_of(arg)}", field=f"spec.command[{i}]", fix="quote it"
            )
    if not value[0].strip():
        raise InputError("the program name is empty", field="spec.command[0]", fix=fix)
    return tuple(value)


def _priority(value: object, field: str) -> int:
    if isinstance(value, str) and value in PRIORITY_NAMES:
        return PRIORITY_NAMES[value]
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_PRIORITY:
            raise InputError(
                f"{shown(value)} is out of range",
                field=field,
                fix=f"write an integer from {-MAX_PRIORITY:,} to {MAX_PRIORITY:,}".replace(
                    ",", "_"
                ),
            )
        return value
    raise InputError(
        f"{kind_of(value)} is not a priority",
        field=field,
        fix="write high, normal or low, or an integer (higher is more important)",
    )


def _health(value: object, where: str) -> HealthCheck:
    raw = read_mapping(value, where, HEALTH_FIELDS)
    probes = [k for k in ("http", "tcp") if k in raw]
    if len(probes) != 1:
        raise InputError(
            "has both http and tcp" if probes else "has neither http nor tcp",
            field=where,
            fix="give exactly one of http: {port: 8000, path: /healthz} or tcp: {port: 8000}",
        )
    kind = probes[0]
    probe = read_mapping(
        raw[kind], join(where, kind), ("port", "path") if kind == "http" else ("port",)
    )
    port = read_int(
        require(probe, "port", join(where, kind), fix="give the port the service listens on"),
        join(join(where, kind), "port"),
        minimum=1,
        maximum=65535,
    )
    path = "/"
    if "path" in probe:
        path = read_str(probe["path"], join(join(where, "http"), "path"))
        if not path.startswith("/"):
            raise InputError(
                f"{path!r} does not start with '/'",
                field=join(join(where, "http"), "path"),
                fix=f"write /{path}",
            )
    return HealthCheck(
        kind=kind,
        port=port,
        path=path,
        period_seconds=read_int(
            raw.get("period_seconds", 5), join(where, "period_seconds"), minimum=1
        ),
        initial_delay_seconds=read_int(
            raw.get("initial_delay_seconds", 0), join(where, "initial_delay_seconds"), minimum=0
        ),
    )


def _gpu_request(value: object, where: str) -> tuple[GpuRequest, str | None]:
    """The request and the key its compute cap was written under (``compute``/``gpucores``), if
    any."""
    raw = read_mapping(value, where, GPU_FIELDS)
    values: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, item in raw.items():
        field = join(where, key)
        canonical = GPU_ALIASES.get(key, key)
        parsed = _gpu_value(key, item, field)
        if canonical in values and values[canonical] != parsed:
            raise InputError(
                f"{written[canonical]} and {key} ask for different amounts "
                f"({_show(canonical, values[canonical])} and {_show(canonical, parsed)})",
                field=field,
                fix=f"give only one of {written[canonical]} and {key}: "
                f"{_alias_note(written[canonical], key)}",
            )
        values.setdefault(canonical, parsed)
        written.setdefault(canonical, key)
    kinds = [k for k in REQUEST_KINDS if k in values]
    if len(kinds) != 1:
        raise InputError(
            f"asks for {' and '.join(kinds)} at once" if kinds else "asks for no GPU",
            field=where,
            fix="give exactly one of count, fraction, memory, mig (with compute only beside "
            "memory)",
        )
    if "compute" in values and kinds[0] != "memory":
        raise InputError(
            f"a compute cap goes with a memory request, not with {kinds[0]}",
            field=join(where, written["compute"]),
            fix="remove the compute cap, or ask for memory instead",
        )
    mig_profile, mig_model = values.get("mig", (None, None))
    request = GpuRequest(
        count=values.get("count"),
        fraction_milli=values.get("fraction"),
        memory_mib=values.get("memory"),
        compute_pct=values.get("compute"),
        mig_profile=mig_profile,
        mig_model=mig_model,
    )
    return request, written.get("compute")


def _show(canonical: str, value: int) -> str:
    if canonical == "memory":
        return f"{value} MiB"
    if canonical == "fraction":
        return f"{value / MILLI:g} GPU"
    return f"{value}%"


def _alias_note(first: str, second: str) -> str:
    alias = second if second in GPU_ALIASES else first
    return f"{alias} is another name for {GPU_ALIASES[alias]}"


def _gpu_value(key: str, value: object, field: str) -> Any:
    if key == "count":
        return read_int(value, field, minimum=1)
    if key in ("fraction", "gpu-fraction"):
        return read_milli(
            value, field, maximum=MILLI - 1, fix="write a number between 0 and 1, like 0.25"
        )
    if key in ("memory", "gpumem", "gpu-memory"):
        return read_memory_mib(value, field, integer_only=key != "memory")
    if key == "compute":
        match = _PERCENT.match(value) if isinstance(value, str) else None
        if match:
            return read_int(int(match.group(1)), field, minimum=1, maximum=100)
        if isinstance(value, str):
            raise InputError(
                f"{kind_of(value)} is not a percentage", field=field, fix="write it like 30% or 30"
            )
        return read_int(value, field, minimum=1, maximum=100)
    if key == "gpucores":
        return read_int(value, field, minimum=1, maximum=100)
    return _mig(value, field)


def _mig(value: object, field: str) -> tuple[str, str | None]:
    if isinstance(value, dict):
        raw = read_mapping(value, field, ("profile", "model"))
        text = read_str(
            require(raw, "profile", field, fix="write profile: 1g.18gb"), join(field, "profile")
        )
        profile_field = join(field, "profile")
    else:
        text = read_str(
            value,
            field,
            fix="write a profile name like 1g.18gb, or {profile: 1g.18gb, model: H200}",
        )
        raw, profile_field = {}, field
    name = parse_profile_name(text, field=profile_field)
    if name.compute_instance_slices is not None:
        raise InputError(
            f"{text!r} is a compute-instance profile",
            field=profile_field,
            fix=f"ask for the GPU instance {name.gpu_instance_name}: a workload gets a whole "
            "GPU instance",
        )
    if "model" not in raw:
        return str(name), None
    model_field = join(field, "model")
    model_name = read_str(raw["model"], model_field)
    try:
        model = lookup_model(model_name)
    except InputError as exc:
        raise exc.at(model_field) from None
    if not model.has_profile(str(name)):
        raise InputError(
            f"{model.key} has no MIG profile {name}",
            field=profile_field,
            fix=f"use one of: {', '.join(p.name for p in model.profiles)}",
        )
    return str(name), model.key


def _check_sharing(gpu: GpuRequest, sharing: str, compute_key: str | None) -> None:
    kind = gpu.kind
    problem: tuple[str, str] | None = None
    if kind == "mig" and sharing not in ("auto", "mig"):
        problem = (
            f"a mig request cannot use sharing: {sharing}",
            "set sharing: mig or auto, or ask for memory or a fraction instead of a MIG profile",
        )
    elif sharing == "mig" and kind == "count":
        problem = (
            "sharing: mig cuts a GPU, but count asks for whole GPUs",
            "ask for mig, memory or a fraction, or set sharing: exclusive or auto",
        )
    elif sharing == "exclusive" and kind in ("fraction", "memory"):
        problem = (
            f"sharing: exclusive means whole GPUs, but the request is a {kind}",
            "ask for whole GPUs with count, or choose another sharing mode",
        )
    elif compute_key is not None and sharing in ("timeslice", "mig"):
        problem = (
            f"a compute cap ({compute_key}) cannot be enforced with sharing: {sharing}",
            f"a compute cap needs MPS: set sharing: mps or auto, or remove {compute_key}",
        )
    if problem:
        raise InputError(problem[0], field="spec.sharing", fix=problem[1])
