"""Where things run, as the CLI shows it, against a real agent: tables that stay one line per row in
a pipe, ``-o json|yaml|name``, readable ``describe``, and watching across an agent restart."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import httpx
import yaml
from typer.testing import CliRunner

from gpufrac.cli.app import app
from tests.integration.conftest import RunningAgent
from tests.integration.test_agent_api import manifest

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(120)"]
LONG = "a-workload-with-a-name-long-enough-to-wrap-a-table-at-80-cols"


def env(agent: RunningAgent) -> dict[str, str]:
    return {**os.environ, "GPUFRAC_SERVER": agent.url, "COLUMNS": "80"}


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def cli(agent: RunningAgent | None, *args: str) -> Ran:
    """The CLI in this process (quicker than a new interpreter); its stdout is not a terminal."""
    server = agent.url if agent else "http://127.0.0.1:9"
    r = CliRunner().invoke(app, list(args), env={"GPUFRAC_SERVER": server, "COLUMNS": "80"})
    return Ran(r.exit_code, r.stdout, r.stderr)


def apply(agent: RunningAgent, text: str) -> None:
    r = httpx.post(agent.url + "/api/v1/workloads", content=text, timeout=10)
    assert r.status_code == 200, r.text


def wait_until(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def phases(agent: RunningAgent) -> dict[str, str]:
    ws = httpx.get(agent.url + "/api/v1/workloads", timeout=10).json()["workloads"]
    return {w["name"]: w["phase"] for w in ws}


def test_where_things_run_one_line_per_row_in_a_pipe_and_every_output_format(
    agent: RunningAgent,
) -> None:
    mig = manifest("onmig", SLEEP, gpu="{mig: 1g.18gb}").replace("  sharing: timeslice\n", "")
    whole = manifest("whole", SLEEP, gpu="{count: 1}").replace("  sharing: timeslice\n", "")
    waits = manifest(LONG, SLEEP, gpu="{count: 2}").replace("  sharing: timeslice\n", "")
    done = manifest("done", [PY, "-c", "pass"], kind="job")
    apply(agent, mig + "---\n" + whole + "---\n" + done)
    apply(agent, waits)  # 2 whole GPUs while one of the 2 is taken: it waits, with a long reason
    wait_until(
        "placements",
        lambda: (
            phases(agent)
            == {"onmig": "running", "whole": "running", LONG: "pending", "done": "succeeded"}
        ),
    )
    gpus = httpx.get(agent.url + "/api/v1/gpus", timeout=10).json()["gpus"]
    by_name = {a["name"]: (g, a) for g in gpus for a in g["allocations"]}
    mig_gpu, onmig = by_name["onmig"]
    reason = next(
        w["reason"]
        for w in httpx.get(agent.url + "/api/v1/workloads").json()["workloads"]
        if w["name"] == LONG
    )
    assert len(reason) > 30

    # piped through grep, the waiting workload's row is whole: its name, phase and full reason
    piped = subprocess.run(
        f"{PY} -m gpufrac.cli get workloads | grep {LONG}",
        shell=True,
        capture_output=True,
        text=True,
        env=env(agent),
        timeout=60,
    )
    assert piped.returncode == 0, piped.stderr
    (row,) = piped.stdout.splitlines()
    assert row.split()[:4] == ["default", LONG, "pending", "0"] and row.endswith(reason)
    table = cli(agent, "get", "workloads").stdout.splitlines()
    assert table[0].split() == [
        "TENANT",
        "NAME",
        "PHASE",
        "RESTARTS",
        "NODE",
        "GPU",
        "SLICE",
        "REASON",
    ]
    rows = {line.split()[1]: line.split() for line in table[1:]}
    slice_ = f"{onmig['mig']['profile']}@{onmig['mig']['start']}"
    assert rows["onmig"][4:7] == [mig_gpu["node"], str(mig_gpu["index"]), slice_]
    assert rows["whole"][6] == "whole" and rows["whole"][5].isdigit()
    assert rows["done"][2] == "succeeded" and rows["done"][5].isdigit()  # where it ran, kept
    assert all("GPU-" not in line for line in table)  # indexes, not UUIDs
    wide = cli(agent, "get", "workloads", "-o", "wide").stdout
    assert mig_gpu["uuid"] in wide and "PRIORITY" in wide

    # -o json is the API's answer; --json the same; yaml the same data; name what commands take
    api = httpx.get(agent.url + "/api/v1/workloads", timeout=10).json()
    assert json.loads(cli(agent, "get", "workloads", "-o", "json").stdout) == api
    assert json.loads(cli(agent, "get", "workloads", "--json").stdout) == api
    assert yaml.safe_load(cli(agent, "get", "workloads", "-o", "yaml").stdout) == api
    assert cli(agent, "get", "workloads", "-o", "name").stdout.split() == [
        f"default/{w['name']}" for w in api["workloads"]
    ]
    bad = cli(agent, "get", "workloads", "-o", "xml")
    assert bad.returncode == 2 and "-o 'xml'" in bad.stderr and "Traceback" not in bad.stderr

    # GPUs: a row per GPU and per MIG instance, with the workload, reserved and size; cordons
    assert cli(agent, "cordon", str(mig_gpu["index"])).returncode == 0
    shown = cli(agent, "get", "gpus").stdout.splitlines()
    gpu_row = next(line for line in shown if line.split()[:2] == [str(mig_gpu["index"]), "(MIG)"])
    assert "cordoned: cordoned by hand" in gpu_row
    inst = next(line for line in shown if "default/onmig" in line).split()
    assert inst[:4] == [str(mig_gpu["index"]), slice_, "default/onmig", "running"]
    gib = f"{onmig['memory_mib'] / 1024:.1f}".removesuffix(".0") + "GiB"
    assert inst[5] == gib  # reserved
    assert any("default/whole" in line and " exclusive " in line for line in shown)
    gpus_json = json.loads(cli(agent, "get", "gpus", "-o", "json").stdout)
    assert [g["uuid"] for g in gpus_json["gpus"]] == [g["uuid"] for g in gpus]
    assert "allocations" in gpus_json["gpus"][0]

    # events: a table of the tenant's; a format events cannot give is bad input
    shown_events = cli(agent, "events", "-t", "default").stdout.splitlines()
    assert shown_events[0].split() == ["TIME", "KIND", "SUBJECT", "MESSAGE"]
    assert any("default/onmig" in line and "started" in line for line in shown_events[1:])
    bad = cli(agent, "events", "-o", "name")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr

    # describe: sections, not JSON; a finished job says where it ran
    described = cli(agent, "describe", "workload", "done").stdout
    assert "Placement (finished; where it ran):" in described
    assert "Phase:       succeeded" in described and '{"' not in described
    running = cli(agent, "describe", "workload", "onmig").stdout
    assert f"MIG instance: {onmig['mig']['profile']} at start {onmig['mig']['start']}" in running
    assert "QoS:" in running and "Events:" in running and "CUDA_VISIBLE_DEVICES=" in running


class Lines:
    """A subprocess's output lines, read by a thread, taken with a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self.q: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.q.put(line.rstrip("\n"))

    def drain(self) -> list[str]:
        """Every line seen, with those not taken yet (once the process has ended)."""
        time.sleep(0.2)
        while not self.q.empty():
            self.seen.append(self.q.get())
        return self.seen

    def until(self, check: Callable[[str], bool], timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if check(line):
                return line
        raise AssertionError(f"no such line within {timeout}s; saw {self.seen}")


def watching(agent: RunningAgent, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PY, "-m", "gpufrac.cli", *args, "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(agent),
    )


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    try:
        return proc.wait(timeout=15)
    finally:
        proc.kill()


def test_get_and_events_watch_keep_going_across_an_agent_restart(agent: RunningAgent) -> None:
    apply(agent, manifest("first", SLEEP))
    proc = watching(agent, "get", "workloads", "-w")
    events = watching(agent, "events", "-w", "-o", "json")
    try:
        out, err = Lines(proc.stdout), Lines(proc.stderr)  # type: ignore[arg-type]
        seen = Lines(events.stdout)  # type: ignore[arg-type]
        out.until(lambda line: line.startswith("default") and " first " in line)
        seen.until(lambda line: json.loads(line)["subject"] == "default/first")
        agent.kill9()
        err.until(lambda line: "does not answer" in line)
        agent.start()
        apply(agent, manifest("second", SLEEP))
        out.until(lambda line: " second " in line and "running" in line)
        err.until(lambda line: "answers again" in line)
        seen.until(lambda line: json.loads(line)["kind"] == "started" and "second" in line)
        assert stop(proc) == 0 and stop(events) == 0
    finally:
        proc.kill()
        events.kill()
    shown: list[dict[str, Any]] = [json.loads(x) for x in seen.drain() if x]
    ids = [e["id"] for e in shown]
    assert ids == sorted(set(ids))  # each event once, in order, across the restart
    assert {e["subject"] for e in shown} >= {"default/first", "default/second"}


def test_get_without_an_agent_is_exit_2() -> None:
    r = cli(None, "get", "workloads")
    assert r.returncode == 2 and "cannot reach the agent" in r.stderr
