"""What a workload's cgroup costs: the process runner with and without one, in one run.

For each way (``process group``: no cgroup; ``cgroup``: the machine's layout, runtime/cgroups.py):

* start to ready: from ``Runs.launch`` (the shim started detached, its cgroup made, the workload
  moved into it before exec) until the workload's first line is in its ``output.log``;
* stop: from ``Runs.stop_live`` until the run has ended (``exit.json``: its processes killed and
  its cgroup removed before that);
* the agent's cost per running workload: CPU time (user + system) of the agent's reconcile pass with
  N workloads running on simulated GPUs, divided by N (the pass reads each run, its cgroup's record
  included).

Medians of the rounds; wall clock on a shared machine, so read the columns against each other.
Run: .venv/bin/python bench/runner.py [--rounds 10] [--workloads 16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpufrac.devices import open_simulated
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.cgroups import Layout, detect
from gpufrac.runtime.runs import Runs
from gpufrac.runtime.shim import read_status

READY = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"


def _until(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not (callable(check) and check()):
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.001)


def start_and_stop(root: Path, layout: Layout, rounds: int) -> tuple[float, float]:
    runs = Runs(root / "runs", stop_grace=5.0, cgroups=layout)
    starts, stops = [], []
    for i in range(rounds):
        t0 = time.perf_counter()
        run = runs.launch(
            "bench", f"w{i}", 1, 1, [sys.executable, "-c", READY], env={}, workdir=None, user=None
        )
        log = run / "output.log"
        _until(lambda log=log: log.exists() and b"ready" in log.read_bytes())
        starts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        runs.stop_live("bench", f"w{i}")
        _until(lambda run=run: read_status(run).done)
        stops.append(time.perf_counter() - t0)
    return statistics.median(starts), statistics.median(stops)


def agent_cost(root: Path, layout: Layout, workloads: int, passes: int) -> float:
    """CPU milliseconds of one reconcile pass per running workload."""
    data = root / "agent"
    agent = Agent(data, open_simulated("h200:4", data), stop_grace=2.0, cgroups=layout)
    try:
        for i in range(workloads):
            agent.apply_workload(
                WorkloadSpec(
                    name=f"w{i}",
                    gpu=GpuRequest(memory_mib=1024),
                    command=(sys.executable, "-c", READY),
                    type="service",
                    sharing="timeslice",
                )
            )
        _until(lambda: all(s.phase == "running" for s in agent.reconcile()), timeout=60)
        t0 = time.process_time()
        for _ in range(passes):
            agent.reconcile()
        return (time.process_time() - t0) / passes / workloads * 1000
    finally:
        for i in range(workloads):
            agent.delete("default", f"w{i}")
        agent.runs.wait_stopped(30)
        agent.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--workloads", type=int, default=16)
    ap.add_argument("--passes", type=int, default=10)
    args = ap.parse_args()
    detected = detect()
    ways = [("process group", Layout({}))]
    if detected.usable:
        ways.append(("cgroup", detected))
    else:
        print("no writable cgroup hierarchy here: only the process group is measured")
    print(f"cgroup layout here: {detected.describe()}")
    rows = []
    for label, layout in ways:
        with tempfile.TemporaryDirectory(prefix="gpufrac-bench-runner-") as tmp:
            start, stop = start_and_stop(Path(tmp), layout, args.rounds)
            cost = agent_cost(Path(tmp), layout, args.workloads, args.passes)
        rows.append((label, start, stop, cost))
    print()
    print(
        f"| runner | start to ready (ms) | stop (ms) | agent CPU per running workload "
        f"and pass (ms, {args.workloads} workloads) |"
    )
    print("| --- | ---: | ---: | ---: |")
    for label, start, stop, cost in rows:
        print(f"| {label} | {start * 1000:.1f} | {stop * 1000:.1f} | {cost:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
