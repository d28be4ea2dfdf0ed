"""`gpufrac mig plan|apply|assert|export|enable|disable` through the CLI, on simulated GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufrac.cli.app import app
from gpufrac.config import data_dir
from gpufrac.devices import open_simulated
from gpufrac.planning.migparted import device_states, parse_migparted

runner = CliRunner()
EXAMPLES = Path(__file__).parents[3] / "examples" / "mig-parted"


def run(*args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_plan_json_shape_on_paper_fleet() -> None:
    code, out, _ = run(
        "mig", "plan", "--gpus", "h200:4", "--demand", "1g.18gb=5,3g.71gb=2", "--json"
    )
    assert code == 0
    plan = json.loads(out)
    assert {"gpus", "unplaced", "actions", "summary"} <= set(plan)
    assert all({"uuid", "index", "model", "instances"} <= set(g) for g in plan["gpus"])
    assert plan["summary"]["gpus_used"] == 2 and plan["unplaced"] == []
    assert {a["kind"] for a in plan["actions"]} == {"create_gi", "create_ci"}


def test_plan_by_need_on_a_mixed_fleet_reports_gpus_per_model() -> None:
    code, out, _ = run(
        "mig", "plan", "--gpus", "h200:2,a100-80gb:2", "--need", "20GiB=6,60GiB=2", "--json"
    )
    assert code == 0
    summary = json.loads(out)["summary"]
    assert sum(summary["gpus_used_by_model"].values()) == summary["gpus_used"] > 0


def test_plan_with_unplaced_demand_exits_1() -> None:
    code, out, _ = run("mig", "plan", "--gpus", "h200:1", "--demand", "7g.141gb=2", "--json")
    assert code == 1
    assert json.loads(out)["unplaced"][0]["count"] == 1


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--gpus", "h200:2", "--demand", "1g.10gb=1"], "--demand"),  # a profile the model lacks
        (["--gpus", "h200:2", "--demand", "1g.18gb=-1"], "--demand"),  # negative count
        (
            ["--gpus", "h300:2", "--demand", "1g.18gb=1"],
            "--gpus",
        ),  # a GPU model that does not exist
        (["--gpus", "h200:0", "--demand", "1g.18gb=1"], "--gpus"),
        (["--gpus", "h200:1"], "--demand"),
        (["--gpus", "h200:1", "--demand", "1g.18gb=1", "--cost", "h200=x"], "--cost"),
    ],
)
def test_plan_bad_input_exits_2_naming_the_field(args: list[str], field: str) -> None:
    code, _, err = run("mig", "plan", *args)
    assert code == 2
    assert field in err


def test_plan_from_gpus_json_then_apply_assert_and_reapply(tmp_path: Path) -> None:
    sim = ["--simulate", "h200:2:mig"]
    code, out, _ = run("gpus", *sim, "--json")
    current = tmp_path / "current.json"
    current.write_text(out)
    plan_file = tmp_path / "plan.json"
    code, _, _ = run(
        "mig",
        "plan",
        "--current",
        str(current),
        "--demand",
        "2g.35gb=3,1g.18gb=1",
        "-o",
        str(plan_file),
    )
    assert code == 0
    code, out, _ = run("mig", "apply", *sim, "--plan", str(plan_file), "--dry-run", "--json")
    dry = json.loads(out)
    assert code == 0 and dry["dry_run"] and len(dry["actions"]) == 8
    assert all(
        g["instances"] == [] for g in json.loads(run("gpus", *sim, "--json")[1])["gpus"]
    )  # nothing changed
    code, out, _ = run("mig", "apply", *sim, "--plan", str(plan_file), "--json")
    assert code == 0 and json.loads(out)["changed"]
    assert run("mig", "assert", *sim, "--plan", str(plan_file))[0] == 0
    code, out, _ = run("mig", "apply", *sim, "--plan", str(plan_file), "--json")
    assert code == 0 and json.loads(out)["actions"] == []


def test_apply_refuses_a_plan_naming_gpus_that_do_not_exist(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(
        json.dumps({"gpus": [{"uuid": "GPU-missing", "index": 0, "instances": []}]})
    )
    code, _, err = run("mig", "apply", "--simulate", "h200:1:mig", "--plan", str(plan_file))
    assert code == 2 and "--plan.gpus[0].uuid" in err


CASES = [
    ("basic-v1.yaml", "all-1g.18gb", "h200:4:mig"),
    ("basic-v1.yaml", "all-enabled", "h200:4"),
    ("device-filter.yaml", None, "h200:2:mig,a30:mig"),
    ("device-filter-list.yaml", "mixed-inference", "h200:2:mig,a30:mig"),
    ("device-indices.yaml", None, "h200:8:mig"),
    ("enabled-no-instances.yaml", None, "h200:2"),
    ("mig-disabled.yaml", None, "h200:8:mig"),
    ("multiple-entries.yaml", "train-and-serve", "h200:8:mig"),
    ("zero-counts.yaml", None, "h200:4:mig"),
    ("profile-attributes.yaml", "one-with-media", "h200:2:mig"),
]


@pytest.mark.parametrize(("name", "config", "fleet"), CASES)
def test_mig_parted_examples_round_trip(
    name: str, config: str | None, fleet: str, tmp_path: Path
) -> None:
    """apply a mig-parted config, export the GPUs as a config: the two are equivalent."""
    path = EXAMPLES / name
    parsed = parse_migparted(path.read_text())
    config = config or next(iter(parsed.configs))
    sim = ["--simulate", fleet]
    code, _, err = run("mig", "apply", *sim, "-f", str(path), "-c", config, "--allow-mode-change")
    assert code == 0, err
    assert run("mig", "assert", *sim, "-f", str(path), "-c", config)[0] == 0
    code, exported, _ = run("mig", "export", *sim)
    assert code == 0
    dev = open_simulated(fleet, data_dir())
    gpus = dev.gpus()
    models = {g.uuid: dev.model(g.uuid) for g in gpus}
    want = device_states(parsed, config, gpus, models)
    got = device_states(parse_migparted(exported), "current", gpus, models)
    assert {i: got[i] for i in want} == want
    assert (
        run("mig", "apply", *sim, "-f", str(path), "-c", config, "--json")[1].count('"kind"') == 0
    )


def test_a_file_of_one_config_needs_no_c_and_skipped_indexes_are_noted() -> None:
    """mig-parted's single-config default; an index the node lacks is skipped with a note (on
    stderr: --json output stays one JSON document)."""
    sim = ["--simulate", "h200:4:mig"]
    path = str(EXAMPLES / "device-indices.yaml")  # two configs: -c is needed
    code, _, err = run("mig", "apply", *sim, "-f", path, "--dry-run")
    assert code == 2 and "which config?" in err and "cut-last-two, whole-first-half" in err
    code, out, err = run("mig", "apply", *sim, "-f", path, "-c", "cut-last-two", "--dry-run")
    assert code == 0, err
    assert "note mig-configs.cut-last-two[0].devices: GPU 6, 7 not on this node" in err
    assert "0 action(s)" in out or "nothing to do" in out
    single = str(EXAMPLES / "enabled-no-instances.yaml")
    code, out, err = run("mig", "apply", *sim, "-f", single, "--dry-run", "--json")
    assert code == 0, err
    json.loads(out)
    code, out, err = run("mig", "assert", *sim, "-f", path, "-c", "cut-last-two")
    assert code == 0 and "GPU 6, 7 not on this node" in err


def test_assert_reports_a_mismatch() -> None:
    code, out, _ = run(
        "mig",
        "assert",
        "--simulate",
        "h200:2:mig",
        "-f",
        str(EXAMPLES / "basic-v1.yaml"),
        "-c",
        "all-1g.18gb",
        "--json",
    )
    assert code == 1
    assert len(json.loads(out)["mismatches"]) == 2


def test_enable_is_pending_while_a_process_holds_the_gpu() -> None:
    import os

    from gpufrac.devices.simfleet import SimulatedFleet

    fleet = SimulatedFleet.open("h200:1", data_dir())
    uuid = open_simulated("h200:1", data_dir()).gpus()[0].uuid
    fleet.attach_process(uuid, os.getpid(), 100)
    code, out, _ = run("mig", "enable", "--simulate", "h200:1", "--gpu", "0")
    assert code == 1 and "idle" in out
    fleet.detach_process(os.getpid())
    assert run("mig", "enable", "--simulate", "h200:1", "--gpu", "0")[0] == 0
    assert run("mig", "disable", "--simulate", "h200:1", "--gpu", "all")[0] == 0
    assert run("mig", "enable", "--simulate", "h200:1", "--gpu", "7")[0] == 2


def test_plan_from_a_listing_with_a_lost_gpu_plans_on_the_others(tmp_path: Path) -> None:
    from gpufrac.devices.simfleet import SimulatedFleet

    sim = ["--simulate", "h200:2:mig"]
    uuid = json.loads(run("gpus", *sim, "--json")[1])["gpus"][1]["uuid"]
    SimulatedFleet.open("h200:2:mig", data_dir()).set_lost(uuid)
    listing = json.loads(run("gpus", *sim, "--json")[1])
    assert [g["health"] for g in listing["gpus"]] == ["ok", "lost"]
    current = tmp_path / "current.json"
    current.write_text(json.dumps(listing))
    code, out, _ = run("mig", "plan", "--current", str(current), "--demand", "7g.141gb=2", "--json")
    plan = json.loads(out)
    assert code == 1 and len(plan["gpus"]) == 1 and plan["unplaced"][0]["count"] == 1
