"""``gpufrac top``: a full-screen live view of a running agent, redrawn every second.

The frames come from ``cli/top_view.py`` (pure); this module does the rest: asking the agent (three
GETs a refresh, with the caller's token), the terminal (cbreak mode for single keys, restored on
exit, on Ctrl-C and on SIGTERM), and the loop. An agent that stops answering is shown as such and
asked again every refresh; the view keeps its last answer meanwhile. httpx, Rich's live display, the
API's models and the view are imported when top runs (not with every command: ``cli/common.py``).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import termios
import time
import tty
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from gpufrac.cli.agent_client import ServerOpt, agent_address, answer_detail
from gpufrac.cli.common import console, fail

if TYPE_CHECKING:
    import httpx
    from pydantic import BaseModel
    from rich.console import Console

    from gpufrac.cli.top_view import Snapshot

PATHS = {
    "gpus": "/api/v1/gpus", "workloads": "/api/v1/workloads", "deployments": "/api/v1/deployments",
}  # fmt: skip


def answers() -> dict[str, type[BaseModel]]:
    from gpufrac.api.schemas import DeploymentList, GpuList, WorkloadList

    return {"gpus": GpuList, "workloads": WorkloadList, "deployments": DeploymentList}


def fetch(client: httpx.Client, last: Snapshot) -> Snapshot:
    """The agent's answers now, or the last ones with why asking failed."""
    import httpx

    from gpufrac.cli.top_view import Snapshot

    models = answers()
    got = {}
    for key, path in PATHS.items():
        try:
            r = client.get(path)
        except httpx.HTTPError as e:
            return replace(last, error=f"cannot reach it ({type(e).__name__}: {e})")
        if r.status_code != 200:
            return replace(last, error=f"{path} answered {r.status_code}: {answer_detail(r)}")
        try:
            body = r.json()
            models[key].model_validate(body)  # the shape the views read
            got[key] = tuple(body[key])
        except (ValueError, KeyError, TypeError):  # ValidationError is a ValueError
            return replace(last, error=f"{path} answered something that is not its JSON")
    return Snapshot(last.server, got["gpus"], got["workloads"], got["deployments"], time.time())


@contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """Single keys without Enter and without echo; the terminal as it was afterwards, also after
    Ctrl-C (still a signal in cbreak mode) and SIGTERM (turned into an exit that unwinds)."""
    saved = termios.tcgetattr(fd)

    def stop(signum: int, _: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, stop)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGTERM, old)


def keys_within(fd: int, seconds: float) -> list[str]:
    """The keys pressed within ``seconds`` (returns at the first read that has any)."""
    ready, _, _ = select.select([fd], [], [], max(0.0, seconds))
    if not ready:
        return []
    from gpufrac.cli.top_view import keys_from

    data = os.read(fd, 64)
    if not data:  # the terminal went away
        raise SystemExit(0)
    return keys_from(data.decode(errors="replace"))


def run(client: httpx.Client, snap: Snapshot, interval: float, screen: Console) -> None:
    from rich.live import Live

    from gpufrac.cli.top_view import ViewState, next_view, render, tenants_of

    fd = sys.stdin.fileno()
    view = ViewState()
    with cbreak(fd), Live(console=screen, screen=True, auto_refresh=False) as live:
        while True:
            snap = fetch(client, snap)
            live.update(render(snap, view), refresh=True)
            due = time.monotonic() + interval
            while (left := due - time.monotonic()) > 0:
                for key in keys_within(fd, left):
                    after = next_view(view, key, tenants_of(snap))
                    if after is None:
                        return
                    view = after
                    live.update(render(snap, view), refresh=True)


def top_command(
    server: ServerOpt = None,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between refreshes.", min=0.2, max=60)
    ] = 1.0,
    once: Annotated[
        bool, typer.Option("--once", help="Print one frame and exit (no terminal needed).")
    ] = False,
) -> None:
    """A live full-screen view of the agent: GPUs and their slices, workloads, deployments, pending.

    Keys (also on its last line): q quit, s sort, r reverse, / filter, t tenant, Esc clear."""
    import httpx

    from gpufrac.cli.top_view import Snapshot, ViewState, frame

    url = agent_address(server)
    token = os.environ.get("GPUFRAC_TOKEN")
    headers = {"authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=url, headers=headers, timeout=2.0) as client:
        if once:
            snap = fetch(client, Snapshot(url))
            console.print(frame(snap, ViewState()))
            if snap.error is not None:
                raise typer.Exit(2)  # as every command that cannot reach the agent
            return
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise fail(
                "gpufrac top needs a terminal",
                2,
                "gpufrac top --once prints one frame; gpufrac get ... --json is for scripts",
            )
        with suppress(KeyboardInterrupt):  # Ctrl-C quits as q does
            run(client, Snapshot(url), interval, console)
