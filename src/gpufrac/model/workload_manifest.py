"""The ``kind: Workload`` document as pydantic models: the schema, the validation and the
cross-field rules, and the ``WorkloadSpec`` a valid document means.

Field names are the names written in files (aliases where Python cannot spell them:
``apiVersion``, ``gpu-fraction``). Descriptions are docs/manifest.md's, shown by editors through
the JSON Schema (``model.schema``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from gpufrac.model.gpu_manifest import SHARING_BROKEN, Resources, check_sharing
from gpufrac.model.manifest_types import (
    DnsLabel,
    Hint,
    ImageRef,
    LabelKey,
    NodeLabelKey,
    NodeLabelValue,
    Priority,
    ShareMilli,
    Strict,
    Text,
    UrlPath,
    Word,
    WorkloadEnvName,
    no_default,
    one_of_fields,
    problem,
    report,
    words_pattern,
)
from gpufrac.model.qos import DEFAULT_QOS, MAX_WEIGHT
from gpufrac.model.workload import (
    PRIORITY_NAMES,
    Engine,
    HealthCheck,
    Preemption,
    QosMode,
    RestartPolicy,
    Sharing,
    VolumeMount,
    WorkloadSpec,
    WorkloadType,
)

API_VERSION = "gpufrac/v1"
DEFAULT_RESTART: dict[WorkloadType, RestartPolicy] = {"service": "always", "job": "on-failure"}
DEFAULT_BACKOFF_LIMIT = 6
_COMMAND_FIX = 'write a list of strings, program first: ["python", "-m", "app"] (no shell is used)'
_NAMES = Hint(fix="write one NAME: value per line")
_PORT = Annotated[int, Field(ge=1, le=65535, description="A TCP port, 1..65535.")]


class Metadata(Strict):
    name: Annotated[DnsLabel, Hint(missing="name the workload")] = Field(
        description="The name (a DNS label), unique within its tenant."
    )
    tenant: DnsLabel = Field(
        "default",
        description="Who it belongs to (a DNS label; quotas apply per tenant). Default: "
        "'default', or the tenant of the API token it is applied with.",
        json_schema_extra=no_default,  # left out, it is the token's tenant
    )
    labels: Annotated[dict[LabelKey, str], _NAMES] = Field(
        {}, description="Free-form labels. Values are strings: quote numbers and booleans."
    )


class HttpProbe(Strict):
    port: Annotated[_PORT, Hint(missing="give the port the service listens on")]
    path: UrlPath = Field("/", description="The path to GET; ready on 2xx/3xx.")


class TcpProbe(Strict):
    port: Annotated[_PORT, Hint(missing="give the port the service listens on")]


def _one_probe(schema: dict[str, Any]) -> None:
    schema["not"] = {"anyOf": one_of_fields(("http", "tcp"), exactly=True)}


class Health(Strict):
    """A service's readiness check: exactly one of http or tcp."""

    model_config = ConfigDict(json_schema_extra=_one_probe)

    http: HttpProbe | None = Field(None, description="HTTP GET to a port; ready on 2xx/3xx.")
    tcp: TcpProbe | None = Field(None, description="Ready when a TCP connect succeeds.")
    period_seconds: Annotated[int, Field(ge=1)] = Field(5, description="Seconds between checks.")
    initial_delay_seconds: Annotated[int, Field(ge=0)] = Field(
        0, description="Seconds after start before the first check."
    )

    @model_validator(mode="after")
    def _one_probe(self) -> Self:
        if (self.http is None) == (self.tcp is None):
            raise problem(
                "has both http and tcp" if self.http else "has neither http nor tcp",
                "give exactly one of http: {port: 8000, path: /healthz} or tcp: {port: 8000}",
            )
        return self

    def check(self) -> HealthCheck:
        probe = self.http or self.tcp
        assert probe is not None
        return HealthCheck(
            kind="http" if self.http else "tcp",
            port=probe.port,
            path=self.http.path if self.http else "/",
            period_seconds=self.period_seconds,
            initial_delay_seconds=self.initial_delay_seconds,
        )


def _command(value: list[str]) -> list[str]:
    if not value[0].strip():
        report("Command", [((0,), "the program name is empty", _COMMAND_FIX)])
    return value


Command = Annotated[
    list[str],
    Field(min_length=1),
    AfterValidator(_command),
    Hint(fix=_COMMAND_FIX),
    WithJsonSchema(
        {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "prefixItems": [{"type": "string", "pattern": r"\S"}],  # a program name, not blank
        }
    ),
]


_ABSOLUTE_FIX = "write an absolute path, such as /data/models"


def _absolute(value: str) -> str:
    if not value.startswith("/") or "\0" in value or any(p == ".." for p in value.split("/")):
        raise problem("is not an absolute path without ..", _ABSOLUTE_FIX)
    return value


AbsolutePath = Annotated[Text, AfterValidator(_absolute), Hint(fix=_ABSOLUTE_FIX)]


def _mountable(value: str) -> str:
    if set(value) & {":", ",", "\n"}:
        raise problem(
            "holds ':', ',' or a line break, which a container engine's mount cannot",
            "mount a path without them (a symbolic link to it, say, within the allowed paths)",
        )
    return value


MountPath = Annotated[
    AbsolutePath,
    AfterValidator(_mountable),
    WithJsonSchema({"type": "string", "pattern": r"^/[^:,\n]*$"}),
]


class MountField(Strict):
    """A host path a container sees (within the operator's allowed paths)."""

    source: MountPath = Field(
        description="The host path; it must lie within gpufrac.yaml's containers.allowed_mounts, "
        "exist, and be a path only root can change (every directory on the way to it)."
    )
    target: MountPath = Field(description="Where the container sees it.")
    read_only: bool = Field(True, description="Mounted read-only (the default).")


_REFUSED = {
    "privileged": "gpufrac never runs a tenant's container privileged (it gets no extra "
    "capabilities and no-new-privileges); remove privileged",
    "host_network": "a container gets its own network namespace, its port published on "
    "127.0.0.1 by gpufrac; remove host_network",
}


# The specs that break a rule of SpecFields, as JSON Schema (for a spec's not: {anyOf: ...}):
# check_sharing's, and mounts without an image
SPEC_BROKEN = [
    *SHARING_BROKEN,
    {
        "required": ["mounts"],
        "properties": {"mounts": {"minItems": 1}},
        "not": {"required": ["image"]},
    },
]


class SpecFields(Strict):
    """The fields a workload and a deployment's replica template share."""

    command: Command | None = Field(
        None,
        description="Program and arguments, run without a shell: a non-empty list of strings.",
    )
    env: Annotated[dict[WorkloadEnvName, str], _NAMES] = Field(
        {},
        description="Environment variables, NAME: string (quote numbers and booleans).",
    )
    workdir: Text | None = Field(None, description="Working directory.")
    user: Text | None = Field(
        None, description="User to run as (one of its tenant's users in gpufrac.yaml)."
    )
    resources: Annotated[Resources, Hint(missing="write resources: {gpu: {count: 1}}")] = Field(
        description="May hold only gpu."
    )
    sharing: Annotated[Sharing, Word] = Field(
        "auto",
        description=(
            "How the GPU is shared; auto lets gpufrac choose; mig is a MIG instance of its own"
            " (mps, timeslice and auto may share one inside: docs/mig.md)."
        ),
    )
    priority: Priority = Field(
        PRIORITY_NAMES["normal"],
        description="high (100), normal (50), low (0), or any integer; higher is more important.",
    )
    preemption: Annotated[Preemption, Word] = Field(
        "lower-priority",
        description="Whether it may evict strictly lower-priority work to get placed.",
    )
    qos: Annotated[QosMode, Word] | None = Field(
        None,
        description="Its class at the QoS arbiter beside priority; default latency for "
        "services, throughput for jobs.",
    )
    weight: Annotated[int, Field(ge=1, le=MAX_WEIGHT)] = Field(
        1, description="Share of the GPU within its class, relative to the others'."
    )
    min_share: ShareMilli | None = Field(
        None,
        description="Part of the GPU's busy time guaranteed while it wants the GPU (10% or "
        "0.1, at most 90%); default: the operator's job_min_share for jobs, 0 for services.",
    )
    node_selector: Annotated[
        dict[NodeLabelKey, NodeLabelValue], Hint(fix="write one LABEL: value per line")
    ] = Field(
        {},
        description="Node labels its node must have, every one (gpufrac.yaml's node.labels on "
        "each machine); multi-GPU requests always stay on one node.",
    )

    image: ImageRef | None = Field(
        None,
        description="A container image on the node (podman or docker, the operator's): the "
        "workload runs as a container of it, command being the container's command. It must "
        "exist locally (no registry is pulled from).",
    )
    engine: Annotated[Engine, Word] | None = Field(
        None,
        description="The inference engine or framework command runs (vllm, sglang, tgi, triton, "
        "pytorch, jax): gpufrac sets its GPU memory flags from the workload's budget.",
    )
    mounts: list[MountField] = Field(
        [], description="Containers only: host paths it sees, within the operator's allowed ones."
    )
    privileged: bool = Field(
        False,
        description="Refused when true (never privileged).",
        json_schema_extra={"const": False},
    )
    host_network: bool = Field(
        False,
        description="Refused when true (own network namespace).",
        json_schema_extra={"const": False},
    )

    @model_validator(mode="after")
    def _container_rules(self) -> Self:
        broken: list[tuple[tuple[str | int, ...], str, str]] = []
        for key, fix in _REFUSED.items():
            if getattr(self, key):
                broken.append(((key,), "is not allowed for a tenant's workload", fix))
        if self.mounts and self.image is None:
            broken.append(
                (("mounts",), "is for containers only", "give spec.image, or remove mounts")
            )
        if self.image is not None:  # a container's env reaches it through a file of lines
            for key, value in self.env.items():
                if set(value) & {"\n", "\r"}:
                    broken.append(
                        (
                            ("env", key),
                            "holds a line break, which a container's environment cannot",
                            "put the text in a file the container mounts, and its path here",
                        )
                    )
        report("Spec", broken)
        return self

    def to_spec(
        self, meta: Metadata, tenant: str, kind: WorkloadType, **fields: Any
    ) -> WorkloadSpec:
        """The workload this spec describes; ``fields`` are the kind's own."""
        assert self.command is not None
        return WorkloadSpec(
            name=meta.name,
            tenant=tenant,
            labels=dict(meta.labels),
            type=kind,
            command=tuple(self.command),
            env=dict(self.env),
            workdir=self.workdir,
            user=self.user,
            gpu=self.resources.gpu.request(),
            host_memory_mib=self.resources.host_memory,
            cpus_milli=self.resources.cpus,
            pids=self.resources.pids,
            sharing=self.sharing,
            priority=self.priority,
            preemption=self.preemption,
            qos=self.qos or DEFAULT_QOS[kind],
            weight=self.weight,
            min_share_milli=self.min_share,
            node_selector=dict(self.node_selector),
            image=self.image,
            engine=self.engine,
            mounts=tuple(VolumeMount(m.source, m.target, m.read_only) for m in self.mounts),
            **fields,
        )


def _workload_spec_json_schema(schema: dict[str, Any]) -> None:
    """The rules between sharing and the request, and the fields of one type only (a job by
    default)."""
    service = {
        "required": ["type"],
        "properties": {"type": {"pattern": words_pattern(["service"])}},
    }
    job_only = {"anyOf": [{"required": ["backoff_limit"]}, {"required": ["deadline_seconds"]}]}
    schema["not"] = {  # a spec that breaks a rule
        "anyOf": [
            *SPEC_BROKEN,
            {"required": ["health"], "not": service},  # health on a job
            {**job_only, **service},  # backoff_limit or deadline_seconds on a service
            {  # movable: true on a job
                "required": ["movable"],
                "properties": {"movable": {"const": True}},
                "not": service,
            },
            {  # movable: true with restart: never
                "required": ["movable", "restart"],
                "properties": {
                    "movable": {"const": True},
                    "restart": {"pattern": words_pattern(["never"])},
                },
            },
        ]
    }


class WorkloadSpecFields(SpecFields):
    model_config = ConfigDict(json_schema_extra=_workload_spec_json_schema)

    type: Annotated[WorkloadType, Word] = Field(
        "job", description="A job runs to completion; a service runs until deleted."
    )
    command: Annotated[Command, Hint(missing='write command: ["python", "app.py"]')] = Field(
        description="Program and arguments, run without a shell: a non-empty list of strings."
    )
    health: Health | None = Field(None, description="Services only: a readiness check.")
    restart: Annotated[RestartPolicy, Word] | None = Field(
        None,
        description="When a stopped workload is started again; default always for services, "
        "on-failure for jobs.",
    )
    backoff_limit: Annotated[int, Field(ge=0)] = Field(
        DEFAULT_BACKOFF_LIMIT,
        description="Jobs only: restarts before the job is failed "
        f"(default {DEFAULT_BACKOFF_LIMIT}).",
        json_schema_extra=no_default,
    )
    deadline_seconds: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Jobs only: stopped and failed after this many seconds."
    )
    movable: bool = Field(
        False,
        description="Services only: gpufrac may restart it on another MIG instance to make "
        "room for a request that fragmentation keeps out (docs/scheduler.md, Moves; it is down "
        "between). A deployment's replicas are always movable, without a gap.",
    )

    @model_validator(mode="after")
    def _rules(self) -> Self:
        broken = check_sharing(self.resources.gpu, self.sharing)
        if self.health is not None and self.type != "service":
            broken.append(
                (
                    ("health",),
                    "a health check is for services only",
                    "remove health, or set type: service",
                )
            )
        for key in ("backoff_limit", "deadline_seconds"):
            if self.type != "job" and key in self.model_fields_set:
                broken.append(
                    (
                        (key,),
                        f"{key} is for jobs only",
                        f"remove {key}: a service runs until deleted and is restarted per "
                        "spec.restart",
                    )
                )
        if self.movable and self.type != "service":
            broken.append(
                (
                    ("movable",),
                    "a job is never moved (it would lose its progress)",
                    "remove movable, or set type: service",
                )
            )
        elif self.movable and self.restart == "never":
            broken.append(
                (
                    ("movable",),
                    "a movable service is started again elsewhere when it is moved, which "
                    "restart: never forbids",
                    "remove movable, or set restart: always or on-failure",
                )
            )
        report("WorkloadSpec", broken)
        return self


class WorkloadDocument(Strict):
    """A workload: a job or a service, and what it needs of a GPU."""

    api_version: Literal["gpufrac/v1"] = Field(alias="apiVersion")
    kind: Literal["Workload"]
    metadata: Annotated[Metadata, Hint(missing="write metadata: {name: my-workload}")]
    spec: Annotated[
        WorkloadSpecFields,
        Hint(missing="write spec: with command and resources (see docs/manifest.md)"),
    ]

    def to_spec(self, tenant: str) -> WorkloadSpec:
        spec = self.spec
        return spec.to_spec(
            self.metadata,
            tenant,
            spec.type,
            health=spec.health.check() if spec.health else None,
            restart=spec.restart or DEFAULT_RESTART[spec.type],
            backoff_limit=spec.backoff_limit,
            deadline_seconds=spec.deadline_seconds,
            movable=spec.movable,
        )
