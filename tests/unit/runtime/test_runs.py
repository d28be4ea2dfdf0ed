"""Runs: each run's runner recorded and asked (the registration, the handle), the agent's notes."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from gpufrac.model.deployment import REPLICA_KEY_ENV
from gpufrac.runtime.cgroups import Layout
from gpufrac.runtime.runner import RUNNER_KINDS, Grant, RunHandle, RunnerKind
from gpufrac.runtime.runs import NOTES, Runs, has_note, make_runner, read_note, write_note

SLEEP = "import time\nprint('up', flush=True)\ntime.sleep(60)\n"


@pytest.mark.parametrize("kind", RUNNER_KINDS)
def test_every_kind_of_runner_is_registered(kind: RunnerKind) -> None:
    assert make_runner(kind, Layout({})).kind == kind


def test_a_run_is_asked_of_the_runner_that_started_it(tmp_path: Path) -> None:
    runs = Runs(tmp_path / "runs", stop_grace=2.0, cgroups=Layout({}))
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "CUDA_VISIBLE_DEVICES": "GPU-1",
        "GPUFRAC_WORKLOAD": "w",
        REPLICA_KEY_ENV: "secret",
        "MY_OWN": "x",
    }
    run = runs.launch(
        "t",
        "w",
        1,
        1,
        [sys.executable, "-c", SLEEP],
        env=env,
        workdir=None,
        user=None,
        grant=Grant({"CUDA_VISIBLE_DEVICES": "GPU-1"}, ("GPU-1",)),
    )
    try:
        assert json.loads((run / "runner.json").read_text()) == {"kind": "process"}
        assert runs.handle(run) == RunHandle(run, "process")
        assert runs.live(run)
        deadline = time.monotonic() + 10
        while runs.status(run).child_pid is None or not runs.log(run).exists():
            assert time.monotonic() < deadline, runs.status(run)
            time.sleep(0.02)
        main = runs.status(run).child_pid
        assert main is not None and runs.owns(run, pid=main)
        assert runs.members(run, [main, os.getpid()]) == {main}
        # what gpufrac handed it, without the replica's secret or the workload's own variables
        assert runs.handed_env(run) == {"CUDA_VISIBLE_DEVICES": "GPU-1", "GPUFRAC_WORKLOAD": "w"}
        assert runs.stop_live("t", "w", "because")
        assert read_note(run, "killed") == {"reason": "because"}
    finally:
        runs.remove("t", "w")
        assert runs.wait_stopped(10)
    assert not runs.of("t", "w").exists()


def test_a_run_from_before_the_record_is_the_process_runners_and_an_unknown_one_is_refused(
    tmp_path: Path,
) -> None:
    runs = Runs(tmp_path / "runs", cgroups=Layout({}))
    old, alien = runs.of("t", "old") / "g1-1", runs.of("t", "alien") / "g1-1"
    old.mkdir(parents=True)
    alien.mkdir(parents=True)
    (alien / "runner.json").write_text(json.dumps({"kind": "spaceship"}))
    assert runs.handle(old).runner == "process"
    assert not runs.live(old)  # never launched: nothing runs
    with pytest.raises(RuntimeError, match="spaceship"):
        runs.status(alien)


def test_the_agents_notes_are_its_own_files_beside_the_runners(tmp_path: Path) -> None:
    assert len(set(NOTES)) == len(NOTES)
    for note in NOTES:
        assert read_note(tmp_path, note) == {} and not has_note(tmp_path, note)
        write_note(tmp_path, note, {"note": note})
        assert read_note(tmp_path, note) == {"note": note} and has_note(tmp_path, note)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.json" for n in NOTES)
