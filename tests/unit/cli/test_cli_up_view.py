"""``gpufrac up``'s live view ends on a line of its own, so the summary's heading is not glued to
its last border (``...┘summary``, seen on a pipe, as in ``make demo``'s captured output)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from gpufrac.cli.up import live_view


def table(title: str) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("workload")
    t.add_row("default/a")
    return t


@pytest.mark.parametrize("terminal", [False, True])
def test_the_summary_starts_below_the_live_view(terminal: bool) -> None:
    out = io.StringIO()
    console = Console(file=out, width=60, force_terminal=terminal, color_system=None)
    with live_view(console) as live:
        live.update(table("GPUs"))
    console.print(table("summary"))
    text = out.getvalue()
    assert "┘summary" not in text and "\nsummary" in text


def test_an_interrupted_view_ends_its_line_too() -> None:
    out = io.StringIO()
    console = Console(file=out, width=60, color_system=None)
    with pytest.raises(KeyboardInterrupt), live_view(console) as live:
        live.update(table("GPUs"))
        raise KeyboardInterrupt
    console.print("interrupted")
    assert "┘interrupted" not in out.getvalue() and "\ninterrupted" in out.getvalue()
