"""An event as it is stored and read back: what happened to a workload, a GPU or a node, and
when. The store (``runtime.store``) writes and reads them; the API renders them per reader."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    at: float
    kind: str
    subject: str
    message: str
    cause: str | None = None  # the workload (TENANT/NAME) that caused it, named in the message
    mentions: tuple[str, ...] = ()  # other workloads the message names

    def named(self) -> tuple[str, ...]:
        """The workloads the message names besides its subject (the cause first)."""
        return ((self.cause,) if self.cause else ()) + self.mentions
