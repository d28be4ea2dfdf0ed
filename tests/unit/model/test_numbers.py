"""Numbers in what people write are ASCII digits, everywhere text becomes a number (from the
hostile review: ``min_share: '١٠%'`` was read as 10%, since ``\\d``, ``int()``, ``float()`` and
``str.isdigit`` all take other scripts' digits). Each reader refuses them with an error that names
its field and the character that is not an ASCII digit, and takes the ASCII form as before."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufrac.errors import InputError
from gpufrac.model.numbers import digits_note, digits_or_none, is_decimal, is_digits

ARABIC = "١٢"  # ARABIC-INDIC DIGIT ONE, TWO: int() reads 12
FULL = "１２"  # FULLWIDTH DIGIT ONE, TWO: int() reads 12


def test_the_predicates_take_ascii_digits_only() -> None:
    for text in ("12", "0", "007"):
        assert is_digits(text) and is_decimal(text) and digits_or_none(text) == int(text)
    assert is_decimal("2.5") and not is_digits("2.5")
    for text in (ARABIC, FULL, "²", "1_2", " 12", "12\n", "+1", "-1", "", "1e3", "nan", "1."):
        assert not is_digits(text) and not is_decimal(text) and digits_or_none(text) is None
    assert digits_or_none(12) is None  # only text is read
    assert digits_note("12") == ""
    assert digits_note(FULL) == ": '１' (FULLWIDTH DIGIT ONE) is not an ASCII digit (write 0-9)"


def manifest(resources: str = "{gpu: {count: 1}}", extra: str = "") -> str:
    return (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: w}\n"
        f"spec:\n  command: [run]\n  resources: {resources}\n{extra}"
    )


MANIFESTS = [
    # (what differs, the field named)
    (manifest(extra=f"  min_share: '{ARABIC}%'\n"), "spec.min_share"),
    (manifest(extra=f"  min_share: '{FULL}%'\n"), "spec.min_share"),
    (manifest(extra="  min_share: '1.٥%'\n"), "spec.min_share"),
    (manifest("{gpu: {memory: 12Gi, compute: '٣٠%'}}"), "spec.resources.gpu.compute"),
    (manifest(f"{{gpu: {{memory: '{ARABIC}Gi'}}}}"), "spec.resources.gpu.memory"),
    (manifest("{gpu: {mig: '١g.18gb'}}"), "spec.resources.gpu.mig"),
    (manifest("{gpu: {mig: '1g.١٨gb'}}"), "spec.resources.gpu.mig"),
    (manifest("{gpu: {count: 1}, host_memory: '٢Gi'}"), "spec.resources.host_memory"),
]


@pytest.mark.parametrize(("text", "field"), MANIFESTS)
def test_a_manifest_with_other_scripts_digits_is_refused_naming_the_field(
    text: str, field: str
) -> None:
    from gpufrac.model.manifest import read_objects

    with pytest.raises(InputError) as exc:
        read_objects(text)
    (error,) = exc.value.errors
    assert error.field is not None and error.field.endswith(field), error
    assert "is not an ASCII digit" in error.message or "is not a MIG profile" in error.message


def test_the_ascii_forms_are_read_as_before() -> None:
    from gpufrac.model.manifest import read_objects

    (read,) = read_objects(manifest("{gpu: {memory: 12Gi, compute: '30%'}}", "  min_share: 10%\n"))
    spec: Any = read.obj
    assert (spec.min_share_milli, spec.gpu.compute_pct, spec.gpu.memory_mib) == (100, 30, 12288)


@pytest.mark.parametrize(
    "text",
    [
        f"node_prune_after: {ARABIC}h\n",
        f"node_prune_after: '{FULL}h'\n",
        f"job_min_share: '{ARABIC}%'\n",
        f"tenants:\n  a: {{gpu_memory: '{ARABIC}Gi'}}\n",
    ],
)
def test_a_settings_file_with_other_scripts_digits_is_refused(text: str) -> None:
    from gpufrac.model.settings import parse_settings

    assert parse_settings("node_prune_after: 12h\n").node_prune_after_s == 12 * 3600
    with pytest.raises(InputError) as exc:
        parse_settings(text, source="gpufrac.yaml")
    assert "is not an ASCII digit" in str(exc.value), exc.value


def _layout(text: str) -> object:
    from gpufrac.model.mig import parse_layout

    return parse_layout(text)


def _need(text: str) -> object:
    from gpufrac.planning.demand import parse_need_demand

    return parse_need_demand(text)


def _profiles(text: str) -> object:
    from gpufrac.planning.demand import parse_profile_demand

    return parse_profile_demand(text)


def _simulate(text: str) -> object:
    from gpufrac.devices.simfleet import parse_simulate_spec

    return parse_simulate_spec(text)


def _lease(text: str) -> object:
    from gpufrac.cluster.control import LEASE_TTL_LABEL, lease_ttl

    return lease_ttl({LEASE_TTL_LABEL: text})


def _load(text: str) -> object:
    from gpufrac.cli.up import _load_steps

    return _load_steps(text, [None])  # type: ignore[list-item]  # only that there is one


READERS: list[tuple[Callable[[str], object], str, str, str]] = [
    # (reader, what it reads, the same with another script's digits, the field named)
    (_layout, "1g.18gb@0", "1g.18gb@٠", "--layout"),
    (_layout, "1g.18gb@6", "1g.18gb@²", "--layout"),
    (_need, "20GiB=2", "20GiB=٢", "--need"),
    (_need, "20GiB/3c=2", "20GiB/٣c=2", "--need"),
    (_profiles, "1g.18gb=5", "1g.18gb=５", "--demand"),
    (_simulate, "h200:2", "h200:٢", "--simulate"),
    (_simulate, "h200:2", "h200:²", "--simulate"),  # isdigit() true, int() raised a ValueError
    (_lease, "10", ARABIC, "metadata.labels.gpufrac.io/lease-ttl"),
    (_lease, "2.5", FULL, "metadata.labels.gpufrac.io/lease-ttl"),
    (_load, "1,12,1", f"1,{ARABIC},1", "--load"),
]


@pytest.mark.parametrize(
    ("reader", "ascii", "other", "field"), READERS, ids=[r[2] + " " + r[3] for r in READERS]
)
def test_each_reader_of_a_number_takes_ascii_digits_only(
    reader: Callable[[str], object], ascii: str, other: str, field: str
) -> None:
    reader(ascii)
    with pytest.raises(InputError) as exc:
        reader(other)
    assert exc.value.field == field, exc.value
    assert "is not an ASCII digit (write 0-9)" in exc.value.message, exc.value


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["load", "http://127.0.0.1:9/x", "--clients", f"1,{ARABIC}"], "--clients"),
        (["load", "http://127.0.0.1:9/x", "--rate", f"{FULL}"], "--rate"),
        (["mig", "plan", "--gpus", "h200:٢", "--demand", "1g.18gb=1"], "--gpus"),
        (["mig", "plan", "--gpus", "h200", "--demand", "1g.18gb=1", "--cost", "h200=٣"], "--cost"),
    ],
)
def test_command_line_values_with_other_scripts_digits_exit_2(args: list[str], option: str) -> None:
    from gpufrac.cli.app import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert option in result.output and "not an ASCII digit" in result.output, result.output


def test_a_content_length_of_other_digits_is_a_400_not_a_crash() -> None:
    """``'²'.isdigit()`` is true and ``int('²')`` raises: the guard answered with a 500."""
    from gpufrac.api.guard import Guard

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the request reached the app")

    guard = Guard(app, tokens=None, max_body=1024)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for length in ("²", "¹²"):  # header values are Latin-1 (ASGI): these are the digits in it
        sent.clear()
        scope = {
            "type": "http",
            "path": "/api/v1/workloads",
            "headers": [(b"content-length", length.encode("latin-1"))],
        }
        asyncio.run(guard(scope, receive, send))
        assert sent[0]["status"] == 400, sent
        assert b"is not a number of bytes" in sent[1]["body"]
