"""`gpufrac validate` and `gpufrac schedule` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpufrac.cli.app import app

runner = CliRunner()
EXAMPLES = Path(__file__).parents[3] / "examples"


def test_validate_accepts_the_examples_and_names_the_field_of_a_bad_one(tmp_path: Path) -> None:
    files = [
        str(p) for p in sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "quickstart.yaml")
    ]
    r = runner.invoke(app, ["validate", *files, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["valid"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: x}\nspec:\n  command: "
        "[run]\n  resources: {gpu: {memory: 12GiB, fraction: 0.5, count: 2}}\n"
    )
    r = runner.invoke(app, ["validate", str(bad)])
    assert r.exit_code == 2 and "spec.resources.gpu" in r.stderr


def test_schedule_places_the_examples_on_a_paper_fleet() -> None:
    files = [
        str(p) for p in sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "quickstart.yaml")
    ]
    r = runner.invoke(
        app,
        [
            "schedule",
            *files,
            "--gpus",
            # a MIG GPU more for HAMi's and KAI's shapes, five GPUs more for their MPS shares and
            # shares of two (time-sliced, and an MPS domain of two)
            "h200:8,h200:3:mig,a100-80gb:1:mig",
            "--settings",
            str(EXAMPLES / "operator" / "gpufrac.yaml"),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert {d["outcome"] for d in out["decisions"]} == {"placed"}
    assert {d["mode"] for d in out["decisions"]} >= {"mig", "mps", "exclusive"}


def test_schedule_reports_what_waits_and_why(tmp_path: Path) -> None:
    f = tmp_path / "two.yaml"
    f.write_text(
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: a}\nspec: {command: "
        "[run], resources: {gpu: {count: 1}}}\n"
        "---\napiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: b}\nspec: "
        "{command: [run], resources: {gpu: {count: 1}}}\n"
        "---\napiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: c}\nspec: "
        "{command: [run], resources: {gpu: {memory: 500GiB}}}\n"
    )
    r = runner.invoke(app, ["schedule", str(f), "--gpus", "h200:1", "--json"])
    assert r.exit_code == 1
    outcomes = {
        d["workload"]: (d["outcome"], d["reason"]) for d in json.loads(r.stdout)["decisions"]
    }
    assert outcomes["default/a"][0] == "placed"
    assert outcomes["default/b"][0] == "pending" and "whole GPU" in outcomes["default/b"][1]
    assert outcomes["default/c"][0] == "refused" and "could ever hold" in outcomes["default/c"][1]


def test_schedule_on_the_live_simulated_gpus_sees_existing_mig_instances() -> None:
    sim = ["--simulate", "h200:1:mig"]
    assert (
        runner.invoke(
            app,
            [
                "mig",
                "apply",
                *sim,
                "-f",
                str(EXAMPLES / "mig-parted" / "basic-v1.yaml"),
                "-c",
                "all-1g.18gb",
            ],
        ).exit_code
        == 0
    )
    r = runner.invoke(app, ["schedule", str(EXAMPLES / "mig-profile.yaml"), *sim, "--json"])
    decisions = {d["workload"]: d for d in json.loads(r.stdout)["decisions"]}
    tok = decisions["default/tokenizer"]
    assert tok["outcome"] == "placed" and [a["kind"] for a in tok["actions"]] == [
        "start"
    ]  # reuses an instance
    assert decisions["default/reranker"]["outcome"] == "refused"  # no A100 here


def test_unreadable_settings_file_is_an_input_error_naming_the_flag(tmp_path: Path) -> None:
    bad = tmp_path / "gpufrac.yaml"
    bad.write_bytes(b"\xff\xfe placement_policy: spread\n")
    manifest = str(EXAMPLES / "fraction.yaml")
    for settings in (bad, tmp_path / "missing.yaml"):
        r = runner.invoke(
            app, ["schedule", manifest, "--gpus", "h200:1", "--settings", str(settings)]
        )
        assert r.exit_code == 2, r.output
        assert "--settings" in r.stderr and "cannot read" in r.stderr
        assert "Traceback" not in r.output


def test_validate_lists_every_problem_of_every_file_named_by_file(tmp_path: Path) -> None:
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text(
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: a}\n"
        "spec: {command: 5, bogus: 1, resources: {gpu: {count: x}}}\n"
    )
    two.write_text(
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: B}\n"
        "spec: {command: [x], resources: {gpu: {count: 1}}, priority: ultra}\n"
    )
    r = runner.invoke(app, ["validate", str(one), str(two)])
    assert r.exit_code == 2
    for file, field in [
        (one, "spec.bogus"),
        (one, "spec.command"),
        (one, "spec.resources.gpu.count"),
        (two, "metadata.name"),
        (two, "spec.priority"),
    ]:
        assert f"{file}: {field}:" in r.output, r.output
