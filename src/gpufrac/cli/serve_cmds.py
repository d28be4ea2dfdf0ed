"""CLI for deployments: ``get deployments``, ``describe deployment``, ``scale``, and ``load`` (a
small load generator with a traffic schedule, for demos and for watching the autoscaler work)."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

import typer
from rich.markup import escape
from rich.table import Table

from gpufrac.cli.common import JsonOpt, console, err_console, fail, print_json
from gpufrac.config import TOKEN_ENV
from gpufrac.model.numbers import digits_note, is_decimal, is_digits

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

NO_ANSWER = 0  # the status recorded for a request that got no answer (refused, reset, cut short)
NOT_SENT = -1  # an open-loop request not sent: MAX_IN_FLIGHT were already waiting for answers
MAX_IN_FLIGHT = 512  # open loop: requests in flight at once (each holds a connection)
CHECK_S = 0.1  # how often the load looks at the answers (to stop on a refused token)
Record = tuple[float, float, int]  # (when it ended, its latency, its status) per request


def status_breakdown(records: list[Record]) -> dict[str, int]:
    """How many answers of each status (``200: 950, 401: 50``), with ``no answer`` and ``not
    sent`` for the requests that got none; in order of status."""
    counts = Counter(status for _, _, status in records)
    names = {NO_ANSWER: "no answer", NOT_SENT: "not sent"}
    return {names.get(k, str(k)): counts[k] for k in sorted(counts, key=lambda k: (k <= 0, k))}


def shown_breakdown(statuses: dict[str, int]) -> str:
    return ", ".join(f"{k}: {n}" for k, n in statuses.items()) or "-"


def load_table(rows: list[dict[str, Any]], title: str) -> Table:
    """One row per step of the load: clients (or the rate asked, open loop), requests, rate, p50,
    p99, non-2xx answers, and the answers by status."""
    open_loop = any(r.get("rate_asked") is not None for r in rows)
    t = Table(title=title, title_justify="left")
    first = "rate asked" if open_loop else "clients"
    for col in (first, "requests", "req/s", "p50 ms", "p99 ms", "non-2xx", "answers"):
        t.add_column(col)
    for r in rows:
        step = f"{r['rate_asked']:g}/s" if open_loop else str(r["clients"])
        t.add_row(
            step, str(r["requests"]), f"{r['rate']:.0f}",
            "-" if r["p50_ms"] is None else f"{r['p50_ms']:.1f}",
            "-" if r["p99_ms"] is None else f"{r['p99_ms']:.1f}", str(r["non_2xx"]),
            shown_breakdown(r.get("statuses", {})),
        )  # fmt: skip
    return t


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bool]:
    """One request on a connection: its status, and whether the connection stays open."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return status, b"connection: close" not in head.lower()


async def _client(
    host: str,
    port: int,
    request: bytes,
    stop: asyncio.Event,
    record: list[Record],
) -> None:
    """A closed-loop client: the next request as soon as the last one is answered."""
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    while not stop.is_set():
        start = time.monotonic()
        status = NO_ANSWER
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            assert reader is not None
            status, keep = await _exchange(reader, writer, request)
            if not keep:
                writer.close()
                reader, writer = None, None
        except (OSError, asyncio.IncompleteReadError, ValueError):
            if writer is not None:
                writer.close()
            reader, writer = None, None
            await asyncio.sleep(0.05)
        record.append((time.monotonic(), time.monotonic() - start, status))


async def _one(
    host: str,
    port: int,
    request: bytes,
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
    record: list[Record],
) -> None:
    """One open-loop request, on an idle connection or a new one (kept for the next)."""
    start = time.monotonic()
    status = NO_ANSWER
    conn = idle.pop() if idle else None
    try:
        if conn is None:
            conn = await asyncio.open_connection(host, port)
        status, keep = await _exchange(*conn, request)
        if keep:
            idle.append(conn)
        else:
            conn[1].close()
    except (OSError, asyncio.IncompleteReadError, ValueError):
        if conn is not None:
            conn[1].close()
    record.append((time.monotonic(), time.monotonic() - start, status))


async def _open_loop(
    host: str,
    port: int,
    request: bytes,
    rate: float,
    seconds: float,
    record: list[Record],
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
) -> None:
    """``rate`` requests a second for ``seconds``, each sent at its time whatever the answers to
    the others (one that is due while the sender was held up goes at once); then the answers to
    the last ones are waited for."""
    count = round(rate * seconds)
    start = time.monotonic()
    flying: set[asyncio.Task[None]] = set()
    for k in range(count):
        due = start + k / rate
        if due > time.monotonic():
            await asyncio.sleep(due - time.monotonic())
        if len(flying) >= MAX_IN_FLIGHT:
            record.append((time.monotonic(), 0.0, NOT_SENT))
            continue
        task = asyncio.ensure_future(_one(host, port, request, idle, record))
        flying.add(task)
        task.add_done_callback(flying.discard)
    rest = start + seconds - time.monotonic()
    if rest > 0:
        await asyncio.sleep(rest)
    if flying:
        await asyncio.wait(flying, timeout=30)


def _request_bytes(url: str, body: bytes, headers: list[tuple[str, str]]) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    return host, port, head.encode() + body


async def run_load(
    url: str,
    body: bytes,
    steps: list[int] | list[float],
    step_seconds: float,
    on_second: Any,
    *,
    headers: list[tuple[str, str]] | None = None,
    open_loop: bool = False,
    stop_when: Any = None,
) -> list[dict[str, Any]]:
    """The load, its steps followed one after the other; one summary row per step.

    Closed loop (the default): ``steps`` are numbers of concurrent clients, each sending its next
    request once the last is answered. Open loop: ``steps`` are rates, requests a second sent on
    schedule whatever the answers' latency (what a service sees from many independent users).
    ``on_second(step, records)`` is called every second with the step's records so far; the
    load stops early once ``stop_when(records of the last second)`` says so."""
    host, port, request = _request_bytes(url, body, headers or [])
    record: list[Record] = []
    clients: list[tuple[asyncio.Event, asyncio.Task[None]]] = []
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    rows = []
    stopped: list[asyncio.Task[None]] = []
    halted = False
    for n in steps:
        started = time.monotonic()
        seen = len(record)
        sender: asyncio.Task[None] | None = None
        if open_loop:
            sender = asyncio.ensure_future(
                _open_loop(host, port, request, float(n), step_seconds, record, idle)
            )
        else:
            while len(clients) < n:
                stop = asyncio.Event()
                clients.append(
                    (stop, asyncio.ensure_future(_client(host, port, request, stop, record)))
                )
            while len(clients) > n:
                stop, task = clients.pop()
                stop.set()
                stopped.append(task)
        ticked, checked = started, len(record)
        while time.monotonic() - started < step_seconds or (sender and not sender.done()):
            await asyncio.sleep(CHECK_S)
            if stop_when is not None and stop_when(record[checked:]):
                halted = True
                break
            checked = len(record)
            if time.monotonic() - ticked >= 1.0:
                ticked = time.monotonic()
                on_second(n, record[seen:])
        if sender is not None:
            if halted:
                sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        mine = record[seen:]
        answered = [x for x in mine if x[2] != NOT_SENT]
        lat = sorted(x[1] for x in answered)
        rows.append(
            {
                "clients": None if open_loop else n,
                "rate_asked": n if open_loop else None,
                "requests": len(answered),
                "rate": len(answered) / max(step_seconds, time.monotonic() - started),
                "p50_ms": lat[len(lat) // 2] * 1000 if lat else None,
                "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1000 if lat else None,
                "non_2xx": sum(1 for x in answered if not 200 <= x[2] < 300),
                "statuses": status_breakdown(mine),
            }
        )
        if halted:
            break
    for stop, _ in clients:
        stop.set()
    await asyncio.gather(*(t for _, t in clients), *stopped, return_exceptions=True)
    for _, writer in idle:
        writer.close()
    return rows


def _headers(given: list[str], token: str | None) -> list[tuple[str, str]]:
    """``-H 'Name: value'`` as curl takes them, and ``--token`` as an Authorization header unless
    one is given."""
    out = []
    for h in given:
        name, sep, value = h.partition(":")
        if (
            not sep
            or not name.strip()
            or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name.strip())
        ):
            raise fail(
                f"--header {h!r} is not a header",
                2,
                "write it as curl does: -H 'Authorization: Bearer TOKEN'",
            )
        if "\r" in value or "\n" in value:
            raise fail(f"--header {name.strip()}: a value holds no line break", 2)
        out.append((name.strip(), value.strip()))
    if token and not any(k.lower() == "authorization" for k, _ in out):
        out.append(("Authorization", f"Bearer {token}"))
    return out


REFUSALS = (401, 403, 404)


HELD_OFF = 429  # the server's rate limit: says nothing of the token either way


def _refused_for_token(latest: list[Record]) -> bool:
    """Every answer since the last look, but those the server held off (429), was a 401 or a 403
    (the token, or its lack, is refused: every request carries the same one) or a 404 (no such
    deployment, or not this token's to see): the load would measure only refusals."""
    answered = [s for _, _, s in latest if s != HELD_OFF]
    return bool(answered) and all(s in REFUSALS for s in answered)


def load_command(
    url: Annotated[str, typer.Argument(help="e.g. http://127.0.0.1:8480/serve/NAME/predict")],
    clients: Annotated[
        str, typer.Option("--clients", help="Concurrent clients per step, e.g. 1,8,16,8,1.")
    ] = "1,8,16,8,1",
    rate: Annotated[
        str | None,
        typer.Option(
            "--rate",
            help="Open loop: requests per second per step, e.g. 50,200,50, each sent on schedule "
            "whatever the answers' latency (instead of --clients).",
        ),
    ] = None,
    step: Annotated[float, typer.Option("--step", help="Seconds per step.")] = 5.0,
    body: Annotated[str, typer.Option("--body", help="The JSON body of each request.")] = (
        '{"inputs": [1, 2, 3]}'
    ),
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar=TOKEN_ENV,
            show_envvar=True,
            help="An API token, sent as Authorization: Bearer TOKEN (where the agent has tokens).",
        ),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(
            "--header", "-H", help="A header for every request, as curl's -H 'Name: value'."
        ),
    ] = None,
    json: JsonOpt = False,
) -> None:
    """Send traffic that steps through a number of concurrent clients (or, with --rate, of requests
    a second); print what it got, with the answers by status. A refused token (401 or 403 for
    every answer) stops the load at once, naming what to give, and exits 1."""
    spec = rate if rate is not None else clients
    option = "--rate" if rate is not None else "--clients"
    parts = [c.strip() for c in spec.split(",") if c.strip()]
    number = is_decimal if rate is not None else is_digits  # ASCII digits: not '١٢', 'nan', '1e3'
    if not parts or not all(number(c) for c in parts):
        example = "50,200,50" if rate is not None else "1,8,16,8,1"
        console.print(
            f"[red]{option}: give numbers like {example}{escape(digits_note(spec))}[/]",
            highlight=False,
        )
        raise typer.Exit(2)
    steps = [float(c) for c in parts]
    if step <= 0:
        raise fail("--step: give a number of seconds above 0", 2)
    sent = _headers(header or [], token)

    def tick(n: float, got: list[Record]) -> None:
        if json:
            return
        now = time.monotonic()
        last = [x for x in got if x[0] > now - 1.0]
        lat = sorted(x[1] for x in last if x[2] != NOT_SENT)
        p99 = f"{lat[int(0.99 * (len(lat) - 1))] * 1000:.1f} ms" if lat else "-"
        what = f"{n:g} req/s asked" if rate is not None else f"{int(n):3d} clients"
        console.print(
            f"{what}: {len(lat):5d} req/s, p99 {p99}, {shown_breakdown(status_breakdown(last))}",
            highlight=False,
        )

    numbers = steps if rate is not None else [int(x) for x in steps]
    rows = asyncio.run(
        run_load(
            url,
            body.encode(),
            numbers,
            step,
            tick,
            headers=sent,
            open_loop=rate is not None,
            stop_when=_refused_for_token,
        )
    )
    total = Counter[str]()
    for r in rows:
        total.update(r["statuses"])
    refused = sum(total[k] for k in ("401", "403"))
    if json:
        print_json({"steps": rows, "statuses": dict(total)})
    else:
        console.print(load_table(rows, "load"))
        console.print(f"answers: {shown_breakdown(dict(total))}", highlight=False)
    if refused:
        sent_one = any(k.lower() == "authorization" for k, _ in sent)
        given = "the token sent was refused" if sent_one else "no token was sent"
        err_console.print(
            f"[yellow]{refused} answer(s) were 401/403[/]: {given}; give a token with --token "
            f"or ${TOKEN_ENV} (or -H 'Authorization: Bearer TOKEN'), one the agent's tokens.yaml "
            "lists and that may use this deployment",
            highlight=False,
        )
    missing = total["404"]
    if missing:
        err_console.print(
            f"[yellow]{missing} answer(s) were 404[/]: no deployment at {url} that this token may "
            "use; gpufrac get deployments shows each one's URL",
            highlight=False,
        )
    answered = sum(total.values()) - total[str(HELD_OFF)]
    if refused + missing and refused + missing == answered:  # the load stopped
        raise typer.Exit(1)
