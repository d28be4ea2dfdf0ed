"""The JSON Schemas of gpufrac's files, generated from the pydantic models that validate them:
one for manifests (a document is a ``Workload`` or a ``Deployment``, told by ``kind``) and one for
the operator's settings file, ``gpufrac.yaml``.

Editors use them to check a file as it is written (docs/manifest.md, "Editors"); ``gpufrac
schema`` prints them, and ``schemas/`` in the repository holds them as files. The manifest schema
refuses what the reader refuses, document by document (the rules between fields, MIG profiles by
GPU model, NaN, choices in any case included), but for ``BEYOND``: what needs another document or
arithmetic between two fields.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from gpufrac.model.deployment_manifest import DeploymentDocument
from gpufrac.model.manifest import API_VERSION, DOCUMENTS
from gpufrac.model.manifest_types import WORD, words_pattern
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

    def function_before_schema(
        self, schema: core_schema.BeforeValidatorFunctionSchema
    ) -> JsonSchemaValue:
        out = super().function_before_schema(schema)
        choices = out.get("enum")
        if schema["function"].get("function") is WORD and choices:
            # the reader takes a choice in any case, with spaces around it; editors still list
            # the words as written (the enum)
            pattern = {"type": "string", "pattern": words_pattern(choices)}
            return {"anyOf": [{k: v for k, v in out.items() if k != "description"}, pattern]} | (
                {"description": out["description"]} if "description" in out else {}
            )
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


# A number that is no number: no real number is both >= 0 and <= -1, but NaN fails every
# comparison, so passes both (in every JSON Schema validator: Python's, JavaScript's, Rust's).
_NAN = {"type": "number", "minimum": 0, "maximum": -1}
# The largest finite double: above it, only infinity.
_MAX_DOUBLE = 1.7976931348623157e308


# The end of the text, in both regex dialects a validator may use: ECMA-262's ``$`` (editors)
# matches only there, Python's ``$`` (jsonschema, check-jsonschema) also before a final newline,
# which the reader refuses ("w\n" is no name). ``\Z`` is Python's alone; a lookahead is both's.
END = r"(?![\s\S])"


def _anchored(node: Any) -> Any:
    """Every pattern (``pattern``, ``patternProperties``' keys) ending in ``$`` ends at the end of
    the text in any validator: its ``$`` written as ``END``."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                out[key] = _at_end(value)
            elif key == "patternProperties" and isinstance(value, dict):
                out[key] = {_at_end(k): _anchored(v) for k, v in value.items()}
            else:
                out[key] = _anchored(value)
        return out
    if isinstance(node, list):
        return [_anchored(v) for v in node]
    return node


def _at_end(pattern: str) -> str:
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        return pattern[:-1] + END
    return pattern


def _finite(node: Any) -> None:
    """Every ``number`` in a schema refuses NaN and infinities, as the reader does (a YAML file
    can hold ``.nan`` and ``.inf``; JSON cannot, so only YAML tools meet them)."""
    if isinstance(node, dict):
        for value in node.values():
            _finite(value)
        if node.get("type") == "number":
            if "minimum" not in node and "exclusiveMinimum" not in node:
                node["minimum"] = -_MAX_DOUBLE
            if "maximum" not in node and "exclusiveMaximum" not in node:
                node["maximum"] = _MAX_DOUBLE
            node["not"] = dict(_NAN)
    elif isinstance(node, list):
        for value in node:
            _finite(value)


def _schema(adapter: TypeAdapter[Any], title: str, description: str) -> dict[str, Any]:
    body = adapter.json_schema(schema_generator=_Generator, ref_template="#/$defs/{model}")
    _finite(body)
    body = _anchored(body)
    rest = {k: v for k, v in body.items() if k not in ("title", "description")}
    return {"$schema": DIALECT, "title": title, "description": description, **rest}


# What gpufrac's reader refuses that JSON Schema cannot state (docs/manifest.md, "JSON Schema and
# editors"); tests/unit/model/test_schema_agreement.py holds a case of each.
BEYOND = (
    "the reader also refuses: a name used twice (one name per tenant, across every document and "
    "file given together); a field and its alias that ask for different amounts (memory: 1Gi "
    "with gpumem: 2048); one HAMi MIG resource key at most (nvidia.com/mig-1g.18gb: 1 with "
    "nvidia.com/mig-2g.35gb: 1: JSON Schema cannot count the keys a pattern matches); a NUL "
    "character or a lone UTF-16 surrogate in any text (no rule of JSON Schema reaches every "
    "string and key)"
)


def manifest_json_schema() -> dict[str, Any]:
    """The JSON Schema of one manifest document (a YAML file holds one or more): by its ``kind``,
    a ``Workload`` or a ``Deployment`` (if/then, so an editor reports against the one meant)."""
    out = _schema(
        TypeAdapter(WorkloadDocument | DeploymentDocument),
        "gpufrac manifest",
        "A gpufrac/v1 document: a Workload or a Deployment (docs/manifest.md, docs/serving.md). "
        f"gpufrac reads YAML as YAML 1.2, as this schema does. Beyond one document, {BEYOND}.",
    )
    del out["anyOf"]
    return {
        **out,
        "type": "object",
        "required": ["apiVersion", "kind"],
        "properties": {"apiVersion": {"const": API_VERSION}, "kind": {"enum": list(DOCUMENTS)}},
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
