"""``gpufrac top``'s frames and keys, from the pure functions: API answers in, text out."""

from __future__ import annotations

import io
import re
from dataclasses import replace
from typing import Any

import httpx
import pytest
from rich.console import Console

from gpufrac.cli.top import fetch
from gpufrac.cli.top_view import (
    SORT_KEYS,
    Snapshot,
    ViewState,
    frame,
    keys_from,
    memory_bar,
    next_view,
    render,
    tenants_of,
)

GIB = 1024


def alloc(tenant: str | None, name: str | None, **kw: Any) -> dict[str, Any]:
    return {"tenant": tenant, "name": name, "phase": "running", "mode": "mps", "mig": None,
            "memory_mib": 24 * GIB, "compute_pct": None, "used_memory_mib": None,
            "sm_percent": None, **kw}  # fmt: skip


def gpu(index: int, *, mig: bool, instances: list[Any], allocations: list[Any], **kw: Any) -> Any:
    mode = "enabled" if mig else "disabled"
    return {"uuid": f"GPU-{index}", "index": index, "model": "H200-141GB", "name": "NVIDIA H200",
            "memory_total_mib": 140 * GIB, "memory_used_mib": 20 * GIB, "utilization_gpu": 37,
            "mig_mode": {"current": mode, "pending": mode}, "instances": instances,
            "processes": [], "health": "ok", "node": "node-a", "cordoned": None,
            "allocations": allocations, **kw}  # fmt: skip


def workload(tenant: str, name: str, phase: str, placement: Any, **kw: Any) -> dict[str, Any]:
    return {"tenant": tenant, "name": name, "phase": phase, "reason": "", "restarts": 0,
            "placement": placement, "spec": {"priority": 50, "gpu": {}}, **kw}  # fmt: skip


MIG_PLACED = {"gpus": ["GPU-0"], "mode": "mig", "mig": {"profile": "1g.18gb", "start": 6}}
SNAP = Snapshot(
    server="http://agent:8470",
    gpus=(
        gpu(0, mig=True,
            instances=[{"profile": "1g.18gb", "start": 6, "gi_id": 1, "memory_mib": 16 * GIB},
                       {"profile": "2g.35gb", "start": 0, "gi_id": 2, "memory_mib": 32 * GIB}],
            allocations=[alloc("search", "ranker", mode="mig", memory_mib=16 * GIB,
                               used_memory_mib=3 * GIB,
                               mig={"profile": "1g.18gb", "start": 6, "gi_id": 1}),
                         alloc("search", "encoder", mode="mig", phase="starting",
                               mig={"profile": "3g.71gb", "start": 4, "gi_id": None})]),
        gpu(1, mig=False, instances=[], cordoned="maintenance",
            allocations=[alloc("research", "trainer", compute_pct=50, used_memory_mib=30 * GIB),
                         alloc(None, None, memory_mib=4 * GIB)]),
    ),
    workloads=(
        workload("search", "ranker", "running", MIG_PLACED, restarts=2),
        workload("search", "encoder", "starting",
                 {**MIG_PLACED, "mig": {"profile": "3g.71gb", "start": 4}}),
        workload("research", "trainer", "running", {"gpus": ["GPU-1"], "mode": "mps", "mig": None}),
        workload("research", "bigjob", "pending", None,
                 reason="needs 1 whole GPU(s) without MIG; 0 free now",
                 spec={"priority": 10, "gpu": {"count": 1}}),
        workload("research", "done", "succeeded",
                 {"outcome": "finished", "where": {"gpus": ["GPU-1"], "mode": "mps"}}),
    ),
    deployments=(
        {"tenant": "search", "name": "chat", "replicas_ready": 1, "replicas_wanted": 3,
         "traffic": {"rate": 12.5, "in_flight": 4, "queued": 7, "p99_ms": 180.2, "rejected": 3}},
    ),
    at=0.0,
)  # fmt: skip


def text(renderable: Any, width: int = 160, height: int = 50) -> str:
    out = io.StringIO()
    Console(file=out, width=width, height=height, color_system=None).print(renderable)
    return out.getvalue()


def line_with(screen: str, *words: str) -> str:
    found = [line for line in screen.splitlines() if all(w in line for w in words)]
    assert found, f"no line with {words} in:\n{screen}"
    return found[0]


def test_a_frame_shows_every_gpu_slice_workload_deployment_and_pending() -> None:
    screen = text(render(SNAP, ViewState()))
    lines = screen.splitlines()
    assert len(lines) == 50  # the whole screen, the keys on its last line
    assert lines[-1].startswith("q quit")
    assert "node-a" in lines[0] and "5 workload(s), 1 pending" in lines[0]
    assert "37%" in line_with(screen, " 0 ", "H200-141GB MIG", "2 workload(s)")
    assert "cordoned: maintenance" in line_with(screen, " 1 ", "H200-141GB ")
    ranker = line_with(screen, "1g.18gb@6", "search/ranker")
    assert "3.0/16.0/16.0G" in ranker  # used/reserved/size of its own MIG instance
    assert "(free)" in line_with(screen, "2g.35gb@0")
    assert "starting" in line_with(screen, "3g.71gb@4 (being made)", "search/encoder")
    trainer = line_with(screen, "mps 50%", "research/trainer")
    assert "30.0/24.0/140.0G" in trainer
    assert "(another tenant)" in line_with(screen, "mps", " -/4.0/140.0G")
    row = line_with(screen, "search/ranker", "GPU 0 mig 1g.18gb@6")
    assert re.search(r"3\.0G/16\.0G\s+2", row)  # memory used/reserved, restarts
    assert "GPU 1 mps" in line_with(screen, "research/done", "succeeded")  # where it ran
    assert re.search(r"search/chat\s+1/3\s+12\.5\s+4\s+7\s+180\s+3", screen)
    pending = line_with(screen, "research/bigjob")
    assert "count=1" in pending and "0 free now" in pending
    assert "running" not in line_with(screen, "research/bigjob")


def test_memory_bar_cells_and_numbers() -> None:
    bar = memory_bar(6 * GIB, 12 * GIB, 24 * GIB)
    assert bar.plain == "█" * 6 + "▒" * 6 + "░" * 12 + " 6.0/12.0/24.0G"
    over = memory_bar(18 * GIB, 12 * GIB, 24 * GIB)
    assert over.plain.startswith("█" * 18 + "░" * 6)
    assert any("red" in str(span.style) for span in over.spans)
    assert memory_bar(None, None, 0).plain == "░" * 24 + " -/-/0.0G"


@pytest.mark.parametrize(
    ("sent", "keys"),
    [
        ("q", ["q"]),
        ("\x1b", ["esc"]),
        ("\x1b[A\x1bOBs", ["s"]),  # arrow keys are dropped
        ("\x1b[5~t", ["t"]),
        ("\x1bt", ["esc", "t"]),
        ("ab\x7f\r", ["a", "b", "backspace", "enter"]),
    ],
)
def test_keys_from_terminal_input(sent: str, keys: list[str]) -> None:
    assert keys_from(sent) == keys


def test_keys_change_the_view() -> None:
    view = ViewState()
    assert next_view(view, "q", []) is None
    seen = [view.sort]
    for _ in SORT_KEYS:
        after = next_view(view, "s", [])
        assert after is not None
        view = after
        seen.append(view.sort)
    assert seen == [*SORT_KEYS, SORT_KEYS[0]]
    typed = view
    for key in ["/", "r", "q", "x", "backspace", "enter"]:
        step = next_view(typed, key, [])
        assert step is not None  # q while typing is a letter, not quit
        typed = step
    assert (typed.text, typed.typing) == ("rq", False)
    cancelled = next_view(next_view(typed, "/", []) or typed, "esc", [])
    assert cancelled is not None and cancelled.text == "rq"
    tenants = tenants_of(SNAP)
    assert tenants == ["research", "search"]
    cycle = []
    for _ in range(3):
        typed = next_view(typed, "t", tenants) or typed
        cycle.append(typed.tenant)
    assert cycle == ["research", "search", None]
    cleared = next_view(replace(typed, tenant="search"), "esc", tenants)
    assert cleared is not None and (cleared.text, cleared.tenant) == ("", None)


def workload_names(screen: str) -> list[str]:
    part = screen.split("workloads (sorted")[1].split("deployments")[0]
    return re.findall(r"^ (\S+/\S+) ", part, flags=re.M)


def test_sorting_the_workloads() -> None:
    by_name = workload_names(text(frame(SNAP, ViewState())))
    assert by_name == ["research/done", "research/trainer", "search/encoder", "search/ranker"]
    by_restarts = workload_names(text(frame(SNAP, ViewState(sort="restarts"))))
    assert by_restarts[0] == "search/ranker"
    by_phase = workload_names(text(frame(SNAP, ViewState(sort="phase", reverse=True))))
    assert by_phase[0] == "research/done"  # succeeded after running, reversed
    assert "sorted by phase, reversed" in text(frame(SNAP, ViewState(sort="phase", reverse=True)))


def test_filters_keep_every_gpu_and_hide_other_workloads() -> None:
    screen = text(frame(SNAP, ViewState(tenant="search")))
    assert " 0 " in line_with(screen, "H200-141GB MIG") and "cordoned" in screen  # GPU 1 stays
    assert "research/trainer" not in screen and "(another tenant)" not in screen
    assert "research/bigjob" not in screen and "search/chat" in screen
    assert workload_names(screen) == ["search/encoder", "search/ranker"]
    screen = text(frame(SNAP, ViewState(text="TRAIN")))
    assert workload_names(screen) == ["research/trainer"]
    assert "(free)" not in screen and "search/chat" not in screen


def test_an_agent_that_went_away_is_shown_with_its_last_answer() -> None:
    gone = replace(SNAP, error="cannot reach it (ConnectError: refused)")
    screen = text(render(gone, ViewState()))
    assert "agent not answering: cannot reach it (ConnectError: refused); retrying" in screen
    assert "search/ranker" in screen  # the last answer is still shown


def test_fetch_keeps_the_last_answer_when_the_agent_is_not_there() -> None:
    with httpx.Client(base_url="http://127.0.0.1:9", timeout=1) as client:  # nothing listens
        after = fetch(client, SNAP)
    assert after.error is not None and "ConnectError" in after.error
    assert after.workloads == SNAP.workloads and after.at == SNAP.at


def test_the_shares_of_a_mig_instance_shared_inside_show_under_it() -> None:
    inst = {"profile": "1g.18gb", "start": 6, "gi_id": 1, "memory_mib": 16 * GIB}
    share = {"profile": "1g.18gb", "start": 6, "gi_id": 1}
    g = gpu(0, mig=True, instances=[inst], allocations=[
        alloc("search", "embed", mig=share, memory_mib=3 * GIB, compute_pct=35),
        alloc("search", "rerank", mig=share, memory_mib=2 * GIB, compute_pct=20),
    ])  # fmt: skip
    screen = text(render(replace(SNAP, gpus=(g,), workloads=()), ViewState()))
    assert "-/3.0/16.0G" in line_with(screen, "1g.18gb@6 mps 35%", "search/embed")
    assert "-/2.0/16.0G" in line_with(screen, "1g.18gb@6 mps 20%", "search/rerank")
