"""The control API describes its bodies and answers: every operation with a body has a schema for
each content type it takes, every JSON answer (and every error answer) a schema that says what is
in it, and the answers' closed sets match the agent's. Read from the app itself, no server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import jsonschema
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from openapi_spec_validator.validation.validators import OpenAPIV31SpecValidator

from gpufrac.api import schemas
from gpufrac.api.app import create_app
from gpufrac.api.tokens import Caller
from gpufrac.devices import open_simulated
from gpufrac.runtime.agent import Agent, Phase
from gpufrac.runtime.service import AgentService
from gpufrac.serving.agent_deployments import AgentDeployments

METHODS = ("get", "put", "post", "delete", "patch")


ALL_METHODS = ("get", "head", "post", "put", "patch", "delete", "options")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    data: Path = tmp_path_factory.mktemp("agent")
    service = AgentService(Agent(data, open_simulated("h200:1", data)))
    return create_app(service, AgentDeployments(service, gateway_port=0))


@pytest.fixture(scope="module")
def openapi(app: FastAPI) -> dict[str, Any]:
    return app.openapi()


def operations(openapi: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, item in openapi["paths"].items():
        for method in METHODS:
            if method in item:
                yield f"{method.upper()} {path}", item[method]


def resolved(openapi: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    assert ref.startswith("#/components/schemas/"), ref
    found: dict[str, Any] = openapi["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return found


def described(openapi: dict[str, Any], schema: dict[str, Any]) -> bool:
    """A schema that says something: properties (of itself or the model it points to), or a type
    with a constraint on it; not ``{}``."""
    s = resolved(openapi, schema)
    if "oneOf" in s:  # a union: each of its members says something
        return all(described(openapi, member) for member in s["oneOf"])
    return bool(s.get("properties")) or (
        "type" in s and s["type"] in ("object", "string") and len(s) > 1
    )


def test_every_body_has_a_schema_for_each_content_type(openapi: dict[str, Any]) -> None:
    bodies = 0
    for name, op in operations(openapi):
        body = op.get("requestBody")
        if body is None:
            continue
        bodies += 1
        assert body["content"], name
        for content_type, media in body["content"].items():
            assert described(openapi, media.get("schema", {})), (name, content_type)
    assert bodies >= 4  # two manifest applies, a MIG layout, a deployment's scale


def test_every_json_answer_has_a_schema_with_its_fields(openapi: dict[str, Any]) -> None:
    for name, op in operations(openapi):
        assert any(code.startswith("2") for code in op["responses"]), name
        for code, answer in op["responses"].items():
            if code in ("429", "501", "504"):  # busy, lacking, timed out: RFC 9457's problems
                assert set(answer.get("content", {})) == {"application/problem+json"}, name
            elif code[0] in "45":  # refusals are JSON, whatever the operation answers otherwise
                assert set(answer.get("content", {})) == {"application/json"}, (name, code)
            for content_type, media in answer.get("content", {}).items():
                if content_type not in ("application/json", "application/problem+json"):
                    continue
                schema = resolved(openapi, media.get("schema", {}))
                assert schema.get("properties"), (name, code, schema)


def test_every_operation_but_the_health_check_declares_what_it_refuses(
    openapi: dict[str, Any],
) -> None:
    for name, op in operations(openapi):
        codes = set(op["responses"])
        if name == "GET /api/v1/health":
            continue
        assert "401" in codes, name
        if op.get("parameters") or op.get("requestBody"):
            assert "422" in codes, name
        if op.get("requestBody"):
            assert {"400", "413"} <= codes, name


def test_the_manifest_bodies_take_yaml_and_json(openapi: dict[str, Any]) -> None:
    for path in ("/api/v1/workloads", "/api/v1/deployments"):
        content = openapi["paths"][path]["post"]["requestBody"]["content"]
        assert set(content) == {"application/yaml", "application/json"}


def test_the_answers_closed_sets_are_the_agents() -> None:
    assert get_args(schemas.Phase) == get_args(Phase)


def test_a_json_manifest_body_is_described_by_the_manifest_schema(openapi: dict[str, Any]) -> None:
    """POST /workloads takes the same JSON Schema as `gpufrac schema` prints, with every reference
    resolvable inside /openapi.json."""
    from gpufrac.model.schema import manifest_json_schema

    body = openapi["paths"]["/api/v1/workloads"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == body["application/yaml"]["schema"]
    manifest = resolved(openapi, body["application/json"]["schema"])
    # one document, as one of its kinds: typed models, told apart by kind (clients generate a
    # union of them), each of them the JSON Schema's own
    kinds = manifest["discriminator"]["mapping"]
    assert manifest["oneOf"] == [{"$ref": ref} for ref in kinds.values()]
    for kind, ref in kinds.items():
        document = resolved(openapi, {"$ref": ref})
        assert document["properties"]["kind"] == {"const": kind, "type": "string"}
        assert set(document["required"]) >= {"apiVersion", "kind", "metadata", "spec"}
        assert document == moved(manifest_json_schema()["$defs"][ref.rsplit("/", 1)[1]])
    components = openapi["components"]["schemas"]
    for name in manifest_json_schema()["$defs"]:
        assert name in components
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            refs.extend(v for k, v in node.items() if k == "$ref")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(openapi)
    assert refs and all(r.rsplit("/", 1)[1] in components for r in refs)
    assert not [r for r in refs if r.startswith("#/$defs/")]


def moved(node: Any) -> Any:
    """A JSON Schema part with its references moved into OpenAPI's components."""
    if isinstance(node, dict):
        return {
            k: v.replace("#/$defs/", "#/components/schemas/") if k == "$ref" else moved(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [moved(v) for v in node]
    return node


def test_the_document_is_valid_openapi(openapi: dict[str, Any]) -> None:
    """openapi-spec-validator: the OpenAPI 3.1 schema, and every required property defined."""
    errors = [str(e) for e in OpenAPIV31SpecValidator(openapi).iter_errors()]
    assert not errors, errors[:5]


def test_a_405_allows_exactly_the_documented_methods(openapi: dict[str, Any], app: FastAPI) -> None:
    """Each path answers a method it does not take with 405 and an Allow header naming the
    methods /openapi.json lists for it (Starlette's own named one route's only: GET and POST of
    /api/v1/workloads are two routes)."""
    client = TestClient(app)
    answered = 0
    for path, item in openapi["paths"].items():
        url = re.sub(r"\{(\w+)\}", "x", path)
        documented = [m.upper() for m in ALL_METHODS if m in item]
        for method in ALL_METHODS:
            if method in item:
                continue
            r = client.request(method.upper(), url)
            assert r.status_code == 405, (method, path, r.status_code)
            assert r.headers["allow"].split(", ") == documented, (method, path)
            answered += 1
    assert answered > 100


def test_every_status_an_operation_answers_is_documented(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """What every call may meet before its handler (the guard: no token, a Content-Length that
    is not a number, a body over the bound) and bad query values, on every operation, answer
    only statuses its responses list."""
    data: Path = tmp_path_factory.mktemp("guarded")
    service = AgentService(Agent(data, open_simulated("h200:1:mig", data)))
    tokens = {"admin-token": Caller(None, admin=True), "search-token": Caller("search")}
    app = create_app(service, AgentDeployments(service, gateway_port=0), tokens=tokens, max_body=64)
    client = TestClient(app, raise_server_exceptions=False)
    admin = {"authorization": "Bearer admin-token"}
    calls: list[dict[str, Any]] = [
        {},
        {"headers": {"authorization": "Bearer nope"}},
        {"headers": {"authorization": "Bearer search-token"}},
        {"headers": {**admin, "content-length": "abc"}},
        {"headers": admin, "content": b"x" * 65},
        {"headers": admin, "params": {"limit": "x", "tail": "x", "since": "x", "after": "x"}},
    ]
    undocumented = []
    for name, op in operations(app.openapi()):
        method, path = name.split(" ", 1)
        url = re.sub(r"\{(\w+)\}", "x", path)
        for call in calls:
            code = client.request(method, url, **call).status_code
            if str(code) not in op["responses"]:
                undocumented.append((name, code))
    assert not undocumented


def test_bodies_the_schema_accepts_are_read_and_those_it_refuses_are_not(
    openapi: dict[str, Any], app: FastAPI
) -> None:
    """What schemathesis found: a YAML manifest body was any string (so '' was valid), a scale's
    replicas 479.0 (an integer to JSON Schema) was refused, a MIG layout's profile '' was valid."""
    components = openapi["components"]["schemas"]
    bundle = {"components": openapi["components"]}

    def valid(name: str, value: Any) -> bool:
        schema = {**bundle, "$ref": f"#/components/schemas/{name}"}
        return jsonschema.Draft202012Validator(schema).is_valid(value)

    body = openapi["paths"]["/api/v1/workloads"]["post"]["requestBody"]["content"]
    assert body["application/yaml"]["schema"] == {"$ref": "#/components/schemas/Manifest"}
    assert not valid("Manifest", "")
    assert valid("ScaleBody", {"replicas": 479.0}) and not valid("ScaleBody", {"replicas": 1.5})
    assert "MigInstanceBody" in components
    assert not valid("MigInstanceBody", {"profile": "", "start": 0})
    assert valid("MigInstanceBody", {"profile": "1g.18gb", "start": 0})
    client = TestClient(app)
    scale = "/api/v1/deployments/default/none/scale"
    assert client.post(scale, json={"replicas": 479.0}).status_code == 404  # read: no such one
    assert client.post(scale, json={"replicas": 1.5}).status_code == 422
