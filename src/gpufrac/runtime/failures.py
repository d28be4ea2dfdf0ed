"""Actions that failed: each recorded once per condition, retried with exponential backoff, and
shown.

One mechanism for every action the agent carries out (creating or destroying a MIG instance,
starting a workload) and for a reconcile step that raised: the first failure of a (subject, action)
pair, or a failure with a different error than the last, writes one ``action_failed`` event; the
same error again writes nothing. The next try waits 1 s, 2 s, 4 s ... up to a minute; ``reason`` is
the line the workload shows meanwhile. A success after failures writes one ``action_recovered``
event and forgets the pair.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from gpufrac.runtime.store import Store

BACKOFF_BASE_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Failure:
    what: str  # the action, as a person reads it: "create MIG instance 7g.141gb@0 on GPU 0"
    error: str
    count: int  # failed tries in a row
    retry_at: float

    def reason(self, now: float) -> str:
        wait = max(0.0, self.retry_at - now)
        tries = f"{self.count} tries" if self.count > 1 else "1 try"
        return f"{self.what} failed: {self.error} ({tries}; next in {wait:.0f}s)"


class Failures:
    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self._by: dict[tuple[str, str], Failure] = {}

    def failed(self, subject: str, what: str, error: BaseException | str) -> Failure:
        """Count a failure of ``what`` for ``subject`` (a workload or a GPU); record it if it is
        new."""
        text = _text(error)
        before = self._by.get((subject, what))
        count = 1 if before is None else before.count + 1
        delay = min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (count - 1))
        now = self.clock()
        failure = Failure(what, text, count, now + delay)
        self._by[(subject, what)] = failure
        if before is None or before.error != text:
            self._record("action_failed", subject, f"{what} failed: {text}; retrying with backoff")
        return failure

    def succeeded(self, subject: str, what: str) -> None:
        before = self._by.pop((subject, what), None)
        if before is not None:
            self._record(
                "action_recovered", subject, f"{what} succeeded after {before.count} failed tries"
            )

    def _record(self, kind: str, subject: str, message: str) -> None:
        """An event, if the store takes it: a failure is counted (and shown) even when the store is
        what fails."""
        with contextlib.suppress(sqlite3.Error, OSError):
            self.store.record_event(kind, subject, message)

    def waiting(self, subject: str, what: str | None = None) -> Failure | None:
        """The failure of ``subject`` (of ``what``, or of any action) whose retry is not due yet."""
        now = self.clock()
        for (s, w), f in self._by.items():
            if s == subject and (what is None or w == what) and f.retry_at > now:
                return f
        return None

    def latest(self, subject: str) -> Failure | None:
        """The failure of ``subject`` retried last (due or not), for its reason."""
        found = [f for (s, _), f in self._by.items() if s == subject]
        return max(found, key=lambda f: f.retry_at, default=None)

    def forget(self, subject: str) -> None:
        """The subject is gone (deleted): its failures with it."""
        for key in [k for k in self._by if k[0] == subject]:
            del self._by[key]

    def subjects(self) -> set[str]:
        return {s for s, _ in self._by}

    def of(self, subject: str) -> list[Failure]:
        """Every failure of ``subject`` now, due or not."""
        return [f for (s, _), f in list(self._by.items()) if s == subject]


def _text(error: BaseException | str) -> str:
    if isinstance(error, str):
        return error
    text = str(error) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
