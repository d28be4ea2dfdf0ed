"""HAMi's and KAI-Scheduler's GPU requests, written as their users write them (string values
included), placed by ``gpufrac schedule`` as they mean; memory and compute as two capacities on a
shared GPU; the scheduler and ``gpufrac mig plan --need`` taking the same profile for one need."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufrac.cli.app import app
from gpufrac.cli.schedule import _fleet, _load, _settings, _workloads
from gpufrac.errors import InputError
from gpufrac.model.catalog import GpuModel, catalog, lookup_model
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from gpufrac.planning.demand import parse_need_demand, resolve_demand
from gpufrac.planning.sched_request import mig_profile_on
from gpufrac.planning.scheduler import Scheduler

A100 = 40960  # MiB of an A100-40GB
runner = CliRunner()


def doc(name: str, gpu: str) -> str:
    """A workload whose GPU request is written as ``gpu`` (YAML flow text, quotes kept)."""
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}}}\nspec:\n"
        f"  command: [run]\n  resources:\n    gpu: {gpu}\n"
    )


def schedule(tmp_path: Path, gpus: str, *docs: str) -> tuple[Scheduler, dict[str, Any]]:
    """``gpufrac schedule FILE --gpus GPUS`` as its function runs it: the scheduler after, and the
    decisions by workload."""
    f = tmp_path / "m.yaml"
    f.write_text("---\n".join(docs))
    cfg = _settings(None, tmp_path)
    sched = Scheduler(_fleet(gpus, None, tmp_path, cfg), cfg)
    decisions = {d.workload: d for s in _workloads(_load([f])) for d in sched.submit(s)}
    return sched, decisions


# (written as HAMi's pod limits or KAI's pod annotations; fleet; mode, memory MiB, share, compute %)
SHAPES = [
    # HAMi: a vGPU with memory in MiB
    (
        '{nvidia.com/gpu: "1", nvidia.com/gpumem: "3000"}',
        "a100-40gb:2",
        "timeslice",
        3000,
        73,
        None,
    ),
    ("{nvidia.com/gpu: 1, nvidia.com/gpumem: 3000}", "a100-40gb:2", "timeslice", 3000, 73, None),
    ('{gpumem: "3000"}', "a100-40gb:2", "timeslice", 3000, 73, None),
    # HAMi: memory as a percentage of the GPU it lands on
    (
        '{nvidia.com/gpu: "1", nvidia.com/gpumem-percentage: "50"}',
        "a100-40gb:2",
        "timeslice",
        A100 // 2,
        500,
        None,
    ),
    ('{gpumem-percentage: "25"}', "h100-80gb:1", "timeslice", 81559 * 25 // 100, 249, None),
    # HAMi: memory and cores
    (
        '{nvidia.com/gpu: "1", nvidia.com/gpumem: "3000", nvidia.com/gpucores: "30"}',
        "a100-40gb:2",
        "mps",
        3000,
        300,
        30,
    ),
    ('{gpumem: "4096", gpucores: "25"}', "a100-40gb:2", "mps", 4096, 250, 25),
    # HAMi: cores alone (the GPU's whole memory, as HAMi gives without gpumem)
    ('{nvidia.com/gpu: "1", nvidia.com/gpucores: "30"}', "a100-40gb:2", "mps", A100, 300, 30),
    # HAMi and Kubernetes: whole GPUs
    ('{nvidia.com/gpu: "2"}', "a100-40gb:2", "exclusive", A100, 1000, None),
    # KAI: annotations are strings
    ('{gpu-fraction: "0.5"}', "a100-40gb:2", "timeslice", A100 // 2, 500, None),
    (
        '{gpu-fraction: "0.25", gpu-fraction-num-devices: "1"}',
        "a100-40gb:2",
        "timeslice",
        A100 // 4,
        250,
        None,
    ),
    ('{gpu-memory: "2000"}', "a100-40gb:2", "timeslice", 2000, 48, None),
    ("{gpu-fraction: 0.5}", "a100-40gb:2", "timeslice", A100 // 2, 500, None),
    # HAMi's basic form: N vGPUs, each on a different GPU of the node, each with gpumem
    (
        '{nvidia.com/gpu: "2", nvidia.com/gpumem: "3000"}',
        "a100-40gb:2",
        "timeslice",
        3000,
        73,
        None,
    ),
    (
        "{nvidia.com/gpu: 2, nvidia.com/gpumem-percentage: 50}",
        "a100-40gb:3",
        "timeslice",
        A100 // 2,
        500,
        None,
    ),
    # HAMi: N vGPUs with cores: under MPS, one daemon serving the N GPUs (an MPS domain)
    (
        '{nvidia.com/gpu: "2", nvidia.com/gpumem: "3000", nvidia.com/gpucores: "30"}',
        "a100-40gb:2",
        "mps",
        3000,
        300,
        30,
    ),
    ('{nvidia.com/gpu: "2", nvidia.com/gpucores: "30"}', "a100-40gb:2", "mps", A100, 300, 30),
    # KAI: a fraction of each of gpu-fraction-num-devices GPUs
    (
        '{gpu-fraction: "0.5", gpu-fraction-num-devices: "2"}',
        "a100-40gb:2",
        "timeslice",
        A100 // 2,
        500,
        None,
    ),
]


@pytest.mark.parametrize(("gpu", "fleet", "mode", "memory", "share", "compute"), SHAPES)
def test_hami_and_kai_shapes_are_placed_as_they_mean(
    tmp_path: Path, gpu: str, fleet: str, mode: str, memory: int, share: int, compute: int | None
) -> None:
    sched, decisions = schedule(tmp_path, fleet, doc("w", gpu))
    decision = decisions["default/w"]
    assert decision.outcome == "placed", decision.reason
    assert decision.mode == mode
    allocs = sched.allocations("default/w")
    want = 2 if re.search(r'(gpu|num-devices): "?2', gpu) else 1
    assert len({a.gpu for a in allocs}) == want
    for a in allocs:
        assert (a.memory_mib, a.milli, a.compute_pct) == (memory, share, compute)


def test_hami_vgpus_on_several_gpus_through_the_cli(tmp_path: Path) -> None:
    """Two pods of HAMi's basic form (nvidia.com/gpu: 2, nvidia.com/gpumem: 3000) on an H200
    node with two GPUs: a share on each GPU for each, both on the same two GPUs."""
    f = tmp_path / "vgpus.yaml"
    gpu = '{nvidia.com/gpu: 2, nvidia.com/gpumem: "3000"}'
    f.write_text(doc("a", gpu) + "---\n" + doc("b", gpu))
    r = runner.invoke(app, ["schedule", str(f), "--gpus", "h200:2", "--json"])
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert [(d["outcome"], d["mode"], len(set(d["gpus"]))) for d in out["decisions"]] == [
        ("placed", "timeslice", 2),
        ("placed", "timeslice", 2),
    ]
    assert out["gpus_used"] == 2
    # a third asks for more GPUs than the node has: refused at once, saying so
    f.write_text(doc("c", '{nvidia.com/gpu: 3, nvidia.com/gpumem: "3000"}'))
    r = runner.invoke(app, ["schedule", str(f), "--gpus", "h200:2", "--json"])
    (d,) = json.loads(r.stdout)["decisions"]
    assert d["outcome"] == "refused" and "a share of each of 3 GPUs" in d["reason"]


def test_hami_vgpus_with_gpucores_on_several_gpus_through_the_cli(tmp_path: Path) -> None:
    """HAMi's README example (2 vGPUs of 3000 MiB and 30% of the cores each) on an H200 node with
    two GPUs: under MPS on both, one MPS domain; a second such pod joins the same domain, and a
    one-GPU MPS pod is refused its GPUs, the domain named."""
    f = tmp_path / "vgpus.yaml"
    gpu = "{nvidia.com/gpu: 2, nvidia.com/gpumem: 3000, nvidia.com/gpucores: 30}"
    one = '{nvidia.com/gpu: 1, nvidia.com/gpumem: 3000, nvidia.com/gpucores: "30"}'
    f.write_text(doc("a", gpu) + "---\n" + doc("b", gpu) + "---\n" + doc("c", one))
    r = runner.invoke(app, ["schedule", str(f), "--gpus", "h200:2", "--json"])
    assert r.exit_code == 1, r.stderr  # one waits
    out = json.loads(r.stdout)
    a, b, c = out["decisions"]
    assert [(d["outcome"], d["mode"]) for d in (a, b)] == [("placed", "mps")] * 2
    assert len(set(a["gpus"])) == 2 and a["gpus"] == b["gpus"]
    assert c["outcome"] == "pending"
    assert "GPUs 0, 1 are one MPS domain: a one-GPU MPS workload" in c["reason"]
    sched, _ = schedule(tmp_path, "h200:2", doc("a", gpu), doc("b", gpu))
    for key in ("default/a", "default/b"):
        assert [(x.mode, x.memory_mib, x.compute_pct) for x in sched.allocations(key)] == [
            ("mps", 3000, 30)
        ] * 2
    assert [g.compute_used for g in sched.state.gpus] == [60, 60]


def test_hami_mig_resource_takes_its_profile(tmp_path: Path) -> None:
    _, decisions = schedule(tmp_path, "a100-40gb:1:mig", doc("w", '{nvidia.com/mig-1g.10gb: "1"}'))
    d = decisions["default/w"]
    assert (d.outcome, d.mode) == ("placed", "mig")
    assert d.mig is not None and d.mig.profile == "1g.10gb"


def test_hami_sharing_pair_fits_one_gpu_where_each_capacity_does(tmp_path: Path) -> None:
    """HAMi's use_sharing_card pair: 40% of the memory with 60% of the cores beside 60% with 40%
    fits one GPU; one more percent of either (memory or compute) takes a second GPU."""

    def pair(first: tuple[int, int], second: tuple[int, int]) -> int:
        docs = [
            doc(
                name,
                f'{{nvidia.com/gpu: "1", nvidia.com/gpumem-percentage: "{m}", '
                f'nvidia.com/gpucores: "{c}"}}',
            )
            for name, (m, c) in (("a", first), ("b", second))
        ]
        sched, decisions = schedule(tmp_path, "a100-40gb:2", *docs)
        assert {d.outcome for d in decisions.values()} == {"placed"}
        assert {d.mode for d in decisions.values()} == {"mps"}
        return sched.state.gpus_used()

    assert pair((40, 60), (60, 40)) == 1
    assert pair((41, 60), (60, 40)) == 2  # memory over
    assert pair((40, 61), (60, 40)) == 2  # compute over
    assert pair((20, 70), (20, 70)) == 2  # compute over, memory to spare


def test_the_pair_through_the_cli(tmp_path: Path) -> None:
    f = tmp_path / "pair.yaml"
    f.write_text(
        doc("a", f'{{gpumem: "{A100 * 40 // 100}", gpucores: "60"}}')
        + "---\n"
        + doc("b", f'{{gpumem: "{A100 * 60 // 100}", gpucores: "40"}}')
    )
    r = runner.invoke(app, ["schedule", str(f), "--gpus", "a100-40gb:2", "--json"])
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["gpus_used"] == 1
    assert len({tuple(d["gpus"]) for d in out["decisions"]}) == 1


def _spec(memory: int, compute: int | None = None) -> WorkloadSpec:
    gpu = GpuRequest(memory_mib=memory, compute_pct=compute)
    return WorkloadSpec(name="w", gpu=gpu, command=("run",), sharing="mig")


def test_scheduler_and_planner_take_the_same_profile_for_8000_mib_on_an_a100_40gb(
    tmp_path: Path,
) -> None:
    model = lookup_model("a100-40gb")
    (planned,) = resolve_demand(parse_need_demand("8000=1"), [model], field="--need")
    assert planned.options[model.key] == "1g.10gb"
    assert mig_profile_on(_spec(8000), model) == "1g.10gb"
    _, decisions = schedule(tmp_path, "a100-40gb:1:mig", doc("w", '{gpu-memory: "8000"}'))
    d = decisions["default/w"]
    assert d.mig is not None and d.mig.profile == "1g.10gb"


def test_scheduler_and_planner_agree_on_every_model_and_need() -> None:
    """For every model with MIG and needs around each of its profiles' memory (with and without
    a compute cap), the scheduler's profile is the planner's."""
    checked = 0
    for model in catalog().values():
        if not model.profiles:
            continue
        sizes = {p.memory_mib for p in model.profiles if p.memory_mib} | {8000, 1}
        for size in sorted(sizes):
            for memory in (m for m in (size - 1, size, size + 1) if m >= 1):
                for pct in (None, 10, 30, 50, 100):
                    need = f"{memory}" if pct is None else f"{memory}/{_slices(model, pct)}c"
                    try:
                        (c,) = resolve_demand(parse_need_demand(f"{need}=1"), [model])
                        planned = c.options.get(model.key)
                    except InputError:  # fits no profile of the model
                        planned = None
                    assert mig_profile_on(_spec(memory, pct), model) == planned, (
                        model.key,
                        need,
                    )
                    checked += 1
    assert checked > 100


def _slices(model: GpuModel, pct: int) -> int:
    """A compute cap as compute slices, as docs/scheduler.md says: rounded up."""
    return -(-pct * model.compute_slices // 100)


def test_a_hami_compute_cap_that_auto_puts_on_mig_is_warned_of_with_sharing_mps(
    tmp_path: Path,
) -> None:
    """HAMi's 3000 MiB with gpucores 30 on a fleet with a MIG GPU: auto takes a MIG instance
    first, the smallest with 30% of the compute (3g.71gb on an H200); apply's warning says so and
    names sharing: mps, under which it is an MPS share of the other GPU, and no warning."""
    hami = "{nvidia.com/gpu: 1, nvidia.com/gpumem: 3000, nvidia.com/gpucores: 30}"
    sched, decisions = schedule(tmp_path, "h200:1:mig,h200:1", doc("auto", hami))
    d = decisions["default/auto"]
    assert d.mode == "mig" and d.mig is not None and d.mig.profile == "3g.71gb"
    spec = next(s for s in _workloads(_load([tmp_path / "m.yaml"])))
    (warning,) = sched.warnings(spec, d)
    assert "3,000 MiB with a 30% compute cap takes a MIG 3g.71gb" in warning
    assert warning.endswith("set sharing: mps")
    mps = doc("mps", hami).replace("  resources:", "  sharing: mps\n  resources:")
    sched, decisions = schedule(tmp_path, "h200:1:mig,h200:1", mps)
    d = decisions["default/mps"]
    assert d.mode == "mps" and d.mig is None
    spec = next(s for s in _workloads(_load([tmp_path / "m.yaml"])))
    assert sched.warnings(spec, d) == []


def test_whole_gpus_with_a_sharing_mode_are_placed_exclusive_and_told_so(tmp_path: Path) -> None:
    """count alone asks for whole GPUs: sharing: timeslice (or mps) changes nothing, and apply
    says so rather than drop it silently."""
    text = doc("whole", "{count: 1}").replace("  resources:", "  sharing: timeslice\n  resources:")
    sched, decisions = schedule(tmp_path, "h200:2", text)
    d = decisions["default/whole"]
    assert d.mode == "exclusive"
    spec = next(s for s in _workloads(_load([tmp_path / "m.yaml"])))
    (warning,) = sched.warnings(spec, d)
    assert "placed exclusive (sharing: timeslice does nothing here)" in warning
    plain = doc("plain", "{count: 1}")
    sched, decisions = schedule(tmp_path, "h200:2", plain)
    spec = next(s for s in _workloads(_load([tmp_path / "m.yaml"])))
    assert sched.warnings(spec, decisions["default/plain"]) == []
