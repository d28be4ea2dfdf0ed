"""The view of the agent's Python that tenants' users get where it lives in a closed directory:
which directories it covers and what it shows (a table over a made-up tree), and, as root, a
workload whose view cannot be made is a failed start that says why."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from gpufrac.runtime.python_view import Cover, PythonView, closed_top, plan_view
from gpufrac.runtime.shim import launch, read_status

PYENV = "/root/.pyenv/versions/3.11.7"


@pytest.mark.parametrize(
    ("closed", "paths", "covers"),
    [
        pytest.param(set(), [PYENV, "/work/venv"], [], id="all open: no view"),
        pytest.param(
            {"/root"},
            ["/work/venv", PYENV, f"{PYENV}/lib/python3.11", f"{PYENV}/bin"],
            [Cover("/root", (PYENV,))],
            id="pyenv's interpreter under /root: its prefix, once",
        ),
        pytest.param(
            {"/root", "/root/gf/.venv/lib"},
            ["/root/gf/.venv", "/root/gf/src", "/root/gf/.venv/lib/python3.11/site-packages"],
            [Cover("/root", ("/root/gf/.venv", "/root/gf/src"))],
            id="a checkout under /root: its venv and source, not the checkout",
        ),
        pytest.param(
            {"/root", "/srv/closed"},
            [PYENV, "/srv/closed/venv"],
            [Cover("/root", (PYENV,)), Cover("/srv/closed", ("/srv/closed/venv",))],
            id="two closed directories: one cover each",
        ),
        pytest.param(
            {"/srv", "/srv/a"},
            ["/srv/a/b/venv"],
            [Cover("/srv", ("/srv/a/b/venv",))],
            id="the topmost closed directory is covered",
        ),
        pytest.param({"/srv/venv"}, ["/srv/venv"], [], id="a closed path itself: not the view's"),
        pytest.param({"/"}, ["/usr/lib/python3"], [], id="a closed / cannot be covered"),
    ],
)
def test_the_view_covers_the_topmost_closed_directories_and_shows_the_outermost_paths(
    closed: set[str], paths: list[str], covers: list[Cover]
) -> None:
    view = plan_view(paths, lambda p: p not in closed)
    assert view == PythonView(tuple(covers))
    assert PythonView.from_json(view.to_json()) == view


def test_closed_top_looks_only_above_the_path() -> None:
    assert closed_top("/root/x", lambda p: p != "/root/x") is None
    assert closed_top("/root/x", lambda p: p != "/root") == "/root"


@pytest.mark.skipif(os.geteuid() != 0, reason="a view is made as root")
def test_a_workload_whose_view_cannot_be_made_fails_to_start_saying_why(tmp_path: Path) -> None:
    run = tmp_path / "run"
    missing = str(tmp_path / "gone" / "venv")
    view = PythonView((Cover(str(tmp_path / "gone"), (missing,)),))
    launch(run, [sys.executable, "-c", "pass"], user=299_999, group=299_999, view=view)
    deadline = time.monotonic() + 20
    while not (status := read_status(run)).done:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert status.exit_code == 127
    assert status.error == (
        f"cannot start {sys.executable!r}: cannot show it the agent's Python:"
        f" cannot open {missing}: No such file or directory"
    )
