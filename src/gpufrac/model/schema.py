"""The JSON Schemas of gpufrac's files, generated from the pydantic models that validate them:
one for manifests (a document is a ``Workload`` or a ``Deployment``, told by ``kind``) and one for
the operator's settings file, ``gpufrac.yaml``.

Editors use them to check a file as it is written (docs/manifest.md, "Editors"); ``gpufrac
schema`` prints them, and ``schemas/`` in the repository holds them as files. The schema checks
what a document may hold; gpufrac's own reader checks the rest (a MIG profile on a GPU model
that has it, a field and its alias agreeing, each name once per file).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from gpufrac.model.deployment_manifest import DeploymentDocument
from gpufrac.model.manifest import DOCUMENTS
from gpufrac.model.settings import SettingsDocument
from gpufrac.model.workload_manifest import WorkloadDocument

DIALECT = "https://json-schema.org/draft/2020-12/schema"
MANIFEST_SCHEMA_FILE = "manifest.schema.json"
SETTINGS_SCHEMA_FILE = "settings.schema.json"


class _Generator(GenerateJsonSchema):
    """pydantic's generator, for files people write: no titles made up from field names, no null
    (a null is never a value: a field that may be left out is shown by its type), and a mapping
    whose keys are constrained (tenant names, variable names) refuses other keys."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        out = super().default_schema(schema)
        if "default" in out and _holds_null(out["default"]):
            del out["default"]  # a null is never a value, not even inside a default
        return out

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        out = super().dict_schema(schema)
        patterns = out.pop("patternProperties", None)
        if patterns:
            ((pattern, values),) = patterns.items()
            # the key's whole schema where it says more than its pattern (a name that is refused)
            keys = self.generate_inner(schema["keys_schema"]) if "keys_schema" in schema else {}
            names = {k: v for k, v in keys.items() if k != "type"}
            out["propertyNames"] = names if "pattern" in names else {"pattern": pattern}
            out["additionalProperties"] = values
        return out


def _holds_null(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_null(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_null(v) for v in value)
    return value is None


def _schema(adapter: TypeAdapter[Any], title: str, description: str) -> dict[str, Any]:
    body = adapter.json_schema(schema_generator=_Generator, ref_template="#/$defs/{model}")
    rest = {k: v for k, v in body.items() if k not in ("title", "description")}
    return {"$schema": DIALECT, "title": title, "description": description, **rest}


def manifest_json_schema() -> dict[str, Any]:
    """The JSON Schema of one manifest document (a YAML file holds one or more): by its ``kind``,
    a ``Workload`` or a ``Deployment`` (if/then, so an editor reports against the one meant)."""
    out = _schema(
        TypeAdapter(WorkloadDocument | DeploymentDocument),
        "gpufrac manifest",
        "A gpufrac/v1 document: a Workload or a Deployment (docs/manifest.md, docs/serving.md).",
    )
    del out["anyOf"]
    return {
        **out,
        "type": "object",
        "required": ["apiVersion", "kind"],
        "properties": {"kind": {"enum": list(DOCUMENTS)}},
        "allOf": [
            {
                "if": {"properties": {"kind": {"const": name}}, "required": ["kind"]},
                "then": {"$ref": f"#/$defs/{model.__name__}"},
            }
            for name, model in DOCUMENTS.items()
        ],
    }


def settings_json_schema() -> dict[str, Any]:
    """The JSON Schema of the operator's settings file, gpufrac.yaml."""
    return _schema(
        TypeAdapter(SettingsDocument),
        "gpufrac operator settings",
        "gpufrac.yaml in the data directory (docs/manifest.md, 'Operator settings').",
    )


def schema_text(schema: dict[str, Any]) -> str:
    """A schema as the files in ``schemas/`` hold it: indented JSON, keys in order, a newline."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
