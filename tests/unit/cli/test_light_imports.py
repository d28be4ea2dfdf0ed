"""A command imports what it uses, not what the others do: ``gpufrac --help``, ``get workloads``
and ``delete`` (run in loops) start without the agent's server side (FastAPI, uvicorn, the API's
models, the runtime), a YAML parser or Rich's live display; ``validate`` without httpx or the
server. Asserted on the modules each one had loaded when it exited, in its own process (not on
time: bench/cli.py measures that). The agent here is a stub over HTTP with canned answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[3] / "examples" / "quickstart.yaml"
SERVER_SIDE = (
    "fastapi", "uvicorn", "starlette", "gpufrac.api", "gpufrac.runtime", "gpufrac.serving",
    "gpufrac.cluster", "gpufrac.planning",
)  # fmt: skip
LIVE = ("rich.live", "gpufrac.cli.top_view")
# httpx's own __init__ imports its command line tool (httpx._main: click, pygments, rich.progress
# and so rich.live): a command that calls the agent has those whatever it does; not gpufrac's view
CALLING_LIVE = ("gpufrac.cli.top_view",)
# what the stub answers: a real agent's answers (one workload on one simulated H200), still what the
# API's models describe (checked below)
RECORDED = json.loads((Path(__file__).parents[2] / "data" / "cli-answers.json").read_text())
ANSWERS = {
    "/api/v1/workloads": RECORDED["workloads"],
    "/api/v1/gpus": RECORDED["gpus"],
    "/api/v1/whoami": {"tenant": "search", "admin": False},
    "/api/v1/workloads/search/embed": {},
}
RUN = (
    "import atexit, json, sys\n"
    "say = lambda: print('MODULES ' + json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    "atexit.register(say)\n"
    "sys.argv = ['gpufrac', *sys.argv[1:]]\n"
    "from gpufrac.cli.app import main\n"
    "main()\n"
)


class Stub(BaseHTTPRequestHandler):
    def answer(self) -> None:
        body = json.dumps(ANSWERS.get(self.path.split("?")[0], {})).encode()
        self.send_response(200 if self.path.split("?")[0] in ANSWERS else 404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_DELETE = answer

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(scope="module")
def agent() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def loaded(*args: str, token: str | None = None) -> tuple[set[str], str]:
    """The modules ``gpufrac ARGS`` had loaded when it exited, and what it printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFRAC_")}
    if token is not None:
        env["GPUFRAC_TOKEN"] = token
    done = subprocess.run(
        [sys.executable, "-c", RUN, *args], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line.removeprefix("MODULES "))), done.stdout


def among(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


def test_the_recorded_answers_are_the_apis() -> None:
    from gpufrac.api.schemas import GpuList, WhoAmI, WorkloadList

    WorkloadList.model_validate(ANSWERS["/api/v1/workloads"])
    GpuList.model_validate(ANSWERS["/api/v1/gpus"])
    WhoAmI.model_validate(ANSWERS["/api/v1/whoami"])


def test_help_imports_no_server_side_no_http_client_no_models() -> None:
    modules, out = loaded("--help")
    assert "get" in out and "agent" in out
    heavy = (*SERVER_SIDE, *LIVE, "httpx", "pydantic", "yaml", "gpufrac.model.manifest")
    assert among(modules, heavy) == []


def test_get_workloads_imports_its_http_client_only(agent: str) -> None:
    modules, out = loaded("get", "workloads", "--server", agent)
    assert out.split("\n")[1].split()[:3] == ["search", "embed", "running"]
    assert "httpx" in modules  # it calls the agent
    # the API's models read an answer only when it cannot be printed (pydantic itself comes with
    # Typer, which converts each parameter with it)
    assert among(modules, (*SERVER_SIDE, *CALLING_LIVE, "yaml", "gpufrac.model.manifest")) == []


def test_delete_with_a_tenants_token_imports_no_models(agent: str) -> None:
    modules, out = loaded("delete", "embed", "--server", agent, token="a-token")
    assert "search/embed deleted" in out  # the token's tenant, as the agent said
    assert among(modules, (*SERVER_SIDE, *CALLING_LIVE, "yaml", "gpufrac.model.manifest")) == []


def test_validate_imports_the_manifest_models_but_no_http_client() -> None:
    modules, out = loaded("validate", str(EXAMPLE))
    assert "valid" in out and "gpufrac.model.manifest" in modules
    assert among(modules, (*SERVER_SIDE, *LIVE, "httpx")) == []
