"""The SQLite store: schema versions, all-or-nothing writes, desired state, placements, events."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
    store.set_placement("a", "one", 1, {"outcome": "placed", "gpus": ["GPU-1"]})
    store.set_placement("a", "one", 1, {"outcome": "placed", "gpus": ["GPU-2"]})
    assert store.placement("a", "one") == (1, {"outcome": "placed", "gpus": ["GPU-2"]})
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
