"""MIG planner benchmark: GPUs used against the exact optimum, a lower bound, first-fit-decreasing
and static mig-parted layouts; then churn with half the instances busy. Pure planning, no devices.

Run: .venv/bin/python bench/mig_planner.py [--quick]
Every number is measured in this run; the optimum and the LP bound come from an integer program over
all per-GPU patterns (scipy's HiGHS), first-fit-decreasing and the static layouts are implemented
here.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from gpufrac.model.catalog import GpuModel, lookup_model
from gpufrac.model.gpu import MigInstanceState
from gpufrac.model.mig import MigPlacement, check_layout
from gpufrac.planning.demand import DemandClass, ResolvedClass, resolve_demand
from gpufrac.planning.mig_planner import PlanGpu, PlanOptions, plan_mig
from gpufrac.planning.patterns import geometry

H200, H100, A100 = lookup_model("h200"), lookup_model("h100"), lookup_model("a100-80gb")


@dataclass
class Case:
    name: str
    fleet: list[GpuModel]
    classes: list[DemandClass]
    opt_unplaced_value: float = 0.0
    unplaced_value: float = 0.0
    per_model: str = ""

    def resolved(self) -> list[ResolvedClass]:
        return resolve_demand(self.classes, {m.key: m for m in self.fleet}.values())


# -- demand generators ----------------------------------------------------------------------------

PROFILE_MIXES = {
    "small": {"1g.18gb": 6, "1g.35gb": 3, "2g.35gb": 2, "3g.71gb": 1},
    "balanced": {"1g.18gb": 3, "2g.35gb": 2, "3g.71gb": 2},
    "large": {"1g.18gb": 2, "2g.35gb": 2, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1},
}
NEEDS_GIB = [8, 12, 16, 20, 30, 40, 60, 70, 90]


def profile_case(rng: random.Random, n_gpus: int, mix: str, load: float) -> Case:
    if mix == "mixed":  # random proportions of the profiles a static all-balanced layout has
        weights = {p: rng.uniform(0.1, 1.0) for p in ("1g.18gb", "2g.35gb", "3g.71gb")}
    else:
        weights = PROFILE_MIXES[mix]
    geo = geometry(H200)
    budget = n_gpus * 8 * load  # memory slots to fill
    counts: Counter[str] = Counter()
    while budget > 0:
        name = rng.choices(list(weights), weights=list(weights.values()))[0]
        counts[name] += 1
        budget -= H200.profile(name).memory_slots
    _ = geo
    classes = [DemandClass(label=k, count=v, profile=k) for k, v in sorted(counts.items())]
    return Case(f"H200 x{n_gpus} {mix} by profile", [H200] * n_gpus, classes)


def need_case(rng: random.Random, fleet: list[GpuModel], load: float) -> Case:
    budget = sum(m.memory_total_mib for m in fleet) * load / 1024  # GiB
    counts: Counter[int] = Counter()
    while budget > 0:
        gib = rng.choice(NEEDS_GIB)
        counts[gib] += 1
        budget -= gib * 1.6  # needs round up to profiles: leave room
    classes = [
        DemandClass(label=f"{g}GiB", count=c, memory_mib=g * 1024)
        for g, c in sorted(counts.items())
    ]
    per = Counter(m.key.split("-")[0] for m in fleet)
    return Case(f"mixed {dict(per)} by need", fleet, classes)


def mixed_fleet(n: int) -> list[GpuModel]:
    a, b = n * 3 // 8, n * 3 // 8
    return [H200] * a + [H100] * b + [A100] * (n - a - b)


# -- planners under test --------------------------------------------------------------------------


def run_gpufrac(case: Case) -> tuple[int, float, int, float]:
    gpus = [PlanGpu(f"GPU-{i}", i, m) for i, m in enumerate(case.fleet)]
    t = time.perf_counter()
    plan = plan_mig(gpus, case.resolved())
    dt = time.perf_counter() - t
    case.unplaced_value = plan.summary["unplaced_value"]
    case.per_model = ", ".join(
        f"{k.split('-')[0]} {v}" for k, v in plan.summary["gpus_used_by_model"].items()
    )
    for g, pg in zip(gpus, plan.gpus, strict=True):
        assert check_layout(g.model, pg.instances) == [], pg
    return plan.summary["gpus_used"], plan.summary["cost"], plan.summary["unplaced"], dt


def run_ffd(case: Case) -> tuple[int, float, int]:
    """First-fit-decreasing with real placements: biggest instances first, first GPU and start that
    fit."""
    items = []
    for c in case.resolved():
        items += [c] * c.count
    items.sort(key=lambda c: -c.value)
    layouts: list[list[MigPlacement]] = [[] for _ in case.fleet]
    first_try: dict[
        tuple[str, str], int
    ] = {}  # a GPU that had no room for a profile never gets room
    unplaced = 0
    for c in items:
        placed = False
        for model_key, prof_name in c.options.items():
            start_gpu = first_try.get((model_key, prof_name), 0)
            for gi in range(start_gpu, len(case.fleet)):
                model = case.fleet[gi]
                if model.key != model_key:
                    continue
                prof = model.profile(prof_name)
                for s in prof.placement_starts:
                    trial = (*layouts[gi], MigPlacement(s, prof.name))
                    if not check_layout(model, tuple(sorted(trial))):
                        layouts[gi].append(MigPlacement(s, prof.name))
                        placed = True
                        break
                if placed:
                    break
                first_try[(model_key, prof_name)] = gi + 1
            if placed:
                break
        unplaced += not placed
    used = [m for m, lay in zip(case.fleet, layouts, strict=True) if lay]
    return len(used), float(sum(m.memory_total_mib for m in used)), unplaced


STATIC = {
    "all-1g": {
        "H200-141GB": {"1g.18gb": 7},
        "H100-80GB": {"1g.10gb": 7},
        "A100-80GB": {"1g.10gb": 7},
    },
    "all-balanced": {
        "H200-141GB": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
        "H100-80GB": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        "A100-80GB": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
    },
}


def run_static(case: Case, layout_name: str) -> tuple[int, int]:
    """GPUs a static layout needs for the demand (as many GPUs as it takes, models in the fleet's
    proportions), and what it can never place.

    An item takes an instance of exactly its profile (by profile) or the smallest instance with
    enough memory and compute (by need)."""
    remaining = []
    for c in case.resolved():
        remaining += [c] * c.count
    by_profile = case.classes[0].profile is not None
    used = 0
    models = list(case.fleet)
    idle_streak = 0
    while remaining and idle_streak < len(models):
        model = (
            models[used % len(models)]
            if idle_streak == 0
            else models[(used + idle_streak) % len(models)]
        )
        slots = []
        for name, n in STATIC[layout_name][model.key].items():
            slots += [model.profile(name)] * n
        took = False
        for prof in sorted(slots, key=lambda p: p.memory_mib or 0):
            for i, c in enumerate(remaining):
                if model.key not in c.options:
                    continue
                want = model.profile(c.options[model.key])
                if by_profile:
                    ok = prof.name == want.name
                else:
                    ok = (prof.memory_mib or 0) >= (
                        want.memory_mib or 0
                    ) and prof.compute_slices >= want.compute_slices
                if ok:
                    remaining.pop(i)
                    took = True
                    break
        if took:
            used += 1
            idle_streak = 0
        else:
            idle_streak += 1
    return used, len(remaining)


# -- the integer program: exact optimum (integral) and LP bound (relaxed) --------------------------


def solve_ip(
    case: Case, integral: bool, time_limit: float = 20.0
) -> tuple[float, float, int, bool]:
    """(cost, gpus, unplaced items, proven optimal) for: place as much value as possible, then least
    cost."""
    classes = case.resolved()
    models = {m.key: m for m in case.fleet}
    avail = Counter(m.key for m in case.fleet)
    cols: list[tuple[str, tuple[int, ...]]] = []
    for key, model in models.items():
        cols += [(key, counts) for counts in geometry(model).patterns if any(counts)]
    ycols = [(ci, key) for ci, c in enumerate(classes) for key in c.options]
    nx, ny = len(cols), len(ycols)
    cost = np.array([models[k].memory_total_mib for k, _ in cols] + [0.0] * ny)
    value = np.array([0.0] * nx + [classes[ci].value for ci, _ in ycols])
    fleet_cost = sum(models[k].memory_total_mib * n for k, n in avail.items())
    big = (fleet_cost + 1) / min(c.value for c in classes)  # one MiB placed outweighs any cost
    obj = cost - big * value
    rows, lo, hi = [], [], []
    for key, n in avail.items():  # GPUs per model
        rows.append([1.0 if k == key else 0.0 for k, _ in cols] + [0.0] * ny)
        lo.append(0)
        hi.append(n)
    for ci, c in enumerate(classes):  # at most the demand
        rows.append([0.0] * nx + [1.0 if yc == ci else 0.0 for yc, _ in ycols])
        lo.append(0)
        hi.append(c.count)
    for key, model in models.items():  # served by instances of the right profile
        geo = geometry(model)
        for q in range(len(model.profiles)):
            row = [-(counts[q]) if k == key else 0.0 for k, counts in cols]
            row += [
                1.0 if (k == key and geo.index(classes[ci].options[k]) == q) else 0.0
                for ci, k in ycols
            ]
            if any(row[nx:]):
                rows.append(row)
                lo.append(-np.inf)
                hi.append(0)
    res = milp(
        obj,
        constraints=LinearConstraint(np.array(rows), lo, hi),
        integrality=np.ones(nx + ny) if integral else np.zeros(nx + ny),
        bounds=Bounds(0, np.inf),
        options={"time_limit": time_limit, "disp": False, "mip_rel_gap": 0.0},
    )
    x = res.x
    placed = sum(x[nx + j] for j in range(ny))
    total = sum(c.count for c in classes)
    unplaced_value = sum(c.value * c.count for c in classes) - float(value[nx:] @ x[nx:])
    case.opt_unplaced_value = unplaced_value
    return float(cost[:nx] @ x[:nx]), float(sum(x[:nx])), round(total - placed), res.status == 0


def simple_bound(case: Case) -> int:
    """GPUs at least needed on an H200-only fleet: memory slots, compute slices, per-profile maxima,
    7g."""
    slots = compute = 0
    per: Counter[str] = Counter()
    whole = 0
    for c in case.resolved():
        prof = H200.profile(c.options[H200.key])
        slots += prof.memory_slots * c.count
        compute += prof.compute_slices * c.count
        per[prof.name] += c.count
        whole += c.count if prof.memory_slots == 8 else 0
    by_max = max((math.ceil(n / H200.profile(p).max_instances) for p, n in per.items()), default=0)
    big = per["4g.71gb"] + per["7g.141gb"]
    return max(
        math.ceil(slots / 8),
        math.ceil(compute / 7),
        by_max,
        big,
        whole + math.ceil((slots - 8 * whole) / 8),
    )


# -- churn -----------------------------------------------------------------------------------------


def churn(case: Case, rng: random.Random) -> dict[str, float]:
    gpus = [PlanGpu(f"GPU-{i}", i, m) for i, m in enumerate(case.fleet)]
    first = plan_mig(gpus, case.resolved())
    current = []
    n_inst = 0
    for g, pg in zip(gpus, first.gpus, strict=True):
        insts = tuple(
            MigInstanceState(
                p.profile, p.start, gi_id=k + 1, uuid=None, busy=rng.random() < 0.5, ci_ids=(0,)
            )
            for k, p in enumerate(pg.instances)
        )
        n_inst += len(insts)
        current.append(PlanGpu(g.uuid, g.index, g.model, insts))
    # shift 10% of the instances asked for, net: from one half of the classes to the other half
    counts = {c.label: c.count for c in case.classes}
    total = sum(counts.values())
    labels = sorted(counts)
    rng.shuffle(labels)
    givers, takers = labels[: len(labels) // 2], labels[len(labels) // 2 :]
    moved = 0
    while moved < total // 10 and any(counts[g] for g in givers):
        src = rng.choice([g for g in givers if counts[g]])
        counts[src] -= 1
        counts[rng.choice(takers)] += 1
        moved += 1
    shifted = [
        DemandClass(c.label, counts[c.label], c.profile, c.model, c.memory_mib, c.compute_slices)
        for c in case.classes
    ]
    classes = resolve_demand(shifted, {m.key: m for m in case.fleet}.values())
    t = time.perf_counter()
    plan = plan_mig(current, classes, PlanOptions())
    dt = time.perf_counter() - t
    s = plan.summary
    return {
        "instances": n_inst,
        "shifted": moved,
        "destroyed": s["destroyed"],
        "created": s["created"],
        "busy_destroyed": s["busy_destroyed"],
        "changed_pct": 100.0 * s["destroyed"] / max(1, n_inst),
        "unplaced": s["unplaced"],
        "seconds": dt,
    }


# -- the report ------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer cases (for a fast look)")
    args = ap.parse_args()
    rng = random.Random(20261130)
    n8 = 12 if args.quick else 40
    print(
        "## 8-GPU fleets: gpufrac against the exact optimum (integer program over all patterns)\n"
    )
    print(
        "| case | demand items | optimum GPUs (cost) | gpufrac GPUs (cost) | FFD GPUs | "
        "unplaced opt/gpufrac | match |"
    )
    print("|---|---|---|---|---|---|---|")
    matches = proven = 0
    for k in range(n8):
        if k % 2 == 0:
            case = profile_case(
                rng, 8, ["small", "balanced", "large"][k % 3], rng.uniform(0.5, 1.05)
            )
        else:
            case = need_case(rng, [H200] * 3 + [H100] * 3 + [A100] * 2, rng.uniform(0.4, 0.9))
        ocost, ogpus, ounpl, ok = solve_ip(case, integral=True)
        gused, gcost, gunpl, _ = run_gpufrac(case)
        fused, _, _ = run_ffd(case)
        # the objective: least unplaced value (MiB asked for), then least cost
        match = (case.unplaced_value, gcost) <= (case.opt_unplaced_value + 1e-6, ocost + 1e-6)
        matches += match
        proven += ok
        items = sum(c.count for c in case.classes)
        print(
            f"| {case.name} #{k} | {items} | {ogpus:.0f} ({ocost:,.0f}) | {gused} "
            f"({gcost:,.0f}) | {fused} | {ounpl}/{gunpl} | {'yes' if match else 'NO'} |"
        )
    share = 100.0 * matches / n8
    print(
        f"\noptimum matched on {matches}/{n8} cases = {share:.0f}% (target >= 95%); "
        f"optimality proven by the solver on {proven}/{n8}\n"
    )

    print(
        "## 100 and 1,000 GPUs: against the LP lower bound, first-fit-decreasing and "
        "static layouts\n"
    )
    print(
        "| case | items | bound | gpufrac | ratio | FFD | all-1g GPUs (never placed) | "
        "all-balanced GPUs (never placed) | plan time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ratios: dict[int, list[float]] = {100: [], 1000: []}
    worse_than_ffd = 0
    static_gain: dict[str, list[float]] = {"mixed": [], "balanced": []}
    times: list[float] = []
    kinds = ["small", "need", "mixed", "balanced"]
    if not args.quick:
        kinds += ["large", "mixed", "need", "mixed"]
    for n in (100, 1000):
        for kind in kinds:
            if kind != "need":
                case = profile_case(rng, n, kind, 0.85)
                lp_cost, lp_gpus, _, _ = solve_ip(case, integral=False)
                bound = max(simple_bound(case), math.ceil(lp_gpus - 1e-6))
                metric_g = None
            else:
                case = need_case(rng, mixed_fleet(n), 0.6)
                lp_cost, lp_gpus, _, _ = solve_ip(case, integral=False)
                bound = lp_cost
            gused, gcost, gunpl, dt = run_gpufrac(case)
            fused, fcost, funpl = run_ffd(case)
            s1, u1 = run_static(case, "all-1g")
            s2, u2 = run_static(case, "all-balanced")
            times.append(dt)
            if kind != "need":
                ratio = gused / bound
                metric_g, metric_f = gused, fused
                shown = (f"{bound}", f"{gused} ({gunpl} unplaced)", f"{fused} ({funpl} unplaced)")
            else:
                ratio = gcost / bound
                metric_g, metric_f = int(gcost), int(fcost)
                shown = (
                    f"cost {bound:,.0f}",
                    f"cost {gcost:,.0f} ({case.per_model}; {gunpl} unplaced)",
                    f"cost {fcost:,.0f} ({funpl} unplaced)",
                )
            ratios[n].append(ratio)
            worse_than_ffd += metric_g > metric_f or gunpl > funpl
            best_static = min((s for s, u in ((s1, u1), (s2, u2)) if u == 0), default=None)
            if best_static is not None and kind in static_gain:
                static_gain[kind].append(100.0 * (best_static - gused) / best_static)
            items = sum(c.count for c in case.classes)
            print(
                f"| {case.name} | {items} | {shown[0]} | {shown[1]} | {ratio:.3f} | "
                f"{shown[2]} | {s1} ({u1}) | {s2} ({u2}) | {dt * 1000:.0f} ms |"
            )
    print()
    for n, rs in ratios.items():
        print(
            f"{n} GPUs: mean ratio to bound {statistics.mean(rs):.4f} (target <= 1.03), "
            f"worst {max(rs):.4f}"
        )
    print(f"cases where gpufrac is worse than first-fit-decreasing: {worse_than_ffd} (target 0)")
    for kind, gains in static_gain.items():
        if not gains:
            continue
        what = (
            "random 1g/2g/3g proportions" if kind == "mixed" else "all-balanced's own proportions"
        )
        goal = "(target >= 20%)" if kind == "mixed" else "(the static layout's best case)"
        print(
            f"GPUs saved against the best static layout, {kind} demand ({what}): "
            f"mean {statistics.mean(gains):.0f}%, min {min(gains):.0f}% {goal}"
        )
    print(f"slowest plan: {max(times):.3f} s (target < 2 s for 1,000 GPUs)\n")

    print("## Churn: 10% of the demand shifted, half the instances busy\n")
    print(
        "| case | instances | shifted | destroyed | created | busy destroyed | changed | "
        "unplaced | time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for n in (100, 1000):
        for mix in ("small", "balanced"):
            case = profile_case(rng, n, mix, 0.8)
            c = churn(case, rng)
            worst = max(worst, c["changed_pct"])
            print(
                f"| {case.name} | {c['instances']:.0f} | {c['shifted']:.0f} | "
                f"{c['destroyed']:.0f} | {c['created']:.0f} | {c['busy_destroyed']:.0f} | "
                f"{c['changed_pct']:.1f}% | {c['unplaced']:.0f} | "
                f"{c['seconds'] * 1000:.0f} ms |"
            )
    print(
        f"\nworst share of instances changed: {worst:.1f}% (target < 15%); busy instances "
        "destroyed must be 0"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
