"""``gpufrac describe workload``: one workload as readable sections (status, placement, QoS,
environment, history), not raw JSON. A finished workload still says where it ran."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, assert_never

from gpufrac.cli.tables import (
    allocation_of,
    gpu_place,
    heartbeat_text,
    labels_text,
    pct,
    share_text,
    size,
    when,
)

if TYPE_CHECKING:
    from gpufrac.api.schemas import MoveJson


def _section(title: str, fields: list[tuple[str, str]]) -> list[str]:
    width = max((len(k) for k, _ in fields), default=0) + 2
    return [f"{title}:"] + [f"  {(k + ':').ljust(width)}{v}" for k, v in fields]


def describe_lines(w: dict[str, Any], gpus: list[dict[str, Any]]) -> list[str]:
    """``w``: ``GET /workloads/{tenant}/{name}``; ``gpus``: ``GET /gpus``'s list."""
    spec = w.get("spec") or {}
    lines = [
        f"Name:        {w['tenant']}/{w['name']}",
        f"Type:        {spec.get('type', '-')} (restart {spec.get('restart', '-')})",
        f"Generation:  {w['generation']}",
        f"Phase:       {w['phase']}",
    ]
    if w.get("reason"):
        lines.append(f"Reason:      {w['reason']}")
    if spec.get("image"):  # a container: of which image, and what of the host it sees
        lines.append(
            f"Image:       {spec['image']}" + (f" ({spec['engine']})" if spec.get("engine") else "")
        )
        for m in spec.get("mounts") or []:
            mode = "ro" if m.get("read_only", True) else "rw"
            lines.append(f"Mount:       {m.get('source')} -> {m.get('target')} ({mode})")
    elif spec.get("engine"):
        lines.append(f"Engine:      {spec['engine']}")
    exit_code = "-" if w.get("exit_code") is None else str(w["exit_code"])
    # restarts: after a failure or an exit; evictions: stopped to make room (moved, preempted)
    lines.append(
        f"Attempts:    {w['attempts']} (restarts {w['restarts']}, evictions "
        f"{w.get('evictions', 0)}, last exit {exit_code})"
    )
    lines += ["", *placement_lines(w, gpus)]
    q = w.get("qos") or {}
    if q:
        placed = w.get("phase") != "pending"
        lines += ["", *_section("QoS", qos_fields(q, placed=placed))]
    env = w.get("env") or {}
    if env:
        lines += ["", "Environment:"] + [f"  {k}={v}" for k, v in sorted(env.items())]
    events = w.get("events") or []
    lines += ["", "Events:" if events else "Events:      none"]
    lines += [f"  {when(e['at'])}  {e['kind']:<14}  {e['message']}" for e in events]
    return lines


def move_text(m: MoveJson) -> str:
    """One move made for this workload: whose, from where, and how."""
    how = "replaced by a new replica, then drained" if m.how == "replace" else "restarted elsewhere"
    return f"{m.workload} off its {m.mig.profile} at start {m.mig.start} on {m.gpu} ({how})"


def placement_lines(w: dict[str, Any], gpus: list[dict[str, Any]]) -> list[str]:
    from gpufrac.api.schemas import CompletedJson, DecisionJson, WhereJson, placement_answer

    placed = placement_answer(w.get("placement"))
    where: DecisionJson | WhereJson | None  # both say mode, gpus and mig
    match placed:
        case DecisionJson():  # where it runs (or nowhere: it waits)
            finished, where = False, placed
        case CompletedJson():  # where it ran (None: it never did)
            finished, where = True, placed.where
        case None:
            finished, where = False, None
        case _:
            assert_never(placed)
    alloc = allocation_of(w, gpus)
    uuids = [] if where is None else where.gpus
    moved = (
        [("Move", move_text(m)) for m in placed.moves] if isinstance(placed, DecisionJson) else []
    )
    if where is None or not uuids:
        why = (placed.reason if placed is not None else "") or w.get("reason") or "not placed yet"
        return _section("Placement", [("Where", "nowhere"), ("Why", why), *moved])
    index, node = gpu_place(uuids, gpus)
    fields = [
        ("Node", node),
        ("GPU", f"{index} ({', '.join(uuids)})"),
        ("Mode", str(where.mode or "-")),
    ]
    mig = where.mig
    if mig is not None:
        gi = (alloc or {}).get("mig", {}) or {}
        fields.append(
            (
                "MIG instance",
                f"{mig.profile} at start {mig.start}"
                + (f" (GPU instance {gi['gi_id']})" if gi.get("gi_id") is not None else ""),
            )
        )
    else:
        fields.append(("Share", share_text(w, alloc)))
    if alloc is not None:
        used = alloc.get("used_memory_mib")
        fields.append(
            (
                "Memory",
                f"{size(used)} used of {size(alloc['memory_mib'])} reserved"
                if used is not None
                else f"{size(alloc['memory_mib'])} reserved",
            )
        )
        if alloc.get("compute_pct") is not None:
            fields.append(("Compute", f"{alloc['compute_pct']}% of the SMs (MPS)"))
        if alloc.get("sm_percent") is not None:
            fields.append(("SM use", pct(alloc["sm_percent"])))
    title = "Placement (finished; where it ran)" if finished else "Placement"
    return _section(title, [*fields, *moved])


def qos_fields(q: dict[str, Any], *, placed: bool = True) -> list[tuple[str, str]]:
    idle = "not arbitrated (alone on its GPU)" if placed else "not arbitrated (it waits)"
    fields = [
        ("Class", f"{q['class']} (priority {q['priority']}, {q['qos']})"),
        ("Weight", str(q["weight"])),
        ("Min share", f"{q['min_share']:.0%}"),
        ("Arbiter", str(q.get("mode") or idle)),
    ]
    if q.get("paused"):
        fields.append(("Paused", f"now, by {q.get('paused_by') or 'another workload'}"))
    if q.get("pauses"):
        fields.append(
            (
                "Pauses",
                f"{q['pauses']}, {q.get('paused_total_s') or 0:.1f}s in all; the longest in the"
                f" last hour {q.get('longest_pause_1h_s') or 0:.1f}s",
            )
        )
    measured = q.get("measured_share")
    by = {"nvml": "NVML per-process SM use", "sdk": "the SDK's CUDA-event timings"}
    fields.append(
        (
            "Measured",
            f"{measured:.0%} of its GPU "
            f"({by.get(q.get('measured_by') or '', q.get('measured_by'))})"
            if measured is not None
            else "not measured (no NVML per-process reading and no SDK timings)",
        )
    )
    if q.get("arbiter_share") is not None:
        fields.append(
            ("Given", f"{q['arbiter_share']:.0%} of its GPU's busy time (the last window)")
        )
    if q.get("run_s") is not None and q.get("busy_s"):
        fields.append(("Ran", f"{q['run_s']:.1f}s of its GPU's {q['busy_s']:.1f}s busy time"))
    return fields


def node_lines(n: dict[str, Any], gpus: list[dict[str, Any]]) -> list[str]:
    """``n``: ``GET /nodes/{name}``; ``gpus``: ``GET /gpus``'s list (its GPUs are those with its
    name)."""
    lines = [
        f"Name:        {n['name']}",
        f"State:       {n['state']}",
        f"Labels:      {labels_text(n.get('labels') or {})}",
        f"Version:     {n.get('version') or '-'}",
        f"Heartbeat:   {heartbeat_text(n.get('last_heartbeat_s'))}",
    ]
    if n.get("address"):
        lines.append(f"Address:     {n['address']}")
    own = [g for g in gpus if g.get("node") == n["name"]]
    lines += ["", f"GPUs:        {n['gpus']}" if not own else "GPUs:"]
    for g in own:
        mig = (g.get("mig_mode") or {}).get("current") == "enabled"
        lines.append(
            f"  {g['index']}  {g.get('name', '-')}  {'MIG' if mig else 'no MIG'}  reserved "
            f"{size(g.get('reserved_memory_mib'))} of {size(g.get('memory_total_mib'))}  "
            f"{g['uuid']}"
        )
    placed = n.get("workloads") or []
    lines += ["", "Workloads:" if placed else "Workloads:   none"]
    lines += [f"  {w}" for w in placed]
    events = n.get("events") or []
    lines += ["", "Events:" if events else "Events:      none"]
    lines += [f"  {when(e['at'])}  {e['kind']:<14}  {e['message']}" for e in events]
    return lines
