"""What ``gpufrac top`` shows, as pure functions: the agent's answers and the viewer's choices in, a
Rich renderable out; keys in, the next choices out. No terminal and no network here (``cli/top.py``
does those), so every frame can be tested by rendering it to a string.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, assert_never, get_args

from rich.console import Group, RenderableType
from rich.layout import Layout
from rich.table import Table
from rich.text import Text

from gpufrac.runtime.agent import PHASES

SortKey = Literal["name", "phase", "gpu", "memory", "restarts"]
SORT_KEYS: tuple[SortKey, ...] = get_args(SortKey)
PHASE_STYLE = {"running": "green", "succeeded": "green", "failed": "red", "backoff": "yellow"}
PHASE_STYLE |= {"pending": "yellow", "paused": "magenta", "starting": "cyan", "unknown": "red"}
BAR = 24  # cells of a memory bar
GIB = 1024


@dataclass(frozen=True)
class Snapshot:
    """The agent's latest answers (kept while it does not answer, marked by ``error``)."""

    server: str
    gpus: tuple[dict[str, Any], ...] = ()
    workloads: tuple[dict[str, Any], ...] = ()
    deployments: tuple[dict[str, Any], ...] = ()
    at: float | None = None  # when the agent last answered
    error: str | None = None  # why the latest try failed


@dataclass(frozen=True)
class ViewState:
    """The viewer's choices: sort column and order, a text filter, a tenant."""

    sort: SortKey = "name"
    reverse: bool = False
    text: str = ""
    tenant: str | None = None
    typing: bool = False  # `/` was pressed: keys go to ``draft`` until Enter or Esc
    draft: str = ""


def keys_from(data: str) -> list[str]:
    """Keys from what the terminal sent: ``esc`` alone is Esc, an escape sequence (an arrow key) is
    dropped, ``enter`` and ``backspace`` are named, anything else is its character."""
    out: list[str] = []
    i = 0
    while i < len(data):
        c = data[i]
        if c == "\x1b":
            if i + 1 < len(data) and data[i + 1] in "[O":
                i += 2
                while i < len(data) and not (data[i].isalpha() or data[i] == "~"):
                    i += 1
            else:
                out.append("esc")
        elif c in "\r\n":
            out.append("enter")
        elif c in "\x7f\x08":
            out.append("backspace")
        else:
            out.append(c)
        i += 1
    return out


def next_view(view: ViewState, key: str, tenants: list[str]) -> ViewState | None:
    """The choices after one key; None to quit."""
    if view.typing:
        if key == "enter":
            return replace(view, typing=False, text=view.draft.strip())
        if key == "esc":
            return replace(view, typing=False, draft=view.text)
        if key == "backspace":
            return replace(view, draft=view.draft[:-1])
        return (
            replace(view, draft=view.draft + key) if len(key) == 1 and key.isprintable() else view
        )
    if key in ("q", "Q"):
        return None
    if key == "s":
        return replace(view, sort=SORT_KEYS[(SORT_KEYS.index(view.sort) + 1) % len(SORT_KEYS)])
    if key == "r":
        return replace(view, reverse=not view.reverse)
    if key == "/":
        return replace(view, typing=True, draft=view.text)
    if key == "t":
        cycle: list[str | None] = [None, *tenants]
        at = cycle.index(view.tenant) if view.tenant in cycle else 0
        return replace(view, tenant=cycle[(at + 1) % len(cycle)])
    if key == "esc":
        return replace(view, text="", draft="", tenant=None)
    return view


def tenants_of(snap: Snapshot) -> list[str]:
    return sorted({w["tenant"] for w in (*snap.workloads, *snap.deployments)})


def _who(a: dict[str, Any]) -> str:
    return "(another tenant)" if a.get("name") is None else f"{a['tenant']}/{a['name']}"


def _shown(view: ViewState, tenant: str | None, *words: str | None) -> bool:
    if view.tenant is not None and tenant != view.tenant:
        return False
    needle = view.text.lower()
    return not needle or any(needle in (w or "").lower() for w in (tenant, *words))


def memory_bar(used: int | None, reserved: int | None, total: int) -> Text:
    """``used`` (█) within ``reserved`` (▒) within ``total`` (░), then the numbers in GiB; used
    beyond reserved is red."""

    def cells(mib: int | None) -> int:
        return 0 if not mib or total <= 0 else min(BAR, round(BAR * mib / total))

    u, r = cells(used), cells(reserved)
    over = used is not None and reserved is not None and used > reserved
    bar = Text()
    bar.append("█" * u, style="red" if over else "green")
    bar.append("▒" * max(0, r - u), style="yellow")
    bar.append("░" * (BAR - max(u, r)), style="dim")
    numbers = "/".join("-" if v is None else f"{v / GIB:.1f}" for v in (used, reserved, total))
    bar.append(f" {numbers}G", style="red" if over else "")
    return bar


def _pct(v: int | None) -> str:
    return "-" if v is None else f"{v}%"


def _state(g: dict[str, Any]) -> Text:
    if g.get("health", "ok") != "ok":
        return Text(f"health: {g['health']}", style="bold red")
    if g.get("cordoned"):
        return Text(f"cordoned: {g['cordoned']}", style="yellow")
    mig = g.get("mig_mode") or {}
    if mig.get("pending") != mig.get("current"):
        return Text(f"MIG {mig.get('pending')} pending", style="yellow")
    return Text("ok", style="green")


def _column(t: Table, name: str, *, ratio: int | None = None, right: bool = False) -> None:
    t.add_column(
        name, no_wrap=True, overflow="ellipsis", ratio=ratio, justify="right" if right else "left"
    )


@dataclass(frozen=True)
class Slice:
    """A row under a GPU: a MIG instance (with its workload, or free) or a workload's share."""

    label: str
    held: dict[str, Any] | None  # the allocation, None for a free MIG instance
    size_mib: int | None  # a MIG instance's own memory, else None (a share of the whole GPU)


def _share_label(label: str, a: dict[str, Any] | None) -> str:
    """An instance's label, with the mode (and MPS compute) of a share where it is shared inside
    (docs/mig.md): ``1g.10gb@6 mps 35%``."""
    if a is None or a.get("mode") in (None, "mig"):
        return label
    pct = a.get("compute_pct")
    return f"{label} {a['mode']}" + ("" if pct is None else f" {pct}%")


def slices(g: dict[str, Any], allocs: list[dict[str, Any]]) -> list[Slice]:
    out = []
    made = set()
    for i in sorted(g.get("instances", []), key=lambda i: i["start"]):
        made.add(i["start"])
        label = f"{i['profile']}@{i['start']}"
        mine: list[dict[str, Any] | None] = [
            a for a in allocs if (a.get("mig") or {}).get("start") == i["start"]
        ]
        out += [Slice(_share_label(label, a), a, i.get("memory_mib")) for a in mine or [None]]
    for a in allocs:
        mig = a.get("mig")
        if mig and mig["start"] not in made:
            out.append(Slice(f"{mig['profile']}@{mig['start']} (being made)", a, None))
        elif not mig:
            pct = a.get("compute_pct")
            out.append(
                Slice(f"{a.get('mode') or 'share'}" + ("" if pct is None else f" {pct}%"), a, None)
            )
    return out


def gpu_table(snap: Snapshot, view: ViewState) -> Table:
    t = Table(title="GPUs", title_justify="left", box=None, padding=(0, 1))
    _column(t, "GPU")
    _column(t, "model / slice")
    _column(t, "workload")
    _column(t, "memory used/reserved/total")
    _column(t, "util", right=True)
    _column(t, "state")
    names = gpu_names(snap)
    for g in sorted(snap.gpus, key=lambda g: (g.get("node") or "", g["index"])):
        allocs = g.get("allocations", [])
        total = g["memory_total_mib"]
        mig_on = (g.get("mig_mode") or {}).get("current") == "enabled"
        reserved = g.get("reserved_memory_mib", sum(a.get("memory_mib") or 0 for a in allocs))
        t.add_row(
            Text(names[g["uuid"]], style="bold"),
            Text(f"{g.get('model') or g['name']}" + (" MIG" if mig_on else ""), style="bold"),
            f"{len(allocs)} workload(s)" if allocs else Text("idle", style="dim"),
            memory_bar(g.get("memory_used_mib"), reserved, total),
            _pct(g.get("utilization_gpu")),
            _state(g),
        )
        filtering = bool(view.text or view.tenant)
        rows = [
            s
            for s in slices(g, allocs)
            if (s.held is None and not filtering)
            or (s.held is not None and _shown(view, s.held.get("tenant"), s.held.get("name")))
        ]
        for n, s in enumerate(rows):
            a = s.held or {}
            who = Text(_who(a)) if s.held else Text("(free)", style="dim")
            if a.get("phase") not in (None, "running"):
                who.append(f" {a['phase']}", style=PHASE_STYLE.get(a["phase"], ""))
            t.add_row(
                "",
                f" {'└' if n == len(rows) - 1 else '├'} {s.label}",
                who,
                memory_bar(a.get("used_memory_mib"), a.get("memory_mib"), s.size_mib or total),
                _pct(a.get("sm_percent")),
                "",
            )
    return t


@dataclass(frozen=True)
class WorkloadRow:
    tenant: str
    name: str
    phase: str
    where: str
    gpu: int | None
    reserved_mib: int | None
    used_mib: int | None
    restarts: int
    reason: str


def gpu_names(snap: Snapshot) -> dict[str, str]:
    """Each GPU's name in the views: its index, and on a cluster (GPUs of several nodes) its node
    before it (``n1/0``)."""
    several = len({g.get("node") for g in snap.gpus}) > 1
    return {
        g["uuid"]: f"{g['node']}/{g['index']}" if several else str(g["index"]) for g in snap.gpus
    }


def workload_rows(snap: Snapshot) -> list[WorkloadRow]:
    index = {g["uuid"]: g["index"] for g in snap.gpus}
    names = gpu_names(snap)
    held = {
        (a.get("tenant"), a.get("name")): a for g in snap.gpus for a in g.get("allocations", [])
    }
    rows = []
    for w in snap.workloads:
        p = w.get("placement") or {}
        p = p.get("where") or p  # a finished workload keeps where it ran
        gpus = [index.get(u) for u in p.get("gpus", [])]
        where = ",".join(names.get(u, "?") for u in p.get("gpus", []))
        where = f"GPU {where} {p.get('mode') or ''}".rstrip() if gpus else ""
        if p.get("mig"):
            where += f" {p['mig']['profile']}@{p['mig']['start']}"
        a = held.get((w["tenant"], w["name"]), {})
        if a.get("compute_pct") is not None and not p.get("mig"):
            where += f" {a['compute_pct']}%"
        first = next((i for i in gpus if i is not None), None)
        rows.append(
            WorkloadRow(
                w["tenant"],
                w["name"],
                w["phase"],
                where,
                first,
                a.get("memory_mib"),
                a.get("used_memory_mib"),
                int(w.get("restarts") or 0),
                w.get("reason") or "",
            )
        )
    return rows


def _sort_key(key: SortKey) -> Callable[[WorkloadRow], Any]:
    match key:
        case "name":
            return lambda r: (r.tenant, r.name)
        case "phase":
            return lambda r: (PHASES.index(r.phase) if r.phase in PHASES else 99, r.tenant, r.name)
        case "gpu":
            return lambda r: (r.gpu is None, r.gpu or 0, r.tenant, r.name)
        case "memory":
            return lambda r: (-(r.reserved_mib or 0), r.tenant, r.name)
        case "restarts":
            return lambda r: (-r.restarts, r.tenant, r.name)
        case _:
            assert_never(key)


def _mib(v: int | None) -> str:
    return "-" if v is None else f"{v / GIB:.1f}G"


def workload_table(rows: list[WorkloadRow], view: ViewState) -> Table:
    head = f"workloads (sorted by {view.sort}{', reversed' if view.reverse else ''})"
    t = Table(title=head, title_justify="left", expand=True, box=None, padding=(0, 1))
    for col in ("workload", "phase", "where", "memory used/reserved", "restarts", "reason"):
        t.add_column(col, no_wrap=True, overflow="ellipsis", ratio=1 if col == "reason" else None)
    for r in sorted(rows, key=_sort_key(view.sort), reverse=view.reverse):
        t.add_row(
            f"{r.tenant}/{r.name}",
            Text(r.phase, style=PHASE_STYLE.get(r.phase, "")),
            r.where,
            f"{_mib(r.used_mib)}/{_mib(r.reserved_mib)}",
            str(r.restarts),
            r.reason,
        )
    return t


def pending_table(snap: Snapshot, view: ViewState) -> Table:
    t = Table(
        title="pending (most important first)",
        title_justify="left",
        expand=True,
        box=None,
        padding=(0, 1),
    )
    for col in ("workload", "priority", "asks", "waiting because"):
        t.add_column(
            col, no_wrap=True, overflow="ellipsis", ratio=1 if col == "waiting because" else None
        )
    waiting = [w for w in snap.workloads if w["phase"] == "pending"]
    waiting = [w for w in waiting if _shown(view, w["tenant"], w["name"], w.get("reason"))]
    for w in sorted(
        waiting, key=lambda w: (-(w.get("spec") or {}).get("priority", 0), w["tenant"], w["name"])
    ):
        spec = w.get("spec") or {}
        ask = spec.get("gpu") or {}
        asks = " ".join(
            f"{k}={v}"
            for k, v in (
                ("mig", ask.get("mig_profile")),
                ("count", ask.get("count") or (ask["devices"] if ask.get("devices") else None)),
                ("memory", _mib(ask.get("memory_mib")) if ask.get("memory_mib") else None),
                ("memory", f"{ask['memory_pct']}%" if ask.get("memory_pct") else None),
                ("compute", f"{ask['compute_pct']}%" if ask.get("compute_pct") else None),
                (
                    "fraction",
                    f"{ask['fraction_milli'] / 1000:g}" if ask.get("fraction_milli") else None,
                ),
            )
            if v
        )
        t.add_row(
            f"{w['tenant']}/{w['name']}",
            str(spec.get("priority", "")),
            asks or "-",
            w.get("reason") or "",
        )
    return t


def deployment_table(snap: Snapshot, view: ViewState) -> Table:
    t = Table(title="deployments", title_justify="left", box=None, padding=(0, 1))
    for col in ("deployment", "ready/wanted", "req/s", "in flight", "queued", "p99 ms", "429s"):
        t.add_column(
            col,
            no_wrap=True,
            overflow="ellipsis",
            justify="left" if col == "deployment" else "right",
        )
    for d in sorted(snap.deployments, key=lambda d: (d["tenant"], d["name"])):
        if not _shown(view, d["tenant"], d["name"]):
            continue
        tr = d.get("traffic") or {}
        p99 = tr.get("p99_ms")
        t.add_row(
            f"{d['tenant']}/{d['name']}",
            f"{d['replicas_ready']}/{d['replicas_wanted']}",
            f"{tr.get('rate', 0):.1f}",
            str(tr.get("in_flight", 0)),
            str(tr.get("queued", 0)),
            "-" if p99 is None else f"{p99:.0f}",
            str(tr.get("rejected", 0)),
        )
    return t


def header(snap: Snapshot, view: ViewState) -> Text:
    pending = sum(1 for w in snap.workloads if w["phase"] == "pending")
    nodes = sorted({g["node"] for g in snap.gpus if g.get("node")})
    line = Text("gpufrac top ", style="bold")
    line.append(f"{snap.server}" + (f" ({', '.join(nodes)})" if nodes else ""))
    line.append(
        f"  {len(snap.gpus)} GPU(s), {len(snap.workloads)} workload(s), {pending} pending, "
        f"{len(snap.deployments)} deployment(s)"
    )
    if snap.at is not None:
        line.append(f"  {time.strftime('%H:%M:%S', time.localtime(snap.at))}", style="dim")
    if view.text or view.tenant:
        line.append(f"  filter: {view.tenant or 'all tenants'} {view.text!r}", style="cyan")
    line.append("\n")
    if snap.error is not None:
        since = "" if snap.at is None else " (the view is from the last answer)"
        line.append(f"agent not answering: {snap.error}; retrying every second{since}", "bold red")
    return line


def footer(view: ViewState) -> Text:
    if view.typing:
        return Text(f"filter: {view.draft}▌   enter apply · esc cancel · backspace delete")
    return Text(
        f"q quit · s sort ({view.sort}) · r reverse · / filter text · "
        f"t tenant ({view.tenant or 'all'}) · esc clear filters   "
        "memory: █ used ▒ reserved ░ free",
        style="reverse",
    )


def frame(snap: Snapshot, view: ViewState) -> Group:
    """Everything, uncut (for ``--once``): header, GPUs with their slices, workloads, deployments,
    pending."""
    return Group(header(snap, view), *_body(snap, view))


def render(snap: Snapshot, view: ViewState) -> RenderableType:
    """One full-screen frame: the body cut to the screen's height, the keys always on its last
    line."""
    layout = Layout()
    layout.split_column(
        Layout(header(snap, view), size=2),
        Layout(Group(*_body(snap, view))),
        Layout(footer(view), size=1),
    )
    return layout


def _body(snap: Snapshot, view: ViewState) -> list[RenderableType]:
    rows = [r for r in workload_rows(snap) if r.phase != "pending"]
    rows = [r for r in rows if _shown(view, r.tenant, r.name, r.phase, r.reason, r.where)]
    parts: list[RenderableType] = [gpu_table(snap, view), Text(), workload_table(rows, view)]
    if snap.deployments:
        parts += [Text(), deployment_table(snap, view)]
    parts += [Text(), pending_table(snap, view)]
    return parts
