"""Consolidation of small inference deployments on MIG: GPUs needed, one instance per workload
against gpufrac's sharing inside MIG instances (docs/mig.md, "Sharing inside an instance").

A fixed mix of small inference deployments, sized from the published parameter counts of common
embedders, rerankers and 1-8B LLMs at FP16 and INT8 (``MIX``; the sizes and their sources were
fixed before any policy was tuned and are not changed to make a policy look better). Per seed, a
stream of deployments arrives (Poisson) and each lives a lognormal time, in simulated time; the
real scheduler (``planning.scheduler.Scheduler``) places them on a fleet of simulated H100-80GB
GPUs in MIG mode. For each policy the benchmark finds the **GPUs needed**: the smallest fleet on
which the stream runs with no deployment waiting more than 60 s of simulated time (binary search
over fleet sizes, each size replayed from scratch). Policies:

* one instance per workload (dynamic MIG): every deployment asks ``sharing: mig`` (an instance of
  its own, the smallest profile that fits it), instances are created on demand and every idle one
  is destroyed when a workload exits (the fleet keeps only busy instances);
* gpufrac with nesting: ``sharing: auto`` with ``mig_nesting: true`` (the default): a small need
  shares an instance by time-slices when the nesting rule says so, else takes a whole instance;
  idle instances stay and are re-cut by demand (``mig_reconfigure: idle``).

Also printed: the lower bound (the ceiling of the peak concurrent memory demand, were every
deployment to start when it arrives, over one GPU's memory), how many deployments shared an
instance, and busy instances destroyed (each ``destroy_mig_instance`` checked against the
instances' holders as the decisions placed them, apart from the scheduler's own state).
Target: gpufrac with nesting needs at least 25 % fewer GPUs than one instance per workload on the
small-model mix, with 0 busy instances destroyed.

A deployment's replicas (1 to 3, ``REPLICAS``) arrive together and are submitted together
(``Scheduler.submit_all``, as the agent applies a deployment's new replicas), so two small replicas
waiting at once may open a shared instance. With every deployment a single replica
(``--singles``), a new shared instance needs two needs waiting at once, which on a fleet where
nothing waits over 60 s hardly happens: nesting then gains little or nothing (the first version
of this benchmark, single replicas and 60 alive at once, showed 0 %; the replicas were added
then, the sizes and the mix were not changed).

Memory of a deployment: weights (parameters x 2 bytes at FP16, x 1 byte at INT8) plus runtime
overhead: 1 GiB for an encoder (embedder or reranker: CUDA context and activations for a batch),
for an LLM 1 GiB plus 20 % of its weights (KV cache and activations for a small serving budget),
rounded up to 256 MiB. Compute is not modelled (inference at these sizes is memory-bound in this
count); what is measured is placement.

Simulated GPUs and simulated time; the scheduler is the real one.
Run: .venv/bin/python bench/consolidation.py [--seeds 1,2,3] [--quick]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpufrac.model.catalog import lookup_model
from gpufrac.model.mig import MigPlacement
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.sched_decision import Decision
from gpufrac.planning.sched_state import SchedGpu
from gpufrac.planning.scheduler import Scheduler

H100 = lookup_model("h100")  # H100-80GB SXM
GIB = 1024
WAIT_LIMIT_S = 60.0
TARGET = 0.25  # fewer GPUs than one instance per workload, at least


@dataclass(frozen=True)
class Model:
    name: str
    params_m: float  # millions of parameters, as published
    kind: str  # "encoder" | "llm"
    source: str  # the model card giving the parameter count


# Published parameter counts (the model cards on huggingface.co; "safetensors" parameter counts
# where the card gives no other).
MODELS = {
    "all-MiniLM-L6-v2": Model(
        "all-MiniLM-L6-v2", 22.7, "encoder", "sentence-transformers/all-MiniLM-L6-v2"
    ),
    "bge-small-en-v1.5": Model("bge-small-en-v1.5", 33.4, "encoder", "BAAI/bge-small-en-v1.5"),
    "bge-base-en-v1.5": Model("bge-base-en-v1.5", 109, "encoder", "BAAI/bge-base-en-v1.5"),
    "bge-large-en-v1.5": Model("bge-large-en-v1.5", 335, "encoder", "BAAI/bge-large-en-v1.5"),
    "e5-large-v2": Model("e5-large-v2", 335, "encoder", "intfloat/e5-large-v2"),
    "bge-reranker-base": Model("bge-reranker-base", 278, "encoder", "BAAI/bge-reranker-base"),
    "bge-reranker-v2-m3": Model("bge-reranker-v2-m3", 568, "encoder", "BAAI/bge-reranker-v2-m3"),
    "Llama-3.2-1B": Model("Llama-3.2-1B", 1236, "llm", "meta-llama/Llama-3.2-1B"),
    "Qwen2.5-1.5B": Model("Qwen2.5-1.5B", 1544, "llm", "Qwen/Qwen2.5-1.5B-Instruct"),
    "gemma-2-2b": Model("gemma-2-2b", 2614, "llm", "google/gemma-2-2b-it"),
    "Llama-3.2-3B": Model("Llama-3.2-3B", 3213, "llm", "meta-llama/Llama-3.2-3B"),
    "Phi-3-mini": Model("Phi-3-mini", 3821, "llm", "microsoft/Phi-3-mini-4k-instruct"),
    "Mistral-7B": Model("Mistral-7B", 7242, "llm", "mistralai/Mistral-7B-Instruct-v0.3"),
    "Qwen2.5-7B": Model("Qwen2.5-7B", 7616, "llm", "Qwen/Qwen2.5-7B-Instruct"),
    "Llama-3.1-8B": Model("Llama-3.1-8B", 8030, "llm", "meta-llama/Llama-3.1-8B-Instruct"),
}

# the small-model mix: (model, precision) -> weight in the stream. Embedders and rerankers are
# the many small services; 1-4B LLMs at INT8 and FP16; a few 7-8B ones.
MIX: dict[tuple[str, str], float] = {
    ("all-MiniLM-L6-v2", "fp16"): 0.08,
    ("bge-small-en-v1.5", "fp16"): 0.08,
    ("bge-base-en-v1.5", "fp16"): 0.10,
    ("bge-large-en-v1.5", "fp16"): 0.08,
    ("e5-large-v2", "fp16"): 0.05,
    ("bge-reranker-base", "fp16"): 0.07,
    ("bge-reranker-v2-m3", "fp16"): 0.07,
    ("Llama-3.2-1B", "int8"): 0.06,
    ("Llama-3.2-1B", "fp16"): 0.05,
    ("Qwen2.5-1.5B", "int8"): 0.06,
    ("Qwen2.5-1.5B", "fp16"): 0.04,
    ("gemma-2-2b", "int8"): 0.04,
    ("Llama-3.2-3B", "int8"): 0.05,
    ("Llama-3.2-3B", "fp16"): 0.03,
    ("Phi-3-mini", "int8"): 0.03,
    ("Mistral-7B", "int8"): 0.02,
    ("Qwen2.5-7B", "fp16"): 0.02,
    ("Llama-3.1-8B", "int8"): 0.03,
    ("Llama-3.1-8B", "fp16"): 0.04,
}
CONCURRENT = 40  # deployments alive at once on average (Little's law sets the arrival rate)
REPLICAS = {1: 0.4, 2: 0.4, 3: 0.2}  # replicas per deployment, started together
MEDIAN_S, SIGMA = 1800.0, 0.8  # lifetimes: lognormal, median 30 minutes
POLICIES = ("one instance per workload", "gpufrac with nesting")


def memory_mib(model: str, precision: str) -> int:
    m = MODELS[model]
    weights = m.params_m * 1e6 * (2 if precision == "fp16" else 1) / 2**20
    overhead = GIB + (0.2 * weights if m.kind == "llm" else 0)
    return -(-math.ceil(weights + overhead) // 256) * 256


@dataclass(frozen=True)
class Deployment:
    at: float
    model: str
    precision: str
    seconds: float
    replicas: int

    @property
    def mib(self) -> int:
        return memory_mib(self.model, self.precision)


def make_trace(seed: int, n: int, singles: bool = False) -> list[Deployment]:
    rng = random.Random(seed)
    mean_s = MEDIAN_S * math.exp(SIGMA**2 / 2)
    rate = CONCURRENT / mean_s
    names, weights = list(MIX), list(MIX.values())
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        model, precision = rng.choices(names, weights)[0]
        seconds = rng.lognormvariate(math.log(MEDIAN_S), SIGMA)
        replicas = rng.choices(list(REPLICAS), list(REPLICAS.values()))[0]
        replicas = 1 if singles else replicas
        out.append(Deployment(t, model, precision, seconds, replicas))
    return out


def lower_bound(trace: list[Deployment]) -> tuple[int, int]:
    """(GPUs, peak MiB): the peak concurrent memory demand were each to start on arrival."""
    events = sorted(
        [(d.at, d.mib * d.replicas) for d in trace]
        + [(d.at + d.seconds, -d.mib * d.replicas) for d in trace]
    )
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return -(-peak // H100.memory_total_mib), peak


# -- one replay ------------------------------------------------------------------------------------


@dataclass
class Replay:
    fits: bool  # no deployment waited more than WAIT_LIMIT_S, every one was placed
    max_wait_s: float
    shared: int  # deployments placed on a MIG instance shared inside
    busy_destroyed: int
    created: int


def spec(i: int, r: int, d: Deployment, sharing: str) -> WorkloadSpec:
    return WorkloadSpec(
        name=f"d{i}-{r}",
        tenant="bench",
        gpu=GpuRequest(memory_mib=d.mib),
        command=("serve",),
        sharing=sharing,  # type: ignore[arg-type]
    )


def replay(trace: list[Deployment], gpus: int, policy: str) -> Replay:
    fleet = [SchedGpu(f"GPU-{i}", i, H100, mig=True) for i in range(gpus)]
    nesting = policy == "gpufrac with nesting"
    s = Scheduler(fleet, OperatorSettings(mig_nesting=nesting, mig_reconfigure="idle"))
    sharing = "auto" if nesting else "mig"
    events: list[tuple[float, int, str, int]] = [
        (d.at, 1, "arrive", i) for i, d in enumerate(trace)
    ]
    heapq.heapify(events)
    started: dict[str, float] = {}  # replica (tenant/name) -> when it was placed
    arrived: dict[str, float] = {}
    holders: dict[tuple[str, MigPlacement], set[str]] = {}  # from the decisions alone
    busy_destroyed = created = shared = 0
    worst = 0.0

    def take(t: float, decisions: list[Decision]) -> None:
        nonlocal busy_destroyed, created, shared, worst
        for dec in decisions:
            for a in dec.actions:
                if a.kind == "destroy_mig_instance" and a.gpu_uuid and a.mig:
                    busy_destroyed += bool(holders.pop((a.gpu_uuid, a.mig), set()))
                if a.kind == "create_mig_instance":
                    created += 1
            if dec.outcome == "placed" and dec.workload not in started:
                started[dec.workload] = t
                worst = max(worst, t - arrived[dec.workload])
                if dec.mig is not None:
                    holders.setdefault((dec.gpus[0], dec.mig), set()).add(dec.workload)
                    shared += dec.mode != "mig"

    while events:
        t, _, kind, i = heapq.heappop(events)
        d = trace[i]
        if kind == "arrive":
            specs = [spec(i, r, d, sharing) for r in range(d.replicas)]
            arrived.update({f"bench/{x.name}": t for x in specs})
            take(t, s.submit_all(specs))  # a deployment's replicas arrive together
            heapq.heappush(events, (t + d.seconds, 0, "done", i))
        else:
            for r in range(d.replicas):
                key = f"bench/d{i}-{r}"
                for placed in holders.values():  # gone before what its going lets in is taken
                    placed.discard(key)
                take(t, s.delete("bench", f"d{i}-{r}"))
            if not nesting:  # destroyed on exit: the fleet keeps only busy instances
                for g in s.state.gpus:
                    busy = [pl for pl, owner in g.instances.items() if owner is not None]
                    if len(busy) != len(g.instances):
                        s.relayout(g.uuid, True, busy, pinned=False)
        late = [k for k, at in arrived.items() if k not in started and t - at > WAIT_LIMIT_S]
        if late:
            return Replay(False, math.inf, shared, busy_destroyed, created)
    fits = len(started) == len(arrived) and worst <= WAIT_LIMIT_S
    return Replay(fits, worst, shared, busy_destroyed, created)


def gpus_needed(
    trace: list[Deployment], policy: str, low: int, replays: Callable[[], None]
) -> tuple[int, Replay]:
    """The smallest fleet on which ``trace`` fits under ``policy`` (binary search from ``low``)."""
    hi = low
    while True:
        replays()
        found = replay(trace, hi, policy)
        if found.fits:
            break
        low, hi = hi + 1, hi * 2
    best = (hi, found)
    while low < best[0]:
        mid = (low + best[0]) // 2
        replays()
        r = replay(trace, mid, policy)
        if r.fits:
            best = (mid, r)
        else:
            low = mid + 1
    return best


def table(rows: list[dict[str, object]], title: str) -> str:
    cols = [
        ("policy", "policy", 28),
        ("gpus", "GPUs needed", 12),
        ("bound", "lower bound", 12),
        ("vs", "vs one-per-workload", 20),
        ("shared", "shared", 8),
        ("created", "created", 8),
        ("busy_destroyed", "busy destroyed", 15),
        ("max_wait_s", "max wait s", 11),
    ]
    out = [f"### {title}", "| " + " | ".join(h for _, h, _ in cols) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for _, _, w in cols) + "|")
    for r in rows:
        cells = []
        for key, _, w in cols:
            v = r[key]
            text = f"{v:.1f}" if isinstance(v, float) else str(v)
            cells.append(text.ljust(w) if key == "policy" else text.rjust(w))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--deployments", type=int, default=400)
    ap.add_argument("--quick", action="store_true", help="one seed, 120 deployments (smoke run)")
    ap.add_argument("--singles", action="store_true", help="every deployment a single replica")
    args = ap.parse_args()
    seeds = [1] if args.quick else [int(x) for x in args.seeds.split(",")]
    n = 120 if args.quick else args.deployments
    started = time.monotonic()
    small = sum(w for (m, p), w in MIX.items() if memory_mib(m, p) * 2 <= 9984)
    print(
        f"## Consolidation: {n} small inference deployments per seed on simulated H100-80GB "
        f"(MIG), {CONCURRENT} alive at once on average, lifetimes lognormal (median "
        f"{MEDIAN_S / 60:.0f} min), "
        f"{'1 replica each' if args.singles else '1-3 replicas each, started together'}, at most "
        f"{WAIT_LIMIT_S:.0f} s waiting (simulated time); "
        f"{small:.0%} of the mix is at most half a 1g.10gb\n"
    )
    sizes = sorted({(memory_mib(m, p), f"{m} {p}") for m, p in MIX})
    print("sizes: " + ", ".join(f"{name} {mib / GIB:.2f}GiB" for mib, name in sizes) + "\n")
    verdicts = []
    every: list[dict[str, object]] = []
    for seed in seeds:
        trace = make_trace(seed, n, args.singles)
        bound, peak = lower_bound(trace)
        count = [0]

        def tick(count: list[int] = count) -> None:
            count[0] += 1

        rows: list[dict[str, object]] = []
        base = 0
        for policy in POLICIES:
            gpus, r = gpus_needed(trace, policy, bound, tick)
            if policy == POLICIES[0]:
                base = gpus
            rows.append(
                {
                    "policy": policy,
                    "gpus": gpus,
                    "bound": bound,
                    "vs": f"{(gpus - base) / base:+.0%}",
                    "shared": r.shared,
                    "created": r.created,
                    "busy_destroyed": r.busy_destroyed,
                    "max_wait_s": r.max_wait_s,
                }
            )
        every += rows
        print(
            table(
                rows,
                f"seed {seed}: {n} deployments over {trace[-1].at / 3600:.1f} h, peak demand "
                f"{peak / GIB:.0f} GiB, {count[0]} fleets replayed",
            )
        )
        ours = rows[1]
        verdicts.append(
            int(str(ours["gpus"])) <= (1 - TARGET) * base and ours["busy_destroyed"] == 0
        )
    if len(seeds) > 1:
        mean = []
        for policy in POLICIES:
            mine = [r for r in every if r["policy"] == policy]
            mean.append(
                {
                    "policy": policy,
                    **{
                        k: statistics.fmean(float(str(r[k])) for r in mine)
                        for k in ("gpus", "bound", "shared", "created", "busy_destroyed")
                    },
                    "vs": "",
                    "max_wait_s": max(float(str(r["max_wait_s"])) for r in mine),
                }
            )
        gains = [
            1 - float(str(every[i + 1]["gpus"])) / float(str(every[i]["gpus"]))
            for i in range(0, len(every), 2)
        ]
        mean[1]["vs"] = f"{-statistics.fmean(gains):+.0%}"
        print(table(mean, f"mean over seeds {','.join(map(str, seeds))}"))
    print(
        f"target (gpufrac with nesting: at least {TARGET:.0%} fewer GPUs than one instance per "
        f"workload on every seed, 0 busy instances destroyed): "
        f"{'met' if all(verdicts) else 'MISSED'}; whole benchmark "
        f"{time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
