"""Workload manifests (``apiVersion: gpufrac/v1``, ``kind: Workload`` or ``Deployment``) to
``WorkloadSpec`` and ``DeploymentSpec`` values.

The documents are pydantic models (``model.workload_manifest``, ``model.deployment_manifest``):
one strict schema, where unknown fields are errors, types are never coerced, and cross-field rules
are checked once there; the JSON Schema editors use is generated from the same models
(``model.schema``). A file is accepted whole or not at all; every problem raises as an
``InputError`` whose ``field`` is the path of the offending field
(``doc[2].spec.resources.gpu.memory`` when the file holds several documents). ``docs/manifest.md``
is the reference for every field; keep the two in step.

A document that is valid may still be written in a way that deserves a word: a size in a unit
spelling of an earlier release, or one whose meaning changed (``12G`` is decimal now, as in
Kubernetes). ``read_objects`` gives each object with those warnings, each naming its field; what
shows a user the result of a manifest (``apply``, ``validate``) shows them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufrac.errors import InputError, Problems
from gpufrac.model.deployment import DeploymentSpec
from gpufrac.model.deployment_manifest import DeploymentDocument
from gpufrac.model.gpu_manifest import GPU_ALIASES, REQUEST_KINDS
from gpufrac.model.kubernetes import is_kubernetes_object, kubernetes_refusal
from gpufrac.model.manifest_errors import fields_of, input_error, noted
from gpufrac.model.manifest_fields import (
    MAX_NODES,
    join,
    kind_of,
    load_documents,
    read_text_file,
    whole_numbers,
)
from gpufrac.model.manifest_types import NOTES
from gpufrac.model.workload import WorkloadSpec
from gpufrac.model.workload_manifest import (
    API_VERSION,
    Metadata,
    WorkloadDocument,
    WorkloadSpecFields,
)

__all__ = [
    "API_VERSION",
    "GPU_ALIASES",
    "REQUEST_KINDS",
    "ManifestFile",
    "Read",
    "load_manifest_file",
    "load_manifest_files",
    "parse_document",
    "parse_manifests",
    "parse_objects",
    "parse_workload",
    "read_document",
    "read_objects",
]

KIND = "Workload"
DOCUMENTS: dict[str, type[WorkloadDocument] | type[DeploymentDocument]] = {
    "Workload": WorkloadDocument,
    "Deployment": DeploymentDocument,
}
DOCUMENT_FIELDS = tuple(fields_of(WorkloadDocument))
METADATA_FIELDS = tuple(fields_of(Metadata))
SPEC_FIELDS = tuple(fields_of(WorkloadSpecFields))


@dataclass(frozen=True, slots=True)
class Read:
    """One document read: its workload or deployment, and the warnings about how it is written
    (``PATH: warning``, located like errors: ``doc[2].spec.resources.gpu.memory`` in a file of
    several documents)."""

    obj: WorkloadSpec | DeploymentSpec
    warnings: tuple[str, ...] = ()
    where: str = ""  # ``doc[N]`` in a text of several documents: where its problems are located


@dataclass(frozen=True, slots=True)
class ManifestFile:
    """A manifest file read whole: its text and its documents."""

    path: Path
    text: str
    read: tuple[Read, ...]

    @property
    def objects(self) -> list[WorkloadSpec | DeploymentSpec]:
        return [r.obj for r in self.read]

    @property
    def warnings(self) -> list[str]:
        """Every document's warnings, each named by the file (``FILE: PATH: warning``)."""
        return [f"{self.path}: {w}" for r in self.read for w in r.warnings]


def load_manifest_file(path: Path) -> list[WorkloadSpec | DeploymentSpec]:
    """Read and parse a manifest file (YAML or JSON, one or more documents of either kind)."""
    text = read_text_file(path, field=str(path), what="the manifest")
    return parse_objects(text, source=path.name)


def load_manifest_files(paths: list[Path]) -> list[ManifestFile]:
    """Every file's text and documents. Every problem of every file is reported at once, each named
    by its file (``FILE: field: ...``), and so is a workload or deployment two files both define."""
    problems = Problems()
    out: list[ManifestFile] = []
    seen: dict[tuple[str, str, str], Path] = {}
    for path in paths:
        try:
            text = read_text_file(path, field=str(path), what="the manifest")
            read = read_objects(text, source=str(path))
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
        for o in (r.obj for r in read):
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
        out.append(ManifestFile(path, text, tuple(read)))
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
    """Every workload and deployment of a manifest text, in order, as ``read_objects`` reads them,
    without their warnings (for callers that show a user nothing of how a manifest is written)."""
    return [r.obj for r in read_objects(text, source=source, default_tenant=default_tenant)]


def read_objects(
    text: str,
    *,
    source: str = "manifest",
    default_tenant: str = "default",
    max_values: int = MAX_NODES,
    bound: str = "",
) -> list[Read]:
    """Every workload and deployment of a manifest text, in order, with its warnings; every problem
    raises ``InputError`` (so a text is accepted whole or not at all). A document that names no
    tenant is ``default_tenant``'s (the caller's, for a tenant's API token). A text of more than
    ``max_values`` values is ``TooLarge`` before it is parsed (``bound``: the setting that says
    so)."""
    yaml_notes: list[list[str]] = []
    documents = load_documents(
        text, source=source, max_values=max_values, bound=bound, notes=yaml_notes
    )
    present = [(i, doc) for i, doc in enumerate(documents, start=1) if doc is not None]
    if not present:
        raise InputError(
            "holds no workload",
            field=source,
            fix=f"write a document with apiVersion: {API_VERSION} and kind: {KIND}",
        )
    several = len(present) > 1
    specs: list[Read] = []
    seen: dict[tuple[str, str, str], int] = {}
    problems = Problems()  # every document's problems, reported together
    for position, doc in present:
        prefix = f"doc[{position}]" if several else ""
        try:
            read = read_document(doc, default_tenant)
        except InputError as exc:
            problems.found.extend(
                (exc.at(prefix or source) if prefix or not exc.field else exc).errors
            )
            continue
        spec = read.obj
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
        at = f"{prefix}." if prefix else ""
        written = (*yaml_notes[position - 1], *read.warnings)
        specs.append(Read(spec, tuple(f"{at}{w}" for w in written), prefix))
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
    """One document, already loaded, of either kind (``read_document`` without its warnings)."""
    return read_document(raw, default_tenant).obj


def read_document(raw: Any, default_tenant: str = "default") -> Read:
    """One document, already loaded, of either kind, with its warnings; errors and warnings are
    located from the document root.

    A document that is not a mapping, or has no or the wrong ``apiVersion`` or ``kind``, is
    reported alone; otherwise every problem of its kind's model is.
    """
    if not isinstance(raw, dict):
        raise InputError(
            f"must be a mapping with apiVersion, kind, metadata, spec, not {kind_of(raw)}",
            fix=f"write a mapping with some of: {', '.join(DOCUMENT_FIELDS)}",
        )
    fix_version = f"write apiVersion: {API_VERSION}"
    if is_kubernetes_object(raw):
        raise kubernetes_refusal(raw, API_VERSION)
    if "apiVersion" not in raw:
        raise InputError("is required", field="apiVersion", fix=fix_version)
    if raw["apiVersion"] != API_VERSION:
        raise InputError(
            f"unsupported apiVersion: {kind_of(raw['apiVersion'])}",
            field="apiVersion",
            fix=fix_version,
        )
    kind = raw.get("kind")
    if "kind" not in raw or not isinstance(kind, str) or kind not in DOCUMENTS:
        raise InputError(
            "is required" if "kind" not in raw else f"unsupported kind: {kind_of(kind)}",
            field="kind",
            fix=f"write kind: {' or '.join(DOCUMENTS)}",
        )
    model = DOCUMENTS[kind]
    raw = whole_numbers(raw)  # count: 1.0 is count: 1, as JSON Schema reads it
    notes: list[tuple[str, str, str]] = []
    try:
        document = model.model_validate(raw, context={NOTES: notes})
    except ValidationError as exc:
        raise input_error(exc, model) from None
    given = "tenant" in document.metadata.model_fields_set
    spec = document.to_spec(document.metadata.tenant if given else default_tenant)
    return Read(spec, tuple(noted(raw, notes)))
