"""What the QoS arbiter's pauses come to, per workload: counts, totals, the longest of the last
hour, and one ``paused`` and one ``resumed`` event for each pause of at least a second.

The arbiter counts every pause itself (``runtime/arbiter.py``: an id when it starts, a record with
its length when it ends); the agent reads the records that ended since its last read on every
reconcile pass (``ArbiterLink.stats``) and hands them here with the members' state. So a pause
shorter than a pass is counted too, and each ``resumed`` event states that pause's own length.

Pure bookkeeping: ``observe`` takes what the arbiter said and returns the events to store.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

EVENT_AFTER_S = 1.0  # a pause this long or longer is an event (shorter ones are only counted)
RECENT_S = 3600.0  # describe's "longest in the last hour"


@dataclass(frozen=True, slots=True)
class PauseEvent:
    kind: str  # paused | resumed
    workload: str
    by: str | None  # the workload whose (higher) class held the GPU
    seconds: float  # how long it was (resumed) or had been (paused) paused


@dataclass(slots=True)
class PauseCount:
    """One workload's pauses since the agent started."""

    pauses: int = 0  # ended ones (the one under way is added by ``total``)
    seconds: float = 0.0  # their total length
    recent: deque[tuple[float, float]] = field(default_factory=deque)  # (ended at, seconds)
    ongoing: tuple[int, float, str | None] | None = None  # (id, since, by) of the pause under way
    told: set[float] = field(default_factory=set)  # starts of the pauses announced (paused)

    def total(self, now: float) -> tuple[int, float]:
        """Pauses started and seconds paused, the pause under way included."""
        if self.ongoing is None:
            return self.pauses, self.seconds
        return self.pauses + 1, self.seconds + max(0.0, now - self.ongoing[1])

    def longest(self, now: float) -> float:
        """The longest pause that ended in the last hour, or the one under way if longer."""
        while self.recent and self.recent[0][0] < now - RECENT_S:
            self.recent.popleft()
        longest = max((s for _, s in self.recent), default=0.0)
        if self.ongoing is not None:
            longest = max(longest, now - self.ongoing[1])
        return longest


class PauseBook:
    def __init__(self) -> None:
        self.counts: dict[str, PauseCount] = {}

    def observe(
        self,
        members: Mapping[str, Mapping[str, Any]],
        ended: Sequence[Mapping[str, Any]],
        now: float,
        stored: Callable[[], set[str]],
    ) -> list[PauseEvent]:
        """``members``: the arbiter's view of each member; ``ended``: the pauses that ended since
        the last call (each once); ``now``: the arbiter's clock; ``stored``: the workloads the
        agent still stores (the counts of the rest are forgotten; a finished one keeps them)."""
        out: list[PauseEvent] = []
        for p in ended:
            key = str(p["member"])
            c = self.counts.setdefault(key, PauseCount())
            seconds = float(p["seconds"])
            c.pauses += 1
            c.seconds += seconds
            c.recent.append((float(p["end"]), seconds))
            pid, start, by = int(p["id"]), float(p["start"]), p.get("by")
            if c.ongoing is not None and c.ongoing[0] == pid:
                c.ongoing = None
            if seconds >= EVENT_AFTER_S:
                if start not in c.told:  # it began and ended between two reads
                    out.append(PauseEvent("paused", key, by, seconds))
                out.append(PauseEvent("resumed", key, by, seconds))
            c.told.discard(start)
        for key, m in members.items():
            c = self.counts.setdefault(key, PauseCount())
            current, began = m.get("pause_id"), m.get("paused_since")
            if not m.get("paused") or current is None or began is None:
                c.ongoing = None
                continue
            since = float(began)
            c.ongoing = (int(current), since, m.get("paused_by"))
            if now - since >= EVENT_AFTER_S and since not in c.told:
                c.told.add(since)
                out.append(PauseEvent("paused", key, m.get("paused_by"), now - since))
        gone = [k for k in self.counts if k not in members]
        if gone:
            keep = stored()
            for key in gone:
                if key not in keep:
                    del self.counts[key]
        return out

    def view(self, key: str, now: float) -> dict[str, Any]:
        """For describe and the API: pauses, seconds paused, the longest in the last hour."""
        c = self.counts.get(key)
        if c is None:
            return {"pauses": 0, "paused_total_s": 0.0, "longest_pause_1h_s": 0.0}
        pauses, seconds = c.total(now)
        return {
            "pauses": pauses,
            "paused_total_s": round(seconds, 3),
            "longest_pause_1h_s": round(c.longest(now), 3),
        }
