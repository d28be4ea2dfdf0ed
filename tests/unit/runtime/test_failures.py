"""Failed actions: recorded once per condition, retried with a growing backoff, and shown."""

from __future__ import annotations

from pathlib import Path

from gpufrac.runtime.failures import BACKOFF_MAX_SECONDS, Failures
from gpufrac.runtime.store import Store


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_failure_is_recorded_once_per_condition_and_backs_off(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    clock = Clock()
    f = Failures(store, clock)
    what = "create MIG instance 7g.141gb@0 on GPU-0"
    delays = []
    for _ in range(10):
        got = f.failed("a/big", what, RuntimeError("Insufficient resources"))
        delays.append(got.retry_at - clock.now)
        assert f.waiting("a/big") is got
        clock.now = got.retry_at  # the retry is due
        assert f.waiting("a/big") is None
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0] and delays[-1] == BACKOFF_MAX_SECONDS
    failed = [e for e in store.events("a/big") if e.kind == "action_failed"]
    assert len(failed) == 1 and "Insufficient resources" in failed[0].message
    # a different error is a new condition: recorded again, once
    f.failed("a/big", what, RuntimeError("GPU is lost"))
    f.failed("a/big", what, RuntimeError("GPU is lost"))
    assert len([e for e in store.events("a/big") if e.kind == "action_failed"]) == 2
    reason = f.latest("a/big")
    assert reason is not None and "12 tries" in reason.reason(clock.now)
    f.succeeded("a/big", what)
    assert [e.kind for e in store.events("a/big")][-1] == "action_recovered"
    assert f.latest("a/big") is None
    f.succeeded("a/big", what)  # nothing failed: nothing recorded
    assert [e.kind for e in store.events("a/big")].count("action_recovered") == 1


def test_failures_of_one_subject_leave_the_others_alone(tmp_path: Path) -> None:
    f = Failures(Store(tmp_path / "state.db"), Clock())
    f.failed("a/x", "start", "no shim")
    assert f.waiting("a/y") is None and f.waiting("a/x", "start") is not None
    f.forget("a/x")
    assert f.subjects() == set()
