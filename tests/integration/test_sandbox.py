"""The workload sandbox: an agent running as root with API tokens runs each tenant's workloads as
the tenant's own unprivileged user, so a tenant's job cannot read the tokens, the store, or another
tenant's runs and logs, nor signal another tenant's processes. Workloads here are shell commands,
but for the last test: the agent's Python, in a directory closed to other users, run by a tenant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import gpufrac
from tests.conftest import kill_leftover_runs
from tests.integration.conftest import FLEET, TOKENS, RunningAgent, free_port, tokens_yaml

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tenant users need a root agent")


@pytest.fixture
def root_agent(tmp_path: Path) -> Iterator[RunningAgent]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "tokens.yaml").write_text(tokens_yaml())  # the default: workload_users: auto
    (data_dir / "tokens.yaml").chmod(0o600)  # tokens are the owner's alone
    port = free_port()
    running = RunningAgent(f"http://127.0.0.1:{port}", data_dir, port, None)  # type: ignore[arg-type]
    running.start()
    yield running
    running.proc.kill()
    running.proc.wait(timeout=10)
    kill_leftover_runs(data_dir)


def h(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[who]}"}


def shell(name: str, tenant: str, script: str, kind: str = "job") -> str:
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}, tenant: {tenant}}}\n"
        f"spec:\n  type: {kind}\n  command: [/bin/sh, -c, {script!r}]\n"
        "  resources: {gpu: {fraction: 0.1}}\n  sharing: timeslice\n  restart: never\n"
    )


def finished(agent: RunningAgent, tenant: str, name: str) -> dict[str, Any]:
    url = f"{agent.url}/api/v1/workloads/{tenant}/{name}"
    deadline = time.monotonic() + 30
    while True:
        w: dict[str, Any] = httpx.get(url, headers=h(tenant)).json()
        if w["phase"] in ("succeeded", "failed"):
            return w
        assert time.monotonic() < deadline, w
        time.sleep(0.1)


def test_a_tenants_workload_cannot_reach_the_agent_or_another_tenant(
    root_agent: RunningAgent,
) -> None:
    url = root_agent.url + "/api/v1"
    data = root_agent.data_dir
    victim = shell("victim", "research", "echo research-secret; sleep 60", "service")
    assert httpx.post(url + "/workloads", content=victim, headers=h("research")).status_code == 200
    deadline = time.monotonic() + 30
    while (
        httpx.get(url + "/workloads/research/victim", headers=h("research")).json()["phase"]
        != "running"
    ):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    victim_pid = int((next((data / "runs/research/victim").glob("g1-*")) / "child.json")
                     .read_text().split('"pid": ')[1].split(",")[0])  # fmt: skip
    attack = (
        f"id -u; id -G; cat {data}/tokens.yaml && echo READ-TOKENS; "
        f"cat {data}/state.db > /dev/null && echo READ-STORE; "
        f"ls {data}/runs/research && echo LISTED-RUNS; "
        f"cat {data}/runs/research/victim/*/output.log && echo READ-LOG; "
        f"kill -STOP {victim_pid} && echo SIGNALLED; "
        "echo HOME=$HOME; env | grep -c GPUFRAC_TOKEN || true; echo done"
    )
    job = shell("attack", "search", attack)
    assert httpx.post(url + "/workloads", content=job, headers=h("search")).status_code == 200
    assert finished(root_agent, "search", "attack")["phase"] == "succeeded"
    out = httpx.get(url + "/workloads/search/attack/logs", headers=h("search")).json()["lines"]
    text = "\n".join(out)
    uid = int(out[0])
    assert uid >= 200_000 and out[1].split() == [str(uid)]  # its own user, no other group
    for leak in ("READ-TOKENS", "READ-STORE", "LISTED-RUNS", "READ-LOG", "SIGNALLED"):
        assert leak not in text, text
    assert TOKENS["admin"] not in text and "research-secret" not in text
    assert "done" in text
    # the same tenant gets the same user again; another tenant another one
    again = shell("again", "search", "id -u")
    assert httpx.post(url + "/workloads", content=again, headers=h("search")).status_code == 200
    finished(root_agent, "search", "again")
    lines = httpx.get(url + "/workloads/search/again/logs", headers=h("search")).json()["lines"]
    assert int(lines[0]) == uid
    other = shell("who", "research", "id -u")
    assert httpx.post(url + "/workloads", content=other, headers=h("research")).status_code == 200
    finished(root_agent, "research", "who")
    lines = httpx.get(url + "/workloads/research/who/logs", headers=h("research")).json()["lines"]
    assert int(lines[0]) not in (0, uid)
    # spec.user only from the tenant's allowlist (none configured here)
    named = shell("named", "search", "id -u").replace("  restart:", "  user: root\n  restart:")
    r = httpx.post(url + "/workloads", content=named, headers=h("search"))
    assert r.status_code == 422 and "spec" in r.text and "user" in r.text


def test_tenants_run_the_agents_python_from_a_directory_closed_to_them(tmp_path: Path) -> None:
    """The README's set-up as root: the checkout, and so its .venv, under a directory only root may
    enter (and, on a machine like this one, the interpreter that venv was made from under /root,
    pyenv's). A tenant's workload still runs that venv's python with the project on its path (what
    a model: replica runs), and sees nothing else of the closed directory."""
    closed = tmp_path / "closed"
    closed.mkdir()
    os.chmod(closed, 0o700)
    venv = closed / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (closed / "src").symlink_to(Path(gpufrac.__file__).parents[1])  # the checkout's, as if here
    site = next((venv / "lib").glob("python3*/site-packages"))
    deps = sysconfig.get_paths()["purelib"]  # the test venv's: the project's dependencies
    (site / "gpufrac.pth").write_text(f"{closed / 'src'}\n{deps}\n")
    secret = closed / "operator-notes"
    secret.write_text("operator-secret")
    os.chmod(secret, 0o644)  # readable by all: only the closed directory guards it
    data = tmp_path / "data"
    data.mkdir()
    (data / "tokens.yaml").write_text(tokens_yaml())
    (data / "tokens.yaml").chmod(0o600)  # tokens are the owner's alone
    port = free_port()
    gw = ("--gateway-port", str(free_port()))
    env = {
        **os.environ,
        "GPUFRAC_SIMULATE": FLEET,
        "GPUFRAC_DATA_DIR": str(data),
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', os.defpath)}",  # as make demo runs it
    }
    out = tmp_path / "agent.out"
    with open(out, "wb") as stdout, open(tmp_path / "agent.log", "wb") as stderr:
        proc = subprocess.Popen(
            [venv / "bin" / "python", "-m", "gpufrac.cli", "agent", "--port", str(port), *gw],
            env=env,
            cwd=tmp_path,
            stdout=stdout,
            stderr=stderr,
        )
    agent = RunningAgent(f"http://127.0.0.1:{port}", data, port, proc)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(agent.url + "/api/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (
                tmp_path / "agent.log"
            ).read_text()
            time.sleep(0.1)
        code = (
            "import os, sys, gpufrac.serving.replica\n"
            "print('prefix', sys.prefix, os.getuid())\n"
            f"try:\n    print(open({str(secret)!r}).read())\n"
            "except OSError as e:\n    print('hidden', type(e).__name__)\n"
        )
        manifest = {
            "apiVersion": "gpufrac/v1",
            "kind": "Workload",
            "metadata": {"name": "py", "tenant": "search"},
            "spec": {
                "type": "job",
                "command": ["python", "-c", code],
                "resources": {"gpu": {"fraction": 0.1}},
                "sharing": "timeslice",
                "restart": "never",
            },
        }
        url = agent.url + "/api/v1"
        r = httpx.post(url + "/workloads", content=json.dumps(manifest), headers=h("search"))
        assert r.status_code == 200, r.text
        w = finished(agent, "search", "py")
        lines = httpx.get(url + "/workloads/search/py/logs", headers=h("search")).json()["lines"]
        assert w["phase"] == "succeeded", (w, lines)
        prefix = next(line for line in lines if line.startswith("prefix "))
        assert prefix.split()[1] == str(venv) and int(prefix.split()[2]) >= 200_000
        assert "operator-secret" not in "\n".join(lines) and "hidden FileNotFoundError" in lines
        assert "read-only view" in out.read_text()  # the agent says how, at start
    finally:
        proc.kill()
        proc.wait(timeout=10)
        kill_leftover_runs(data)
