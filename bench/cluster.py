"""Cluster benchmark, part (a): the control plane's core over 100 simulated nodes of 8 GPUs each,
against the single-machine scheduler on the same GPUs and the same requests, in the same run.

* **decisions**: 8,000 submissions of mixed sizes (``bench/scheduler.py``'s mix), then 2,400 deletes
  and 2,400 arrivals; per decision the wall time of ``ClusterCore.apply`` / ``delete``
  (placement, epoch, assignment) against ``Scheduler.submit`` / ``delete`` on one machine with the
  same 800 GPUs.
* **apply to acknowledged start**: with the nodes calling in (one heartbeat each per round, the
  node reporting what its last answer gave it as running), the time from ``apply`` until the node
  that got the workload has acknowledged it, as applies per second over 2,000 applies.

Targets (the cluster issue): at least 3,000 decisions/s with p99 under 10 ms; at least 200 applies/s
acknowledged. No Ray and no HTTP here: the nodes are in this process.

Part (b), ``--ray`` (as root): the multi-node Ray cluster of ``tests/integration/ray_scenario.py``
(a head and three raylets on this machine, inside ``unshare -n``; a control plane over HTTP with a
node agent on each Ray node, simulated GPUs): apply-to-running on the remote nodes (p50),
node-loss-to-replaced (target under 15 s), and control-plane restart-to-ready.

Run: .venv/bin/python bench/cluster.py [--quick] [--ray]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import random
import sys
import time
from pathlib import Path
from typing import Any

from gpufrac.cluster.core import ClusterCore, Report
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import WorkloadSpec
from gpufrac.planning.sched_state import SchedGpu
from gpufrac.planning.scheduler import Scheduler

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("bench_scheduler", HERE / "scheduler.py")
assert _spec is not None and _spec.loader is not None
mix = sys.modules["bench_scheduler"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mix)


def node_gpus(nodes: int, per_node: int) -> list[list[SchedGpu]]:
    """Per node, its GPUs: the scheduler benchmark's mix of models and MIG, node by node."""
    flat = mix.fleet(nodes * per_node)
    return [flat[i * per_node : (i + 1) * per_node] for i in range(nodes)]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def decisions(
    nodes: int, per_node: int, n_submit: int, n_churn: int, cluster: bool
) -> dict[str, Any]:
    rng = random.Random(7)
    groups = node_gpus(nodes, per_node)
    core: ClusterCore | None = None
    if cluster:
        core = ClusterCore(OperatorSettings())
        for i, g in enumerate(groups):
            core.join(f"node-{i:03d}", {"rack": str(i % 10)}, g, 0.0)
        sched = core.scheduler
    else:
        flat = [g for grp in groups for g in grp]
        for i, g in enumerate(flat):
            g.index = i
        sched = Scheduler(flat, OperatorSettings())
    lat: list[float] = []
    placed = 0
    live: list[WorkloadSpec] = []

    def submit(spec: WorkloadSpec) -> None:
        nonlocal placed
        t = time.perf_counter()
        d = core.apply(spec) if core is not None else sched.submit(spec)[0]
        lat.append(time.perf_counter() - t)
        placed += d.outcome == "placed"
        if d.outcome != "refused":
            live.append(spec)

    def delete(spec: WorkloadSpec) -> None:
        t = time.perf_counter()
        if core is not None:
            core.delete(spec.tenant, spec.name)
        else:
            sched.delete(spec.tenant, spec.name)
        lat.append(time.perf_counter() - t)

    gc.disable()
    start = time.perf_counter()
    for k in range(n_submit):
        submit(mix.request(rng, k))
    for k in range(n_churn):
        delete(live.pop(rng.randrange(len(live))))
        submit(mix.request(rng, n_submit + k))
    wall = time.perf_counter() - start
    gc.enable()
    problems = sched.state.violations(False, {})
    assert not problems, problems[:3]
    return {
        "decisions": len(lat),
        "per_s": len(lat) / sum(lat),
        "p50_ms": pct(lat, 0.5) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "placed": placed,
        "wall_s": wall,
    }


def acknowledged(nodes: int, per_node: int, n_apply: int) -> dict[str, Any]:
    """Applies until acknowledged: each round, a batch of applies, then every node calls in once
    and reports as running what it was given the round before."""
    rng = random.Random(11)
    core = ClusterCore(OperatorSettings())
    names = [f"node-{i:03d}" for i in range(nodes)]
    for name, g in zip(names, node_gpus(nodes, per_node), strict=True):
        core.join(name, {}, g, 0.0)
    given: dict[str, dict[str, int]] = {n: {} for n in names}
    applied_at: dict[str, float] = {}
    acked: dict[str, float] = {}
    batch = 50
    now = 0.0
    start = time.perf_counter()
    k = 0
    while len(acked) < n_apply:
        for _ in range(min(batch, n_apply - k)):
            spec = mix.request(rng, k)
            key = f"{spec.tenant}/{spec.name}"
            applied_at[key] = time.perf_counter()
            if core.apply(spec).outcome != "placed":
                acked[key] = applied_at[key]  # waits: nothing for a node to start
            k += 1
        now += 0.01
        for name in names:
            answer = core.heartbeat(name, Report(running=given[name]), now)
            t = time.perf_counter()
            for key in given[name]:
                acked.setdefault(key, t)
            given[name] = {a.workload: a.epoch for a in answer.run}
        if k >= n_apply:  # the last batch: one more round for its acknowledgements
            for name in names:
                core.heartbeat(name, Report(running=given[name]), now)
                t = time.perf_counter()
                for key in given[name]:
                    acked.setdefault(key, t)
    wall = time.perf_counter() - start
    waits = [acked[k] - applied_at[k] for k in applied_at]
    return {"applies": n_apply, "per_s": n_apply / wall, "p50_ms": pct(waits, 0.5) * 1e3,
            "p99_ms": pct(waits, 0.99) * 1e3}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ray", action="store_true", help="also part (b), on a Ray cluster (root)")
    args = ap.parse_args()
    nodes, per = 100, 8
    n_submit, n_churn, n_apply = (2000, 600, 500) if args.quick else (8000, 2400, 2000)
    print(
        f"## Cluster core (a): {nodes} simulated nodes x {per} GPUs, in one process (no Ray, no "
        f"HTTP); {n_submit:,} submissions then {n_churn:,} deletes + {n_churn:,} arrivals\n"
    )
    print("| run | decisions | decisions/s | p50 ms | p99 ms | placed |")
    print("|---|---|---|---|---|---|")
    rows = {}
    runs = (("single machine (one scheduler, 800 GPUs)", False), ("cluster core (100 nodes)", True))
    for _, cluster in runs:  # warm the caches both share (MIG geometry), so order does not count
        decisions(nodes, per, 300, 0, cluster)
    for label, cluster in runs:
        r = rows[label] = decisions(nodes, per, n_submit, n_churn, cluster)
        print(
            f"| {label} | {r['decisions']:,} | {r['per_s']:,.0f} | {r['p50_ms']:.3f} | "
            f"{r['p99_ms']:.3f} | {r['placed']:,} |"
        )
    a = acknowledged(nodes, per, n_apply)
    print(
        f"\napply to acknowledged start (nodes calling in, in process): {a['per_s']:,.0f} "
        f"applies/s, p50 {a['p50_ms']:.1f} ms, p99 {a['p99_ms']:.1f} ms"
    )
    c = rows["cluster core (100 nodes)"]
    met = c["per_s"] >= 3000 and c["p99_ms"] < 10 and a["per_s"] >= 200
    print(
        f"target (>= 3,000 decisions/s, p99 < 10 ms; >= 200 applies/s acknowledged): "
        f"{'met' if met else 'MISSED'}"
    )
    if args.ray:
        return on_ray()
    return 0


def on_ray() -> int:
    import json
    import subprocess
    import tempfile

    scenario = HERE.parent / "tests" / "integration" / "ray_scenario.py"
    with tempfile.TemporaryDirectory(prefix="gpufrac-ray-") as out:
        done = subprocess.run(
            ["unshare", "-n",
             sys.executable, str(scenario), "--lo-up", out],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        print(done.stdout[-2000:], done.stderr[-2000:])
        return 1
    seen = json.loads(lines[-1])
    print("\n## Cluster (b): 3 Ray worker nodes + head on this machine, simulated GPUs\n")
    print("| measure | seconds |\n|---|---|")
    print(f"| Ray cluster and 3 node agents up | {seen['cluster_up_s']} |")
    print(f"| apply to running on a remote node, p50 of 3 | {seen['apply_to_running_p50_s']} |")
    print(f"| node loss to replaced (lease 8 s) | {seen['node_loss_to_replaced_s']} |")
    print(f"| control plane restart to ready | {seen['control_restart_to_ready_s']} |")
    ok = seen["node_loss_to_replaced_s"] < 15 and seen["restart_kept"]
    print(
        "target (node loss to replaced < 15 s, restart restarts nothing): "
        + ("met" if ok else "MISSED")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
