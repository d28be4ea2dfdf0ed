"""Applying MIG targets to simulated GPUs through the real adapter: converges, idempotent,
resumable."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.devices.errors import InsufficientResources
from gpufrac.devices.simfleet import SimulatedFleet
from gpufrac.errors import InputError
from gpufrac.model.catalog import lookup_model
from gpufrac.model.mig import MigPlacement, parse_layout
from gpufrac.planning.demand import DemandClass, resolve_demand
from gpufrac.planning.mig_planner import PlanGpu, plan_mig
from gpufrac.planning.patterns import geometry
from gpufrac.runtime.mig_apply import ApplyRefused, GpuTarget, apply_targets, diff_actions

FLEET = "h200:2:mig,a30:mig"
LAYOUTS = {key: geometry(lookup_model(key)).layouts for key in ("h200", "a30")}


class Crash(BaseException):
    """Stands for the process dying part-way (not an error the applier may handle)."""


def targets_strategy() -> st.SearchStrategy[list[tuple[MigPlacement, ...]]]:
    return st.tuples(
        st.sampled_from(LAYOUTS["h200"]),
        st.sampled_from(LAYOUTS["h200"]),
        st.sampled_from(LAYOUTS["a30"]),
    ).map(lambda t: [lay.placements for lay in t])


def layouts_now(dev: NvmlDevices) -> list[tuple[MigPlacement, ...]]:
    return [g.layout for g in dev.gpus()]


def to_targets(dev: NvmlDevices, layouts: list[tuple[MigPlacement, ...]]) -> list[GpuTarget]:
    return [GpuTarget(g.uuid, True, lay) for g, lay in zip(dev.gpus(), layouts, strict=True)]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(first=targets_strategy(), second=targets_strategy(), crash_after=st.integers(0, 30))
def test_apply_converges_is_idempotent_and_resumes_after_a_crash(
    tmp_path_factory: pytest.TempPathFactory,
    first: list[tuple[MigPlacement, ...]],
    second: list[tuple[MigPlacement, ...]],
    crash_after: int,
) -> None:
    dev = open_simulated(FLEET, tmp_path_factory.mktemp("fleet"))
    apply_targets(dev, to_targets(dev, first))
    assert layouts_now(dev) == [tuple(sorted(x)) for x in first]
    assert apply_targets(dev, to_targets(dev, first)) == []  # re-applying is a no-op

    count = 0

    def die(_: object) -> None:
        nonlocal count
        count += 1
        if count > crash_after:
            raise Crash

    with contextlib.suppress(Crash):
        apply_targets(dev, to_targets(dev, second), on_action=die)
    done = apply_targets(dev, to_targets(dev, second))  # the next run finishes the job
    assert layouts_now(dev) == [tuple(sorted(x)) for x in second]
    assert all(i.uuid and i.ci_ids for g in dev.gpus() for i in g.instances)
    assert apply_targets(dev, to_targets(dev, second)) == []
    assert (
        len(done)
        <= len(diff_actions(dev, to_targets(dev, first))) + 2 * sum(len(x) for x in second) + 8
    )


def test_a_plan_applied_to_simulated_gpus_reads_back_as_its_target(data_dir: Path) -> None:
    dev = open_simulated("h200:3:mig", data_dir)
    gpus = [PlanGpu(g.uuid, g.index, dev.model(g.uuid)) for g in dev.gpus()]
    classes = resolve_demand(
        [
            DemandClass("1g.18gb", 5, "1g.18gb"),
            DemandClass("3g.71gb", 3, "3g.71gb"),
            DemandClass("2g.35gb", 2, "2g.35gb"),
        ],
        [gpus[0].model],
    )
    plan = plan_mig(gpus, classes)
    apply_targets(dev, [GpuTarget(p.uuid, True, p.instances) for p in plan.gpus])
    assert [g.layout for g in dev.gpus()] == [tuple(sorted(p.instances)) for p in plan.gpus]


def test_killed_with_sigkill_part_way_then_rerun_converges(data_dir: Path) -> None:
    """A real process is killed -9 in the middle of an apply; the next apply repairs everything."""
    target = "1g.18gb@0,1g.18gb@1,1g.18gb@2,1g.18gb@3,1g.18gb@4,1g.18gb@5,1g.18gb@6"
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from gpufrac.devices import open_simulated
        from gpufrac.model.mig import parse_layout
        from gpufrac.runtime.mig_apply import GpuTarget, apply_targets
        dev = open_simulated("h200:1:mig", Path({str(data_dir)!r}))
        n = 0
        def maybe_die(action):
            global n
            n += 1
            if n == 5:  # after create_gi, create_ci, create_gi, create_ci, create_gi: \
a GI without CI
                os.kill(os.getpid(), signal.SIGKILL)
        apply_targets(dev, [GpuTarget(dev.gpus()[0].uuid, True, parse_layout({target!r}))], \
on_action=maybe_die)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -9, proc.stderr
    dev = open_simulated("h200:1:mig", data_dir)
    half = dev.gpus()[0]
    assert len(half.instances) == 3 and any(not i.ci_ids for i in half.instances)
    apply_targets(dev, [GpuTarget(half.uuid, True, parse_layout(target))])
    assert dev.gpus()[0].layout == parse_layout(target)
    assert all(i.ci_ids for i in dev.gpus()[0].instances)


def test_busy_instances_are_not_destroyed_without_drain(
    sim: NvmlDevices, fleet: SimulatedFleet
) -> None:
    uuid = sim.gpus()[0].uuid
    apply_targets(sim, [GpuTarget(uuid, True, parse_layout("3g.71gb@0"))])
    gi = sim.gpu(uuid).instances[0].gi_id
    fleet.attach_process(uuid, os.getpid(), 100, gi_id=gi)
    with pytest.raises(ApplyRefused, match="busy"):
        apply_targets(sim, [GpuTarget(uuid, True, parse_layout("7g.141gb@0"))])
    assert sim.gpu(uuid).layout == parse_layout("3g.71gb@0")  # nothing changed
    fleet.detach_process(os.getpid())
    apply_targets(sim, [GpuTarget(uuid, True, parse_layout("7g.141gb@0"))])
    assert sim.gpu(uuid).layout == parse_layout("7g.141gb@0")


def test_mode_changes_need_the_flag(sim: NvmlDevices) -> None:
    plain = sim.gpus()[1].uuid
    with pytest.raises(ApplyRefused, match="allow-mode-change"):
        apply_targets(sim, [GpuTarget(plain, True, parse_layout("1g.18gb@6"))])
    assert not sim.gpu(plain).mig_enabled
    apply_targets(sim, [GpuTarget(plain, True, parse_layout("1g.18gb@6"))], allow_mode_change=True)
    assert sim.gpu(plain).mig_enabled and sim.gpu(plain).layout == parse_layout("1g.18gb@6")
    apply_targets(sim, [GpuTarget(plain, False, ())], allow_mode_change=True)
    assert not sim.gpu(plain).mig_enabled


def test_bad_targets_are_input_errors_and_change_nothing(sim: NvmlDevices) -> None:
    mig = sim.gpus()[0].uuid
    with pytest.raises(InputError, match="not valid") as exc:
        apply_targets(sim, [GpuTarget(mig, True, parse_layout("3g.71gb@0,4g.71gb@0"))])
    assert exc.value.field == "plan.gpus[0].instances"
    with pytest.raises(InputError, match="no GPU") as exc:
        apply_targets(sim, [GpuTarget(mig, True, ()), GpuTarget("GPU-nope", True, ())])
    assert exc.value.field == "plan.gpus[1].uuid"
    assert sim.gpu(mig).instances == ()


def test_a_failure_part_way_rolls_back(sim: NvmlDevices, monkeypatch: pytest.MonkeyPatch) -> None:
    mig = sim.gpus()[0].uuid
    apply_targets(sim, [GpuTarget(mig, True, parse_layout("3g.71gb@0,1g.18gb@4"))])
    real = sim.create_gpu_instance

    def flaky(uuid: str, profile: str, start: int) -> int:
        if profile == "2g.35gb":
            raise InsufficientResources("simulated failure")
        return real(uuid, profile, start)

    monkeypatch.setattr(sim, "create_gpu_instance", flaky)
    with pytest.raises(ApplyRefused, match="taken back"):
        apply_targets(sim, [GpuTarget(mig, True, parse_layout("3g.71gb@0,2g.35gb@4,1g.18gb@6"))])
    assert sim.gpu(mig).layout == parse_layout("3g.71gb@0,1g.18gb@4")


PROFILES = {
    "H200-141GB": [p.name for p in lookup_model("h200").profiles],
    "A30-24GB": [p.name for p in lookup_model("a30").profiles],
}


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    start=targets_strategy(),
    counts=st.dictionaries(
        st.sampled_from(PROFILES["H200-141GB"] + PROFILES["A30-24GB"]),
        st.integers(0, 5),
        min_size=1,
        max_size=4,
    ),
)
def test_any_plan_applied_reads_back_as_its_target(
    tmp_path_factory: pytest.TempPathFactory,
    start: list[tuple[MigPlacement, ...]],
    counts: dict[str, int],
) -> None:
    dev = open_simulated(FLEET, tmp_path_factory.mktemp("fleet"))
    apply_targets(dev, to_targets(dev, start))
    states = dev.gpus()
    gpus = [PlanGpu(g.uuid, g.index, dev.model(g.uuid), g.instances) for g in states]
    models = {g.model.key: g.model for g in gpus}.values()
    classes = resolve_demand([DemandClass(n, c, n) for n, c in sorted(counts.items())], models)
    plan = plan_mig(gpus, classes)
    apply_targets(dev, [GpuTarget(p.uuid, True, p.instances) for p in plan.gpus])
    assert [g.layout for g in dev.gpus()] == [tuple(sorted(p.instances)) for p in plan.gpus]
    assert apply_targets(dev, [GpuTarget(p.uuid, True, p.instances) for p in plan.gpus]) == []


def test_drain_stops_the_processes_in_busy_instances_then_applies(
    sim: NvmlDevices, fleet: SimulatedFleet
) -> None:
    uuid = sim.gpus()[0].uuid
    apply_targets(sim, [GpuTarget(uuid, True, parse_layout("3g.71gb@0"))])
    gi = sim.gpu(uuid).instances[0].gi_id
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    fleet.attach_process(uuid, child.pid, 1000, gi_id=gi)
    with pytest.raises(ApplyRefused, match=f"stop their processes {child.pid}"):
        apply_targets(sim, [GpuTarget(uuid, True, parse_layout("7g.141gb@0"))])
    apply_targets(
        sim, [GpuTarget(uuid, True, parse_layout("7g.141gb@0"))], drain=True, drain_grace=5
    )
    assert child.wait(timeout=10) == -15  # SIGTERM
    assert sim.gpu(uuid).layout == parse_layout("7g.141gb@0")
