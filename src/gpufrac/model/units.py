"""Units users write: memory sizes (``12Gi``) and percentages (``30%``), to fixed-point
integers.

A size is read as a Kubernetes quantity, case-sensitive: ``Ki Mi Gi Ti Pi Ei`` are binary (powers
of 1024), ``k M G T P E`` decimal (powers of 1000); ``KiB ... EiB`` are binary too; a bare number
is MiB (HAMi's ``gpumem`` and every manifest before this release use MiB). The suffixes below a
byte (``m`` milli, ``u`` micro, ``n`` nano) mean nothing for memory, and a decimal exponent
(``129e6``) is a count of bytes in Kubernetes while a bare number here is MiB: each is refused with
the reason and the fix. A size above ``MAX_SIZE_MIB`` (one exbibyte, ``1Ei``) is refused as too
large, whatever its unit. Digits are ASCII (``model.numbers``). The spellings of earlier releases
are still read as they were, each with a warning naming the Kubernetes form: ``MB GB TB``
(decimal), and the old case-insensitive ones (``g``, ``gb``, ``gib``...). ``M G T`` alone meant
MiB, GiB, TiB before and are decimal now, as in Kubernetes: they warn on every use for one release.

``SIZE_UNITS`` is the table; ``SIZE_PATTERN`` (the JSON Schema's) accepts exactly what
``read_size`` reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Literal

from gpufrac.errors import InputError
from gpufrac.model.numbers import SPACE, digits_note

Spelling = Literal["kubernetes", "iec", "changed", "deprecated"]
"""How a unit is taken: a Kubernetes quantity; an IEC name (``GiB``), kept; one whose meaning
changed in this release (``G`` was GiB, is 10^9 bytes now); a spelling of an earlier release, read
as before, with a warning."""


@dataclass(frozen=True, slots=True)
class SizeUnit:
    bytes: int
    spelling: Spelling
    kubernetes: str  # the Kubernetes form of the same amount (what a warning tells to write)


_K, _M, _G, _T, _P, _E = 10**3, 10**6, 10**9, 10**12, 10**15, 10**18
_KI, _MI, _GI, _TI, _PI, _EI = 2**10, 2**20, 2**30, 2**40, 2**50, 2**60
SIZE_UNITS: dict[str, SizeUnit] = {
    "Ki": SizeUnit(_KI, "kubernetes", "Ki"),
    "Mi": SizeUnit(_MI, "kubernetes", "Mi"),
    "Gi": SizeUnit(_GI, "kubernetes", "Gi"),
    "Ti": SizeUnit(_TI, "kubernetes", "Ti"),
    "Pi": SizeUnit(_PI, "kubernetes", "Pi"),
    "Ei": SizeUnit(_EI, "kubernetes", "Ei"),
    "k": SizeUnit(_K, "kubernetes", "k"),
    "M": SizeUnit(_M, "changed", "M"),
    "G": SizeUnit(_G, "changed", "G"),
    "T": SizeUnit(_T, "changed", "T"),
    "P": SizeUnit(_P, "kubernetes", "P"),
    "E": SizeUnit(_E, "kubernetes", "E"),
    "KiB": SizeUnit(_KI, "iec", "Ki"),
    "MiB": SizeUnit(_MI, "iec", "Mi"),
    "GiB": SizeUnit(_GI, "iec", "Gi"),
    "TiB": SizeUnit(_TI, "iec", "Ti"),
    "PiB": SizeUnit(_PI, "iec", "Pi"),
    "EiB": SizeUnit(_EI, "iec", "Ei"),
}
# Kubernetes' suffixes below a byte: a quantity of them is a fraction of a byte, not a memory size
_BELOW_A_BYTE = {"m": "milli", "u": "micro", "n": "nano"}
# the spellings of earlier releases, in any case (``Gb``, ``gib``, ``GIB``): read as before
_OLD = {
    "mb": SizeUnit(_M, "deprecated", "M"),
    "gb": SizeUnit(_G, "deprecated", "G"),
    "tb": SizeUnit(_T, "deprecated", "T"),
    "mib": SizeUnit(_MI, "deprecated", "Mi"),
    "gib": SizeUnit(_GI, "deprecated", "Gi"),
    "tib": SizeUnit(_TI, "deprecated", "Ti"),
    "g": SizeUnit(_GI, "deprecated", "Gi"),
    "t": SizeUnit(_TI, "deprecated", "Ti"),
}
_BINARY_BEFORE = {"M": _MI, "G": _GI, "T": _TI}  # what a changed unit meant before
MAX_SIZE_MIB = 2**40  # an exbibyte (1Ei): far above any fleet, and every count stays small
MAX_SIZE_TEXT = 40  # "1048576Ti", "0.000001Gi", with room: no size needs more characters

# a Kubernetes quantity's number: 12, 1.5, 1. or .5, ASCII digits only (model.numbers)
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_SIZE = re.compile(
    rf"{SPACE}*(?P<sign>[+-])?(?P<n>{_NUMBER})(?P<exp>[eE][+-]?[0-9]+)?"
    rf"{SPACE}*(?P<unit>[A-Za-z]+)?{SPACE}*"
)


def _any_case(word: str) -> str:
    return "".join(f"[{c.upper()}{c}]" for c in word)


SIZE_PATTERN = (
    rf"^{SPACE}*\+?{_NUMBER}{SPACE}*("
    + "|".join([*SIZE_UNITS, *(_any_case(w) for w in _OLD if len(w) > 1), "g", "t"])
    + rf")?{SPACE}*$"
)  # a JSON Schema pattern for what ``read_size`` reads
SIZE_FIX = (
    "write a Kubernetes quantity like 12Gi or 512Mi (binary), 12G (decimal), or MiB as a number"
)


@dataclass(frozen=True, slots=True)
class Size:
    """A size read: whole MiB (rounded up), and a warning where the spelling is of an earlier
    release or means something else than it did (what to write instead)."""

    mib: int
    warning: str | None = None


def read_size(text: str, *, field: str) -> Size:
    """``20Gi`` -> 20480 MiB; ``20G`` -> 19074 (decimal, with a warning for one release); a bare
    number is MiB. Rounds up to whole MiB. Longer than ``MAX_SIZE_TEXT`` characters, it is refused
    before it is read (a million digits would cost the parser seconds)."""
    if len(text) > MAX_SIZE_TEXT:
        raise InputError(
            f"{text[:24]!r}... ({len(text):,} characters) is not a memory size",
            field=field,
            fix=f"{SIZE_FIX} (at most {MAX_SIZE_TEXT} characters)",
        )
    m = _SIZE.fullmatch(text)
    if not m:
        raise InputError(
            f"{text!r} is not a memory size{digits_note(text)}", field=field, fix=SIZE_FIX
        )
    number, written, exponent = m.group("n"), m.group("unit"), m.group("exp")
    if exponent is not None:
        if written is not None:  # no Kubernetes quantity has both
            raise InputError(f"{text!r} is not a memory size", field=field, fix=SIZE_FIX)
        raise InputError(
            f"{text!r} has a decimal exponent ({exponent}): in Kubernetes that is a number of "
            "bytes, while a bare number here is MiB",
            field=field,
            fix="write it with a unit instead, like 129M or 123Mi",
        )
    if written is None:
        unit = SizeUnit(_MI, "kubernetes", "Mi")
    elif written in _BELOW_A_BYTE:
        prefix = _BELOW_A_BYTE[written]
        raise InputError(
            f"{text!r} is {number} {prefix}-bytes: lower-case {written} is {prefix} in "
            "Kubernetes quantities",
            field=field,
            fix=f"write {number}Mi for MiB (or {number}: a bare number is MiB)",
        )
    elif written in SIZE_UNITS:
        unit = SIZE_UNITS[written]
    elif written.lower() in _OLD:
        unit = _OLD[written.lower()]
    else:
        raise InputError(
            f"{text!r} is not a memory size: {written!r} is not a unit", field=field, fix=SIZE_FIX
        )
    mib = _to_mib(number, unit.bytes)
    if mib <= 0 or m.group("sign") == "-":
        raise InputError(f"{text!r} is not a positive size", field=field, fix=SIZE_FIX)
    if mib > MAX_SIZE_MIB:
        raise InputError(
            f"{text!r} is too large: {mib:,} MiB, above the bound of {MAX_SIZE_MIB:,} MiB (1Ei)",
            field=field,
            fix="give at most 1Ei (1048576Ti)",
        )
    return Size(mib, _warning(number, written or "", unit, mib))


def _warning(number: str, written: str, unit: SizeUnit, mib: int) -> str | None:
    decimal = not unit.kubernetes.endswith("i")
    kind = "decimal" if decimal else "binary"
    match unit.spelling:
        case "kubernetes" | "iec":
            return None
        case "changed":
            before = f"{number}{written}iB"  # G was GiB
            old = _to_mib(number, _BINARY_BEFORE[written])
            return (
                f"{number}{written} is decimal now, as in Kubernetes ({mib:,} MiB); before this "
                f"release gpufrac read it as {before} ({old:,} MiB): write {number}{written}i for "
                "that"
            )
        case "deprecated":
            other = (
                f"{number}{unit.kubernetes.removesuffix('i')}"
                if not decimal
                else (f"{number}{unit.kubernetes}i")
            )
            return (
                f"{number}{written} is {kind} ({mib:,} MiB), as before; this spelling is "
                f"deprecated: write {number}{unit.kubernetes} (Kubernetes quantities are "
                f"case-sensitive: {other} is {'binary' if decimal else 'decimal'})"
            )


def _to_mib(number: str, unit_bytes: int) -> int:
    return int((Decimal(number) * unit_bytes / _MI).to_integral_value(rounding=ROUND_CEILING))


def format_gib(mib: int) -> str:
    """An amount as a person checks it against a GPU's size: ``90.0GiB``."""
    return f"{mib / 1024:.1f}GiB"


def format_mib(mib: int) -> str:
    if mib % 1024 == 0:
        return f"{mib // 1024}GiB"
    return f"{mib}MiB"
