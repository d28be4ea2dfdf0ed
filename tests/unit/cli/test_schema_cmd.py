"""`gpufrac schema`: the JSON Schemas of manifests and of the operator's settings."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpufrac.cli.app import app
from gpufrac.model.schema import manifest_json_schema, settings_json_schema

runner = CliRunner()


def test_schema_prints_the_manifest_schema() -> None:
    r = runner.invoke(app, ["schema"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == manifest_json_schema()


def test_schema_settings_prints_the_settings_schema() -> None:
    r = runner.invoke(app, ["schema", "--settings"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == settings_json_schema()


def test_schema_output_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "manifest.schema.json"
    r = runner.invoke(app, ["schema", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text()) == manifest_json_schema()
    assert str(out) in r.stdout


def test_schema_output_that_cannot_be_written_is_an_input_error(tmp_path: Path) -> None:
    r = runner.invoke(app, ["schema", "--output", str(tmp_path / "no" / "such" / "dir.json")])
    assert r.exit_code == 2
    assert "--output" in r.stderr and "cannot write" in r.stderr


def test_schema_help_says_what_it_prints() -> None:
    r = runner.invoke(app, ["schema", "--help"])
    assert r.exit_code == 0
    for word in ("JSON", "Schema", "--settings", "--output", "yaml-language-server"):
        assert word in r.stdout
