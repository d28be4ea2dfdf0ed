"""The SQLite store: schema versions, all-or-nothing writes, desired state, placements, events."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpufrac.planning.sched_decision import Decision, StoredPlacement
from gpufrac.runtime.store import SCHEMA_VERSION, Store, StoreError

SPEC = {"name": "emb", "gpu": {"memory_mib": 12288}, "command": ["python"]}


def test_new_database_is_migrated_to_the_current_schema(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    assert store.schema_version() == SCHEMA_VERSION
    store.close()
    again = Store(tmp_path / "state.db")  # reopening migrates nothing and keeps data
    assert again.schema_version() == SCHEMA_VERSION


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="upgrade gpufrac"):
        Store(tmp_path / "state.db")


def test_put_is_idempotent_and_changes_bump_the_generation(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    assert store.put_workload("search", "emb", SPEC) == (1, True)
    assert store.put_workload("search", "emb", dict(SPEC)) == (
        1,
        False,
    )  # unchanged: nothing happens
    assert store.put_workload("search", "emb", {**SPEC, "command": ["python", "-m", "x"]}) == (
        2,
        True,
    )
    assert [w.key for w in store.workloads()] == ["search/emb"]
    assert [e.kind for e in store.events("search/emb")] == ["applied", "changed"]
    assert store.delete_workload("search", "emb") and not store.delete_workload("search", "emb")
    assert store.workloads() == []


def test_a_failing_transaction_changes_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.put_workload("a", "one", SPEC)
    with pytest.raises(RuntimeError), store.transaction() as db:
        db.execute("DELETE FROM workloads")
        db.execute("INSERT INTO events (at, kind, subject, message) VALUES (0, 'x', 'y', 'z')")
        raise RuntimeError("crash in the middle")
    assert [w.name for w in store.workloads()] == ["one"]
    assert all(e.kind != "x" for e in store.events())


def test_placements_follow_their_workload(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.put_workload("a", "one", SPEC)
    store.set_placement("a", "one", 1, Decision("a/one", "placed", gpus=("GPU-1",)))
    store.set_placement("a", "one", 1, Decision("a/one", "placed", gpus=("GPU-2",)))
    assert store.placement("a", "one") == StoredPlacement(
        1, Decision("a/one", "placed", gpus=("GPU-2",))
    )
    store.delete_workload("a", "one")
    assert store.placement("a", "one") is None  # cascaded


def test_a_process_killed_mid_write_leaves_the_old_state(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Store(path).put_workload("a", "keep", SPEC)
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from gpufrac.runtime.store import Store
        store = Store(Path({str(path)!r}))
        with store.transaction() as db:
            db.execute("DELETE FROM workloads")
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -9
    assert [w.name for w in Store(path).workloads()] == ["keep"]


def test_a_data_directory_of_an_older_schema_is_migrated_with_its_data(tmp_path: Path) -> None:
    from gpufrac.runtime.store import MIGRATIONS

    path = tmp_path / "state.db"
    db = sqlite3.connect(path)  # a data directory written by the previous gpufrac (schema 3)
    for version in (1, 2, 3):
        for statement in MIGRATIONS[version]:
            db.execute(statement)
    db.execute("PRAGMA user_version = 3")
    db.execute(
        "INSERT INTO workloads VALUES ('search', 'emb', ?, 2, 1.0, 1.0)",
        ('{"name": "emb"}',),
    )
    db.execute("INSERT INTO cordons VALUES ('GPU-1', 'bad fan', 1.0)")
    db.commit()
    db.close()
    store = Store(path)
    assert store.schema_version() == SCHEMA_VERSION >= 4
    assert [(w.key, w.generation) for w in store.workloads()] == [("search/emb", 2)]
    assert store.cordons() == {"GPU-1": "bad fan"}
    assert store.mig_pins() == frozenset()
    store.pin_mig("GPU-0")
    assert store.mig_pins() == {"GPU-0"}
    assert store.unpin_mig("GPU-0") and not store.unpin_mig("GPU-0")


def test_events_are_pruned_to_the_newest(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    for i in range(30):
        store.record_event("x", "a/b", str(i))
    assert store.prune_events(keep=10) == 20
    assert [e.message for e in store.events(limit=100)] == [str(i) for i in range(20, 30)]


def test_events_written_with_an_apply_count_toward_the_prune_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the hostile review: events written inside another write (an apply's ``applied``, a
    delete's) never counted, so a flood of applies grew the table past any bound."""
    from gpufrac.runtime import store as store_module

    monkeypatch.setattr(store_module, "PRUNE_EVERY", 10)
    monkeypatch.setattr(store_module, "EVENTS_KEPT", 5)
    store = Store(tmp_path / "state.db")
    for i in range(40):
        store.put_workload("a", f"w{i}", {"name": f"w{i}"})  # each records an "applied" event
    assert len(store.events(limit=1000)) <= 5 + 10
