"""What a ``gpufrac`` command costs before it does its work: start-up time of the CLI.

Times, as their own processes (wall clock, and CPU time: user + system), ``gpufrac --help``,
``gpufrac get workloads`` against a running agent (its own process, simulated GPUs, 8 workloads) and
``gpufrac validate`` on one file. Baselines from the same run: ``python -c pass`` (the interpreter's
start), the same interpreter importing Typer and httpx (the frameworks a calling command cannot do
without), the same two GETs ``get workloads`` makes, done with the standard library (what the
agent's answers cost), and a bare Typer command of ``get``'s parameters making them with httpx (the
floor of a Typer command that calls: Typer converts each parameter with pydantic). Target:
``get workloads`` within 0.25 s of ``python -c pass`` (median). Then where the import time of
``get workloads`` goes (``python -X importtime``, the largest top-level imports).

Byte-code is cached as a user's installation has it (a first run of each writes it). Run:
.venv/bin/python bench/cli.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 0.25


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpufrac() -> list[str]:
    """The installed ``gpufrac`` script (what a user runs), else the module."""
    script = Path(sys.executable).parent / "gpufrac"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpufrac.cli"]


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``cmd``, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.decode()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def import_profile(cmd: list[str], env: dict[str, str], top: int = 8) -> list[tuple[str, float]]:
    """The largest top-level imports of one run (``-X importtime``): (module, ms)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpufrac.cli", *cmd],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].startswith(" ") and not parts[2].startswith("  "):
            with_children = parts[1].strip()
            if with_children.isdigit():
                rows.append((parts[2].strip(), int(with_children) / 1000))
    return sorted(rows, key=lambda r: -r[1])[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpufrac-cli-bench-"))
    data = tmp / "data"
    data.mkdir()
    (data / "gpufrac.yaml").write_text("workload_users: agent\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update({"GPUFRAC_SIMULATE": "h200:2", "GPUFRAC_DATA_DIR": str(data)})
    env.pop("GPUFRAC_TOKEN", None)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    manifest = tmp / "workloads.yaml"
    manifest.write_text(
        "---\n".join(
            "apiVersion: gpufrac/v1\nkind: Workload\n"
            f"metadata: {{name: w{i}, tenant: t{i % 2}}}\n"
            "spec:\n  type: service\n  command: [sleep, '3600']\n"
            "  resources: {gpu: {fraction: 0.1}}\n  sharing: timeslice\n"
            for i in range(8)
        )
    )
    with open(tmp / "agent.log", "wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpufrac.cli", "agent", "--port", str(port),
             "--gateway-port", str(free_port())],
            env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=REPO,
        )  # fmt: skip
    get_both = (
        "import urllib.request as u\n"
        f"for p in ('workloads', 'gpus'): u.urlopen('{url}/api/v1/' + p).read()\n"
    )
    # the floor of a Typer command: get's parameters, the same two calls with httpx, one line out
    bare_typer = (
        "from typing import Annotated, Optional\nimport typer\napp = typer.Typer()\n"
        "@app.command()\n"
        "def get(what: str, tenant: Annotated[Optional[str], typer.Option()] = None,\n"
        "        output: Annotated[Optional[str], typer.Option()] = None,\n"
        "        watch: Annotated[bool, typer.Option()] = False,\n"
        "        interval: Annotated[float, typer.Option()] = 1.0,\n"
        "        server: Annotated[Optional[str], typer.Option()] = None,\n"
        "        json: Annotated[bool, typer.Option()] = False) -> None:\n"
        "    import httpx\n"
        "    with httpx.Client() as c:\n"
        "        n = [len(c.get(f'{server}/api/v1/{p}').json()[p]) for p in ('workloads',"
        " 'gpus')]\n"
        "    print(n)\n"
        "@app.command()\ndef other() -> None: pass\n"
        "app()\n"
    )
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python: import typer, httpx": [sys.executable, "-c", "import typer, httpx"],
        "python: the 2 GETs (urllib)": [sys.executable, "-c", get_both],
        "a bare Typer get (httpx)": [sys.executable, "-c", bare_typer, "get", "w", "--server", url],
        "gpufrac --help": [*gpufrac(), "--help"],
        "gpufrac get workloads": [*gpufrac(), "get", "workloads", "--server", url],
        "gpufrac validate (1 file)": [*gpufrac(), "validate", "examples/quickstart.yaml"],
    }
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/api/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        got = httpx.post(url + "/api/v1/workloads", content=manifest.read_text(), timeout=60)
        got.raise_for_status()
        for cmd in cases.values():  # warm: byte-code written, files in the page cache
            timed(cmd, env)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for _ in range(args.rounds):  # interleaved, so a busy moment costs every case alike
            for name, cmd in cases.items():
                runs[name].append(timed(cmd, env))
        profile = import_profile(["get", "workloads", "--server", url], env)
    finally:
        for i in range(8):  # stopped through the agent, then anything left by hand
            with contextlib.suppress(httpx.HTTPError):
                httpx.delete(f"{url}/api/v1/workloads/t{i % 2}/w{i}", timeout=30)
        agent.kill()
        agent.wait(timeout=10)
        from soak import stop_workloads  # what the workloads' shims started

        stop_workloads(data)
        shutil.rmtree(tmp, ignore_errors=True)

    def median(name: str, i: int) -> float:
        return statistics.median(r[i] for r in runs[name])

    def p95(name: str) -> float:
        walls = sorted(r[0] for r in runs[name])
        return walls[int(0.95 * (len(walls) - 1))]

    base = median("python -c pass", 0)
    print(
        f"cli: start-up of gpufrac commands, {args.rounds} rounds, {os.cpu_count()} CPU cores, "
        f"load average {os.getloadavg()[0]:.1f}; wall s median / p95, CPU s median, "
        "over python -c pass"
    )
    print("| command | wall | CPU | over python -c pass | target |")
    print("| --- | --- | --- | --- | --- |")
    for name in cases:
        over = median(name, 0) - base
        target = f"< {TARGET_S} s over" if name == "gpufrac get workloads" else ""
        print(
            f"| {name} | {median(name, 0):.3f} / {p95(name):.3f} | {median(name, 1):.3f} "
            f"| {over:+.3f} | {target} |"
        )
    print(
        "largest imports of get workloads (ms, with what they import): "
        + ", ".join(f"{m} {ms:.0f}" for m, ms in profile)
    )
    met = median("gpufrac get workloads", 0) - base < TARGET_S
    print("target:", "met" if met else "MISSED")


if __name__ == "__main__":
    main()
