"""A log read from its end, within a byte cap (``runtime.log_tail``): the lines asked for, whole,
and whether the cap left some out; never more of the file in memory than the cap. The bounds on
reads under way (``Slots``), and the settings that give them (``log_relay_*``)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from gpufrac.errors import Busy, InputError
from gpufrac.model.settings import OperatorSettings, parse_settings
from gpufrac.runtime.log_tail import LogReads, Slots, lines_of, read_tail, read_window

TEN = b"".join(b"line %d\n" % i for i in range(10))  # 7 bytes a line


@pytest.mark.parametrize(
    ("content", "tail", "max_bytes", "lines", "truncated"),
    [
        (TEN, 3, 1000, ["line 7", "line 8", "line 9"], False),
        (TEN, 0, 1000, [f"line {i}" for i in range(10)], False),
        # the cap: the newest whole lines that fit, and a word that older ones were left out
        (TEN, 0, 21, ["line 7", "line 8", "line 9"], True),
        (TEN, 0, 20, ["line 8", "line 9"], True),  # 20 bytes start inside line 7: left out
        (TEN, 5, 21, ["line 7", "line 8", "line 9"], True),
        (TEN, 2, 21, ["line 8", "line 9"], False),  # the tail fits: nothing asked for left out
        (TEN, 3, 21, ["line 7", "line 8", "line 9"], False),
        (b"a\nb\nlast, unended", 2, 1000, ["b", "last, unended"], False),
        (b"a\nb\nlast, unended", 0, 15, ["b", "last, unended"], True),  # b starts the window
        (b"a\nb\nlast, unended", 0, 14, ["last, unended"], True),
        # one line longer than the cap: its newest part, said to be cut
        (b"x" * 100, 0, 10, ["x" * 10], True),
        (b"x" * 100 + b"\n", 1, 10, ["x" * 9], True),
        (b"", 0, 10, [], False),
        (b"\xff\xfeok\n", 0, 100, ["\ufffd\ufffdok"], False),  # not UTF-8: replaced, not refused
    ],
)
def test_a_tail_within_a_cap(
    tmp_path: Path, content: bytes, tail: int, max_bytes: int, lines: list[str], truncated: bool
) -> None:
    log = tmp_path / "output.log"
    log.write_bytes(content)
    assert read_tail(log, tail=tail, max_bytes=max_bytes) == (lines, truncated)
    window, cut = read_window(log, tail=tail, max_bytes=max_bytes)
    assert len(window) <= max_bytes and cut == truncated
    assert lines_of(window, tail) == lines


def test_no_log_is_no_lines(tmp_path: Path) -> None:
    assert read_tail(tmp_path / "none.log", tail=0, max_bytes=10) == ([], False)
    with pytest.raises(ValueError, match="max_bytes"):
        read_tail(tmp_path / "none.log", tail=0, max_bytes=0)


def test_a_big_log_is_never_read_whole(tmp_path: Path) -> None:
    """32 MiB of output, a 1 MiB cap: the read holds about the cap, not the file."""
    log = tmp_path / "output.log"
    line = b"y" * 1023 + b"\n"
    with log.open("wb") as f:
        for _ in range(32):
            f.write(line * 1024)
    tracemalloc.start()
    try:
        lines, truncated = read_tail(log, tail=0, max_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert truncated and len(lines) == 1024  # 1 MiB of 1 KiB lines, the newest
    assert peak < 4 << 20, f"{peak / 2**20:.1f} MiB held to read 1 MiB of a 32 MiB log"
    # with a tail, only what holds it is read: a few lines, not the cap
    tracemalloc.start()
    try:
        assert read_tail(log, tail=2, max_bytes=1 << 20) == ([line[:-1].decode()] * 2, False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 512 << 10


def test_slots_refuse_over_their_bound_at_once_and_free_on_the_way_out() -> None:
    slots = Slots(2, what="log reads of tenant {}", setting="log_relay_per_tenant", retry_after_s=3)
    with slots.taken("a"), slots.taken("a"):
        with pytest.raises(Busy) as busy, slots.taken("a"):
            pass
        assert busy.value.retry_after_s == 3
        assert "2 log reads of tenant a are under way" in busy.value.detail
        assert "log_relay_per_tenant in gpufrac.yaml" in busy.value.detail
        with slots.taken("b"):  # another key has its own
            assert slots.held("b") == 1
    assert slots.held("a") == 0
    with pytest.raises(RuntimeError), slots.taken("a"):
        raise RuntimeError("a read that failed")
    assert slots.held("a") == 0  # given back, also on an error
    with pytest.raises(ValueError, match="bound"):
        Slots(0, what="{}", setting="x", retry_after_s=1)


def test_the_bounds_come_from_gpufrac_yaml() -> None:
    reads = LogReads(OperatorSettings())
    assert (reads.deadline_s, reads.max_bytes) == (10.0, 16 << 20)
    assert (reads.per_tenant.bound, reads.per_node.bound) == (4, 8)
    assert reads.per_tenant.retry_after_s == 10
    read = parse_settings(
        "log_relay_deadline: 1m\nlog_relay_max: 2MiB\nlog_relay_per_tenant: 1\n"
        "log_relay_per_node: 3\n"
    )
    reads = LogReads(read)
    assert (reads.deadline_s, reads.max_bytes) == (60.0, 2 << 20)
    assert (reads.per_tenant.bound, reads.per_node.bound) == (1, 3)
    assert parse_settings("log_relay_deadline: 5\n").log_relay_deadline_s == 5.0


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("log_relay_deadline: 0s\n", "log_relay_deadline"),
        ("log_relay_deadline: 11m\n", "log_relay_deadline"),
        ("log_relay_deadline: soon\n", "log_relay_deadline"),
        ("log_relay_max: 0\n", "log_relay_max"),
        ("log_relay_max: 2GiB\n", "log_relay_max"),
        ("log_relay_per_tenant: 0\n", "log_relay_per_tenant"),
        ("log_relay_per_node: many\n", "log_relay_per_node"),
    ],
)
def test_bad_bounds_are_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(InputError) as e:
        parse_settings(text)
    assert e.value.errors[0].field == field, str(e.value)
    assert e.value.errors[0].fix, str(e.value)
