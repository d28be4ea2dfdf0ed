"""The agent's decision log: one line per event the agent records (placed, evicted, paused,
resumed, restarted, MIG changes, scaled, failures ...), as it is committed to the store.

Two formats (``gpufrac agent --log-format``, or ``$GPUFRAC_LOG_FORMAT``):

* ``text``, for a terminal: ``12:00:03 placed      default/train  mig on GPU-... (1g.18gb@0)``;
* ``json``, one object a line for a log shipper: ``time`` (ISO 8601, UTC), ``level`` (``info``, or
  ``warning`` for what went wrong), ``event`` (the kind), ``subject`` (a workload or deployment as
  TENANT/NAME, a GPU UUID, ``gateway`` or ``agent``), ``message``, and the event's details where it
  has them: ``workload``, ``deployment``, ``gpu`` (GPU indexes, comma-separated, as the ``gpu``
  label of ``/metrics``), ``UUID``, ``mode``, ``mig`` (PROFILE@START), ``evicted``, ``replicas``.

A line that cannot be written (a closed stderr) is dropped: logging never stops the agent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal, TextIO, assert_never, get_args

from gpufrac.model.event import Event

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = get_args(LogFormat)
LOG_FORMAT_ENV = "GPUFRAC_LOG_FORMAT"
# kinds that say something went wrong; every other event is logged at level info
WARNINGS = frozenset(
    {
        "failed",
        "action_failed",
        "memory_limit",
        "evicted",
        "refused",
        "gateway_error",
        "engine_warning",
    }
)


class DecisionLog:
    """A store listener writing each committed event as one line to ``stream``."""

    def __init__(self, stream: TextIO, fmt: LogFormat = "text") -> None:
        self.stream = stream
        self.fmt = fmt
        self._lock = threading.Lock()  # events come from the reconcile thread and API threads

    def __call__(self, event: Event, details: Mapping[str, object]) -> None:
        line = format_event(event, details, self.fmt)
        with self._lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (
                OSError,
                ValueError,
            ):  # a closed or broken stream: the line is lost, not the agent
                pass


def format_event(event: Event, details: Mapping[str, object], fmt: LogFormat) -> str:
    level = "warning" if event.kind in WARNINGS else "info"
    match fmt:
        case "json":
            record: dict[str, object] = {
                "time": datetime.fromtimestamp(event.at, UTC).isoformat(timespec="milliseconds"),
                "level": level,
                "event": event.kind,
                "subject": event.subject,
                "message": event.message,
            }
            record.update((k, v) for k, v in details.items() if v is not None and k not in record)
            return json.dumps(record, default=str)
        case "text":
            clock = time.strftime("%H:%M:%S", time.localtime(event.at))
            mark = "!" if level == "warning" else " "
            return f"{clock}{mark}{event.kind:<16} {event.subject}  {event.message}".rstrip()
        case _:
            assert_never(fmt)
