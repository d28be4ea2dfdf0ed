"""What the dashboard and a Prometheus scrape cost the agent, with 200 workloads on 8 GPUs.

A real agent (``gpufrac agent``, its own process, uvicorn, simulated GPUs: 8 H200, time-sliced) runs
200 workloads (``sleep``, each under its own shim, 2 GiB each). Measured from outside over HTTP, the
same calls the dashboard's page makes every 2 s (``/api/v1/gpus``, ``/workloads``, ``/deployments``,
``/events?limit=200`` at once, then ``/history?since=...``), the first full ``/history`` load, and a
``/metrics`` scrape. Baselines from the same run: the same calls on the same agent before any
workload was applied, and ``/api/v1/health`` (the cheapest call there is). Target: a dashboard poll
and a ``/metrics`` scrape each answer in under 50 ms (median) with 200 workloads.

Run: .venv/bin/python bench/views.py [--workloads 200] [--rounds 30]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
FLEET = "h200:8"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def manifests(n: int) -> str:
    docs = [
        "apiVersion: gpufrac/v1\nkind: Workload\n"
        f"metadata: {{name: w{i:03d}, tenant: t{i % 4}}}\n"
        "spec:\n  command: [sleep, '3600']\n  type: service\n"
        "  resources: {gpu: {memory: 2GiB}}\n"
        for i in range(n)
    ]
    return "---\n".join(docs)


def timed(client: httpx.Client, path: str) -> float:
    t0 = time.perf_counter()
    r = client.get(path)
    took = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    return took


def dashboard_poll(client: httpx.Client, pool: concurrent.futures.ThreadPoolExecutor) -> float:
    """One refresh of the page: four calls at once, then the history since the last sample."""
    t0 = time.perf_counter()
    paths = ["/api/v1/gpus", "/api/v1/workloads", "/api/v1/deployments", "/api/v1/events?limit=200"]
    for f in [pool.submit(timed, client, p) for p in paths]:
        f.result()
    timed(client, f"/api/v1/history?since={time.time() - 5:.3f}")
    return (time.perf_counter() - t0) * 1000


def measure(client: httpx.Client, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {
        "health": [],
        "dashboard poll": [],
        "history, full": [],
        "metrics scrape": [],
    }
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for _ in range(rounds):
            out["health"].append(timed(client, "/api/v1/health"))
            out["dashboard poll"].append(dashboard_poll(client, pool))
            out["history, full"].append(timed(client, "/api/v1/history"))
            out["metrics scrape"].append(timed(client, "/metrics"))
            time.sleep(0.1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpufrac-views-"))
    data = tmp / "data"
    data.mkdir()
    (data / "gpufrac.yaml").write_text("workload_users: agent\n")
    port = free_port()
    env = {**os.environ, "GPUFRAC_SIMULATE": FLEET, "GPUFRAC_DATA_DIR": str(data)}
    with open(tmp / "agent.log", "wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpufrac.cli", "agent", "--port", str(port),
             "--gateway-port", str(free_port())],
            env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=REPO,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            for _ in range(300):
                try:
                    if client.get("/api/v1/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            time.sleep(6)  # a history sample or two
            empty = measure(client, args.rounds)
            t0 = time.monotonic()
            r = client.post("/api/v1/workloads", content=manifests(args.workloads))
            r.raise_for_status()
            running = 0
            while time.monotonic() - t0 < 300:
                ws = client.get("/api/v1/workloads").json()["workloads"]
                running = sum(1 for w in ws if w["phase"] == "running")
                if running >= args.workloads:
                    break
                time.sleep(1)
            up_s = time.monotonic() - t0
            time.sleep(11)  # the history holds samples of them all
            full = measure(client, args.rounds)
            sizes = {
                p: len(client.get(p).content)
                for p in ("/api/v1/gpus", "/api/v1/workloads", "/api/v1/history", "/metrics")
            }
    finally:
        agent.kill()
        agent.wait(timeout=10)
        subprocess.run(["pkill", "-KILL", "-f", str(data)], check=False)  # the shims
        from soak import stop_workloads  # and what they started

        stop_workloads(data)

    def cell(v: list[float]) -> str:
        return f"{statistics.median(v):.1f} / {sorted(v)[int(0.95 * (len(v) - 1))]:.1f}"

    print(
        f"views: {args.workloads} workloads ({running} running after {up_s:.0f} s) on simulated "
        f"{FLEET}, {os.cpu_count()} CPU cores, {args.rounds} rounds; ms, median / p95"
    )
    print(f"| call | no workloads | {args.workloads} workloads | target |")
    print("| --- | --- | --- | --- |")
    for name in empty:
        target = "< 50 ms" if name in ("dashboard poll", "metrics scrape") else ""
        print(f"| {name} | {cell(empty[name])} | {cell(full[name])} | {target} |")
    print(
        "answer sizes with workloads: "
        + ", ".join(f"{p} {n / 1024:.0f} KiB" for p, n in sizes.items())
    )
    met = all(statistics.median(full[k]) < 50 for k in ("dashboard poll", "metrics scrape"))
    print("targets:", "met" if met else "MISSED")


if __name__ == "__main__":
    main()
