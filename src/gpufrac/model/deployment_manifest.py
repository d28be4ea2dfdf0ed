"""The ``kind: Deployment`` document as pydantic models, validated as strictly as workloads, and
the ``DeploymentSpec`` a valid one means.

The replica template has the workload fields that apply to a replica (``SpecFields``: every one
means the same here), with ``model``, ``max_batch_size`` and ``max_wait_ms`` beside them.
docs/serving.md lists every field.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from gpufrac.model.deployment import Autoscale, DeploymentSpec
from gpufrac.model.gpu_manifest import check_sharing
from gpufrac.model.manifest_types import (
    DnsLabel,
    Hint,
    Strict,
    Text,
    UrlPath,
    no_default,
    one_of_fields,
    problem,
    report,
)
from gpufrac.model.workload_manifest import SPEC_BROKEN, Metadata, SpecFields

MAX_NAME = 50  # replica names add "-<8 hex>-<index>" and must stay DNS labels (63)
MODEL_REF_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
_MODEL_REF = re.compile(MODEL_REF_PATTERN)
_PLACEHOLDER = ("python", "-m", "gpufrac.serving.replica")  # the replica server's, set per replica
_SECONDS = Annotated[float, Field(ge=0, le=86_400)]


def _short_name(name: str) -> str:
    if len(name) > MAX_NAME:
        raise problem(
            f"is {len(name)} characters long",
            f"use at most {MAX_NAME}: replica names add a template hash and an index",
        )
    return name


class DeploymentMetadata(Metadata):
    name: Annotated[DnsLabel, AfterValidator(_short_name), Hint(missing="name the deployment")] = (
        Field(
            description=f"The name (a DNS label of at most {MAX_NAME} characters), unique within "
            "its tenant.",
            json_schema_extra={"maxLength": MAX_NAME},
        )
    )


def _model_ref(model: str) -> str:
    if not _MODEL_REF.fullmatch(model):
        raise problem(
            f"{model!r} is not package.module:factory",
            "write it like my_models.text:make (a function that returns the model)",
        )
    return model


def _template_json_schema(schema: dict[str, Any]) -> None:
    schema["not"] = {  # a template that breaks a rule
        "anyOf": [
            *one_of_fields(("model", "command"), exactly=True),
            *SPEC_BROKEN,
            {  # batching is for model: templates
                "anyOf": [{"required": ["max_batch_size"]}, {"required": ["max_wait_ms"]}],
                "not": {"required": ["model"]},
            },
            {"required": ["env"], "properties": {"env": {"required": ["PORT"]}}},  # its own PORT
        ]
    }


class Template(SpecFields):
    """A replica: a service the agent health-checks on $PORT, serving ``model`` with gpufrac's
    replica server or running ``command`` (a server on $PORT)."""

    model_config = ConfigDict(json_schema_extra=_template_json_schema)

    model: Annotated[Text, AfterValidator(_model_ref)] | None = Field(
        None,
        description="package.module:factory, a function returning the model gpufrac serves.",
        json_schema_extra={"pattern": MODEL_REF_PATTERN},
    )
    max_batch_size: Annotated[int, Field(ge=1, le=4096)] = Field(
        1,
        description="model: templates: the most requests batched into one call (default 1).",
        json_schema_extra=no_default,
    )
    max_wait_ms: Annotated[float, Field(ge=0, le=10_000)] = Field(
        5.0,
        description="model: templates: the longest a request waits for a batch to fill "
        "(default 5).",
        json_schema_extra=no_default,
    )

    @model_validator(mode="after")
    def _rules(self) -> Self:
        broken = check_sharing(self.resources.gpu, self.sharing)
        given = self.model_fields_set
        if "model" in given and "command" in given:
            broken.append(
                (
                    (),
                    "has both model and command",
                    "give model: (gpufrac serves it) or command: (your server on $PORT), not both",
                )
            )
        elif not given & {"model", "command"}:
            broken.append(
                (
                    (),
                    "has neither model nor command",
                    "give model: package.module:factory, or command: [...] for a server on $PORT",
                )
            )
        broken += [
            (
                (key,),
                f"{key} is for model: templates",
                "batch inside your own server, or use model:",
            )
            for key in ("max_batch_size", "max_wait_ms")
            if key in given and "model" not in given
        ]
        if "PORT" in self.env:
            broken.append(
                (
                    ("env", "PORT"),
                    "sets PORT",
                    "remove it: gpufrac gives each replica its own $PORT",
                )
            )
        report("Template", broken)
        return self


class AutoscaleFields(Strict):
    min_replicas: Annotated[int, Field(ge=0, le=1000)] = Field(
        1, description="Replicas kept however idle (0: scale to zero)."
    )
    max_replicas: Annotated[int, Field(ge=1, le=1000)] | None = Field(
        None, description="The most replicas; default max(min_replicas, 4)."
    )
    target_in_flight: Annotated[int, Field(ge=1, le=10_000)] = Field(
        4, description="Requests in flight (and queued) per replica the autoscaler aims at."
    )
    scale_up_delay_seconds: _SECONDS = 5.0
    scale_down_delay_seconds: _SECONDS = 30.0
    scale_to_zero_delay_seconds: _SECONDS = 60.0
    traffic_history_seconds: Annotated[float, Field(gt=0, le=86_400)] = 10.0
    p99_latency_ms: Annotated[float, Field(gt=0, le=3_600_000)] | None = Field(
        None, description="An objective: scale up while the p99 latency is above it."
    )

    @model_validator(mode="after")
    def _range(self) -> Self:
        lo, hi = self.min_replicas, self.max_replicas
        if hi is not None and hi < lo:
            report(
                "Autoscale",
                [
                    (
                        ("max_replicas",),
                        f"{hi} is out of range",
                        f"write a whole number from {max(1, lo)} to 1000",
                    )
                ],
            )
        return self

    def autoscale(self) -> Autoscale:
        lo = self.min_replicas
        return Autoscale(
            min_replicas=lo,
            max_replicas=self.max_replicas if self.max_replicas is not None else max(lo, 4),
            target_in_flight=self.target_in_flight,
            scale_up_delay_seconds=self.scale_up_delay_seconds,
            scale_down_delay_seconds=self.scale_down_delay_seconds,
            scale_to_zero_delay_seconds=self.scale_to_zero_delay_seconds,
            traffic_history_seconds=self.traffic_history_seconds,
            p99_latency_ms=self.p99_latency_ms,
        )


class DeploymentSpecFields(Strict):
    model_config = ConfigDict(json_schema_extra={"not": {"required": ["replicas", "autoscale"]}})

    template: Annotated[
        Template, Hint(missing="write template: {model: pkg.mod:make, resources: ...}")
    ] = Field(description="The replica template.")
    replicas: Annotated[int, Field(ge=0, le=1000)] | None = Field(
        None, description="A fixed number of replicas (default 1); not with autoscale."
    )
    autoscale: AutoscaleFields | None = Field(
        None, description="Replicas scaled with traffic; not with replicas."
    )
    readiness_path: UrlPath | None = Field(
        None,
        description="Ready when GET of this path answers 2xx/3xx; default /healthz for a model, "
        "a TCP connect for a command.",
    )
    max_concurrency: Annotated[int, Field(ge=1, le=10_000)] = Field(
        8, description="Requests the gateway sends one replica at once."
    )
    queue_limit: Annotated[int, Field(ge=0, le=1_000_000)] = Field(
        256, description="Requests that may wait for a free replica before a 429."
    )
    timeout_seconds: Annotated[float, Field(gt=0, le=86_400)] = Field(
        60.0, description="The longest a request may take."
    )
    public: bool = Field(
        False, description="With API tokens: answered without one (else only its tenant's)."
    )

    @model_validator(mode="after")
    def _one_scale(self) -> Self:
        if self.replicas is not None and self.autoscale is not None:
            raise problem(
                "has both replicas and autoscale",
                "give a fixed replicas: N, or autoscale: {min_replicas, max_replicas, ...}",
            )
        return self


class DeploymentDocument(Strict):
    """A replicated model server behind the gateway."""

    api_version: Literal["gpufrac/v1"] = Field(alias="apiVersion")
    kind: Literal["Deployment"]
    metadata: Annotated[DeploymentMetadata, Hint(missing="write metadata: {name: my-model}")]
    spec: Annotated[
        DeploymentSpecFields,
        Hint(missing="write spec: with template and replicas (docs/serving.md)"),
    ]

    def to_spec(self, tenant: str) -> DeploymentSpec:
        spec, t = self.spec, self.spec.template
        template = t.model_copy(update={"command": list(_PLACEHOLDER)}) if t.model else t
        return DeploymentSpec(
            name=self.metadata.name,
            tenant=tenant,
            labels=dict(self.metadata.labels),
            template=template.to_spec(self.metadata, tenant, "service", restart="always"),
            model=t.model,
            max_batch_size=t.max_batch_size,
            max_wait_ms=t.max_wait_ms,
            readiness_path=spec.readiness_path,
            replicas=None if spec.autoscale else spec.replicas if spec.replicas is not None else 1,
            autoscale=spec.autoscale.autoscale() if spec.autoscale else None,
            max_concurrency=spec.max_concurrency,
            queue_limit=spec.queue_limit,
            timeout_seconds=spec.timeout_seconds,
            public=spec.public,
        )
