"""Consolidation on MIG: GPUs needed and waits, every policy side by side, from a static
mig-parted layout to gpufrac's re-cuts, sharing inside instances (docs/mig.md, "Sharing inside an
instance") and moves (docs/scheduler.md, "MIG re-cut by demand").

Simulated H100-80GB GPUs in MIG mode and simulated time; the scheduler is the real one
(``planning.scheduler.Scheduler``), given every request and deletion as the agent would and a
clock that reads the simulated time. Compute is not modelled (inference at these sizes is
memory-bound in this count); what is measured is placement.

**Policies** (the settings each scheduler gets; every deployment replica carries the label
``gpufrac.io/deployment`` = its deployment's name under every policy, so the stream is the same):

1. static mig-parted layout: every GPU pre-cut to mig-parted's ``all-balanced`` layout for
   H100-80GB (2x 1g.10gb, 1x 2g.20gb, 1x 3g.40gb: ``1g.10gb@0,1g.10gb@1,2g.20gb@2,3g.40gb@4``) and
   pinned (``Scheduler.relayout(..., pinned=True)``, as ``gpufrac mig apply`` does),
   ``mig_reconfigure: never``, ``mig_nesting: false``, ``sharing: mig``: only free instances of
   that layout are used. Each replica asks by name the layout's smallest profile that holds it
   (as a pod asks ``nvidia.com/mig-2g.20gb`` of such a layout: the scheduler gives a request by
   memory only the smallest profile that fits it, never a larger free instance, so an 18 GiB
   replica asking by memory would wait for a 1g.20gb the layout lacks); a replica no profile of
   the layout holds (more than 40 GB, or more than 3 of the 7 compute slices) and the jobs asking
   4g.40gb or 7g.80gb are never placed;
2. one instance per workload (dynamic MIG, no moves): ``sharing: mig``, ``mig_nesting: false``,
   ``mig_reconfigure: idle``; instances are created on demand and every idle one is destroyed
   when a workload exits (the fleet keeps only busy instances);
3. gpufrac re-cut by demand (one mode per GPU): as 2, but idle instances stay and are re-cut by
   demand (``mig_reconfigure: idle``);
4. gpufrac with nesting: ``sharing: auto`` with ``mig_nesting: true``: a small need shares an
   instance by time-slices when the nesting rule says so, else takes a whole instance; idle
   instances stay and are re-cut by demand;
5. gpufrac with nesting and moves: as 4, plus live moves (``mig_moves: true``, the default budget
   ``max_moves_per_minute`` 6 and ``max_moves_per_workload_per_hour`` 2). Policies 1-4 run with
   ``mig_moves: false``. A move the scheduler asks for (``Decision.moves``) is carried out as the
   agent does: a deployment replica (``how == "replace"``) gets a replacement replica of the same
   deployment (a new name); once that one is placed and has been ready for a cold start (30 s
   plus 90 s per 80 GB of the replica's memory: loading the weights, so 30-120 s), the old
   replica is deleted while ``Scheduler.moving`` still wants the move (the waiting request is then
   placed by a re-cut); if the move is no longer wanted by then (its request was placed or
   deleted, or the move timed out) the replacement is the surplus and is deleted, the old replica
   serving on where it was; a replacement still waiting when its move is no longer wanted is
   deleted too. A movable service (``how == "restart"``) is re-placed by the scheduler in the same
   call and only counted (the stream has none: every service is a deployment's replica). Jobs
   never move. While a MIG request waits, ``Scheduler.plan_moves`` is called every 5 s of
   simulated time (``PASS_S``; the agent calls it each reconcile pass, every 0.5 s): it gives up
   plans that did not let their request in within 600 s and begins moves the budget held back.

**Streams** (per seed; Poisson arrivals, lognormal lifetimes, in simulated time):

* small: a fixed mix of small inference deployments (``MIX``), sized from the published parameter
  counts of common embedders, rerankers and 1-8B LLMs at FP16 and INT8 (the sizes and their
  sources were fixed before any policy was tuned and are not changed to make a policy look
  better), 1-3 replicas each (``REPLICAS``), 40 alive at once on average, lifetimes median 30 min;
* mixed (``--hours`` of arrivals, 7 by default): 60 % of arrivals such small deployments, 20 %
  large LLM deployments (``LARGE``: 13B-70B at FP16, INT8 or, for the 70B, INT4 (at INT8 its
  weights and overhead pass 80 GB), 1-2 replicas, needing 3g.40gb, 4g.40gb (one asks half the
  GPU's compute) or 7g.80gb), 20 % batch jobs (``JOBS``: evaluations and fine-tunes asking a named
  profile, 2g.20gb to 7g.80gb, running 3 to 60 minutes: lognormal, median 20 min, clipped),
  30 alive at once on average.

A deployment's replicas arrive together and are submitted together (``Scheduler.submit_all``, as
the agent applies a deployment's new replicas), so two small replicas waiting at once may open a
shared instance; with ``--singles`` every small deployment is a single replica (nesting then
gains little: a new shared instance needs two needs waiting at once; the first version of this
benchmark, single replicas and 60 alive at once, showed 0 %; the replicas were added then, the
sizes and the mix were not changed). A deployment lives its
lifetime from its arrival (its replicas are deleted then, placed or not); a job runs its duration
from its placement. What waits sits in the scheduler's pending queue and is placed by the
scheduler itself when a deletion makes room (the decisions ``delete`` returns).

Memory of a deployment: weights (parameters x 2 bytes at FP16, x 1 at INT8, x 0.5 at INT4) plus
runtime overhead: 1 GiB for an encoder (embedder or reranker: CUDA context and activations for a
batch), for an LLM 1 GiB plus 20 % of its weights (KV cache and activations for a small serving
budget), rounded up to 256 MiB. A job asks its profile by name.

**Measured**, per policy: **GPUs needed**, the smallest fleet on which the stream runs with no
workload waiting more than 60 s of simulated time (binary search over fleet sizes, each size
replayed from scratch; "never" where some workload needs what the policy can never give it, with
how many); on one fleet size for the mixed stream, **the lower bound** (below: the fewest GPUs
whose memory holds the peak demand, fixed by the stream alone, before any policy; a fleet on
which every policy has workloads waiting past 60 s; ``--fleet`` sets another), the
**mean and p95 wait** (arrival to first placement, simulated seconds, over every workload: each
deployment replica and each job; a workload never placed counts its wait until it was deleted or
the replay's end, and such workloads are also counted apart), how many waited more than 60 s,
**moves per hour** (moves begun / simulated hours of the replay, from 0 to its last departure or
job's end, so past the hours of arrivals), **busy instances destroyed**
(each ``destroy_mig_instance`` checked against the instances' holders as the decisions placed
them, apart from the scheduler's own state, over every replay of the policy), and for policy 5
whether the moves begun stayed within the budget (counted here from the moves' times, apart from
the scheduler's own budget: at most ``max_moves_per_minute`` begun in any 60 s, at most
``max_moves_per_workload_per_hour`` of one deployment in any hour). Also the lower bound (the
ceiling of the peak concurrent memory demand, were every workload to start when it arrives, over
one GPU's memory) and how many placements shared an instance.

Targets: on the small stream gpufrac with nesting needs at least 25 % fewer GPUs than one
instance per workload (every seed); on the mixed stream gpufrac with nesting and moves has the
lowest mean wait of every policy (every seed; ties count as met); 0 busy instances destroyed by
every policy; moves within the budget. A missed target is printed as missed.

**Requests lost to moves** are measured on a real agent (``--live-rounds``, 3 by default): two
simulated H100s in MIG mode, a model replica (``examples/serving``) on a 1g.10gb of GPU 0 in the
way of a 7g.80gb (GPU 1 holds a job), 4 closed-loop clients through the gateway from before the
7g.80gb is applied until 2 s after it runs; each round counts the requests and those not
answered 2xx, and the seconds from the apply to the 7g.80gb running (the replacement's start and
readiness, the drain, the re-cut).

The simulated numbers are the same every run (the scheduler's ties are broken by GPU and
instance start, not by set order, which followed string hashing until this benchmark found it:
"gpufrac re-cut by demand" moved by a GPU with ``PYTHONHASHSEED``). The whole benchmark takes
under a minute on two cores (``--quick``: a few seconds, with ``--live-rounds 0``).

Run: .venv/bin/python bench/consolidation.py [--seeds 1,2,3] [--hours 7] [--fleet N] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import heapq
import itertools
import math
import os
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpufrac.model.catalog import lookup_model
from gpufrac.model.mig import MigPlacement, parse_layout
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.moves import Move
from gpufrac.planning.sched_decision import Decision
from gpufrac.planning.sched_state import SchedGpu
from gpufrac.planning.scheduler import Scheduler

H100 = lookup_model("h100")  # H100-80GB SXM
GIB = 1024
WAIT_LIMIT_S = 60.0
TARGET = 0.25  # fewer GPUs than one instance per workload, at least
TENANT = "bench"
DEPLOYMENT_LABEL = "gpufrac.io/deployment"  # model.deployment.LABEL: a replica of that deployment
# mig-parted's "all-balanced" for H100-80GB: 2x 1g.10gb, 1x 2g.20gb, 1x 3g.40gb
STATIC_LAYOUT = parse_layout("1g.10gb@0,1g.10gb@1,2g.20gb@2,3g.40gb@4")
PASS_S = 5.0  # while a MIG request waits, Scheduler.plan_moves is called this often (below)


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
    # the large ones (the mixed stream)
    "Llama-2-13B": Model("Llama-2-13B", 13016, "llm", "meta-llama/Llama-2-13b-chat-hf"),
    "Qwen2.5-14B": Model("Qwen2.5-14B", 14770, "llm", "Qwen/Qwen2.5-14B-Instruct"),
    "Qwen2.5-32B": Model("Qwen2.5-32B", 32764, "llm", "Qwen/Qwen2.5-32B-Instruct"),
    "Mixtral-8x7B": Model("Mixtral-8x7B", 46703, "llm", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
    "Llama-3.1-70B": Model("Llama-3.1-70B", 70554, "llm", "meta-llama/Llama-3.1-70B-Instruct"),
}
BYTES = {"fp16": 2.0, "int8": 1.0, "int4": 0.5}  # bytes per parameter

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

# the large deployments of the mixed stream: (model, precision, compute % of the GPU or None) ->
# weight. By memory alone each takes 3g.40gb or 7g.80gb (the smallest profile that fits); the
# 14B with half the GPU's compute (a latency target) takes 4g.40gb.
LARGE: dict[tuple[str, str, int | None], float] = {
    ("Llama-2-13B", "fp16", None): 0.20,
    ("Qwen2.5-14B", "fp16", None): 0.15,
    ("Qwen2.5-14B", "fp16", 50): 0.15,
    ("Qwen2.5-32B", "int8", None): 0.20,
    ("Mixtral-8x7B", "int8", None): 0.10,
    ("Qwen2.5-32B", "fp16", None): 0.10,
    ("Llama-3.1-70B", "int4", None): 0.10,
}
LARGE_REPLICAS = {1: 0.6, 2: 0.4}


@dataclass(frozen=True)
class Job:
    name: str
    profile: str  # the MIG profile it asks by name
    weight: float
    why: str


# the batch jobs of the mixed stream: each asks a named profile (memory for its model, compute
# slices for its throughput)
JOBS = (
    Job("eval Llama-3.1-8B", "2g.20gb", 0.30, "FP16 weights 15 GiB, serving overhead: 19 GiB"),
    Job("eval Qwen2.5-32B", "3g.40gb", 0.15, "INT8 weights 31 GiB, serving overhead: 38 GiB"),
    Job("LoRA Llama-3.1-8B", "3g.40gb", 0.25, "FP16 weights 15 GiB, activations, adapters"),
    Job("LoRA Qwen2.5-14B", "4g.40gb", 0.15, "FP16 weights 28 GiB, 4 slices for throughput"),
    Job("QLoRA Llama-3.1-70B", "7g.80gb", 0.15, "INT4 weights 33 GiB, long-sequence activations"),
)
JOB_MEDIAN_S, JOB_SIGMA, JOB_MIN_S, JOB_MAX_S = 1200.0, 0.7, 180.0, 3600.0
MIXED_SHARES = {"small": 0.6, "large": 0.2, "job": 0.2}  # of the mixed stream's arrivals
MIXED_CONCURRENT = 30  # workloads (deployments and jobs) alive at once on average


def memory_mib(model: str, precision: str) -> int:
    m = MODELS[model]
    weights = m.params_m * 1e6 * BYTES[precision] / 2**20
    overhead = GIB + (0.2 * weights if m.kind == "llm" else 0)
    return -(-math.ceil(weights + overhead) // 256) * 256


def profile_mib(name: str) -> int:
    mib = H100.profile(name).memory_mib
    assert mib is not None, name
    return mib


def cold_start_s(mib: int) -> float:
    """How long a replacement replica takes to be ready once placed: loading its weights."""
    return 30.0 + 90.0 * mib / profile_mib("7g.80gb")


@dataclass(frozen=True)
class Arrival:
    """A deployment (``replicas`` together, alive ``seconds`` from ``at``) or a batch job (running
    ``seconds`` from its placement)."""

    at: float
    model: str
    precision: str
    seconds: float
    replicas: int
    kind: str = "small"  # "small" | "large" | "job"
    compute_pct: int | None = None
    job: Job | None = None

    @property
    def mib(self) -> int:
        if self.job is not None:
            return profile_mib(self.job.profile)
        return memory_mib(self.model, self.precision)

    @property
    def what(self) -> str:
        return self.job.name if self.job is not None else f"{self.model} {self.precision}"


def make_trace(seed: int, n: int, singles: bool = False) -> list[Arrival]:
    """The small stream: ``n`` small deployments."""
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
        out.append(Arrival(t, model, precision, seconds, replicas))
    return out


def make_mixed(seed: int, hours: float, singles: bool = False) -> list[Arrival]:
    """The mixed stream: small and large deployments and batch jobs arriving for ``hours``."""
    rng = random.Random(1000 + seed)
    job_mean = JOB_MEDIAN_S * math.exp(JOB_SIGMA**2 / 2)
    deploy_mean = MEDIAN_S * math.exp(SIGMA**2 / 2)
    mean_s = (1 - MIXED_SHARES["job"]) * deploy_mean + MIXED_SHARES["job"] * job_mean
    rate = MIXED_CONCURRENT / mean_s
    kinds, shares = list(MIXED_SHARES), list(MIXED_SHARES.values())
    small, small_w = list(MIX), list(MIX.values())
    large, large_w = list(LARGE), list(LARGE.values())
    t, out = rng.expovariate(rate), []
    while t < hours * 3600:
        kind = rng.choices(kinds, shares)[0]
        if kind == "job":
            job = rng.choices(JOBS, [j.weight for j in JOBS])[0]
            seconds = rng.lognormvariate(math.log(JOB_MEDIAN_S), JOB_SIGMA)
            seconds = min(max(seconds, JOB_MIN_S), JOB_MAX_S)
            out.append(Arrival(t, "", "", seconds, 1, "job", job=job))
        elif kind == "large":
            model, precision, compute = rng.choices(large, large_w)[0]
            seconds = rng.lognormvariate(math.log(MEDIAN_S), SIGMA)
            replicas = rng.choices(list(LARGE_REPLICAS), list(LARGE_REPLICAS.values()))[0]
            out.append(Arrival(t, model, precision, seconds, replicas, "large", compute))
        else:
            model, precision = rng.choices(small, small_w)[0]
            seconds = rng.lognormvariate(math.log(MEDIAN_S), SIGMA)
            replicas = rng.choices(list(REPLICAS), list(REPLICAS.values()))[0]
            out.append(Arrival(t, model, precision, seconds, 1 if singles else replicas))
        t += rng.expovariate(rate)
    return out


def lower_bound(trace: list[Arrival]) -> tuple[int, int]:
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


# -- the policies ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    name: str
    sharing: str  # what every deployment replica asks
    reconfigure: str  # mig_reconfigure
    nesting: bool  # mig_nesting
    destroy_idle: bool  # every idle instance destroyed when a workload exits
    static: bool  # every GPU pre-cut to STATIC_LAYOUT, pinned
    moves: bool  # mig_moves

    def scheduler(self, fleet: list[SchedGpu], clock: Callable[[], float]) -> Scheduler:
        settings = OperatorSettings(
            mig_nesting=self.nesting,
            mig_reconfigure=self.reconfigure,  # type: ignore[arg-type]
            mig_moves=self.moves,
        )
        s = Scheduler(fleet, settings, clock=clock)
        if self.static:
            for g in fleet:
                s.relayout(g.uuid, True, list(STATIC_LAYOUT), pinned=True)
        return s


STATIC = Policy("static mig-parted layout", "mig", "never", False, False, True, False)
PER_WORKLOAD = Policy("one instance per workload", "mig", "idle", False, True, False, False)
RECUT = Policy("gpufrac re-cut by demand", "mig", "idle", False, False, False, False)
NESTING = Policy("gpufrac with nesting", "auto", "idle", True, False, False, False)
MOVING = Policy("gpufrac with nesting and moves", "auto", "idle", True, False, False, True)
POLICIES = (STATIC, PER_WORKLOAD, RECUT, NESTING, MOVING)


def layout_profile(d: Arrival) -> str | None:
    """The smallest profile of STATIC_LAYOUT that holds ``d`` (its memory and compute), if any."""
    fit = [
        H100.profile(pl.profile)
        for pl in STATIC_LAYOUT
        if profile_mib(pl.profile) >= d.mib
        and H100.profile(pl.profile).compute_slices * 100 >= (d.compute_pct or 0) * 7
    ]
    return min(fit, key=lambda p: (p.memory_slots, p.compute_slices)).name if fit else None


def replica_spec(name: str, i: int, d: Arrival, policy: Policy) -> WorkloadSpec:
    # under a static layout a replica asks the layout's smallest profile that holds it by name (as
    # a pod asks nvidia.com/mig-2g.20gb of mig-parted's layout); a need no profile there holds asks
    # its memory, and waits
    profile = layout_profile(d) if policy.static else None
    return WorkloadSpec(
        name=name,
        tenant=TENANT,
        gpu=(
            GpuRequest(mig_profile=profile)
            if profile
            else GpuRequest(memory_mib=d.mib, compute_pct=d.compute_pct)
        ),
        command=("serve",),
        type="service",
        labels={DEPLOYMENT_LABEL: f"d{i}"},
        sharing=policy.sharing,  # type: ignore[arg-type]
    )


def job_spec(name: str, d: Arrival) -> WorkloadSpec:
    assert d.job is not None
    return WorkloadSpec(
        name=name,
        tenant=TENANT,
        gpu=GpuRequest(mig_profile=d.job.profile),
        command=("train",),
        type="job",
        sharing="mig",
    )


def never_placed(trace: list[Arrival], policy: Policy) -> int:
    """How many workloads of ``trace`` no GPU under ``policy`` could hold, were it empty."""
    fits: dict[tuple[int, int | None, str | None], bool] = {}
    count = 0
    for i, d in enumerate(trace):
        shape = (d.mib, d.compute_pct, d.job.profile if d.job else None)
        if shape not in fits:
            s = policy.scheduler([SchedGpu("GPU-0", 0, H100, mig=True)], lambda: 0.0)
            spec = job_spec("probe", d) if d.job else replica_spec("probe", i, d, policy)
            fits[shape] = s.submit(spec)[0].outcome == "placed"
        count += 0 if fits[shape] else d.replicas
    return count


# -- one replay ------------------------------------------------------------------------------------


@dataclass
class Replay:
    fits: bool  # no workload waited more than WAIT_LIMIT_S, every one was placed
    max_wait_s: float
    waits: list[float]  # every workload's (stopped early: those placed so far)
    never: int  # workloads never placed (deleted waiting, or waiting at the end)
    late: int  # workloads that waited more than WAIT_LIMIT_S (never placed included)
    shared: int  # placements on a MIG instance shared inside
    created: int
    busy_destroyed: int
    moves: int  # moves begun (every Move the scheduler asked for, once)
    moves_done: int  # replace moves finished: the old replica deleted once its replacement served
    moves_dropped: int  # replace moves no longer wanted: the replacement deleted
    over_budget: int  # moves begun past the budget, counted here
    hours: float  # simulated hours replayed


class Sim:
    """One replay of ``trace`` on ``gpus`` GPUs under ``policy``; with ``stop_late``, it stops at
    the first workload that waits more than WAIT_LIMIT_S."""

    def __init__(self, trace: list[Arrival], gpus: int, policy: Policy, stop_late: bool) -> None:
        self.trace, self.policy, self.stop_late = trace, policy, stop_late
        self.now = 0.0
        fleet = [SchedGpu(f"GPU-{i}", i, H100, mig=True) for i in range(gpus)]
        self.s = policy.scheduler(fleet, lambda: self.now)
        self.events: list[tuple[float, int, str, int | str]] = []
        self.order = itertools.count()
        self.waiting: dict[str, float] = {}  # workload not placed yet -> when it arrived
        self.placed: set[str] = set()  # placed at least once
        self.waits: list[float] = []
        self.never = 0
        self.jobs: dict[str, float] = {}  # job -> how long it runs once placed
        self.slot: dict[str, tuple[int, int]] = {}  # replica -> (deployment, replica) it stands for
        self.standing: dict[tuple[int, int], set[str]] = {}  # and back: old and replacement
        self.replacing: dict[str, str] = {}  # replacement -> the replica it replaces
        self.renamed: dict[tuple[int, int], int] = {}  # replacements started per replica
        self.begun: set[tuple[str, str]] = set()  # (mover, request): moves seen
        self.move_times: list[tuple[float, str]] = []  # (when, budget key)
        # (GPU, instance) -> its holders, from the decisions alone; and each holder's instance
        self.holders: dict[tuple[str, MigPlacement], set[str]] = {}
        self.where: dict[str, tuple[str, MigPlacement]] = {}
        self.shared = self.created = self.busy_destroyed = 0
        self.moves_done = self.moves_dropped = 0
        self.next_pass: float | None = None

    def push(self, t: float, kind: str, what: int | str) -> None:
        # at one time: departures first, then readiness, then arrivals
        rank = {"depart": 0, "done": 0, "ready": 1, "pass": 1, "arrive": 2}[kind]
        heapq.heappush(self.events, (t, rank * 10**9 + next(self.order), kind, what))

    def run(self) -> Replay:
        for i, d in enumerate(self.trace):
            self.push(d.at, "arrive", i)
        while self.events:
            t, _, kind, what = heapq.heappop(self.events)
            self.now = t
            if kind == "arrive":
                self.arrive(int(what))
            elif kind == "depart":
                self.depart(int(what))
            elif kind == "done":
                self.gone(str(what))
            elif kind == "pass":
                self.next_pass = None
                self.take(self.s.plan_moves())
            else:
                self.ready(str(what))
            if self.replacing:
                self.cancel_unwanted()
            if self.policy.moves and self.s.pending.mig and self.next_pass is None and self.events:
                # the agent's reconcile pass (every 0.5 s there): plans given up, moves begun that
                # the budget held back; while a MIG request waits and anything else is to come
                self.next_pass = t + PASS_S
                self.push(self.next_pass, "pass", 0)
            if self.stop_late and (
                self.never or any(t - at > WAIT_LIMIT_S for at in self.waiting.values())
            ):
                return self.result(early=True)
        for at in self.waiting.values():  # never placed: its wait runs to the end
            self.waits.append(self.now - at)
            self.never += 1
        return self.result(early=False)

    def result(self, early: bool) -> Replay:
        worst = max(self.waits, default=0.0)
        fits = not early and not self.never and worst <= WAIT_LIMIT_S
        s = self.s.settings
        over = 0
        for k, (t, key) in enumerate(self.move_times):
            before = self.move_times[: k + 1]
            minute = sum(1 for u, _ in before if u > t - 60.0)
            hour = sum(1 for u, other in before if other == key and u > t - 3600.0)
            over += minute > s.max_moves_per_minute or hour > s.max_moves_per_workload_per_hour
        return Replay(
            fits=fits,
            max_wait_s=math.inf if early else worst,
            waits=self.waits,
            never=self.never,
            late=sum(w > WAIT_LIMIT_S for w in self.waits),
            shared=self.shared,
            created=self.created,
            busy_destroyed=self.busy_destroyed,
            moves=len(self.move_times),
            moves_done=self.moves_done,
            moves_dropped=self.moves_dropped,
            over_budget=over,
            hours=self.now / 3600,
        )

    # -- the workloads' lives

    def arrive(self, i: int) -> None:
        d = self.trace[i]
        if d.job is not None:
            spec = job_spec(f"j{i}", d)
            self.jobs[f"{TENANT}/j{i}"] = d.seconds
            self.waiting[f"{TENANT}/j{i}"] = self.now
            self.take(self.s.submit(spec))
            return
        specs = [replica_spec(f"d{i}-r{r}", i, d, self.policy) for r in range(d.replicas)]
        for r, spec in enumerate(specs):
            key = f"{TENANT}/{spec.name}"
            self.waiting[key] = self.now
            self.slot[key] = (i, r)
            self.standing[(i, r)] = {key}
        self.take(self.s.submit_all(specs))  # a deployment's replicas arrive together
        self.push(self.now + d.seconds, "depart", i)

    def depart(self, i: int) -> None:
        """A deployment goes: whichever replicas stand for it (replacements included)."""
        for r in range(self.trace[i].replicas):
            for key in sorted(self.standing.pop((i, r), set())):
                self.replacing.pop(key, None)
                self.gone(key)

    def gone(self, key: str) -> None:
        """Delete one workload (a departure, a finished job, a move's surplus replica)."""
        if not self.s.knows(key):
            return
        at = self.waiting.pop(key, None)
        if at is not None:  # deleted before it was ever placed
            self.waits.append(self.now - at)
            self.never += 1
        slot = self.slot.pop(key, None)
        if slot is not None and slot in self.standing:
            self.standing[slot].discard(key)
        self.drop(key)  # gone before what its going lets in is taken
        tenant, name = key.split("/", 1)
        self.take(self.s.delete(tenant, name))
        if self.policy.destroy_idle:  # destroyed on exit: the fleet keeps only busy instances
            for g in self.s.state.gpus:
                busy = [pl for pl, owner in g.instances.items() if owner is not None]
                if len(busy) != len(g.instances):
                    self.s.relayout(g.uuid, True, busy, pinned=False)

    def drop(self, key: str) -> None:
        held = self.where.pop(key, None)
        if held is not None:
            self.holders.get(held, set()).discard(key)

    # -- the scheduler's answers

    def take(self, decisions: Sequence[Decision]) -> None:
        for dec in decisions:  # placed again (a restarted move) or evicted: its instance first
            for a in dec.actions:
                if a.kind == "evict":
                    self.drop(a.workload)
            if dec.outcome == "placed" and dec.workload in self.placed:
                self.drop(dec.workload)
        for dec in decisions:
            for a in dec.actions:
                if a.kind == "destroy_mig_instance" and a.gpu_uuid and a.mig:
                    self.busy_destroyed += bool(self.holders.pop((a.gpu_uuid, a.mig), set()))
                elif a.kind == "create_mig_instance":
                    self.created += 1
            if dec.outcome == "placed":
                self.placed_now(dec)
            for move in dec.moves:
                self.begin(move)

    def placed_now(self, dec: Decision) -> None:
        key = dec.workload
        if dec.mig is not None:
            where = (dec.gpus[0], dec.mig)
            self.holders.setdefault(where, set()).add(key)
            self.where[key] = where
        if key in self.placed:
            return
        self.placed.add(key)
        self.shared += dec.mig is not None and dec.mode != "mig"
        at = self.waiting.pop(key, None)
        if at is not None:
            self.waits.append(self.now - at)
        if key in self.jobs:
            self.push(self.now + self.jobs[key], "done", key)
        if key in self.replacing:
            d = self.trace[self.slot[key][0]]
            self.push(self.now + cold_start_s(d.mib), "ready", key)

    # -- moves (policy 5)

    def begin(self, move: Move) -> None:
        """A move the scheduler asked for: counted once; a replica's replacement started."""
        if (move.workload, move.cause) in self.begun or move.workload in self.replacing.values():
            return  # asked again, or its replacement already under way
        self.begun.add((move.workload, move.cause))
        spec = self.s.spec(move.workload)
        group = spec.labels.get(DEPLOYMENT_LABEL) if spec is not None else None
        self.move_times.append((self.now, f"{TENANT}/{group}" if group else move.workload))
        if move.how != "replace" or move.workload not in self.slot or spec is None:
            return  # a restarted service: placed again by the same call, nothing to do
        slot = self.slot[move.workload]
        n = self.renamed[slot] = self.renamed.get(slot, 0) + 1
        new = dataclasses.replace(spec, name=f"d{slot[0]}-r{slot[1]}-m{n}")
        key = f"{TENANT}/{new.name}"
        self.slot[key] = slot
        self.standing[slot].add(key)
        self.replacing[key] = move.workload
        self.take(self.s.submit(new))

    def ready(self, key: str) -> None:
        """A replacement has served for its cold start: the old replica goes if its move is still
        wanted, else the replacement is the surplus and goes."""
        old = self.replacing.pop(key, None)
        if old is None or not self.s.knows(key) or not self.s.knows(old):
            return
        if old in self.s.moving:
            self.gone(old)
            self.moves_done += 1
        else:
            self.gone(key)
            self.moves_dropped += 1

    def cancel_unwanted(self) -> None:
        """Replacements still waiting whose move is no longer wanted are deleted."""
        wanted = self.s.moving
        for key, old in list(self.replacing.items()):
            if key not in self.placed and old not in wanted:
                del self.replacing[key]
                self.gone(key)
                self.moves_dropped += 1


def replay(trace: list[Arrival], gpus: int, policy: Policy, stop_late: bool = True) -> Replay:
    return Sim(trace, gpus, policy, stop_late).run()


@dataclass
class Tally:
    """What every replay of one policy on one stream added up to (the checks that must hold on
    every fleet tried, not only the one reported)."""

    replays: int = 0
    busy_destroyed: int = 0
    over_budget: int = 0
    moves: int = 0

    def add(self, r: Replay) -> Replay:
        self.replays += 1
        self.busy_destroyed += r.busy_destroyed
        self.over_budget += r.over_budget
        self.moves += r.moves
        return r


def gpus_needed(
    trace: list[Arrival], policy: Policy, low: int, tally: Tally
) -> tuple[int | None, Replay | None, str]:
    """The smallest fleet on which ``trace`` fits under ``policy`` (binary search from ``low``);
    None with the reason where none does."""
    never = never_placed(trace, policy)
    if never:
        return None, None, f"never ({never})"
    low = max(low, 1)
    cap = 16 * low
    hi = low
    while True:
        found = tally.add(replay(trace, hi, policy))
        if found.fits:
            break
        if hi >= cap:
            return None, None, f"> {cap}"
        low, hi = hi + 1, min(hi * 2, cap)
    best = (hi, found)
    while low < best[0]:
        mid = (low + best[0]) // 2
        r = tally.add(replay(trace, mid, policy))
        if r.fits:
            best = (mid, r)
        else:
            low = mid + 1
    return best[0], best[1], str(best[0])


# -- printing --------------------------------------------------------------------------------------


Column = tuple[str, str, int]


def table(rows: list[dict[str, object]], title: str, cols: list[Column]) -> str:
    out = [f"### {title}", "| " + " | ".join(h.ljust(w) for _, h, w in cols) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for _, _, w in cols) + "|")
    for r in rows:
        cells = []
        for key, _, w in cols:
            v = r.get(key, "")
            text = f"{v:.1f}" if isinstance(v, float) else str(v)
            cells.append(text.ljust(w) if key == "policy" else text.rjust(w))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


SMALL_COLS: list[Column] = [
    ("policy", "policy", 30),
    ("gpus", "GPUs needed", 11),
    ("bound", "lower bound", 11),
    ("vs", "vs one-per-workload", 19),
    ("shared", "shared", 6),
    ("created", "created", 7),
    ("busy_destroyed", "busy destroyed", 14),
    ("moves_h", "moves/h", 7),
    ("max_wait_s", "max wait s", 10),
]
MIXED_COLS: list[Column] = [
    ("policy", "policy", 30),
    ("gpus", "GPUs needed", 11),
    ("vs", "vs one-per-workload", 19),
    ("mean", "mean wait s", 11),
    ("p95", "p95 wait s", 10),
    ("late", "waited >60 s", 12),
    ("never", "never placed", 12),
    ("moves_h", "moves/h", 7),
    ("busy_destroyed", "busy destroyed", 14),
    ("budget", "moves in budget", 15),
]


def p95(waits: list[float]) -> float:
    if not waits:
        return 0.0
    ordered = sorted(waits)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


def vs(gpus: int | None, base: int | None) -> str:
    if gpus is None or base is None:
        return "n/a"
    return f"{(gpus - base) / base:+.0%}"


def mean_vs(gpus: list[object], base: list[object]) -> str:
    """The mean over seeds of each seed's change in GPUs against one instance per workload."""
    if None in gpus or None in base or len(gpus) != len(base):
        return "n/a"
    gains = [float(str(a)) / float(str(b)) - 1 for a, b in zip(gpus, base, strict=True)]
    return f"{statistics.fmean(gains):+.0%}"


def budget(policy: Policy, tally: Tally) -> str:
    if not policy.moves:
        return "-"
    return "yes" if not tally.over_budget else f"NO ({tally.over_budget} over)"


def small_stream(seeds: list[int], n: int, singles: bool, tallies: dict[str, Tally]) -> bool:
    """The small stream's GPUs-needed tables; whether the nesting target was met on every seed."""
    verdicts = []
    every: dict[str, list[dict[str, object]]] = {p.name: [] for p in POLICIES}
    for seed in seeds:
        trace = make_trace(seed, n, singles)
        bound, peak = lower_bound(trace)
        rows: list[dict[str, object]] = []
        needed: dict[str, int | None] = {}
        replays = 0
        for policy in POLICIES:
            tally = tallies.setdefault(f"small {policy.name}", Tally())
            before = tally.replays
            gpus, r, text = gpus_needed(trace, policy, bound, tally)
            replays += tally.replays - before
            needed[policy.name] = gpus
            row: dict[str, object] = {
                "policy": policy.name,
                "gpus": text,
                "bound": bound,
                "gpus_n": gpus,
                "busy_destroyed": tally.busy_destroyed,
            }
            if r is not None:
                row.update(
                    shared=r.shared,
                    created=r.created,
                    moves_h=round(r.moves / max(r.hours, 1e-9), 1),
                    max_wait_s=r.max_wait_s,
                )
            rows.append(row)
            every[policy.name].append(row)
        for row in rows:
            if "gpus_n" in row:
                row["vs"] = vs(needed[str(row["policy"])], needed.get(PER_WORKLOAD.name))
        print(
            table(
                rows,
                f"small stream, seed {seed}: {n} deployments over {trace[-1].at / 3600:.1f} h, "
                f"peak demand {peak / GIB:.0f} GiB, {replays} fleets replayed",
                SMALL_COLS,
            )
        )
        ours, base = needed.get(NESTING.name), needed.get(PER_WORKLOAD.name)
        verdicts.append(ours is not None and base is not None and ours <= (1 - TARGET) * base)
    if len(seeds) > 1:
        mean: list[dict[str, object]] = []
        for policy in POLICIES:
            mine = every[policy.name]
            numbers = [r for r in mine if isinstance(r.get("shared"), int)]
            if len(numbers) != len(seeds):
                mean.append({"policy": policy.name, "gpus": "never"})
                continue
            row = {
                "policy": policy.name,
                **{
                    k: round(statistics.fmean(float(str(r[k])) for r in mine), 1)
                    for k in ("gpus", "bound", "shared", "created", "moves_h")
                },
                "busy_destroyed": tallies[f"small {policy.name}"].busy_destroyed,
                "max_wait_s": max(float(str(r["max_wait_s"])) for r in mine),
            }
            row["vs"] = mean_vs(
                [r["gpus_n"] for r in mine], [r["gpus_n"] for r in every[PER_WORKLOAD.name]]
            )
            mean.append(row)
        print(table(mean, f"small stream, mean over seeds {','.join(map(str, seeds))}", SMALL_COLS))
    return all(verdicts)


def mixed_stream(
    seeds: list[int], hours: float, fleet: int | None, singles: bool, tallies: dict[str, Tally]
) -> list[bool]:
    """The mixed stream's tables; per seed, whether policy 5 had the lowest mean wait."""
    verdicts = []
    every: dict[str, list[dict[str, object]]] = {p.name: [] for p in POLICIES}
    for seed in seeds:
        trace = make_mixed(seed, hours, singles)
        bound, peak = lower_bound(trace)
        needed: dict[str, int | None] = {}
        texts: dict[str, str] = {}
        for policy in POLICIES:
            tally = tallies.setdefault(f"mixed {policy.name}", Tally())
            needed[policy.name], _, texts[policy.name] = gpus_needed(trace, policy, bound, tally)
        size = fleet if fleet is not None else bound
        rows: list[dict[str, object]] = []
        means: dict[str, float] = {}
        for policy in POLICIES:
            tally = tallies[f"mixed {policy.name}"]
            r = tally.add(replay(trace, size, policy, stop_late=False))
            means[policy.name] = statistics.fmean(r.waits) if r.waits else 0.0
            row: dict[str, object] = {
                "policy": policy.name,
                "gpus": texts[policy.name],
                "gpus_n": needed[policy.name],
                "vs": vs(needed[policy.name], needed.get(PER_WORKLOAD.name)),
                "mean": means[policy.name],
                "p95": p95(r.waits),
                "late": r.late,
                "never": r.never,
                "moves_h": round(r.moves / max(r.hours, 1e-9), 1),
                "busy_destroyed": tally.busy_destroyed,
                "budget": budget(policy, tally),
                "moves_done": r.moves_done,
                "moves_dropped": r.moves_dropped,
            }
            rows.append(row)
            every[policy.name].append(row)
        kinds = {k: sum(d.replicas for d in trace if d.kind == k) for k in MIXED_SHARES}
        where = (
            "set by --fleet"
            if fleet is not None
            else "the lower bound: the fewest whose memory holds the peak demand"
        )
        print(
            table(
                rows,
                f"mixed stream, seed {seed}: {len(trace)} arrivals over "
                f"{trace[-1].at / 3600:.1f} h "
                f"({kinds['small']} small replicas, {kinds['large']} large replicas, "
                f"{kinds['job']} jobs), peak demand {peak / GIB:.0f} GiB, lower bound {bound} "
                f"GPUs; waits on {size} GPUs ({where})",
                MIXED_COLS,
            )
        )
        moved = next((r for r in rows if r["policy"] == MOVING.name and "mean" in r), None)
        if moved is not None:
            print(
                f"moves on {size} GPUs: {moved['moves_done']} finished (old replica deleted once "
                f"its replacement served), {moved['moves_dropped']} no longer wanted "
                f"(replacement deleted)\n"
            )
        if MOVING.name in means:
            others = [m for name, m in means.items() if name != MOVING.name]
            verdicts.append(means[MOVING.name] <= min(others))
    if len(seeds) > 1:
        mean: list[dict[str, object]] = []
        for policy in POLICIES:
            mine = every[policy.name]
            gpus = [r["gpus_n"] for r in mine]
            base = [r["gpus_n"] for r in every[PER_WORKLOAD.name]]
            avg: dict[str, object] = {
                "policy": policy.name,
                "gpus": (
                    f"{statistics.fmean(float(str(g)) for g in gpus):.1f}"
                    if None not in gpus
                    else "never"
                ),
                "vs": mean_vs(gpus, base),
                **{
                    k: round(statistics.fmean(float(str(r[k])) for r in mine), 1)
                    for k in ("mean", "p95", "late", "never", "moves_h")
                },
                "busy_destroyed": tallies[f"mixed {policy.name}"].busy_destroyed,
                "budget": budget(policy, tallies[f"mixed {policy.name}"]),
            }
            mean.append(avg)
        print(table(mean, f"mixed stream, mean over seeds {','.join(map(str, seeds))}", MIXED_COLS))
    return verdicts


# -- moves on a real agent: requests lost ---------------------------------------------------------

LIVE_BODY = b'{"inputs": [1, 2, 3]}'
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _live_doc(kind: str, name: str, spec: str) -> str:
    return f"apiVersion: gpufrac/v1\nkind: {kind}\nmetadata: {{name: {name}}}\nspec:\n{spec}"


def _live_round(clients: int) -> dict[str, float]:
    """One move on a real agent (two simulated H100s in MIG mode): a model replica on GPU 0 is in
    the way of a 7g.80gb (GPU 1 holds a job), under ``clients`` closed-loop clients through the
    gateway from before the 7g.80gb is applied until 2 s after it runs. Returns the requests sent
    and failed, and seconds from the apply to the 7g.80gb running."""
    import asyncio
    import signal
    import socket
    import subprocess
    import tempfile
    import threading

    import httpx

    from gpufrac.cli.serve_cmds import run_load

    def free() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    port, gateway = free(), free()
    data = tempfile.mkdtemp(prefix="gpufrac-moves-")
    env = {**os.environ, "GPUFRAC_SIMULATE": "h100:2:mig", "GPUFRAC_DATA_DIR": data}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpufrac.cli",
            "agent",
            "--port",
            str(port),
            "--gateway-port",
            str(gateway),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    c = httpx.Client(timeout=30)

    def until(check: Callable[[], bool], what: str, limit: float = 90.0) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}")

    def phase(name: str) -> str:
        return str(c.get(f"{url}/api/v1/workloads/default/{name}").json()["phase"])

    def post(path: str, text: str) -> None:
        r = c.post(url + path, content=text)
        if r.status_code != 200:
            raise RuntimeError(r.text)

    def job(name: str, profile: str) -> str:
        spec = f"  command: [sleep, '600']\n  resources: {{gpu: {{mig: {profile}}}}}\n"
        return _live_doc("Workload", name, spec)

    try:
        until(lambda: c.get(url + "/api/v1/health").status_code == 200, "the agent")
        post(
            "/api/v1/deployments",
            _live_doc(
                "Deployment",
                "web",
                "  replicas: 1\n  template:\n    model: examples.serving.models:echo_sum\n"
                f"    workdir: {ROOT}\n    resources: {{gpu: {{mig: 1g.10gb}}}}\n",
            ),
        )
        until(
            lambda: bool(c.get(url + "/api/v1/deployments/default/web").json()["replicas_ready"]),
            "a ready replica",
        )
        for name, profile in (("fill", "4g.40gb"), ("fill2", "2g.20gb"), ("train", "1g.10gb")):
            post("/api/v1/workloads", job(name, profile))
        for name in ("fill", "fill2"):  # idle instances stay; the replica is in the way
            c.delete(f"{url}/api/v1/workloads/default/{name}")
        until(lambda: phase("train") == "running", "the job")
        done = threading.Event()
        rows: list[list[dict[str, float]]] = []
        load = threading.Thread(
            target=lambda: rows.append(
                asyncio.run(
                    run_load(
                        f"http://127.0.0.1:{gateway}/serve/web/predict",
                        LIVE_BODY,
                        [clients] * 120,
                        1.0,
                        lambda n, got: None,
                        stop_when=lambda _records: done.is_set(),
                    )
                )
            )
        )
        load.start()
        time.sleep(2.0)
        applied = time.monotonic()
        post("/api/v1/workloads", job("big", "7g.80gb"))
        until(lambda: phase("big") == "running", "the 7g.80gb running")
        took = time.monotonic() - applied
        time.sleep(2.0)
        done.set()
        load.join(timeout=60)
        sent = sum(r["requests"] for r in rows[0]) if rows else 0
        failed = sum(r["non_2xx"] for r in rows[0]) if rows else 0
        return {"sent": sent, "failed": failed, "seconds": took}
    finally:
        for path in (
            "/api/v1/deployments/default/web",
            *(f"/api/v1/workloads/default/{n}" for n in ("big", "train")),
        ):
            with contextlib.suppress(httpx.HTTPError):
                c.delete(url + path)
        with contextlib.suppress(RuntimeError):  # every run gone before the agent goes
            until(lambda: not c.get(url + "/api/v1/workloads").json()["workloads"], "clean-up", 30)
        c.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)


def live_moves(rounds: int, clients: int = 4) -> bool:
    """``rounds`` moves on a real agent under traffic; printed; whether no request was lost."""
    rows: list[dict[str, object]] = []
    for i in range(rounds):
        got = _live_round(clients)
        rows.append(
            {
                "round": i + 1,
                "requests": int(got["sent"]),
                "failed": int(got["failed"]),
                "seconds": round(got["seconds"], 2),
            }
        )
    cols: list[Column] = [
        ("round", "round", 5),
        ("requests", "requests through the gateway", 28),
        ("failed", "failed (not 2xx)", 16),
        ("seconds", "7g.80gb applied to running, s", 29),
    ]
    title = (
        "moves on a real agent (two simulated H100s in MIG mode): a model replica moved under "
        f"{clients} closed-loop clients through the gateway, {rounds} rounds"
    )
    print(table(rows, title, cols))
    return all(r["failed"] == 0 for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--deployments", type=int, default=400, help="of the small stream")
    ap.add_argument("--hours", type=float, default=7.0, help="of the mixed stream's arrivals")
    ap.add_argument("--fleet", type=int, help="GPUs the mixed stream's waits are measured on")
    ap.add_argument("--quick", action="store_true", help="one seed, 120 deployments, 3 h mixed")
    ap.add_argument("--singles", action="store_true", help="every small deployment one replica")
    ap.add_argument(
        "--live-rounds", type=int, default=3, help="moves on a real agent under traffic (0: none)"
    )
    args = ap.parse_args()
    seeds = [1] if args.quick else [int(x) for x in args.seeds.split(",")]
    n = 120 if args.quick else args.deployments
    hours = 3.0 if args.quick else args.hours
    started = time.monotonic()
    small = sum(w for (m, p), w in MIX.items() if memory_mib(m, p) * 2 <= 9984)
    print(
        f"## Consolidation on simulated H100-80GB (MIG), simulated time, the real scheduler; "
        f"at most {WAIT_LIMIT_S:.0f} s waiting for GPUs needed\n\n"
        f"small stream: {n} small inference deployments per seed, {CONCURRENT} alive at once on "
        f"average, lifetimes lognormal (median {MEDIAN_S / 60:.0f} min), "
        f"{'1 replica each' if args.singles else '1-3 replicas each, started together'}; "
        f"{small:.0%} of the mix is at most half a 1g.10gb\n"
        f"mixed stream: {hours:g} h of arrivals per seed, "
        + ", ".join(f"{v:.0%} {k}" for k, v in MIXED_SHARES.items())
        + f", {MIXED_CONCURRENT} alive at once on average; jobs run "
        f"{JOB_MIN_S / 60:.0f}-{JOB_MAX_S / 60:.0f} min (median {JOB_MEDIAN_S / 60:.0f}) from "
        f"placement; static layout {','.join(map(str, STATIC_LAYOUT))}\n"
    )
    sizes = sorted({(memory_mib(m, p), f"{m} {p}") for m, p in MIX})
    print("small sizes: " + ", ".join(f"{name} {mib / GIB:.2f}GiB" for mib, name in sizes))
    large = sorted(
        (memory_mib(m, p), f"{m} {p}" + (f" compute {c}%" if c else "")) for m, p, c in LARGE
    )
    print("large sizes: " + ", ".join(f"{name} {mib / GIB:.2f}GiB" for mib, name in large))
    print("jobs: " + ", ".join(f"{j.name} {j.profile}" for j in JOBS))
    print(
        'GPUs needed "never (N)": N workloads of the stream need what no GPU could ever give them '
        "under that policy (a profile the static layout lacks); they wait to the end\n"
    )
    tallies: dict[str, Tally] = {}
    small_met = small_stream(seeds, n, args.singles, tallies)
    moved = mixed_stream(seeds, hours, args.fleet, args.singles, tallies)
    busy = {k: t.busy_destroyed for k, t in tallies.items() if t.busy_destroyed}
    over = sum(t.over_budget for t in tallies.values())
    moves = sum(t.moves for k, t in tallies.items() if MOVING.name in k)
    replays = sum(t.replays for t in tallies.values())

    def met(ok: bool) -> str:
        return "met" if ok else "MISSED"

    print("targets:")
    print(
        f"- gpufrac with nesting needs at least {TARGET:.0%} fewer GPUs than one instance per "
        f"workload on the small stream, every seed: {met(small_met)}"
    )
    print(
        f"- gpufrac with nesting and moves has the lowest mean wait of every policy on the "
        f"mixed stream: {met(all(moved))} on {sum(moved)} of {len(moved)} seed(s)"
    )
    budget = OperatorSettings()
    print(
        f"- moves within the budget ({budget.max_moves_per_minute} a minute, "
        f"{budget.max_moves_per_workload_per_hour} of one deployment an hour), every replay: "
        f"{met(not over)} ({moves} moves begun, {over} past the budget)"
    )
    print(
        f"- 0 busy instances destroyed, every policy, every replay ({replays} replays): "
        f"{met(not busy)}" + (f" ({busy})" if busy else "")
    )
    if args.live_rounds:
        lost_none = live_moves(args.live_rounds)
        print(
            f"- 0 requests lost to moves (a real agent, {args.live_rounds} moves under traffic): "
            f"{met(lost_none)}"
        )
    print(f"whole benchmark {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
