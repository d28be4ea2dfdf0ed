"""Watching the agent: ``gpufrac get ... -w`` and ``gpufrac events [-w]``.

A watch polls the agent and prints again only when what it would print changed. It outlives the
agent: while the agent does not answer (restarting, say) it says so once on stderr, keeps trying,
and says when the agent is back. Ctrl-C ends it with exit 0. ``events -w`` follows new events by
their id (``GET /events?after=ID``), so none is printed twice and none is skipped across a restart.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from gpufrac.cli.agent_client import ServerOpt, agent_address, answer, read_as, send
from gpufrac.cli.common import JsonOpt, err_console, fail
from gpufrac.cli.tables import (
    OutputOpt,
    as_yaml,
    event_header,
    event_line,
    output_format,
    table_text,
    when,
)

WatchOpt = Annotated[
    bool, typer.Option("--watch", "-w", help="Keep watching: print again when something changes.")
]
IntervalOpt = Annotated[
    float, typer.Option("--interval", help="Seconds between looks at the agent while watching.")
]
LIMIT = 1000  # events asked for per call while following


class Poller:
    """Calls to the agent that wait out an agent that does not answer (each outage said once)."""

    def __init__(self, server: str | None, interval: float) -> None:
        self.server = server
        self.interval = interval
        self.down = False

    def get(self, path: str, **params: Any) -> Any:
        """The answer to GET ``path``; exits as ``answer`` does on a refusal (401, 403, 404,
        422)."""
        import httpx

        while True:
            try:
                r = send("GET", self.server, path, params=params or None, timeout=10)
            except httpx.HTTPError as e:
                self._lost(str(e) or type(e).__name__)
            else:
                if r.status_code < 500:
                    if self.down:
                        self.down = False
                        err_console.print(
                            f"the agent at {agent_address(self.server)} answers again",
                            highlight=False,
                        )
                    return answer(r)
                self._lost(f"it answered {r.status_code}")
            time.sleep(self.interval)

    def _lost(self, why: str) -> None:
        if not self.down:
            self.down = True
            err_console.print(
                f"the agent at {agent_address(self.server)} does not answer ({why}); "
                f"trying again every {self.interval:g}s (Ctrl-C stops)",
                highlight=False,
            )


def watch(render: Callable[[Poller], str], server: str | None, interval: float) -> None:
    """Print ``render``'s text, and again each time it changes, until Ctrl-C (exit 0)."""
    poller = Poller(server, interval)
    last: str | None = None
    try:
        while True:
            text = render(poller)
            if text != last:
                if last is not None:
                    out("")
                out(text)
                last = text
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def out(text: str) -> None:
    """A line (or several) to stdout, flushed: a pipe reading a watch sees each change at once."""
    if text:
        sys.stdout.write(text + "\n")
    else:
        sys.stdout.write("\n")
    sys.stdout.flush()


def events_command(
    watch_: WatchOpt = False,
    tenant: Annotated[
        str | None, typer.Option("--tenant", "-t", help="Only this tenant's workloads' events.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", help="How many of the newest events to show first.")
    ] = 100,
    output: OutputOpt = None,
    json_: JsonOpt = False,
    interval: IntervalOpt = 1.0,
    server: ServerOpt = None,
) -> None:
    """The agent's events (placed, started, evicted, paused, failed, MIG changes, ...), oldest
    first; with -w, then each new one as it happens. -o json: the API's answer; with -w, one JSON
    object per event and line."""
    from gpufrac.api.schemas import EventList

    fmt = output_format(output, json_, ("table", "json", "yaml"))
    if not 1 <= limit <= 10_000:
        raise fail("--limit: give 1 to 10000", 2)
    if interval <= 0:
        raise fail("--interval: give a number of seconds above 0", 2)
    params: dict[str, Any] = {"limit": limit}
    if tenant is not None:
        params["tenant"] = tenant
    poller = Poller(server, interval)
    try:
        first = poller.get("/api/v1/events", **params)
        if not watch_:
            match fmt:
                case "json":
                    out(json.dumps(first, indent=2))
                case "yaml":
                    out(as_yaml(first))
                case _:
                    rows = [
                        [when(e.at), e.kind, e.subject, e.message]
                        for e in read_as(EventList, first).events
                    ]
                    out(table_text(("TIME", "KIND", "SUBJECT", "MESSAGE"), rows))
            return
        if fmt == "table":
            out(event_header())
        last = 0
        got = first
        while True:
            # each event as it came (-o json, yaml) and as read (the table; the id to follow)
            for raw, e in zip(got["events"], read_as(EventList, got).events, strict=True):
                match fmt:
                    case "table":
                        out(event_line(e))
                    case "json":
                        out(json.dumps(raw))
                    case _:
                        out("---\n" + as_yaml(raw))
                last = max(last, e.id)
            time.sleep(interval)
            got = poller.get("/api/v1/events", **{**params, "after": last, "limit": LIMIT})
    except KeyboardInterrupt:
        return
