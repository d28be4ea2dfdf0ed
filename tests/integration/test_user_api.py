"""ONE suite of the user API (``api.user_api``), run against one machine's agent and against a
cluster's control plane with one ``--local`` node, the same hardware on both (one simulated H200 in
MIG mode, node ``local-0`` labelled ``gpufrac.io/kind=mig``): the same ``/openapi.json``, the same
answers (``apply``'s diff and warnings, ``get``, logs, events, GPUs, cordons, nodes, health, whoami,
metrics, deployments, the dashboard), 501 for what one side lacks, and schemathesis on both with
response-schema conformance. Each side is started once for the module (real processes, real
HTTP); each test uses its own workload names."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from typer.testing import CliRunner

from gpufrac import __version__
from gpufrac.api import schemas
from gpufrac.cli.app import app
from tests.conftest import kill_leftover_runs
from tests.integration.conftest import TOKENS, free_port, tokens_yaml

PY = sys.executable
NODE = "local-0"  # what `gpufrac control --local 1` names its node; the agent is named so too
FLEET = "h200:1:mig"  # and what that node simulates
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
Side = Literal["agent", "control"]


@dataclass
class Server:
    side: Side
    url: str
    root: Path
    proc: subprocess.Popen[bytes]

    def call(self, method: str, path: str, token: str = "admin", **kw: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {TOKENS[token]}"}
        return httpx.request(method, self.url + path, headers=headers, timeout=10, **kw)

    def get(self, path: str, token: str = "admin", **kw: Any) -> Any:
        r = self.call("GET", path, token, **kw)
        assert r.status_code == 200, (self.side, path, r.text)
        return r.json()

    def apply(self, text: str) -> dict[str, Any]:
        r = self.call("POST", "/api/v1/workloads", content=text)
        assert r.status_code == 200, (self.side, r.text)
        results: list[dict[str, Any]] = r.json()["results"]
        return results[0]

    def cli(self, *args: str) -> tuple[int, str]:
        env = {"GPUFRAC_SERVER": self.url, "GPUFRAC_TOKEN": TOKENS["admin"], "COLUMNS": "200"}
        r = CliRunner().invoke(app, list(args), env=env)
        return r.exit_code, r.stdout + r.stderr


def wait(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (httpx.HTTPError, AssertionError, KeyError, IndexError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc: subprocess.Popen[bytes], data: Path) -> None:
    proc.send_signal(signal.SIGTERM)  # the control plane stops its local node with it
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    kill_leftover_runs(data)


def start_agent(root: Path) -> Server:
    data = root / "agent"
    data.mkdir()
    (data / "tokens.yaml").write_text(tokens_yaml())
    (data / "tokens.yaml").chmod(0o600)  # tokens are the owner's alone (else refused)
    (data / "gpufrac.yaml").write_text(
        f"workload_users: agent\nnode:\n  name: {NODE}\n  labels: {{gpufrac.io/kind: mig}}\n"
    )
    port = free_port()
    env = {**os.environ, "GPUFRAC_SIMULATE": FLEET, "GPUFRAC_DATA_DIR": str(data)}
    args = [PY, "-m", "gpufrac.cli", "agent", "--port", str(port)]
    args += ["--gateway-port", str(free_port())]
    with open(root / "agent.log", "ab") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=log)
    return Server("agent", f"http://127.0.0.1:{port}", data, proc)


def start_control(root: Path) -> Server:
    data = root / "control"
    data.mkdir()
    (data / "tokens.yaml").write_text(tokens_yaml())
    (data / "tokens.yaml").chmod(0o600)  # tokens are the owner's alone (else refused)
    port = free_port()
    args = [PY, "-m", "gpufrac.cli", "control", "--local", "1", "--port", str(port)]
    args += ["--gateway-port", str(free_port()), "--node-port", str(free_port())]
    args += ["--data-dir", str(data)]
    with open(root / "control.log", "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=log)
    return Server("control", f"http://127.0.0.1:{port}", data, proc)


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Side, Server]]:
    """Both sides, started together, each running ``search/hello`` (which prints a line) by the
    time the tests begin."""
    root = tmp_path_factory.mktemp("user-api")
    started: dict[Side, Server] = {}
    try:
        started["agent"] = start_agent(root)
        started["control"] = start_control(root)
        for s in started.values():  # the control plane: once its node has shown its GPU
            wait(f"the {s.side}", lambda s=s: len(s.get("/api/v1/gpus")["gpus"]) == 1)
            s.apply(manifest("hello", code=HELLO))
        for s in started.values():
            running(s, "hello")
        yield started
    finally:
        for s in started.values():
            stop(s.proc, s.root)


@pytest.fixture(scope="module")
def agent_side(sides: dict[Side, Server]) -> Server:
    return sides["agent"]


@pytest.fixture(scope="module")
def control_side(sides: dict[Side, Server]) -> Server:
    return sides["control"]


@pytest.fixture(params=["agent", "control"])
def server(request: pytest.FixtureRequest) -> Server:
    found: Server = request.getfixturevalue(f"{request.param}_side")
    return found


HELLO = "print('hello', flush=True); import time; time.sleep(300)"


def manifest(name: str, code: str = "import time; time.sleep(120)", gpu: str = "5Gi") -> str:
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}, tenant: search}}\n"
        f"spec:\n  type: service\n  command: [{PY}, -c, {code!r}]\n"
        f"  resources: {{gpu: {{memory: {gpu}}}}}\n"
    )


def running(server: Server, name: str) -> dict[str, Any]:
    wait(
        f"{name} running on {server.side}",
        lambda: server.get(f"/api/v1/workloads/search/{name}")["phase"] == "running",
    )
    found: dict[str, Any] = server.get(f"/api/v1/workloads/search/{name}")
    return found


def test_both_describe_the_same_api(agent_side: Server, control_side: Server) -> None:
    """The same paths, operations, parameters, bodies and answers (the node protocol is not part
    of it); what one side lacks is declared on both, as a 501 problem."""
    one, cluster = agent_side.get("/openapi.json"), control_side.get("/openapi.json")
    assert (one["info"]["title"], cluster["info"]["title"]) == (
        "gpufrac agent",
        "gpufrac control plane",
    )
    assert one["paths"] == cluster["paths"]
    assert one["components"] == cluster["components"]
    assert not [p for p in one["paths"] if not p.startswith(("/api/v1/", "/metrics"))]
    for path, method in (
        ("/api/v1/gpus/{gpu}/mig", "post"),
        ("/api/v1/gpus/{gpu}/mig/pin", "delete"),
        ("/api/v1/workloads/{tenant}/{name}/keepalive", "post"),
        ("/api/v1/deployments", "get"),
        ("/api/v1/nodes/{name}/{verdict}", "post"),
    ):
        answer = one["paths"][path][method]["responses"]["501"]
        assert set(answer["content"]) == {"application/problem+json"}


def test_apply_answers_alike_with_its_warnings_and_diff(server: Server) -> None:
    """Both answer with the spelling's warning and the MIG slice's, the decision, and on a change
    the diff."""
    first = server.apply(manifest("alike", gpu="5gib"))  # an earlier release's spelling
    assert (first["kind"], first["workload"], first["result"]) == (
        "Workload",
        "search/alike",
        "created",
    )
    assert first["decision"]["outcome"] == "placed" and first["decision"]["mig"], first
    assert first["diff"] == [] and first["displaced"] == []
    spelling, slice_ = first["warnings"]
    assert "5gib" in spelling and "5Gi" in spelling, spelling
    assert "takes a MIG 1g.18gb" in slice_, slice_
    schemas.ApplyAnswer.model_validate({"results": [first]})
    again = server.apply(manifest("alike", gpu="5gib"))
    assert again["result"] == "unchanged" and again["diff"] == []
    changed = server.apply(manifest("alike", code="import time; time.sleep(99)", gpu="5gib"))
    assert changed["result"] == "replaced", changed
    assert [line for line in changed["diff"] if line.startswith("command")], changed["diff"]
    assert server.call("DELETE", "/api/v1/workloads/search/alike").status_code == 200
    assert server.call("GET", "/api/v1/workloads/search/alike").status_code == 404
    assert server.call("DELETE", "/api/v1/workloads/search/alike").status_code == 404


def test_a_workload_is_read_alike_with_its_logs_events_and_node(server: Server) -> None:
    w = server.get("/api/v1/workloads/search/hello")
    schemas.WorkloadDetail.model_validate(w)
    assert w["node"] == NODE and w["placement"]["outcome"] == "placed", w
    (gpu,) = server.get("/api/v1/gpus")["gpus"]
    assert w["placement"]["gpus"] == [gpu["uuid"]] and gpu["node"] == NODE
    assert "applied" in [e["kind"] for e in w["events"]], w["events"]
    wait(
        "its output", lambda: "hello" in server.get("/api/v1/workloads/search/hello/logs")["lines"]
    )
    listed = server.get("/api/v1/workloads")["workloads"]
    assert [x["phase"] for x in listed if x["name"] == "hello"] == ["running"]
    seen = server.get("/api/v1/events", params={"tenant": "search"})["events"]
    assert {e["subject"] for e in seen} == {
        e["subject"] for e in seen if e["subject"].startswith("search/")
    }
    # a tenant sees its own; another's looks like it does not exist, on both
    assert server.call("GET", "/api/v1/workloads/search/hello", "search").status_code == 200
    assert server.call("GET", "/api/v1/workloads/search/hello", "research").status_code == 404
    code, shown = server.cli("get", "workloads")
    row = next(line for line in shown.splitlines() if " hello " in line)
    assert code == 0 and NODE in row.split() and "running" in row.split(), shown
    code, shown = server.cli("logs", "search/hello")
    assert code == 0 and "hello" in shown.splitlines(), shown


def test_nodes_are_listed_and_described_on_both(server: Server) -> None:
    """One machine's agent is its own node: the same answer as the cluster's one node."""
    (node,) = server.get("/api/v1/nodes")["nodes"]
    assert (node["name"], node["state"], node["gpus"]) == (NODE, "alive", 1), node
    assert node["labels"]["gpufrac.io/kind"] == "mig" and node["version"] == __version__
    assert (node["last_heartbeat_s"] is None) == (server.side == "agent")
    detail = server.get(f"/api/v1/nodes/{NODE}")
    schemas.NodeDetail.model_validate(detail)
    assert "search/hello" in detail["workloads"], detail
    assert server.get(f"/api/v1/nodes/{NODE}", "research")["workloads"] == []  # not its own
    assert server.call("GET", "/api/v1/nodes/nowhere").status_code == 404
    code, shown = server.cli("get", "nodes")
    assert code == 0 and shown.split("\n")[0].split()[:3] == ["NAME", "STATE", "GPUS"], shown
    assert shown.splitlines()[1].split()[:3] == [NODE, "alive", "1"], shown
    code, shown = server.cli("get", "nodes", "-o", "json")
    assert code == 0 and '"name": "local-0"' in shown, shown
    code, shown = server.cli("describe", "node", NODE)
    assert code == 0 and "State:       alive" in shown and "search/hello" in shown, shown
    assert "NVIDIA H200" in shown, shown  # its GPU
    code, shown = server.cli("describe", "node", NODE, "-o", "json")
    assert code == 0 and '"workloads"' in shown
    code, shown = server.cli("describe", "node", "nowhere")
    assert code == 1 and "no node nowhere" in shown and NODE in shown, shown


def test_a_gpu_is_cordoned_by_node_and_index_on_both(server: Server) -> None:
    (gpu,) = server.get("/api/v1/gpus")["gpus"]
    assert server.call("POST", f"/api/v1/gpus/{NODE}/0/cordon", "search").status_code == 403
    assert server.call("POST", "/api/v1/gpus/elsewhere/0/cordon").status_code == 404
    r = server.call("POST", f"/api/v1/gpus/{NODE}/0/cordon")
    assert r.status_code == 200 and r.json() == {"cordoned": gpu["uuid"]}, r.text
    assert server.get("/api/v1/gpus")["gpus"][0]["cordoned"] == "cordoned by hand"
    r = server.call("POST", f"/api/v1/gpus/{NODE}/0/uncordon")
    assert r.status_code == 200 and r.json()["uncordoned"] == gpu["uuid"], r.text
    wait("uncordoned", lambda: server.get("/api/v1/gpus")["gpus"][0]["cordoned"] is None)


def test_manifests_over_the_bounds_are_refused_alike_and_one_within_is_read(
    server: Server,
) -> None:
    """Bounded before parsing, on both sides (the operator's max_manifest_nodes: 20,000 values;
    api_max_body and max_manifest_bytes: 1 MiB): a 600 KB flow list is 413 naming the setting,
    a byte over 1 MiB is 413; a manifest of exactly 1 MiB with few values is applied."""
    flow = "a: [" + ",".join(["1"] * 300_000) + "]\n"
    r = server.call("POST", "/api/v1/workloads", "search", content=flow)
    assert r.status_code == 413, (server.side, r.text)
    assert "max_manifest_nodes" in r.json()["detail"] and "20,000" in r.json()["detail"]
    text = manifest("onemib")
    padded = text + "#" * ((1 << 20) - len(text.encode()) - 1) + "\n"
    assert len(padded.encode()) == 1 << 20
    r = server.call("POST", "/api/v1/workloads", "search", content=padded + "#")
    assert r.status_code == 413, (server.side, r.text)
    r = server.call("POST", "/api/v1/workloads", "search", content=padded)
    assert r.status_code == 200, (server.side, r.text)
    assert r.json()["results"][0]["workload"] == "search/onemib"
    assert server.call("DELETE", "/api/v1/workloads/search/onemib").status_code == 200


def test_what_a_side_lacks_answers_501_and_the_rest_alike(server: Server) -> None:
    lacking = (
        [
            ("POST", "/api/v1/workloads/search/x/keepalive", "ray-leases"),
            ("POST", f"/api/v1/nodes/{NODE}/approve", "node-admission"),
        ]
        if server.side == "agent"
        else [
            ("POST", f"/api/v1/gpus/{NODE}/0/mig", "mig-layouts"),
            ("DELETE", f"/api/v1/gpus/{NODE}/0/mig/pin", "mig-layouts"),
        ]
    )
    for method, path, capability in lacking:
        r = server.call(method, path, json={})
        assert r.status_code == 501 and r.headers["content-type"] == "application/problem+json"
        assert r.json()["capability"] == capability and r.json()["status"] == 501, r.text
    health = server.get("/api/v1/health")
    role = {"agent": "agent", "control": "control-plane"}[server.side]
    assert (health["role"], health["nodes"], health["nodes_alive"]) == (role, 1, 1), health
    assert server.get("/api/v1/whoami", "search") == {"tenant": "search", "admin": False}
    assert server.call("GET", "/metrics").status_code == 200
    assert server.call("GET", "/metrics", "search").status_code == 403
    assert server.get("/api/v1/deployments") == {"deployments": []}
    assert set(server.get("/api/v1/history")) >= {"times", "gpus", "workloads", "deployments"}
    assert httpx.get(server.url + "/ui", timeout=5).status_code == 200


def fuzz(server: Server, token: str, phases: str) -> subprocess.Popen[str]:
    """schemathesis: a few examples per operation; no answer may be a server error (a 501 of what
    this side lacks is no error), nor a status, content type or body its schema does not say."""
    config = server.root.parent / "schemathesis.toml"
    config.write_text(
        '[checks.not_a_server_error]\nexpected-statuses = ["2xx", "3xx", "4xx", "501"]\n'
    )
    args = [
        str(SCHEMATHESIS), "--config-file", str(config), "run", server.url + "/openapi.json",
        "--checks", CHECKS, "--max-examples", "4", "--seed", "1", "--phases", phases,
        "--request-timeout", "10", "--workers", "1", "--no-color",
        "--header", f"Authorization: Bearer {TOKENS[token]}",
    ]  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": ""}
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


# the admin reaches every handler: its edge cases too (the coverage phase); a tenant's token the
# refusals of what is not its own, with a few generated examples per operation
@pytest.mark.parametrize(
    ("token", "phases"), [("admin", "examples,coverage,fuzzing"), ("search", "examples,fuzzing")]
)
def test_no_operation_answers_outside_its_schema(
    agent_side: Server, control_side: Server, token: str, phases: str
) -> None:
    """Both sides at once. Last in the module: what it generates (a cordon, a workload) is not
    undone."""
    runs = [(s.side, fuzz(s, token, phases)) for s in (agent_side, control_side)]
    for side, run in runs:
        said, _ = run.communicate(timeout=120)
        assert run.returncode == 0, (side, said[-12000:])
        assert " passed" in said and "failed" not in said.split("Test cases:")[-1], (side, said)
