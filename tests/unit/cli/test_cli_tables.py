"""The CLI's tables and output formats, from API answers (no agent)."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from gpufrac.cli.describe import describe_lines
from gpufrac.cli.tables import gpu_rows, output_format, share_text, size, table_text, workload_rows


def test_a_table_is_one_line_per_row_whatever_its_cells_hold() -> None:
    text = table_text(["A", "LONG"], [["x", "two\nlines " + "y" * 300], ["", "z"]])
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[1] == "x  two lines " + "y" * 300
    assert lines[2].split() == ["-", "z"]  # an empty cell shows as -
    assert lines[0].index("LONG") == lines[1].index("two")


@pytest.mark.parametrize(
    ("output", "as_json", "expected"),
    [(None, False, "table"), (None, True, "json"), ("wide", False, "wide"), ("json", True, "json")],
)
def test_output_formats(output: str | None, as_json: bool, expected: str) -> None:
    assert output_format(output, as_json) == expected


@pytest.mark.parametrize(("output", "as_json"), [("xml", False), ("yaml", True)])
def test_a_bad_or_clashing_format_is_exit_2(output: str, as_json: bool) -> None:
    with pytest.raises(typer.Exit) as e:
        output_format(output, as_json)
    assert e.value.exit_code == 2


@pytest.mark.parametrize(
    ("mib", "text"), [(None, "-"), (512, "512MiB"), (1536, "1.5GiB"), (18432, "18GiB")]
)
def test_sizes(mib: int | None, text: str) -> None:
    assert size(mib) == text


def alloc(**kw: Any) -> dict[str, Any]:
    base = {
        "tenant": "search",
        "name": "embed",
        "phase": "running",
        "mode": "mps",
        "mig": None,
        "memory_mib": 8192,
        "compute_pct": 30,
        "used_memory_mib": 1500,
        "sm_percent": None,
    }
    return {**base, **kw}


MIG_GPU = {
    "uuid": "GPU-a",
    "index": 0,
    "name": "NVIDIA H200",
    "node": "n1",
    "memory_total_mib": 143771,
    "memory_used_mib": 1500,
    "utilization_gpu": None,
    "mig_mode": {"current": "enabled", "pending": "enabled"},
    "instances": [
        {"profile": "1g.18gb", "start": 0, "gi_id": 3, "uuid": "MIG-x", "busy": True},
        {"profile": "1g.18gb", "start": 1, "gi_id": 4, "uuid": "MIG-y", "busy": False},
    ],
    "processes": [],
    "cordoned": "cordoned by hand",
    "mig_layout_pinned": False,
    "allocations": [
        alloc(
            tenant=None,
            name=None,
            mode="mig",
            mig={"profile": "1g.18gb", "start": 0, "gi_id": 3},
            memory_mib=16384,
            compute_pct=None,
            used_memory_mib=None,
        ),
        alloc(
            name="next",
            mode="mig",
            phase="starting",
            mig={"profile": "2g.35gb", "start": 2, "gi_id": None},
            compute_pct=None,
        ),
    ],
    "reserved_memory_mib": 24576,
    "reserved_compute_pct": 0,
}
MPS_GPU = {
    **MIG_GPU,
    "uuid": "GPU-b",
    "index": 1,
    "mig_mode": {"current": "disabled", "pending": "disabled"},
    "instances": [],
    "cordoned": None,
    "allocations": [alloc()],
    "reserved_memory_mib": 8192,
    "reserved_compute_pct": 30,
}


def test_gpu_rows_show_each_instance_and_share_with_its_workload() -> None:
    headers, rows = gpu_rows([MIG_GPU, MPS_GPU], wide=False)
    text = table_text(headers, rows).splitlines()
    assert text[1].split()[:3] == ["0", "(MIG)", "2"] and "cordoned: cordoned by hand" in text[1]
    assert text[2].split()[:4] == ["0", "1g.18gb@0", "(another", "tenant)"]
    assert text[3].split()[:3] == ["0", "1g.18gb@1", "-"]  # free
    assert text[4].split()[:4] == ["0", "2g.35gb@2", "search/next", "starting"]
    assert text[4].endswith("instance being created")
    assert text[5].split()[:3] == ["1", "(mps)", "1"]
    assert text[6].split()[:8] == [
        "1",
        "mps",
        "search/embed",
        "running",
        "1.5GiB",
        "8GiB",
        "-",
        "30%",
    ]
    wide_headers, wide_rows = gpu_rows([MIG_GPU], wide=True)
    assert len(wide_headers) == len(wide_rows[0]) and wide_rows[1][-2:] == ["3", "MIG-x"]


def workload(**kw: Any) -> dict[str, Any]:
    base = {
        "tenant": "search",
        "name": "embed",
        "phase": "running",
        "restarts": 0,
        "reason": "",
        "generation": 1,
        "attempts": 1,
        "exit_code": None,
        "env": {},
        "spec": {"type": "service", "restart": "always", "gpu": {"memory_mib": 8192}},
        "placement": {"outcome": "placed", "mode": "mps", "gpus": ["GPU-b"], "mig": None},
        "qos": {},
        "events": [],
    }
    return {**base, **kw}


def test_workload_rows_show_gpu_index_node_and_share() -> None:
    done = workload(
        name="done",
        phase="succeeded",
        placement={
            "outcome": "completed",
            "phase": "succeeded",
            "where": {"mode": "mig", "gpus": ["GPU-a"], "mig": {"profile": "1g.18gb", "start": 1}},
        },
    )
    _, rows = workload_rows([workload(), done], [MIG_GPU, MPS_GPU], wide=False)
    assert rows[0][4:7] == ["n1", "1", "8GiB/30%"]
    assert rows[1][4:7] == ["n1", "0", "1g.18gb@1"]  # where the finished one ran
    assert share_text(workload(placement=None, spec={"gpu": {"count": 2}}), None) == "2 whole"
    asked = {"memory_mib": None, "memory_pct": 50, "compute_pct": 30}
    assert share_text(workload(placement=None, spec={"gpu": asked}), None) == "50% mem/30%"
    asked = {"memory_mib": None, "memory_pct": None, "compute_pct": 30}  # HAMi's gpucores alone
    assert share_text(workload(placement=None, spec={"gpu": asked}), None) == "all mem/30%"
    asked = {"memory_mib": 10240, "devices": 2}  # a share of each of two GPUs, waiting
    assert share_text(workload(placement=None, spec={"gpu": asked}), None) == "10GiB x2"
    lines = describe_lines(done, [MIG_GPU, MPS_GPU])
    assert "Placement (finished; where it ran):" in lines
    assert "  GPU:          0 (GPU-a)" in lines


def test_a_workloads_log_line_cannot_drive_the_terminal() -> None:
    from gpufrac.cli.agent_cmds import _shown_escaped

    line = "\x1b]0;TITLE\x07\x1b[31mRED\x1b[0m\r\x1b[Kfake\tok \x9b2J é"
    shown = _shown_escaped(line)
    assert not any((ord(c) < 32 and c != "\t") or 0x7F <= ord(c) <= 0x9F for c in shown)
    assert shown == "\\x1b]0;TITLE\\x07\\x1b[31mRED\\x1b[0m\\x0d\\x1b[Kfake\tok \\x9b2J é"


def test_describe_says_a_workload_is_a_container_of_which_image_and_what_it_mounts() -> None:
    spec = {
        "type": "job",
        "restart": "never",
        "gpu": {"memory_mib": 8192},
        "image": "localhost/model:1",
        "engine": "vllm",
        "mounts": [{"source": "/srv/models", "target": "/models", "read_only": True}],
    }
    lines = describe_lines(workload(spec=spec, placement=None), [MIG_GPU, MPS_GPU])
    assert "Image:       localhost/model:1 (vllm)" in lines
    assert "Mount:       /srv/models -> /models (ro)" in lines
    process = describe_lines(workload(placement=None), [MIG_GPU, MPS_GPU])
    assert not any(line.startswith(("Image:", "Mount:")) for line in process)


def test_describe_says_a_waiting_workload_is_not_arbitrated_because_it_waits() -> None:
    qos = {"class": 1, "priority": 50, "qos": "normal", "weight": 1, "min_share": 0.0}
    waiting = workload(phase="pending", placement=None, qos=qos)
    assert any(
        line.strip().startswith("Arbiter") and line.endswith("not arbitrated (it waits)")
        for line in describe_lines(waiting, [MIG_GPU, MPS_GPU])
    )
    running = describe_lines(workload(placement=None, qos=qos), [MIG_GPU, MPS_GPU])
    assert any(line.endswith("not arbitrated (alone on its GPU)") for line in running)
