"""Scheduler benchmark: 10,000 submissions of mixed sizes onto 1,000 GPUs, then churn, in memory.

Prints placements per second, p50/p99 decision latency, GPUs used against first-fit run on the same
sequence in the same run, and peak memory (a separate traced run, since tracing slows everything).

Run: .venv/bin/python bench/scheduler.py [--quick]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass

from gpufrac.model.catalog import lookup_model
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.sched_state import SchedGpu
from gpufrac.planning.scheduler import Scheduler

H200, A100 = lookup_model("h200"), lookup_model("a100-80gb")
TENANTS = [f"team{i}" for i in range(8)]


def fleet(n: int) -> list[SchedGpu]:
    """n GPUs: 70% H200 without MIG, 20% H200 in MIG mode, 10% A100-80GB without MIG."""
    gpus = []
    for i in range(n):
        r = i % 10
        model = A100 if r == 9 else H200
        gpus.append(SchedGpu(f"GPU-{i:05d}", i, model, mig=r in (7, 8)))
    return gpus


def request(rng: random.Random, k: int) -> WorkloadSpec:
    """Mixed sizes, about 7% of a GPU on average, so 10 submissions per GPU fill the fleet to
    ~70%."""
    r = rng.random()
    gib = 1024
    if r < 0.48:
        gpu = GpuRequest(memory_mib=rng.choice([1, 2, 2, 4, 4, 6, 8]) * gib)
    elif r < 0.63:
        gpu = GpuRequest(memory_mib=rng.choice([2, 4, 6]) * gib, compute_pct=rng.choice([5, 5, 10]))
    elif r < 0.78:
        gpu = GpuRequest(fraction_milli=rng.choice([25, 50, 50, 100]))
    elif r < 0.88:
        gpu = GpuRequest(
            mig_profile=rng.choice(["1g.18gb", "1g.18gb", "1g.18gb", "2g.35gb"]),
            mig_model="H200-141GB",
        )
    elif r < 0.985:
        gpu = GpuRequest(memory_mib=rng.choice([12, 16, 24]) * gib)
    else:
        gpu = GpuRequest(count=1)
    sharing = (
        "timeslice" if gpu.memory_mib and gpu.compute_pct is None and rng.random() < 0.3 else "auto"
    )
    return WorkloadSpec(
        name=f"w{k}",
        gpu=gpu,
        command=("python", "-c", "pass"),
        tenant=rng.choice(TENANTS),
        sharing=sharing,
        priority=rng.choice([0, 50, 50, 50, 100]),
    )


@dataclass
class Result:
    placements: int = 0
    pending: int = 0
    refused: int = 0
    preemptions: int = 0
    seconds: float = 0.0
    latencies: list[float] | None = None
    gpus_after_submit: int = 0
    gpus_after_churn: int = 0


def run(policy: str, n_gpus: int, n_submit: int, n_churn: int, seed: int) -> Result:
    rng = random.Random(seed)
    sched = Scheduler(fleet(n_gpus), OperatorSettings(), policy=policy)
    res = Result(latencies=[])
    assert res.latencies is not None
    live: list[WorkloadSpec] = []

    def record(decisions: list, dt: float) -> None:  # type: ignore[type-arg]
        res.seconds += dt
        res.latencies.append(dt)  # type: ignore[union-attr]
        for d in decisions:
            if d.outcome == "placed":
                res.placements += 1
                res.preemptions += len(d.evicted)
            elif d.outcome == "refused":
                res.refused += 1

    gc.disable()
    for k in range(n_submit):
        spec = request(rng, k)
        t = time.perf_counter()
        decisions = sched.submit(spec)
        record(decisions, time.perf_counter() - t)
        if decisions[0].outcome != "refused":
            live.append(spec)
    res.gpus_after_submit = sched.state.gpus_used()
    for k in range(n_churn):  # one delete and one arrival each step
        victim = live.pop(rng.randrange(len(live)))
        t = time.perf_counter()
        decisions = sched.delete(victim.tenant, victim.name)
        record(decisions, time.perf_counter() - t)
        spec = request(rng, n_submit + k)
        t = time.perf_counter()
        decisions = sched.submit(spec)
        record(decisions, time.perf_counter() - t)
        if decisions[0].outcome != "refused":
            live.append(spec)
    gc.enable()
    res.gpus_after_churn = sched.state.gpus_used()
    res.pending = len(sched.pending)
    problems = sched.state.violations(False, {})
    assert not problems, problems[:5]
    return res


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n_gpus, n_submit, n_churn = (200, 2000, 600) if args.quick else (1000, 10_000, 3000)
    print(
        f"## Scheduler: {n_submit:,} submissions onto {n_gpus:,} GPUs (70% H200, 20% H200 "
        f"in MIG mode, 10% A100-80GB), then {n_churn:,} deletes + {n_churn:,} arrivals\n"
    )
    print(
        "| policy | placements | placements/s | p50 decision | p99 decision | GPUs used "
        "after submissions | after churn | pending at end | refused | preempted |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = {}
    for policy in ("binpack", "first-fit", "spread"):
        r = run(policy, n_gpus, n_submit, n_churn, seed=7)
        results[policy] = r
        assert r.latencies is not None
        print(
            f"| {policy} | {r.placements:,} | {r.placements / r.seconds:,.0f} | "
            f"{pct(r.latencies, 0.5) * 1e3:.3f} ms | "
            f"{pct(r.latencies, 0.99) * 1e3:.3f} ms | {r.gpus_after_submit} | "
            f"{r.gpus_after_churn} | {r.pending} | {r.refused} | {r.preemptions} |"
        )
    tracemalloc.start()
    run("binpack", n_gpus, n_submit, n_churn, seed=7)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    b, f = results["binpack"], results["first-fit"]
    assert b.latencies is not None
    print()
    print(f"placements/s (binpack): {b.placements / b.seconds:,.0f} (target >= 5,000)")
    print(
        f"p99 decision latency (binpack): {pct(b.latencies, 0.99) * 1e3:.2f} ms (target < "
        f"5 ms); mean {statistics.mean(b.latencies) * 1e3:.3f} ms"
    )
    print(
        f"GPUs used, binpack vs first-fit: {b.gpus_after_submit} vs {f.gpus_after_submit} "
        f"after submissions, {b.gpus_after_churn} vs {f.gpus_after_churn} after churn "
        "(target: no more than first-fit)"
    )
    print(f"peak traced memory of the binpack run: {peak / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
