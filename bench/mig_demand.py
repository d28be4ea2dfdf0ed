"""MIG re-cut by demand against static layouts: a stream of MIG requests through the real agent.

Per seed: about 150 requests for MIG slices of mixed sizes, Poisson arrivals at about 85% of the
fleet's compute slices, lognormal durations (median 5 s). Each runs as a real job (``sleep``) under
a real shim, placed and carried out by the real agent on 8 simulated H200s in MIG mode whose fake
NVML takes 0.5 s to create or destroy an instance. Side by side, in the same run (the three at once,
each in its own
process):

* static: the best single fleet layout for the trace's mix, found by replaying candidate layouts
  through the scheduler in simulated time (every uniform pattern, and the MIG planner's layouts for
  the mix at several scales); the agent never changes it (``mig_reconfigure: never``);
* whole-GPU re-cut: instances are created in free space, and a GPU is cut again only once all its
  instances are idle (what gpufrac did before);
* gpufrac: re-cut by demand (``mig_reconfigure: idle``): the fewest idle instances in the way go.

Reported per policy: mean and p95 time pending (arrival to start), requests never placed (not
started within 40 s of the last arrival), slice-seconds idle (compute slices of instances that exist
with no running workload, sampled every 0.25 s), instances created and destroyed, and busy instances
destroyed (a run whose MIG device vanished while it ran, from the devices sampled independently of
the agent).

Simulated GPUs; the agent, its scheduler, shims and processes are real.
Run: .venv/bin/python bench/mig_demand.py [--seeds 1,2,3] [--quick]
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufrac.devices import open_simulated
from gpufrac.devices.simfleet import SimulatedFleet
from gpufrac.model.catalog import lookup_model
from gpufrac.model.mig import MigPlacement
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.demand import DemandClass, resolve_demand
from gpufrac.planning.mig_planner import PlanGpu, plan_mig
from gpufrac.planning.patterns import geometry
from gpufrac.planning.sched_state import SchedGpu
from gpufrac.planning.scheduler import Scheduler
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.runs import read_json
from gpufrac.runtime.service import AgentService
from gpufrac.runtime.shim import read_status

H200 = lookup_model("h200")
GPUS = 8
FLEET = f"h200:{GPUS}:mig"
MIX = {"1g.18gb": 0.35, "2g.35gb": 0.25, "3g.71gb": 0.20, "4g.71gb": 0.12, "7g.141gb": 0.08}
LOAD = 0.85
MEDIAN_S, SIGMA = 5.0, 0.6
LATENCY_S = 0.5
TAIL_S = 40.0  # after the last arrival, how long a request may still start
POLICIES = ("static", "whole-GPU re-cut", "gpufrac re-cut")


@dataclass(frozen=True)
class Request:
    at: float
    profile: str
    seconds: float


def slices(profile: str) -> int:
    return H200.profile(profile).compute_slices


def make_trace(seed: int, n: int) -> list[Request]:
    rng = random.Random(seed)
    mean_slices = sum(slices(p) * w for p, w in MIX.items())
    mean_s = MEDIAN_S * math.exp(SIGMA**2 / 2)
    rate = LOAD * GPUS * H200.compute_slices / (mean_slices * mean_s)
    t, out = 0.0, []
    names, weights = list(MIX), list(MIX.values())
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(
            Request(
                t, rng.choices(names, weights)[0], rng.lognormvariate(math.log(MEDIAN_S), SIGMA)
            )
        )
    return out


# -- the static baseline: candidate layouts replayed in simulated time -----------------------------

Layout = list[tuple[MigPlacement, ...]]


def replay(trace: list[Request], layout: Layout) -> tuple[int, float]:
    """(never placed, mean wait) of the trace on a fleet cut once as ``layout``, in simulated
    time."""
    gpus = []
    for i, placements in enumerate(layout):
        g = SchedGpu(f"GPU-{i}", i, H200, mig=True, pinned=True)
        g.instances = dict.fromkeys(placements)
        gpus.append(g)
    s = Scheduler(gpus, OperatorSettings(mig_reconfigure="never"))
    events: list[tuple[float, int, str, int]] = [
        (r.at, 1, "arrive", i) for i, r in enumerate(trace)
    ]
    heapq.heapify(events)
    started: dict[int, float] = {}
    while events:
        t, _, kind, i = heapq.heappop(events)
        decisions = s.submit(spec(i, trace[i])) if kind == "arrive" else s.delete("bench", f"r{i}")
        for d in decisions:
            j = int(d.workload.split("/r")[1])
            if d.outcome == "placed" and j not in started:
                started[j] = t
                heapq.heappush(events, (t + trace[j].seconds, 0, "done", j))
    end = trace[-1].at + TAIL_S
    waits = [started[i] - r.at for i, r in enumerate(trace) if i in started and started[i] <= end]
    return len(trace) - len(waits), statistics.fmean(waits) if waits else math.inf


def candidates(trace: list[Request]) -> list[Layout]:
    out: list[Layout] = []
    wanted = {r.profile for r in trace}
    for lay in geometry(H200).patterns.values():  # one pattern on every GPU
        if lay.placements and {p.profile for p in lay.placements} & wanted:
            out.append([lay.placements] * GPUS)
    span = trace[-1].at - trace[0].at
    for scale in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0):  # the planner's layout for the mix, at scales
        counts = {p: 0.0 for p in wanted}
        for r in trace:
            counts[r.profile] += r.seconds / span * scale  # Little's law: how many at once
        demand = [
            DemandClass(f"{p}={max(1, round(n))}", max(1, round(n)), profile=p)
            for p, n in counts.items()
        ]
        plan = plan_mig(
            [PlanGpu(f"GPU-{i}", i, H200) for i in range(GPUS)], resolve_demand(demand, [H200])
        )
        out.append([g.instances for g in plan.gpus])
    return out


def best_static(trace: list[Request]) -> tuple[Layout, int]:
    scored = [(replay(trace, c), i, c) for i, c in enumerate(candidates(trace))]
    (_never, _), _, layout = min(scored, key=lambda x: (x[0][0], x[0][1], x[1]))
    return layout, len(scored)


# -- one policy through the real agent -------------------------------------------------------------


def spec(i: int, r: Request) -> WorkloadSpec:
    return WorkloadSpec(
        name=f"r{i}",
        tenant="bench",
        gpu=GpuRequest(mig_profile=r.profile),
        command=("sleep", f"{r.seconds:.3f}"),
        type="job",
    )


def run_policy(
    policy: str, trace: list[Request], layout: Layout | None, data: Path
) -> dict[str, Any]:
    dev = open_simulated(FLEET, data)
    fleet = SimulatedFleet.open(FLEET, data)
    uuids = [g.uuid for g in dev.gpus()]
    if layout is not None:
        for uuid, placements in zip(uuids, layout, strict=True):
            for pl in placements:
                dev.create_instance(uuid, pl.profile, pl.start)
    fleet.set_latency(create_s=LATENCY_S, destroy_s=LATENCY_S)
    settings = OperatorSettings(mig_reconfigure="never" if policy == "static" else "idle")
    recut = "whole_gpu" if policy == "whole-GPU re-cut" else None
    agent = Agent(data, dev, settings, stop_grace=1.0, recut=recut)
    if policy == "static":
        for uuid in uuids:
            agent.scheduler.set_pinned(uuid, True)
    stop = threading.Event()
    lifetimes: dict[str, list[float]] = {}  # MIG device UUID -> [first seen, last seen]
    idle_slice_s = [0.0]

    service = AgentService(agent)  # the agent's own reconcile loop, as `gpufrac agent` runs it

    def watch() -> None:  # the devices alone, independent of the agent: when each MIG device lives
        while not stop.wait(0.1):
            see()

    def see() -> None:
        now_wall = time.time()
        for g in dev.gpus():
            for inst in g.instances:
                if inst.uuid:
                    lifetimes.setdefault(inst.uuid, [now_wall, now_wall])[1] = now_wall

    def sample() -> None:  # compute slices of instances that exist with no workload running there
        last = time.monotonic()
        while not stop.wait(0.25):
            now = time.monotonic()
            held = {
                (tuple(st.decision.gpus), st.decision.mig)
                for st in list(service.states.values())
                if st.decision is not None and st.phase == "running"
            }
            idle = sum(
                slices(inst.profile)
                for g in dev.gpus()
                for inst in g.instances
                if ((g.uuid,), inst.placement) not in held
            )
            idle_slice_s[0] += idle * (now - last)
            last = now

    service.start()
    threads = [threading.Thread(target=f) for f in (sample, watch)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    arrived: dict[int, float] = {}
    for i, r in enumerate(trace):
        time.sleep(max(0.0, t0 + r.at - time.monotonic()))
        arrived[i] = time.time()
        with agent.lock:
            agent.apply_workload(spec(i, r))
        service.wake()
    end = t0 + trace[-1].at + TAIL_S
    while time.monotonic() < end:
        with agent.lock:
            done = all(
                (p := agent.store.placement("bench", f"r{i}")) is not None
                and p[1].get("outcome") == "completed"
                for i in range(len(trace))
            )
        if done:
            break
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    service.stop()
    see()
    starts, busy_destroyed = {}, 0
    for i in range(len(trace)):
        run = agent.runs.latest("bench", f"r{i}", 1)
        first = agent.runs.attempts("bench", f"r{i}", 1)
        if run is None or not first:
            continue
        status = read_status(first[0])
        if status.started is not None and status.started <= arrived[i] + (end - t0):
            starts[i] = status.started
        env = read_json(run / "spec.json").get("env") or {}
        assert isinstance(env, dict)
        device = str(env.get("CUDA_VISIBLE_DEVICES", ""))
        seen = lifetimes.get(device)
        finished = read_status(run).finished or time.time()
        if seen is not None and finished > seen[1] + 0.5:
            busy_destroyed += 1  # its MIG device was gone while it still ran
            print(
                f"busy destroyed? r{i} on {device} ran {status.started:.2f}..{finished:.2f}, "
                f"device seen {seen[0]:.2f}..{seen[1]:.2f}",
                file=sys.stderr,
            )
    waits = sorted(starts[i] - arrived[i] for i in starts)
    by_profile = {
        prof: statistics.fmean(starts[i] - arrived[i] for i in starts if trace[i].profile == prof)
        for prof in MIX
        if any(trace[i].profile == prof for i in starts)
    }
    events = agent.store.events(limit=100_000)
    placed_at: dict[str, float] = {}
    for e in events:
        if e.kind == "placed" and e.subject not in placed_at:
            placed_at[e.subject] = e.at
    queue = [placed_at[f"bench/r{i}"] - arrived[i] for i in starts if f"bench/r{i}" in placed_at]
    prep = [starts[i] - placed_at[f"bench/r{i}"] for i in starts if f"bench/r{i}" in placed_at]
    out = {
        "policy": policy,
        "mean_pending_s": statistics.fmean(waits) if waits else math.inf,
        "p95_pending_s": waits[min(len(waits) - 1, int(0.95 * len(waits)))] if waits else math.inf,
        "never_placed": len(trace) - len(waits),
        "idle_slice_s": idle_slice_s[0],
        "created": sum(1 for e in events if e.kind == "mig_created"),
        "destroyed": sum(1 for e in events if e.kind == "mig_destroyed"),
        "busy_destroyed": busy_destroyed,
        "action_failures": sum(1 for e in events if e.kind == "action_failed"),
        "wall_s": time.monotonic() - t0,
        "mean_pending_by_profile_s": by_profile,
        "mean_queued_s": statistics.fmean(queue) if queue else math.inf,  # arrival to placement
        "mean_prepared_s": statistics.fmean(prep) if prep else math.inf,  # placement to start
    }
    with agent.lock:
        for i in range(len(trace)):
            agent.delete("bench", f"r{i}")
    agent.close()
    dev.close()
    return out


# -- the table -------------------------------------------------------------------------------------


def table(rows: list[dict[str, Any]], title: str) -> str:
    head = (
        "| policy | mean pending s | p95 pending s | never placed | slice-s idle | created | "
        "destroyed | busy destroyed | queued / prepared s |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    body = "".join(
        f"| {r['policy']} | {r['mean_pending_s']:.2f} | {r['p95_pending_s']:.2f} | "
        f"{r['never_placed']} | {r['idle_slice_s']:.0f} | {r['created']} | {r['destroyed']} | "
        f"{r['busy_destroyed']} | {r['mean_queued_s']:.2f} / {r['mean_prepared_s']:.2f} |\n"
        for r in rows
    )
    return f"### {title}\n\n{head}{body}"


def child(args: argparse.Namespace) -> None:
    trace = make_trace(args.seed, args.requests)
    layout = None
    if args.layout:
        layout = [
            tuple(MigPlacement(p["start"], p["profile"]) for p in g)
            for g in json.loads(args.layout)
        ]
    with tempfile.TemporaryDirectory(prefix="gpufrac-migdemand-") as tmp:
        print(json.dumps(run_policy(args.policy, trace, layout, Path(tmp))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--quick", action="store_true", help="one seed, 40 requests (a smoke run)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument(
        "--start",
        choices=("static", "empty"),
        default="static",
        help="what the re-cut policies start from: the static layout (default), or empty GPUs",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--policy", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--layout", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    seeds = [1] if args.quick else [int(s) for s in args.seeds.split(",")]
    n = 40 if args.quick else args.requests
    started = time.monotonic()
    print(
        f"## MIG re-cut by demand: {n} requests per seed on {GPUS} simulated H200 (MIG), "
        f"{LATENCY_S} s per instance created or destroyed, load {LOAD:.0%}, median {MEDIAN_S} s; "
        "the re-cut policies start from "
        f"{'the static layout' if args.start == 'static' else 'empty GPUs'}\n"
    )
    every: list[dict[str, Any]] = []
    for seed in seeds:
        trace = make_trace(seed, n)
        t = time.monotonic()
        layout, tried = best_static(trace)
        chose = time.monotonic() - t
        shown = "; ".join(",".join(str(p) for p in g) or "(empty)" for g in layout[:2]) + (
            "; ..." if len(layout) > 2 else ""
        )
        print(
            f"seed {seed}: {n} requests over {trace[-1].at:.0f} s; static layout chosen of "
            f"{tried} candidates replayed in {chose:.1f} s: {shown}"
        )
        procs = {}
        for policy in POLICIES:
            cmd = [sys.executable, __file__, "--child", "--policy", policy, "--seed", str(seed)]
            cmd += ["--requests", str(n)]
            if policy == "static" or args.start == "static":
                cmd += ["--layout", json.dumps([[p.to_json() for p in g] for g in layout])]
            procs[policy] = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        rows = []
        for policy, proc in procs.items():
            out, _ = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"{policy} failed (exit {proc.returncode})")
            rows.append({**json.loads(out.strip().splitlines()[-1]), "seed": seed})
        every += rows
        print(table(rows, f"seed {seed}"))
    if len(seeds) > 1:
        mean = [
            {
                "policy": p,
                **{
                    k: statistics.fmean(r[k] for r in every if r["policy"] == p)
                    for k in every[0]
                    if isinstance(every[0][k], int | float) and k != "seed"
                },
            }
            for p in POLICIES
        ]
        print(table(mean, f"mean over seeds {','.join(map(str, seeds))}"))
    ours = [r for r in every if r["policy"] == "gpufrac re-cut"]
    others = [r for r in every if r["policy"] != "gpufrac re-cut"]
    target = all(
        r["mean_pending_s"] <= min(o["mean_pending_s"] for o in others if o["seed"] == r["seed"])
        and r["never_placed"] <= min(o["never_placed"] for o in others if o["seed"] == r["seed"])
        and r["busy_destroyed"] == 0
        for r in ours
    )
    print(
        f"target (gpufrac re-cut: lowest mean wait and fewest never placed per seed, 0 busy "
        f"destroyed): {'met' if target else 'MISSED'}; whole benchmark "
        f"{time.monotonic() - started:.0f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(every, indent=2))


if __name__ == "__main__":
    main()
