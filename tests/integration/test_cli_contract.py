"""The CLI a script can trust, against a real agent: exit codes, every input problem at once,
tenants in names, and warnings about units that were probably not meant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.integration.conftest import RunningAgent
from tests.integration.test_agent_api import manifest

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(60)"]


def cli(agent: RunningAgent, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUFRAC_SERVER": agent.url, "COLUMNS": "200"}
    return subprocess.run(
        [PY, "-m", "gpufrac.cli", *args], capture_output=True, text=True, env=env, timeout=60
    )


def names(agent: RunningAgent) -> set[str]:
    ws = httpx.get(agent.url + "/api/v1/workloads", timeout=10).json()["workloads"]
    return {f"{w['tenant']}/{w['name']}" for w in ws}


def test_a_refusal_exits_1_and_the_valid_documents_are_applied(
    agent: RunningAgent, tmp_path: Path
) -> None:
    f = tmp_path / "two.yaml"
    f.write_text(manifest("ok", SLEEP) + "---\n" + manifest("huge", SLEEP, gpu="{count: 64}"))
    r = cli(agent, "apply", "-f", str(f))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "default/ok created" in r.stdout and "default/huge refused" in r.stdout
    assert (
        "64 whole GPUs" in r.stdout
        and "1 of 2 documents refused; the other 1 was applied" in r.stderr
    )
    assert names(agent) == {"default/ok"}
    again = cli(agent, "apply", "-f", str(f), "--json")
    assert again.returncode == 1 and '"refused"' in again.stdout


def test_every_input_error_is_exit_2_with_all_problems_and_no_traceback(
    agent: RunningAgent, tmp_path: Path
) -> None:
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(manifest("x", SLEEP).encode().replace(b"x,", b"caf\xe9,"))
    r = cli(agent, "apply", "-f", str(latin))
    assert r.returncode == 2 and "not UTF-8" in r.stderr and "Traceback" not in r.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: gpufrac/v1\nkind: [unclosed\n")
    r = cli(agent, "apply", "-f", str(broken))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(
        manifest("w", SLEEP)
        .replace("type: service", "type: servise")
        .replace("restart: always", "restart: sometimes")
        + "  weight: 0\n"
    )
    good = tmp_path / "good.yaml"
    good.write_text(manifest("g", SLEEP))
    r = cli(agent, "apply", "-f", str(good), "-f", str(wrong))
    assert r.returncode == 2, r.stdout + r.stderr
    for field in ("spec.type", "spec.restart", "spec.weight"):
        assert field in r.stderr, r.stderr
    assert names(agent) == set()  # the good file was not applied either: all or nothing


def test_tenant_slash_name_works_everywhere_and_not_found_says_where(
    agent: RunningAgent, tmp_path: Path
) -> None:
    f = tmp_path / "ml.yaml"
    f.write_text(manifest("tiny", SLEEP, tenant="ml") + "---\n" + manifest("web", SLEEP))
    assert cli(agent, "apply", "-f", str(f)).returncode == 0
    r = cli(agent, "describe", "workload", "ml/tiny")
    assert r.returncode == 0 and "ml/tiny" in r.stdout
    missing = cli(agent, "describe", "workload", "tiny")
    assert missing.returncode == 1 and "did you mean ml/tiny" in missing.stderr
    listed = cli(agent, "get", "workloads", "-t", "ml", "--json")
    assert [w["name"] for w in json.loads(listed.stdout)["workloads"]] == ["tiny"]
    clash = cli(agent, "delete", "ml/tiny", "-t", "other")
    assert clash.returncode == 2 and "names tenant 'ml'" in clash.stderr
    assert cli(agent, "delete", "ml/tiny").returncode == 0
    assert names(agent) == {"default/web"}


def test_units_that_were_probably_not_meant_are_warned_about(
    agent: RunningAgent, tmp_path: Path
) -> None:
    f = tmp_path / "units.yaml"
    f.write_text(
        manifest("dec", SLEEP, gpu="{memory: 18GB}").replace("  sharing: timeslice\n", "")
        + "---\n"
        + manifest("cap", SLEEP, gpu="{memory: 4GiB, compute: 20%}").replace(
            "sharing: timeslice", "sharing: MPS"
        )
        + "---\n"
        + manifest("k8s", SLEEP, gpu="{memory: 12G}")
    )
    r = cli(agent, "apply", "-f", str(f))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "18GB is decimal" in r.stderr and "write 18G (" in r.stderr
    # 12G is decimal now, as in Kubernetes: said on every use, naming the field
    changed = "doc[3].spec.resources.gpu.memory: 12G is decimal now"
    assert changed in r.stderr and "write 12Gi" in r.stderr, r.stderr
    k8s = httpx.get(agent.url + "/api/v1/workloads/default/k8s", timeout=10).json()
    assert k8s["spec"]["gpu"]["memory_mib"] == 11445
    checked = cli(agent, "validate", str(f))
    assert checked.returncode == 0 and changed in checked.stderr, checked.stderr
    assert "1g.35gb" in r.stderr  # 17,167 MiB does not fit a 1g.18gb: twice the slice
    cap = httpx.get(agent.url + "/api/v1/workloads/default/cap", timeout=10).json()
    assert cap["spec"]["sharing"] == "mps"  # a choice in any case
