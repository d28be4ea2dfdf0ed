"""Agent benchmark: durable operations through the API, reconcile time, re-attachment after a
restart.

1. Applies and deletes through the real HTTP API (the agent as its own process, uvicorn, SQLite
   commits), against a bare SQLite insert-and-commit loop in the same run (the floor for a durable
   write).
2. One reconcile pass over 200 running workloads (real processes under shims).
3. A new agent over the same data directory (as after a crash) until all 100 running workloads are
   re-attached.

Simulated GPUs; everything else is real. Run: .venv/bin/python bench/agent.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gpufrac.devices import open_simulated
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.shim import read_status


def doc(i: int) -> str:
    # on an all-MIG fleet of one GPU, one 7g instance exists: the first is placed, the rest wait
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: w{i}}}\nspec:\n"
        "  type: service\n  command: [sleep, '600']\n  resources: {gpu: {mig: 7g.141gb}}\n"
    )


def bare_sqlite(n: int, path: Path) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)")
    t = time.perf_counter()
    for i in range(n):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t VALUES (?, ?)", (f"k{i}", "x" * 300))
        db.execute("COMMIT")
    return n / (time.perf_counter() - t)


def api_ops(n: int, data_dir: Path) -> tuple[float, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GPUFRAC_SIMULATE": "h200:1:mig", "GPUFRAC_DATA_DIR": str(data_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufrac.cli", "agent", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=30) as client:
            for _ in range(300):
                try:
                    client.get(url + "/api/v1/health")
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            t = time.perf_counter()
            for i in range(n):
                r = client.post(url + "/api/v1/workloads", content=doc(i))
                assert r.status_code == 200, r.text
            applies = n / (time.perf_counter() - t)
            t = time.perf_counter()
            for i in reversed(
                range(n)
            ):  # the waiting ones first: no process is stopped and restarted
                assert client.delete(url + f"/api/v1/workloads/default/w{i}").status_code == 200
            deletes = n / (time.perf_counter() - t)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    return applies, deletes


def running(n: int, data_dir: Path) -> tuple[Agent, float]:
    dev = open_simulated(f"h200:{max(1, n // 20)}", data_dir)
    agent = Agent(data_dir, dev)
    for i in range(n):
        agent.apply_workload(
            WorkloadSpec(
                name=f"s{i}",
                gpu=GpuRequest(memory_mib=1024),
                command=("sleep", "600"),
                type="service",
                restart="always",
                sharing="timeslice",
            )
        )
    agent.reconcile()  # starts them all
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        states = agent.reconcile()
        if all(s.phase == "running" for s in states):
            break
        time.sleep(0.2)
    t = time.perf_counter()
    states = agent.reconcile()
    return agent, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n_ops, n_run, n_attach = (100, 40, 20) if args.quick else (500, 200, 100)
    root = Path(tempfile.mkdtemp(prefix="gpufrac-bench-"))
    floor = bare_sqlite(2000, root / "bare.db")
    applies, deletes = api_ops(n_ops, root / "api")
    agent, reconcile_s = running(n_run, root / "run")
    runs = sorted((root / "run" / "runs").glob("*/*/*"))
    try:
        # a restart: a fresh agent over the same data (the shims keep running), until all are
        # re-attached
        keep = [f"s{i}" for i in range(n_attach)]
        for i in range(n_attach, n_run):
            agent.delete("default", f"s{i}")
        agent.close()
        t = time.perf_counter()
        again = Agent(root / "run", open_simulated(f"h200:{max(1, n_run // 20)}", root / "run"))
        states = {s.key: s for s in again.reconcile()}
        reattach_s = time.perf_counter() - t
        ok = all(
            states[f"default/{k}"].phase == "running" and states[f"default/{k}"].attempts == 1
            for k in keep
        )
        for k in keep:
            again.delete("default", k)
    finally:
        for run in runs:
            status = read_status(run)
            if status.child_pid and not status.done:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(status.child_pid, signal.SIGKILL)
    print(
        "## Agent: durable operations, reconcile, re-attachment (simulated GPUs, real processes)\n"
    )
    print("| measure | value | target |")
    print("|---|---|---|")
    print(f"| bare SQLite insert+commit loop (the floor) | {floor:,.0f} ops/s | |")
    print(f"| apply through the API ({n_ops} workloads) | {applies:,.0f} ops/s | >= 200 |")
    print(f"| delete through the API | {deletes:,.0f} ops/s | |")
    print(
        f"| one reconcile pass over {n_run} running workloads | {reconcile_s * 1000:,.0f} "
        "ms | < 1,000 ms |"
    )
    print(
        f"| new agent until {n_attach} running workloads re-attached | "
        f"{reattach_s * 1000:,.0f} ms "
        f"({'all re-attached, none started twice' if ok else 'NOT ALL RE-ATTACHED'}) | < "
        "3,000 ms |"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
