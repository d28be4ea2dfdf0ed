"""schemathesis against a throwaway agent's /openapi.json, without and with API tokens: every
operation gets generated requests (about 10 examples each, in a hard time limit), and not one may be
answered with a server error, a status code the operation does not declare, or an answer (errors
included) whose content type or body does not match its declared schema."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import TOKENS, RunningAgent

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
    )
)


def fuzz(agent: RunningAgent, *headers: str) -> subprocess.CompletedProcess[str]:
    args = [
        str(SCHEMATHESIS), "run", agent.url + "/openapi.json",
        "--checks", CHECKS, "--max-examples", "10", "--seed", "1",
        "--request-timeout", "10", "--workers", "1", "--no-color",
    ]  # fmt: skip
    for h in headers:
        args += ["--header", h]
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
        check=False,
    )


def test_no_operation_answers_a_server_error_without_tokens(agent: RunningAgent) -> None:
    done = fuzz(agent)
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in done.stdout and "failed" not in done.stdout.split("Test cases:")[-1]


def test_no_operation_answers_a_server_error_with_a_tenants_token(
    tenant_agent: RunningAgent,
) -> None:
    done = fuzz(tenant_agent, f"Authorization: Bearer {TOKENS['search']}")
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in done.stdout and "failed" not in done.stdout.split("Test cases:")[-1]
