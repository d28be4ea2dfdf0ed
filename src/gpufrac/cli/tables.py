"""What ``gpufrac get`` and ``gpufrac events`` print: the output formats, and tables as plain text.

A table is plain text in aligned columns, one line per row whatever the width of the terminal (a
long reason makes a long line; it is never broken into fragments), so ``gpufrac get workloads | grep
NAME`` gives the whole row. ``-o json`` is the API's answer as it came, ``-o yaml`` the same in
YAML, ``-o name`` one ``TENANT/NAME`` (a GPU: its index) per line, as other commands take them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, assert_never, get_args

import typer

from gpufrac.cli.common import fail

if TYPE_CHECKING:
    from gpufrac.api.schemas import EventJson

Output = Literal["table", "wide", "json", "yaml", "name"]
OUTPUTS: tuple[Output, ...] = get_args(Output)
Kind = Literal["workloads", "deployments", "gpus", "nodes"]
KINDS: tuple[Kind, ...] = get_args(Kind)

OutputOpt = Annotated[
    str | None,
    typer.Option(
        "--output",
        "-o",
        help="table (default), wide (more columns), json (the API's answer), yaml, or name.",
        show_default=False,
    ),
]


def output_format(output: str | None, as_json: bool, allowed: Sequence[Output] = OUTPUTS) -> Output:
    """The format asked for (``--json`` is ``-o json``); anything else is bad input (exit 2)."""
    if output is None:
        return "json" if as_json else "table"
    for o in allowed:
        if output == o:
            if as_json and o != "json":
                raise fail(f"--json and -o {output} ask for two formats: give one", 2)
            return o
    raise fail(f"-o {output!r} is not a format: use {', '.join(allowed)}", 2)


def kind_of(what: str) -> Kind:
    for k in KINDS:
        if what == k:
            return k
    raise fail(f"cannot get {what!r}: use workloads, deployments, gpus or nodes", 2)


def table_text(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Aligned columns, two spaces apart, one line per row (line breaks in a cell become spaces)."""
    cells = [[" ".join(str(c).split()) or "-" for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [list(headers), *cells]
    ]
    return "\n".join(lines)


def as_yaml(data: Any) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip("\n")


def size(mib: int | None) -> str:
    """Memory for people: 512MiB, 1.5GiB, 18GiB."""
    if mib is None:
        return "-"
    if mib < 1024:
        return f"{mib}MiB"
    return f"{mib / 1024:.1f}".removesuffix(".0") + "GiB"


def pct(value: int | float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def when(at: float) -> str:
    """An event's time, local, to the second (the date too when it is not today)."""
    t = time.localtime(at)
    today = time.localtime()
    same = (t.tm_year, t.tm_yday) == (today.tm_year, today.tm_yday)
    return time.strftime("%H:%M:%S" if same else "%Y-%m-%d %H:%M:%S", t)


def render(kind: Kind, data: dict[str, Any], gpus: list[dict[str, Any]], output: Output) -> str:
    """``data``: the API's answer for ``kind``; ``gpus``: ``GET /gpus``'s list (where things
    run)."""
    match output:
        case "json":
            return json.dumps(data, indent=2)
        case "yaml":
            return as_yaml(data)
        case "name":
            if kind == "gpus":
                return "\n".join(str(g["index"]) for g in data["gpus"])
            if kind == "nodes":
                return "\n".join(str(n["name"]) for n in data["nodes"])
            return "\n".join(f"{x['tenant']}/{x['name']}" for x in data[kind])
        case "table" | "wide":
            wide = output == "wide"
            match kind:
                case "workloads":
                    return table_text(*workload_rows(data["workloads"], gpus, wide))
                case "deployments":
                    return table_text(*deployment_rows(data["deployments"], wide))
                case "gpus":
                    return table_text(*gpu_rows(data["gpus"], wide))
                case "nodes":
                    return table_text(*node_rows(data["nodes"], wide))
                case _:
                    assert_never(kind)
        case _:
            assert_never(output)


# -- workloads ------------------------------------------------------------------------------------


def where_ran(w: dict[str, Any]) -> dict[str, Any]:
    """A workload's placement, or where a finished one ran (kept after its GPU was given back)."""
    p = w.get("placement") or {}
    where: dict[str, Any] = p.get("where") or p
    return where


def allocation_of(w: dict[str, Any], gpus: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The workload's entry in ``GET /gpus`` (its first GPU's), if it holds one now."""
    for g in gpus:
        for a in g.get("allocations", []):
            if a["tenant"] == w["tenant"] and a["name"] == w["name"]:
                return dict(a)
    return None


def share_text(w: dict[str, Any], alloc: dict[str, Any] | None) -> str:
    """MIG ``PROFILE@START``, or the share: memory (and compute under MPS); from the request while
    it holds nothing."""
    mig = where_ran(w).get("mig") or (alloc or {}).get("mig")
    if mig:
        return f"{mig['profile']}@{mig['start']}"
    if alloc is not None:
        if alloc["mode"] == "exclusive":
            return "whole"
        text = size(alloc["memory_mib"])
        return text + (f"/{alloc['compute_pct']}%" if alloc.get("compute_pct") else "")
    gpu = (w.get("spec") or {}).get("gpu") or {}
    if gpu.get("mig_profile"):
        return str(gpu["mig_profile"])
    if gpu.get("count"):
        return f"{gpu['count']} whole" if gpu["count"] > 1 else "whole"
    each = f" x{gpu['devices']}" if gpu.get("devices", 1) > 1 else ""  # a share of each GPU
    if gpu.get("fraction_milli"):
        return f"{gpu['fraction_milli'] / 1000:g} GPU" + each
    compute = f"/{gpu['compute_pct']}%" if gpu.get("compute_pct") else ""
    if gpu.get("memory_mib"):
        return size(gpu["memory_mib"]) + compute + each
    if gpu.get("memory_pct"):
        return f"{gpu['memory_pct']}% mem" + compute + each
    if compute:
        return "all mem" + compute  # a compute cap alone: the GPU's whole memory
    return "-"


def gpu_place(uuids: Sequence[str], gpus: list[dict[str, Any]]) -> tuple[str, str]:
    """(GPU indexes, node) of GPU UUIDs; a GPU the agent no longer lists shows its UUID."""
    by_uuid = {g["uuid"]: g for g in gpus}
    found = [by_uuid.get(u) for u in uuids]
    index = ",".join(str(g["index"]) if g else u for g, u in zip(found, uuids, strict=True))
    nodes = sorted({str(g.get("node") or "-") for g in found if g})
    return index or "-", ",".join(nodes) or "-"


def workload_rows(
    workloads: list[dict[str, Any]], gpus: list[dict[str, Any]], wide: bool
) -> tuple[list[str], list[list[str]]]:
    headers = ["TENANT", "NAME", "PHASE", "RESTARTS", "NODE", "GPU", "SLICE"]
    if wide:
        headers += ["EVICTIONS", "MODE", "MEM-USED", "SM", "PRIORITY", "GPU-UUID"]
    headers.append("REASON")
    rows = []
    for w in workloads:
        where = where_ran(w)
        uuids = list(where.get("gpus") or [])
        alloc = allocation_of(w, gpus)
        index, node = gpu_place(uuids, gpus) if uuids else ("-", "-")
        if node == "-" and w.get("node"):  # a GPU no longer listed (its node gone): where it ran
            node = str(w["node"])
        row = [w["tenant"], w["name"], w["phase"], str(w["restarts"]), node, index]
        row.append(share_text(w, alloc))
        if wide:
            row += [
                str(w.get("evictions", 0)),
                str(where.get("mode") or "-"),
                size((alloc or {}).get("used_memory_mib")),
                pct((alloc or {}).get("sm_percent")),
                str((w.get("spec") or {}).get("priority", "-")),
                ",".join(uuids) or "-",
            ]
        row.append(w.get("reason") or "-")
        rows.append(row)
    return headers, rows


# -- GPUs -----------------------------------------------------------------------------------------


def _shared_instance_rows(
    index: int, inst: dict[str, Any], shares: list[dict[str, Any]], used: int
) -> list[tuple[list[str], int | None, str, str]]:
    """A MIG instance shared inside: its row (how many share it, under which mode, what they
    reserved), then one row per share (``-> mps``)."""
    mode = shares[0]["mode"]
    compute = sum(a["compute_pct"] or 0 for a in shares)
    row = [str(index), f"{inst['profile']}@{inst['start']}", f"{len(shares)} sharing ({mode})"]
    row += ["-", size(used), size(sum(a["memory_mib"] for a in shares))]
    row += [size(inst.get("memory_mib")), pct(compute) if compute else "-", "-", "ok"]
    out = [(row, inst["gi_id"], inst.get("uuid") or "-", "-")]
    for a in shares:
        share = [str(index), f"-> {mode}", _holder(a), a["phase"], size(a["used_memory_mib"])]
        share += [size(a["memory_mib"]), "-", pct(a["compute_pct"]), pct(a["sm_percent"]), "ok"]
        out.append((share, inst["gi_id"], inst.get("uuid") or "-", "-"))
    return out


def _holder(a: dict[str, Any]) -> str:
    return f"{a['tenant']}/{a['name']}" if a["name"] else "(another tenant)"


def gpu_status(g: dict[str, Any]) -> str:
    notes = []
    if g.get("health", "ok") != "ok":
        notes.append(f"health {g['health']}")
    if g.get("cordoned"):
        notes.append(f"cordoned: {g['cordoned']}")
    mode = g.get("mig_mode") or {}
    if mode.get("current") != mode.get("pending"):
        notes.append(f"MIG {mode.get('current')} -> {mode.get('pending')} pending")
    if g.get("mig_layout_pinned"):
        notes.append("MIG layout pinned")
    return "; ".join(notes) or "ok"


def gpu_rows(gpus: list[dict[str, Any]], wide: bool) -> tuple[list[str], list[list[str]]]:
    """Per GPU a row, then a row per MIG instance (with its workload, or free) or per workload
    sharing it: reserved against used memory, compute and SM use."""
    headers = ["GPU", "SLICE", "WORKLOAD", "PHASE", "MEM-USED", "RESERVED", "SIZE", "COMPUTE"]
    headers += ["UTIL", "STATUS"]
    # several nodes (a cluster's control plane): GPU 0 is not one GPU, so the node is always shown
    nodes = len({g.get("node") for g in gpus}) > 1
    if wide:
        headers = ["NODE", *headers[:1], "MODEL", *headers[1:], "GI", "UUID"]
    elif nodes:
        headers = ["NODE", *headers]
    rows = []
    for g in gpus:
        allocs = g.get("allocations", [])
        mig = (g.get("mig_mode") or {}).get("current") == "enabled"
        modes = sorted({a["mode"] for a in allocs})
        kind = "MIG" if mig else "/".join(modes) or "free"
        n = len(allocs)
        compute = g.get("reserved_compute_pct") or 0
        gpu_row = [str(g["index"]), f"({kind})", f"{n} workload{'s' if n != 1 else ''}", "-"]
        gpu_row += [size(g.get("memory_used_mib")), size(g.get("reserved_memory_mib"))]
        gpu_row += [size(g.get("memory_total_mib")), pct(compute) if compute else "-"]
        gpu_row += [pct(g.get("utilization_gpu")), gpu_status(g)]
        part_rows: list[tuple[list[str], int | None, str, str]] = [
            (gpu_row, None, g["uuid"], g.get("name", "-"))
        ]
        for inst in g.get("instances", []) if mig else []:
            on = [
                a
                for a in allocs
                if a["mig"]
                and (a["mig"]["profile"], a["mig"]["start"]) == (inst["profile"], inst["start"])
            ]
            used = sum(
                p.get("used_memory_mib") or 0
                for p in g.get("processes", [])
                if p.get("gi_id") == inst["gi_id"]
            )
            shares = [a for a in on if a["mode"] != "mig"]
            if shares:  # shared inside by MPS or time-slices: the instance, then each share
                part_rows += _shared_instance_rows(g["index"], inst, shares, used)
                continue
            a = on[0] if on else None
            who = _holder(a) if a else ("(in use outside gpufrac)" if inst["busy"] else "-")
            row = [str(g["index"]), f"{inst['profile']}@{inst['start']}", who]
            row += [a["phase"] if a else "-"]
            row += [size(a["used_memory_mib"] if a else (used if inst["busy"] else None))]
            row += [size(a["memory_mib"] if a else None), size(inst.get("memory_mib")), "-"]
            row += [pct(a["sm_percent"] if a else None), "busy" if inst["busy"] else "ok"]
            part_rows.append((row, inst["gi_id"], inst.get("uuid") or "-", "-"))
        made = {(i["profile"], i["start"]) for i in g.get("instances", [])}
        for a in allocs:
            if a["mig"] and (a["mig"]["profile"], a["mig"]["start"]) in made:
                continue  # shown with its instance
            slice_ = f"{a['mig']['profile']}@{a['mig']['start']}" if a["mig"] else a["mode"]
            row = [str(g["index"]), slice_, _holder(a), a["phase"], size(a["used_memory_mib"])]
            row += [size(a["memory_mib"]), "-", pct(a["compute_pct"]), pct(a["sm_percent"])]
            row.append("instance being created" if a["mig"] else "ok")
            part_rows.append((row, None, "-", "-"))
        for row, gi, uuid, model in part_rows:
            if wide:
                row = [str(g.get("node") or "-"), row[0], model, *row[1:], str(gi or "-"), uuid]
            elif nodes:
                row = [str(g.get("node") or "-"), *row]
            rows.append(row)
    return headers, rows


# -- nodes ----------------------------------------------------------------------------------------


def labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"


def heartbeat_text(seconds: float | None) -> str:
    """How long ago a node last called in; ``-`` for one machine's agent (its own node)."""
    return "-" if seconds is None else f"{seconds:.1f}s ago"


def node_rows(nodes: list[dict[str, Any]], wide: bool) -> tuple[list[str], list[list[str]]]:
    """A row per node (one machine's agent is its own node)."""
    headers = ["NAME", "STATE", "GPUS", "HEARTBEAT", "VERSION", "LABELS"]
    if wide:
        headers.append("ADDRESS")
    rows = []
    for n in nodes:
        row = [n["name"], n["state"], str(n["gpus"]), heartbeat_text(n.get("last_heartbeat_s"))]
        row += [str(n.get("version") or "-"), labels_text(n.get("labels") or {})]
        if wide:
            row.append(str(n.get("address") or "-"))
        rows.append(row)
    return headers, rows


# -- deployments ----------------------------------------------------------------------------------


def deployment_rows(
    deployments: list[dict[str, Any]], wide: bool
) -> tuple[list[str], list[list[str]]]:
    headers = ["TENANT", "NAME", "READY", "IN-FLIGHT", "QUEUED", "P99-MS"]
    if wide:
        headers += ["REQ/S", "REJECTED", "ERRORS", "TEMPLATE"]
    headers.append("URL")
    rows = []
    for d in deployments:
        tr = d.get("traffic") or {}
        p99 = tr.get("p99_ms")
        row = [d["tenant"], d["name"], f"{d['replicas_ready']}/{d['replicas_wanted']}"]
        row += [str(tr.get("in_flight", 0)), str(tr.get("queued", 0))]
        row.append("-" if p99 is None else f"{p99:.1f}")
        if wide:
            row += [f"{tr.get('rate', 0):.1f}", str(tr.get("rejected", 0))]
            row += [str(tr.get("errors", 0)), str(d.get("template", "-"))]
        row.append(d["url"])
        rows.append(row)
    return headers, rows


# -- events ---------------------------------------------------------------------------------------

EVENT_HEADERS = ("TIME", "KIND", "SUBJECT", "MESSAGE")


# a stream's columns cannot be sized to what is still to come: wide enough for the kinds gpufrac
# records (deployment_applied) and a replica's name (TENANT/NAME-TEMPLATE-N)
KIND_WIDTH, SUBJECT_WIDTH = 18, 30


def event_line(e: EventJson) -> str:
    """One event as a line whose columns line up with ``event_header`` (for a stream of them)."""
    return (
        f"{when(e.at):<8}  {e.kind:<{KIND_WIDTH}}  {e.subject:<{SUBJECT_WIDTH}}  "
        + " ".join(e.message.split())
    ).rstrip()


def event_header() -> str:
    return f"{'TIME':<8}  {'KIND':<{KIND_WIDTH}}  {'SUBJECT':<{SUBJECT_WIDTH}}  MESSAGE"
