"""``gpufrac schema``: the JSON Schema of manifests (or of the operator's settings file), for
editors and other tools (docs/manifest.md, "Editors")."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gpufrac.cli.common import console, handled_errors
from gpufrac.errors import InputError


def schema_command(
    settings: Annotated[
        bool,
        typer.Option(
            "--settings",
            help="The schema of the operator's settings file (gpufrac.yaml) instead of manifests'.",
        ),
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the schema to FILE instead of stdout."),
    ] = None,
) -> None:
    """Print the JSON Schema of manifests (Workload and Deployment documents), generated from
    the models gpufrac validates them with. Point an editor at it with a first line like
    '# yaml-language-server: $schema=manifest.schema.json'."""
    from gpufrac.model.schema import manifest_json_schema, schema_text, settings_json_schema

    text = schema_text(settings_json_schema() if settings else manifest_json_schema())
    if output is None:
        sys.stdout.write(text)
        return
    with handled_errors():
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InputError(
                f"cannot write {output}: {exc.strerror or exc}",
                field="--output",
                fix="give a path in a directory that exists and that you may write to",
            ) from None
    console.print(f"wrote {output}", highlight=False)
