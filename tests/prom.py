"""Reading the agent's ``/metrics`` in tests: parsed by prometheus-client's own parser, so a test
checks series and values, not how the text is laid out."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}


def samples(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples named ``name`` whose labels include ``labels``: (labels, value) each."""
    return [
        (dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample's value (None if there is none; an error if there are several)."""
    found = samples(text, name, **labels)
    assert len(found) <= 1, found
    return found[0][1] if found else None


def exported_names(text: str) -> set[str]:
    """Every series name the text declares (families without samples too), as PromQL names them:
    a counter's ``_total``, a histogram's ``_bucket``, ``_count`` and ``_sum``."""
    out: set[str] = set()
    for family in text_string_to_metric_families(text):
        out.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
    return out
