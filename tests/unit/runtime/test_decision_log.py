"""The decision log: the store tells its listeners of each event once it is committed (never of
one rolled back), and the log writes one line per event, as text or as JSON."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpufrac.model.event import Event
from gpufrac.runtime.decision_log import DecisionLog, format_event
from gpufrac.runtime.store import Store


def test_listeners_hear_committed_events_with_their_details(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    heard: list[tuple[Event, Mapping[str, object]]] = []
    store.listeners.append(lambda e, d: heard.append((e, d)))
    store.record_event("placed", "t/a", "mig on GPU-1", {"workload": "t/a", "gpu": "0"})
    with pytest.raises(RuntimeError), store.transaction() as db:
        store._event(db, "placed", "t/b", "never committed")
        raise RuntimeError("rolled back")
    store.put_workload("t", "c", {"x": 1})  # an event written inside another write
    assert [(e.kind, e.subject, dict(d)) for e, d in heard] == [
        ("placed", "t/a", {"workload": "t/a", "gpu": "0"}),
        ("applied", "t/c", {}),
    ]
    assert [e.id for e, _ in heard] == [e.id for e in store.events() if e.subject != "t/b"]


def test_json_lines_carry_the_event_and_its_details() -> None:
    out = io.StringIO()
    log = DecisionLog(out, "json")
    log(
        Event(1, 0.0, "placed", "t/a", "mig on GPU-1"), {"workload": "t/a", "gpu": "0", "mig": None}
    )
    log(Event(2, 1.5, "failed", "t/a", "exited with 1"), {})
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first == {
        "time": "1970-01-01T00:00:00.000+00:00",
        "level": "info",
        "event": "placed",
        "subject": "t/a",
        "message": "mig on GPU-1",
        "workload": "t/a",
        "gpu": "0",
    }
    assert (second["level"], second["event"], second["time"][-12:]) == (
        "warning",
        "failed",
        "01.500+00:00",
    )


def test_text_is_one_readable_line() -> None:
    line = format_event(Event(1, 0.0, "evicted", "t/a", "made room for t/b"), {}, "text")
    assert "\n" not in line and line.endswith("evicted          t/a  made room for t/b")
    assert line[8] == "!"  # a warning is marked


def test_a_closed_stream_loses_the_line_not_the_agent() -> None:
    out = io.StringIO()
    out.close()
    DecisionLog(out, "text")(Event(1, 0.0, "placed", "t/a", ""), {})
