"""One metric family of ``/metrics``, filled at scrape time: a thin layer over prometheus-client's
``Metric`` that takes label values of any type and leaves out the labels that have none (so a series
outside MIG has no ``GPU_I_ID``, as with the DCGM exporter)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from prometheus_client.metrics_core import Metric

Kind = Literal["gauge", "counter", "histogram"]


class Family:
    def __init__(self, name: str, kind: Kind, help_text: str) -> None:
        """``name`` without ``_total`` for a counter: its samples get the suffix."""
        self.metric = Metric(name, help_text, kind)
        self._suffix = "_total" if kind == "counter" else ""

    def add(self, labels: Mapping[str, object], value: float) -> None:
        self.metric.add_sample(self.metric.name + self._suffix, _labels(labels), float(value))

    def add_histogram(
        self,
        labels: Mapping[str, object],
        bounds: Sequence[float],
        counts: Sequence[int],
        total: float,
    ) -> None:
        """``counts``: per bucket, not cumulative, one more than ``bounds`` (the last above all)."""
        base = _labels(labels)
        running = 0
        for le, n in zip([*bounds, float("inf")], counts, strict=True):
            running += n
            self.metric.add_sample(self.metric.name + "_bucket", {**base, "le": _le(le)}, running)
        self.metric.add_sample(self.metric.name + "_count", base, running)
        self.metric.add_sample(self.metric.name + "_sum", base, total)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _labels(labels: Mapping[str, object]) -> dict[str, str]:
    return {k: str(v) for k, v in labels.items() if v is not None and v != ""}
