"""Co-location benchmark: a latency-critical inference process beside a trainer on one GPU.

Each cell runs real processes side by side; all cells in one run, so the solo numbers they are
compared with are measured in the same run:

* solo: the trainer, ResNet-50 inference (infer-R) and transformer inference (infer-T), each alone;
* each inference model beside the trainer under native time-slicing, MPS, MPS with the trainer at
  client priority 1, and gpufrac (the QoS arbiter: inference as a high-priority latency workload
  taking a turn per request, the trainer as a throughput workload taking a turn per step, with yield
  points at module boundaries);
* two trainers: native time-slicing, gpufrac at weights 1:1 and 3:1, and a low-priority trainer with
  ``min_share: 10%`` beside a high-priority one.

Inference: seeded Poisson arrivals (``--periodic``: fixed intervals, like the baseline file), open
loop, latency from the scheduled arrival to completion (queueing included). The models and rates are
those of ``shared/reference/h200/colocation-baseline.md``. Each cell measures back-to-back windows
(3 for solo, native and gpufrac cells, 1 for the others; ``--quick``: 1 short window each, a subset
of cells); the table shows the median over windows and the spread (max - min).

``--dry-run`` runs the same processes, arbiter and SDK on the CPU with spin-loop "models" (an
inference request of 2 ms, a training step of 8 modules of 1 ms): it checks the code path, not GPU
behaviour; MPS cells are skipped there. Without a GPU the benchmark runs as ``--dry-run``.

Run: python bench/colocation.py [--quick | --dry-run] [--periodic] [--json PATH]
The same file is the worker (``--worker infer|train``), started by the benchmark itself.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
if SRC.is_dir() and str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

INTERVAL_MS = {"R": 20.0, "T": 25.0}  # mean time between requests, as in the baseline file
HIGH, LOW = 100, 0  # priorities

# -- workers --------------------------------------------------------------------------------------


def _resnet50(torch: Any) -> Any:
    """ResNet-50 (bottleneck blocks 3-4-6-3), random weights: torchvision is not needed."""
    nn = torch.nn

    class Bottleneck(nn.Module):  # type: ignore[misc]
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout),
            )  # fmt: skip
            self.skip = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x: Any) -> Any:
            return torch.relu(self.body(x) + self.skip(x))

    layers: list[Any] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
    ]  # fmt: skip
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def build_infer(kind: str, dry: bool) -> Callable[[], None]:
    """One request: GPU work, finished (synchronized) when the call returns."""
    if dry:
        return lambda: _spin(0.002)
    import torch

    torch.backends.cudnn.benchmark = True
    with torch.inference_mode():
        if kind == "R":
            model = _resnet50(torch).cuda().half().eval().to(memory_format=torch.channels_last)
            x = torch.randn(16, 3, 224, 224, device="cuda").half()
            x = x.to(memory_format=torch.channels_last)
        else:
            layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True)
            model = torch.nn.TransformerEncoder(layer, 24, enable_nested_tensor=False)
            model = model.cuda().half().eval()
            x = torch.randn(32, 128, 1024, device="cuda").half()

    def run() -> None:
        with torch.inference_mode():
            model(x)
        torch.cuda.current_stream().synchronize()

    return run


def build_train(dry: bool, qos: bool) -> Callable[[], None]:
    """One training step (``loss.item()`` at the end, so one step in flight)."""
    if dry:
        from gpufrac.sdk.turns import current_turn

        def step() -> None:
            for _ in range(8):  # 8 "modules", a yield point before each, as the hooks give
                turn = current_turn()
                if turn is not None:
                    turn.checkpoint()
                _spin(0.001)

        return step
    import torch

    layers: list[Any] = []
    for _ in range(8):
        layers += [torch.nn.Linear(8192, 8192), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).cuda().to(torch.bfloat16)
    if qos:
        from gpufrac.sdk.torch_turns import yield_points

        yield_points(model, [m for m in model if isinstance(m, torch.nn.Linear)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x = torch.randn(2048, 8192, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        loss.item()

    return step


def worker(args: argparse.Namespace) -> None:
    """Warm up, say ``ready``, wait for ``go T0``, measure ``windows`` windows, print one JSON
    line."""
    qos = bool(os.environ.get("GPUFRAC_ARBITER"))
    plain = (
        build_infer(args.model, args.dry_run)
        if args.worker == "infer"
        else build_train(args.dry_run, qos)
    )

    def work() -> None:
        if not qos:
            plain()
            return
        from gpufrac.sdk.turns import gpu_turn

        with gpu_turn():  # one request, or one training step
            plain()

    for _ in range(3 if args.dry_run else 10):
        work()
    print("ready", flush=True)
    t0 = float(sys.stdin.readline().split()[1])
    n, length = args.windows, args.window
    if args.worker == "train":
        steps = [0] * n
        while time.time() < t0:
            work()
        end = t0 + n * length + args.tail
        while time.time() < end:
            work()
            k = int((time.time() - t0) // length)
            if 0 <= k < n:
                steps[k] += 1
        print(json.dumps({"it_s": [s / length for s in steps]}), flush=True)
        return
    rng = random.Random(args.seed)
    mean = INTERVAL_MS[args.model] / 1000
    arrivals: list[float] = []
    t = t0
    while t < t0 + n * length:
        arrivals.append(t)
        t += mean if args.periodic else rng.expovariate(1 / mean)
    lat: list[list[float]] = [[] for _ in range(n)]
    for at in arrivals:
        wait = at - time.time()
        if wait > 0:
            time.sleep(wait)
        work()
        lat[int((at - t0) // length)].append((time.time() - at) * 1000)
    print(json.dumps({"lat_ms": lat}), flush=True)


# -- the benchmark --------------------------------------------------------------------------------


@dataclass
class Cell:
    name: str
    infer: str | None  # R | T | None
    trainers: int  # 0, 1 or 2
    mode: str  # solo | native | mps | mps-prio | gpufrac
    repeats: int
    weights: tuple[int, int] = (1, 1)
    min_share: bool = False
    result: dict[str, Any] = field(default_factory=dict)


def cells(quick: bool, dry: bool, mps_gpufrac: bool = False) -> list[Cell]:
    full = 1 if quick else 3
    out = [
        Cell("trainer solo", None, 1, "solo", full),
        Cell("two trainers, native time-slicing", None, 2, "native", 1 if quick else full),
        Cell("two trainers, gpufrac 1:1", None, 2, "gpufrac", full),
        Cell("two trainers, gpufrac 3:1", None, 2, "gpufrac", full, (3, 1)),
        Cell(
            "high + low trainer (min_share 10%), gpufrac", None, 2, "gpufrac", full, min_share=True
        ),
    ]
    for m in ("R", "T"):
        out += [
            Cell(f"infer-{m} solo", m, 0, "solo", full),
            Cell(f"infer-{m} + trainer, native time-slicing", m, 1, "native", full),
            Cell(f"infer-{m} + trainer, gpufrac", m, 1, "gpufrac", full),
        ]
        if not dry and not (quick and m == "T"):
            out += [
                Cell(f"infer-{m} + trainer, MPS", m, 1, "mps", 1),
                Cell(f"infer-{m} + trainer, MPS, trainer priority 1", m, 1, "mps-prio", 1),
            ]
        if mps_gpufrac and not dry:
            out.append(Cell(f"infer-{m} + trainer, gpufrac over MPS", m, 1, "mps-gpufrac", 1))
    return out


class Runner:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.spares: list[subprocess.Popen[str]] = []
        self.window = args.window or (2.0 if args.dry_run else 4.0 if args.quick else 8.0)

    def _start_spare(self) -> subprocess.Popen[str]:
        """A worker that imports PyTorch (the slow part of a start) and waits to be told its
        role."""
        cmd = [sys.executable, __file__, "--worker", "pool"]
        cmd += ["--window", str(self.window), "--seed", str(self.args.seed)]
        cmd += ["--dry-run"] * self.args.dry_run + ["--periodic"] * self.args.periodic
        cmd += ["--tail", "0.3" if self.args.dry_run else "0.5"]
        path = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
        return subprocess.Popen(
            cmd,
            env={**os.environ, "PYTHONPATH": path},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group, as under the agent
        )

    def prefetch(self, count: int = 2) -> None:
        """Start the next cell's workers now: they import PyTorch while this cell measures (CPU
        only; no CUDA context is made before they are told their role)."""
        while len(self.spares) < count:
            self.spares.append(self._start_spare())

    def _spawn(self, role: list[str], env: dict[str, str], windows: int) -> subprocess.Popen[str]:
        p = self.spares.pop(0) if self.spares else self._start_spare()
        if not _readline(p, 300).startswith("loaded"):
            raise RuntimeError("a worker did not start")
        assert p.stdin is not None
        p.stdin.write("build " + json.dumps({"role": role, "env": env, "windows": windows}) + "\n")
        p.stdin.flush()
        return p

    def close(self) -> None:
        for p in self.spares:
            p.kill()
            p.wait()
        self.spares = []

    def run(self, cell: Cell) -> None:
        from gpufrac.model.qos import QosParams, arbiter_rank, mps_client_priority
        from gpufrac.runtime.arbiter_link import ArbiterLink, MemberSpec
        from gpufrac.runtime.mps import MpsDaemons

        root = self.tmp / f"mps-{time.monotonic_ns()}"  # a fresh pipe directory per cell
        mps = MpsDaemons(root, enabled=True) if cell.mode.startswith("mps") else None
        link = ArbiterLink(self.tmp / f"arbiter-{time.monotonic_ns()}", preempt=self.args.preempt)
        if mps is not None and not mps.ensure("0"):
            cell.result = {"error": "nvidia-cuda-mps-control not found"}
            return
        roles: list[tuple[str, list[str], dict[str, str], QosParams]] = []
        if cell.infer:
            q = QosParams(arbiter_rank(HIGH, "latency"))
            roles.append(("infer", ["infer", "--model", cell.infer], {}, q))
        for i in range(cell.trainers):
            if cell.min_share:
                q = QosParams(
                    arbiter_rank(HIGH if i == 0 else LOW, "throughput"), 1, 0 if i == 0 else 100
                )
            else:
                q = QosParams(arbiter_rank(LOW, "throughput"), cell.weights[i])
            roles.append((f"train{i}", ["train"], {}, q))
        procs = []
        try:
            if cell.mode.endswith("gpufrac"):
                link.sync({}, start=True)
            for name, role, env, q in roles:
                env = dict(env)
                if mps is not None:
                    env["CUDA_MPS_PIPE_DIRECTORY"] = str(mps.pipe_dir("0"))
                    env["CUDA_MPS_LOG_DIRECTORY"] = str(root / "0" / "log")
                    if cell.mode == "mps-prio" and name.startswith("train"):
                        env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
                    if cell.mode == "mps-gpufrac":  # as the agent maps qos to MPS client priority
                        qos = "latency" if name == "infer" else "throughput"
                        env["CUDA_MPS_CLIENT_PRIORITY"] = str(mps_client_priority(qos))
                if cell.mode.endswith("gpufrac"):  # what the agent hands over
                    env |= {
                        "GPUFRAC_ARBITER": link.address,
                        "GPUFRAC_TENANT": "bench",
                        "GPUFRAC_WORKLOAD": name,
                        "GPUFRAC_QOS_DOMAIN": "gpu0",
                        "GPUFRAC_QOS_RANK": str(q.rank),
                        "GPUFRAC_QOS_WEIGHT": str(q.weight),
                        "GPUFRAC_QOS_MIN_SHARE_MILLI": str(q.min_share_milli),
                    }
                procs.append((name, self._spawn(role, env, cell.repeats), q))
            for name, p, _ in procs:
                if not _readline(p, 300).startswith("ready"):
                    raise RuntimeError(f"{name} did not warm up")
            if mps is not None and not _mps_serving(mps.pipe_dir("0")):
                raise RuntimeError("no MPS server is running: the cell would measure no MPS at all")
            if cell.mode.endswith(
                "gpufrac"
            ):  # registered as the agent registers them: key, class, group
                link.sync({f"bench/{n}": MemberSpec("gpu0", q, p.pid) for n, p, q in procs})
            t0 = time.time() + 0.5
            for _, p, _ in procs:
                assert p.stdin is not None
                p.stdin.write(f"go {t0}\n")
                p.stdin.flush()
            self.prefetch()
            timeout = cell.repeats * self.window + 120
            cell.result = {name: json.loads(_readline(p, timeout)) for name, p, _ in procs}
            if cell.mode.endswith("gpufrac"):
                cell.result["arbiter"] = link.stats()
        except (RuntimeError, ValueError) as e:
            cell.result = {"error": str(e)}
        finally:
            for _, p, _ in procs:
                p.kill()
                p.wait()
            link.close()
            if mps is not None:
                mps.stop("0")
                _wait_mps_gone()


def _mps_serving(pipe: Path) -> bool:
    """Does the control daemon behind ``pipe`` have a server (so the clients really run under
    MPS)?"""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    out = subprocess.run(
        ["nvidia-cuda-mps-control"], input="get_server_list\n", env=env,
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return bool(out.stdout.strip())


def _wait_mps_gone(timeout: float = 15.0) -> None:
    """``quit`` returns before the server has let go of the GPU: wait for it, so the next cell is
    clean."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if subprocess.run(
            ["pgrep", "-f", "nvidia-cuda-mps-server"], capture_output=True, check=False
        ).returncode:
            return
        time.sleep(0.2)


def _readline(p: subprocess.Popen[str], timeout: float) -> str:
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    line = p.stdout.readline() if ready else ""
    if not line:
        raise RuntimeError(f"worker {p.args[3:5]} gave no answer (exit {p.poll()})")
    return line


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def summarize(cs: list[Cell]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows of the table (medians over windows and spreads) and the targets with their verdicts."""
    rows: dict[str, dict[str, Any]] = {}
    for c in cs:
        r: dict[str, Any] = {"scenario": c.name, "windows": c.repeats}
        if "error" in c.result:
            r["error"] = c.result["error"]
            rows[c.name] = r
            continue
        if c.infer:
            p50 = [_pct(w, 0.5) for w in c.result["infer"]["lat_ms"]]
            p99 = [_pct(w, 0.99) for w in c.result["infer"]["lat_ms"]]
            r |= {"p50_ms": statistics.median(p50), "p99_ms": statistics.median(p99)}
            r["p99_spread_ms"] = max(p99) - min(p99)
        its = [c.result[f"train{i}"]["it_s"] for i in range(c.trainers)]
        if its:
            per_window = [sum(w) for w in zip(*its, strict=True)]
            r["it_s"] = statistics.median(per_window)
            r["it_s_spread"] = max(per_window) - min(per_window)
            if c.trainers == 2:
                firsts = [a / (a + b) if a + b else 0.0 for a, b in zip(*its, strict=True)]
                r["first_share"] = statistics.median(firsts)
                r["per_trainer"] = [statistics.median(x) for x in its]
                # what the arbiter granted (turn time held), which CPU load on the host cannot skew
                held = [
                    float(c.result.get("arbiter", {}).get(f"bench/train{i}", {}).get("held_s") or 0)
                    for i in range(2)
                ]
                if sum(held) > 0:
                    r["granted_first_share"] = held[0] / sum(held)
                # the second's share of the GPU's busy time (docs/qos.md: the time it was allowed
                # to run, beside the first or alone, over the time either ran)
                low = c.result.get("arbiter", {}).get("bench/train1", {})
                if float(low.get("busy_s") or 0) > 0:
                    r["second_run_share"] = float(low.get("held_s") or 0) / float(low["busy_s"])
        rows[c.name] = r
    solo_it = rows.get("trainer solo", {}).get("it_s")
    for r in rows.values():
        if solo_it and "it_s" in r:
            r["it_vs_solo"] = r["it_s"] / solo_it
        for m in ("R", "T"):
            solo = rows.get(f"infer-{m} solo", {}).get("p99_ms")
            if r["scenario"].startswith(f"infer-{m}") and solo and "p99_ms" in r:
                r["p99_vs_solo"] = r["p99_ms"] / solo
    targets: list[dict[str, Any]] = []

    def target(name: str, row: str, key: str, ok: Callable[[float], bool], want: str) -> None:
        value = rows.get(row, {}).get(key)
        met = value is not None and ok(value)
        targets.append({"target": name, "want": want, "value": value, "met": met})

    for m, trainer_min in (("R", 0.88), ("T", 0.70)):
        row = f"infer-{m} + trainer, gpufrac"
        target(f"infer-{m} p99 vs solo", row, "p99_vs_solo", lambda v: v <= 1.05, "<= 1.05")
        target(
            f"infer-{m} pair: trainer vs solo",
            row,
            "it_vs_solo",
            lambda v, t=trainer_min: v >= t,
            f">= {trainer_min}",
        )
    target(
        "1:1 split (first trainer)",
        "two trainers, gpufrac 1:1",
        "first_share",
        lambda v: abs(v - 0.5) <= 0.05,
        "0.50 +- 0.05",
    )
    target(
        "3:1 split (first trainer)",
        "two trainers, gpufrac 3:1",
        "first_share",
        lambda v: abs(v - 0.75) <= 0.05,
        "0.75 +- 0.05",
    )
    target(
        "1:1 pair vs one solo trainer",
        "two trainers, gpufrac 1:1",
        "it_vs_solo",
        lambda v: v >= 0.95,
        ">= 0.95",
    )
    target(
        "3:1 pair vs one solo trainer",
        "two trainers, gpufrac 3:1",
        "it_vs_solo",
        lambda v: v >= 0.95,
        ">= 0.95",
    )
    target(
        "min_share 10% gets",
        "high + low trainer (min_share 10%), gpufrac",
        "second_run_share",
        lambda v: v >= 0.09,
        "low runs >= 0.09 of the busy time",
    )
    return list(rows.values()), targets


def _fmt(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


def print_table(rows: list[dict[str, Any]], targets: list[dict[str, Any]], machine: str) -> None:
    print(f"\nco-location on {machine}")
    head = (
        "scenario",
        "win",
        "p50 ms",
        "p99 ms",
        "p99 spread",
        "p99/solo",
        "train it/s",
        "it spread",
        "it/solo",
        "1st share",
    )
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in rows:
        if "error" in r:
            print(f"{r['scenario']} | error: {r['error']}")
            continue
        print(" | ".join([
            r["scenario"], str(r["windows"]),
            _fmt(r.get("p50_ms"), ".2f"), _fmt(r.get("p99_ms"), ".2f"),
            _fmt(r.get("p99_spread_ms"), ".2f"), _fmt(r.get("p99_vs_solo"), ".2f"),
            _fmt(r.get("it_s"), ".1f"), _fmt(r.get("it_s_spread"), ".1f"),
            _fmt(r.get("it_vs_solo"), ".2f"), _fmt(r.get("first_share"), ".2f"),
        ]))  # fmt: skip
    print("\ntarget | want | measured | met")
    print("--- | --- | --- | ---")
    for t in targets:
        value = "n/a" if t["value"] is None else f"{t['value']:.3f}"
        print(f"{t['target']} | {t['want']} | {value} | {'yes' if t['met'] else 'NO'}")


def _machine(dry: bool) -> str:
    if dry:
        return f"CPU ({os.cpu_count()} cores), --dry-run: spin-loop models, not GPU behaviour"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown GPU"
    out = subprocess.run(
        [smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return f"{out.stdout.strip().splitlines()[0] if out.stdout.strip() else 'unknown GPU'} (driver)"


def _have_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="one short window per cell, fewer cells (< 3 min)"
    )
    p.add_argument("--dry-run", action="store_true", help="CPU spin-loop models, same code path")
    p.add_argument(
        "--periodic", action="store_true", help="fixed arrivals, as in the baseline file"
    )
    p.add_argument("--window", type=float, default=0.0, help="seconds per measured window")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", type=Path, help="write rows, targets and raw results here")
    p.add_argument("--only", help="run only cells whose name contains this")
    p.add_argument(
        "--mps-gpufrac",
        action="store_true",
        help="add cells with the arbiter over MPS (1 window each)",
    )
    p.add_argument(
        "--preempt",
        choices=("overlap", "drain"),
        default="overlap",
        help="the arbiter's qos_preempt",
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        help="modules queued ahead of the GPU at a yield point (SDK default 2)",
    )
    p.add_argument("--worker", choices=("pool", "infer", "train"), help=argparse.SUPPRESS)
    p.add_argument("--model", choices=("R", "T"), default="R", help=argparse.SUPPRESS)
    p.add_argument("--windows", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--tail", type=float, default=1.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "pool":
        if not args.dry_run:
            import torch  # noqa: F401 - the slow part of a start, done before the role is known
        print("loaded", flush=True)
        spec = json.loads(sys.stdin.readline().split(" ", 1)[1])
        os.environ.update(spec["env"])  # before anything makes a CUDA context
        role = spec["role"]
        args.worker = role[0]
        if "--model" in role:
            args.model = role[role.index("--model") + 1]
        args.windows = int(spec["windows"])
    if args.worker:
        worker(args)
        return 0
    if not args.dry_run and not _have_gpu():
        print("no CUDA GPU here (or no PyTorch): running --dry-run on the CPU")
        args.dry_run = True
    todo = [
        c
        for c in cells(args.quick, args.dry_run, args.mps_gpufrac)
        if not args.only or args.only in c.name
    ]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpufrac-coloc-") as tmp:
        if args.max_in_flight is not None:
            os.environ["GPUFRAC_QOS_MAX_IN_FLIGHT"] = str(args.max_in_flight)
        runner = Runner(args, Path(tmp))
        try:
            for i, c in enumerate(todo, 1):
                print(
                    f"[{i}/{len(todo)}] {c.name} ({c.repeats} x {runner.window:.0f} s) ...",
                    flush=True,
                )
                runner.run(c)
        finally:
            runner.close()
    rows, targets = summarize(todo)
    machine = _machine(args.dry_run)
    print_table(rows, targets, machine)
    print(f"\n{time.monotonic() - started:.0f} s in all")
    if args.json:
        raw = {c.name: c.result for c in todo}
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine,
                    "dry_run": args.dry_run,
                    "periodic": args.periodic,
                    "rows": rows,
                    "targets": targets,
                    "raw": raw,
                },
                indent=1,
            )
        )
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
