"""Container workloads at apply (a mount outside the operator's allowed paths, an image not on
this machine: refused, naming the field) and engines told their slice (model/engines.py, through
the executor)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.errors import InputError
from gpufrac.model.engines import ENGINE_ARGS_ENV
from gpufrac.model.mig import parse_layout
from gpufrac.model.settings import ContainerSettings, OperatorSettings
from gpufrac.model.workload import GpuRequest, VolumeMount, WorkloadSpec
from gpufrac.runtime.agent import Agent
from tests.conftest import kill_leftover_runs, settle


def spec(**kw: object) -> WorkloadSpec:
    return replace(WorkloadSpec("w", GpuRequest(count=1), ("true",)), **kw)  # type: ignore[arg-type]


def test_mounts_outside_the_allowed_paths_are_refused_by_field() -> None:
    settings = OperatorSettings(containers=ContainerSettings(allowed_mounts=("/data",)))
    settings.check_mounts((VolumeMount("/data/models", "/m"),))
    with pytest.raises(InputError) as e:
        settings.check_mounts((VolumeMount("/data/models", "/m"), VolumeMount("/etc", "/e")))
    assert e.value.field == "spec.mounts[1].source"
    with pytest.raises(InputError):
        settings.check_mounts((VolumeMount("/database", "/m"),))  # not below /data


def test_a_link_under_an_allowed_path_that_leads_out_of_it_is_refused(tmp_path: Path) -> None:
    """Checked where the path leads (a tenant who can write in an allowed directory could put a
    link to / there): at apply and again at each start, and what is mounted is what was checked."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    (allowed / "models").mkdir(parents=True)
    outside.mkdir()
    (allowed / "out").symlink_to(outside)
    settings = OperatorSettings(containers=ContainerSettings(allowed_mounts=(str(allowed),)))
    inside = VolumeMount(str(allowed / "models"), "/m")
    assert settings.check_mounts((inside,), os.path.realpath) == (str(allowed / "models"),)
    with pytest.raises(InputError) as e:
        settings.check_mounts((inside, VolumeMount(str(allowed / "out"), "/o")), os.path.realpath)
    assert e.value.field == "spec.mounts[1].source" and f"leads to {outside}" in str(e.value)
    # an allowed path that is itself a link counts where it leads
    (tmp_path / "link").symlink_to(allowed)
    via = OperatorSettings(containers=ContainerSettings(allowed_mounts=(str(tmp_path / "link"),)))
    assert via.check_mounts((inside,), os.path.realpath) == (str(allowed / "models"),)


# -- spec.image and spec.engine through the agent ----------------------------------------------


@pytest.fixture
def dev(data_dir: Path) -> Iterator[NvmlDevices]:
    yield open_simulated("h200:1:mig,h200:1", data_dir)
    kill_leftover_runs(data_dir)


def settings(tmp_path: Path) -> OperatorSettings:
    kind = f"gpufrac.io/unit{abs(hash(str(tmp_path))) % 10**8}"
    return OperatorSettings(
        containers=ContainerSettings(engine="podman", cdi_kind=kind, cdi_dir=str(tmp_path / "cdi"))
    )


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")
def test_an_image_not_on_this_machine_is_refused_by_field_and_nothing_is_stored(
    data_dir: Path, dev: NvmlDevices, tmp_path: Path
) -> None:
    agent = Agent(data_dir, dev, settings(tmp_path))
    missing = "localhost/gpufrac-no-such-image:0"
    with pytest.raises(InputError) as e:
        agent.apply_workload(spec(image=missing))
    assert e.value.field == "spec.image" and missing in str(e.value)
    assert "podman load" in e.value.fix and "podman images" in e.value.fix
    assert agent.store.workload("default", "w") is None
    assert not (data_dir / "runs" / "default" / "w").exists()


def test_without_an_engine_an_image_is_refused_by_field(
    data_dir: Path, dev: NvmlDevices, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no podman, no docker
    agent = Agent(data_dir, dev, settings(tmp_path))
    with pytest.raises(InputError) as e:
        agent.apply_workload(spec(image="localhost/anything:1"))
    assert e.value.field == "spec.image" and "apt-get install podman" in e.value.fix
    assert agent.store.workload("default", "w") is None


ARGV = "#!{py}\nimport json, os, sys\nprint(json.dumps([sys.argv[1:], dict(os.environ)]))\n"


def test_an_engines_flags_are_added_where_absent_and_a_user_value_above_the_slice_is_warned(
    data_dir: Path, dev: NvmlDevices, tmp_path: Path
) -> None:
    vllm = tmp_path / "bin" / "vllm"  # the engine's entry point, as its name says
    vllm.parent.mkdir()
    vllm.write_text(ARGV.format(py=sys.executable))
    vllm.chmod(0o755)
    agent = Agent(data_dir, dev)
    command = (str(vllm), "serve", "m", "--gpu-memory-utilization", "0.90")
    agent.apply_workload(
        spec(
            name="v",
            command=command,
            engine="vllm",
            sharing="timeslice",
            gpu=GpuRequest(memory_mib=14_377),  # a tenth of an H200 (143,771 MiB)
            restart="never",
        )
    )
    settle(agent, "default/v", {"succeeded"})
    log = agent.latest_log("default", "v", 1)
    assert log is not None
    argv, env = json.loads(log.read_text().strip().splitlines()[-1])
    assert argv == [
        "serve", "m", "--gpu-memory-utilization", "0.90",  # the user's, kept
        "--max-num-seqs", "64", "--max-num-batched-tokens", "4096",  # added: absent
    ]  # fmt: skip
    assert env[ENGINE_ARGS_ENV] == (
        "--gpu-memory-utilization 0.09 --max-num-seqs 64 --max-num-batched-tokens 4096"
    )
    warned = [e.message for e in agent.store.events("default/v") if e.kind == "engine_warning"]
    assert len(warned) == 1 and "--gpu-memory-utilization 0.90" in warned[0]


def test_a_frameworks_share_of_its_mig_instance_is_in_its_environment(
    data_dir: Path, dev: NvmlDevices
) -> None:
    agent = Agent(data_dir, dev)
    show = "import json, os; print(json.dumps(dict(os.environ)))"
    agent.apply_workload(
        spec(
            name="j",
            command=(sys.executable, "-c", show),
            engine="jax",
            gpu=GpuRequest(mig_profile="1g.18gb"),
            restart="never",
        )
    )
    settle(agent, "default/j", {"succeeded"})
    log = agent.latest_log("default", "j", 1)
    assert log is not None
    env = json.loads(log.read_text().strip().splitlines()[-1])
    # its whole instance is its budget: the most an engine is given of what it sees
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.95"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    assert env[ENGINE_ARGS_ENV] == ""
    assert not [e for e in agent.store.events("default/j") if e.kind == "engine_warning"]


def cdi_names(path: Path) -> set[str]:
    return {str(d["name"]) for d in json.loads(path.read_text())["devices"]}


def test_a_recut_rewrites_the_cdi_spec_before_the_next_start(
    data_dir: Path, dev: NvmlDevices, tmp_path: Path
) -> None:
    agent = Agent(data_dir, dev, settings(tmp_path), stop_grace=1.0)
    assert agent.executor.refresh_cdi()  # as a container start writes it (containers use it)
    path = next((tmp_path / "cdi").glob("*.json"))
    gpu0, gpu1 = (g.uuid for g in dev.gpus())
    assert cdi_names(path) == {"0", gpu0, "1", gpu1}  # no MIG instance yet
    sleep = "import time; time.sleep(60)"
    small = spec(
        name="small",
        command=(sys.executable, "-c", sleep),
        type="service",
        gpu=GpuRequest(mig_profile="1g.18gb"),
    )
    agent.apply_workload(small)
    settle(agent, "default/small", {"running"})
    first = next(i for i in dev.gpus()[0].instances if i.uuid)
    # a process was started (no container): the MIG change itself rewrote the spec
    assert cdi_names(path) == {"0", gpu0, "1", gpu1, f"0:{first.gi_id}", str(first.uuid)}
    agent.delete("default", "small")
    whole = replace(small, name="whole", gpu=GpuRequest(mig_profile="7g.141gb"))
    agent.apply_workload(whole)
    settle(agent, "default/whole", {"running"})
    second = next(i for i in dev.gpus()[0].instances if i.uuid)
    assert second.uuid != first.uuid and second.profile == "7g.141gb"
    assert cdi_names(path) == {"0", gpu0, "1", gpu1, f"0:{second.gi_id}", str(second.uuid)}
    events = [e.kind for e in agent.store.events()]
    assert "mig_destroyed" in events and "mig_created" in events
    agent.delete("default", "whole")
    assert agent.runs.wait_stopped(10)
    # an operator's layout, made at once (not by the MIG worker): the spec follows it too
    agent.set_mig_layout(gpu0, True, list(parse_layout("3g.71gb@0,3g.71gb@4")))
    halves = [i for i in dev.gpus()[0].instances if i.uuid]
    assert len(halves) == 2
    assert cdi_names(path) == {"0", gpu0, "1", gpu1} | {
        n for i in halves for n in (f"0:{i.gi_id}", str(i.uuid))
    }


def test_no_cdi_spec_is_written_on_a_mig_change_where_no_container_uses_one(
    data_dir: Path, dev: NvmlDevices, tmp_path: Path
) -> None:
    agent = Agent(data_dir, dev, settings(tmp_path), stop_grace=1.0)
    job = spec(
        name="m", command=(sys.executable, "-c", "pass"), gpu=GpuRequest(mig_profile="1g.18gb")
    )
    agent.apply_workload(job)
    settle(agent, "default/m", {"succeeded"})
    assert "mig_created" in [e.kind for e in agent.store.events()]
    assert not list((tmp_path / "cdi").glob("*.json"))
