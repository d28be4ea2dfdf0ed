"""What ``/openapi.json`` says beyond what FastAPI reads from the handlers: the bodies the handlers
read themselves (the small JSON bodies of ``api/bodies.py`` and the manifest text of apply), and
the error answers each operation may give.

The answers' models are in ``api/schemas.py``; every operation declares its own with
``response_model``. ``tests/unit/api/test_openapi.py`` checks that every body and every JSON answer
has a schema.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from gpufrac.api.schemas import (
    BusyAnswer,
    ErrorAnswer,
    ProblemsAnswer,
    TimedOutAnswer,
    UnsupportedAnswer,
)
from gpufrac.model.manifest import DOCUMENTS
from gpufrac.model.schema import manifest_json_schema

REF = "#/components/schemas/"
MANIFEST = "Manifest"  # the components' name of the manifest JSON Schema (one document)
MANIFEST_TYPES = ("application/yaml", "application/json")
ERRORS = {
    400: "a malformed request (a Content-Length that is not a number)",
    401: "no valid API token (Authorization: Bearer TOKEN)",
    403: "the token may not do this (another tenant's, or not the admin's)",
    404: "no such workload, deployment, node or GPU (another tenant's look like they do not exist)",
    409: "refused: nothing was changed",
    413: "the body or manifest is over a limit (the operator's api_max_body, max_manifest_bytes "
    "or max_manifest_nodes setting): nothing was changed",
    422: "bad input: each problem's field path (loc), what is wrong (msg) and the fix",
    429: "too many such calls at once or a second (a tenant's applies: the operator's "
    "max_concurrent_applies, apply_rate and apply_burst; log reads: log_relay_*; "
    "application/problem+json): nothing was changed; try again "
    "after Retry-After seconds",
    501: "this server lacks the capability (named in the answer, application/problem+json)",
    503: "the server cannot write its store or data directory, or reach a node, now: nothing "
    "was changed; retry",
    504: "what the call waited for (a node) did not answer within its deadline "
    "(application/problem+json): nothing was changed; retry",
}
GUARD_ERRORS = (400, 413)  # api.guard answers them to any call, before its operation's handler
# the answers written as RFC 9457 problems, and their models
PROBLEMS: dict[int, type[BaseModel]] = {
    429: BusyAnswer,
    501: UnsupportedAnswer,
    504: TimedOutAnswer,
}
PROBLEM_TYPE = "application/problem+json"


def _answer_of(code: int) -> dict[str, Any]:
    if code in PROBLEMS:
        ref = REF + PROBLEMS[code].__name__
        answer: dict[str, Any] = {
            "description": ERRORS[code],
            "content": {PROBLEM_TYPE: {"schema": {"$ref": ref}}},
        }
        if code == 429:
            answer["headers"] = {
                "Retry-After": {
                    "description": "seconds after which a call may find room",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 1},
                }
            }
        return answer
    return {"model": ProblemsAnswer if code == 422 else ErrorAnswer, "description": ERRORS[code]}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of an operation that may answer ``codes``."""
    return {code: _answer_of(code) for code in codes}


def json_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``errors`` of an operation whose own answer is not JSON (its errors still are)."""
    return {
        code: {
            "description": ERRORS[code],
            "content": {
                "application/json": {
                    "schema": {"$ref": REF + ("ProblemsAnswer" if code == 422 else "ErrorAnswer")}
                }
            },
        }
        for code in codes
    }


def manifest_body_schema(content_type: str) -> dict[str, Any]:
    """The schema of a manifest sent as ``content_type`` (one of ``MANIFEST_TYPES``): the manifest
    JSON Schema (``gpufrac schema``, whose parts ``describe_bodies`` adds to the components), for
    YAML as for JSON: a schema says what the body holds, whichever way it is written (as OpenAPI
    reads a YAML body, and tools that write YAML bodies from it, such as schemathesis). A YAML text
    may hold several such documents, ``---`` between them. Both are read by the manifest parser
    (docs/manifest.md), which reports every problem at once."""
    if content_type not in MANIFEST_TYPES:
        raise ValueError(f"no manifest body of type {content_type}")
    return {"$ref": REF + MANIFEST}


def _components(schema: dict[str, Any]) -> dict[str, Any]:
    """The manifest JSON Schema as OpenAPI components: its ``$defs`` beside it, every
    ``#/$defs/X`` pointing at ``#/components/schemas/X``."""

    def moved(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: (REF + v.removeprefix("#/$defs/"))
                if k == "$ref" and isinstance(v, str)
                else moved(v)
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [moved(v) for v in node]
        return node

    # One document, as the one of its kinds it is: the JSON Schema's if/then (which editors
    # report against) as a oneOf told by kind (the same documents: each kind's model holds its
    # kind as a constant), which client generators make a union of typed models of
    kinds = {name: REF + model.__name__ for name, model in DOCUMENTS.items()}
    body = {
        "title": schema["title"],
        "description": schema["description"],
        "oneOf": [{"$ref": ref} for ref in kinds.values()],
        "discriminator": {"propertyName": "kind", "mapping": kinds},
    }
    return {**moved(schema.get("$defs", {})), MANIFEST: body}


def manifest_body(
    schema_of: Callable[[str], dict[str, Any]] = manifest_body_schema,
) -> dict[str, Any]:
    """The ``openapi_extra`` of an operation whose body is manifest text."""
    return {
        "requestBody": {
            "required": True,
            "description": "a manifest, YAML (one or more documents, --- between them) or JSON "
            "(one document); accepted whole or not at all",
            "content": {t: {"schema": schema_of(t)} for t in MANIFEST_TYPES},
        }
    }


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` of an operation whose body is ``model`` (read by ``read_body``; the
    model's schema is added to the components by ``describe_bodies``)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": REF + model.__name__}}},
        }
    }


def describe_bodies(app: FastAPI, models: Iterable[type[BaseModel]]) -> None:
    """Add the schemas of ``models`` (bodies the handlers read themselves) to the app's OpenAPI
    components, where ``json_body`` points."""
    generate = app.openapi
    models = (*models, *PROBLEMS.values())  # the problems (501, 429, 504) errors() points at

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        found = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            described = model.model_json_schema(ref_template=REF + "{model}")
            found.update(described.pop("$defs", {}))
            found[model.__name__] = described
        found.update(_components(manifest_json_schema()))
        # the guard's answers, before any handler and whatever the operation: a Content-Length
        # that is not a number (400), a body over the bound (413), a body-less GET's too
        for item in schema.get("paths", {}).values():
            for operation in item.values():
                for code, answer in json_errors(*GUARD_ERRORS).items():
                    operation.setdefault("responses", {}).setdefault(str(code), answer)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
