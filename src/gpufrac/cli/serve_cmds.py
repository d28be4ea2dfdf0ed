"""CLI for deployments: ``get deployments``, ``describe deployment``, ``scale``, and ``load`` (a
small load generator with a traffic schedule, for demos and for watching the autoscaler work)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

import typer
from rich.table import Table

from gpufrac.cli.common import JsonOpt, console, print_json

if TYPE_CHECKING:
    import asyncio


def print_deployment(d: dict[str, Any]) -> None:
    tr = d.get("traffic") or {}
    console.print(
        f"[bold]{d['tenant']}/{d['name']}[/] at {d['url']}: {d['replicas_ready']} ready of "
        f"{d['replicas_wanted']} wanted (template {d['template']})",
        highlight=False,
    )
    if tr:
        p99 = tr.get("p99_ms")
        console.print(
            f"traffic: {tr.get('in_flight', 0)} in flight, {tr.get('queued', 0)} queued, "
            f"{tr.get('rate', 0):.1f} req/s, p99 {'-' if p99 is None else f'{p99:.1f} ms'}, "
            f"{tr.get('rejected', 0)} rejected (429), {tr.get('errors', 0)} errors, "
            f"{tr.get('retries', 0)} retried",
            highlight=False,
        )
    t = Table(title="replicas", title_justify="left")
    for col in ("replica", "phase", "where", "port", "outstanding", "served", "note"):
        t.add_column(col, overflow="fold")
    for r in d["replicas"]:
        note = ", ".join(
            n for n, on in (("draining", r["draining"]), ("old template", not r["current"])) if on
        )
        t.add_row(
            r["name"], r["phase"], f"{r['mode'] or ''} {' '.join(r['gpus'])}".strip(),
            str(r["port"]), str(r["outstanding"]), str(r["served"]), note,
        )  # fmt: skip
    console.print(t)
    for r in d["replicas"]:
        if r.get("last_error"):
            console.print(
                f"  [red]{r['name']}[/] ({r['phase']}: {r.get('reason') or ''}) last wrote: "
                f"{r['last_error']}",
                highlight=False,
            )
    for e in d.get("events", []):
        if e["kind"] in (
            "scaled",
            "autoscaler",
            "replica_removed",
            "deployment_applied",
            "displaced",  # what a replica took the place of
        ):
            stamp = time.strftime("%H:%M:%S", time.localtime(e["at"]))
            console.print(f"  {stamp} {e['kind']}: {e['message']}", highlight=False)


# -- the load generator ----------------------------------------------------------------------------


def load_table(rows: list[dict[str, Any]], title: str) -> Table:
    """One row per step of the load: clients, requests, rate, p50, p99, non-2xx answers."""
    t = Table(title=title, title_justify="left")
    for col in ("clients", "requests", "req/s", "p50 ms", "p99 ms", "non-2xx"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            str(r["clients"]), str(r["requests"]), f"{r['rate']:.0f}",
            "-" if r["p50_ms"] is None else f"{r['p50_ms']:.1f}",
            "-" if r["p99_ms"] is None else f"{r['p99_ms']:.1f}", str(r["non_2xx"]),
        )  # fmt: skip
    return t


async def _client(
    host: str,
    port: int,
    request: bytes,
    stop: asyncio.Event,
    record: list[tuple[float, float, int]],
) -> None:
    import asyncio

    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    while not stop.is_set():
        start = time.monotonic()
        status = 0
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            assert reader is not None
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            if b"connection: close" in head.lower():
                writer.close()
                reader, writer = None, None
        except (OSError, asyncio.IncompleteReadError, ValueError):
            if writer is not None:
                writer.close()
            reader, writer = None, None
            await asyncio.sleep(0.05)
        record.append((time.monotonic(), time.monotonic() - start, status))


async def run_load(
    url: str, body: bytes, steps: list[int], step_seconds: float, on_second: Any
) -> list[dict[str, Any]]:
    """Closed-loop clients, their number following ``steps``; one summary row per step."""
    import asyncio

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = (
        f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    record: list[tuple[float, float, int]] = []
    clients: list[tuple[asyncio.Event, asyncio.Task[None]]] = []
    rows = []
    stopped: list[asyncio.Task[None]] = []
    for n in steps:
        while len(clients) < n:
            stop = asyncio.Event()
            clients.append(
                (stop, asyncio.ensure_future(_client(host, port, request, stop, record)))
            )
        while len(clients) > n:
            stop, task = clients.pop()
            stop.set()
            stopped.append(task)
        started = time.monotonic()
        seen = len(record)
        while time.monotonic() - started < step_seconds:
            await asyncio.sleep(1.0)
            on_second(n, record[seen:])
        mine = record[seen:]
        lat = sorted(x[1] for x in mine)
        rows.append(
            {
                "clients": n,
                "requests": len(mine),
                "rate": len(mine) / step_seconds,
                "p50_ms": lat[len(lat) // 2] * 1000 if lat else None,
                "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1000 if lat else None,
                "non_2xx": sum(1 for x in mine if not 200 <= x[2] < 300),
            }
        )
    for stop, _ in clients:
        stop.set()
    await asyncio.gather(*(t for _, t in clients), *stopped, return_exceptions=True)
    return rows


def load_command(
    url: Annotated[str, typer.Argument(help="e.g. http://127.0.0.1:8480/serve/NAME/predict")],
    clients: Annotated[
        str, typer.Option("--clients", help="Concurrent clients per step, e.g. 1,8,16,8,1.")
    ] = "1,8,16,8,1",
    step: Annotated[float, typer.Option("--step", help="Seconds per step.")] = 5.0,
    body: Annotated[str, typer.Option("--body", help="The JSON body of each request.")] = (
        '{"inputs": [1, 2, 3]}'
    ),
    json: JsonOpt = False,
) -> None:
    """Send traffic that steps through a number of concurrent clients; print what it got."""
    try:
        steps = [int(c) for c in clients.split(",") if c.strip()]
        if not steps or min(steps) < 0:
            raise ValueError
    except ValueError:
        console.print("[red]--clients: give whole numbers like 1,8,16,8,1[/]")
        raise typer.Exit(2) from None

    def tick(n: int, got: list[tuple[float, float, int]]) -> None:
        if json:
            return
        now = time.monotonic()
        last = [x for x in got if x[0] > now - 1.0]
        lat = sorted(x[1] for x in last)
        p99 = f"{lat[int(0.99 * (len(lat) - 1))] * 1000:.1f} ms" if lat else "-"
        bad = sum(1 for x in last if not 200 <= x[2] < 300)
        console.print(
            f"{n:3d} clients: {len(last):5d} req/s, p99 {p99}, non-2xx {bad}", highlight=False
        )

    import asyncio

    rows = asyncio.run(run_load(url, body.encode(), steps, step, tick))
    if json:
        print_json({"steps": rows})
        return
    console.print(load_table(rows, "load"))
