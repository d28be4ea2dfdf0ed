"""The control API describes its bodies and answers: every operation with a body has a schema for
each content type it takes, every JSON answer (and every error answer) a schema that says what is
in it, and the answers' closed sets match the agent's. Read from the app itself, no server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from fastapi import FastAPI

from gpufrac.api import schemas
from gpufrac.api.app import create_app
from gpufrac.devices import open_simulated
from gpufrac.runtime.agent import Agent, Phase
from gpufrac.runtime.service import AgentService
from gpufrac.serving.agent_deployments import AgentDeployments

METHODS = ("get", "put", "post", "delete", "patch")


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data: Path = tmp_path_factory.mktemp("agent")
    service = AgentService(Agent(data, open_simulated("h200:1", data)))
    app: FastAPI = create_app(service, AgentDeployments(service, gateway_port=0))
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
    manifest = resolved(openapi, body["application/json"]["schema"])
    assert manifest["required"] == manifest_json_schema()["required"] == ["apiVersion", "kind"]
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
