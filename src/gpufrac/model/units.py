"""Units users write: memory sizes (``12GiB``) and percentages (``30%``), to fixed-point
integers."""

from __future__ import annotations

import re

from gpufrac.errors import InputError

_SIZE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>mib|gib|tib|mb|gb|tb|m|g|t)?$", re.IGNORECASE)
_UNIT_MIB = {
    "mib": 1.0,
    "m": 1.0,
    "gib": 1024.0,
    "g": 1024.0,
    "tib": 1024.0 * 1024,
    "t": 1024.0 * 1024,
    "mb": 1e6 / 2**20,
    "gb": 1e9 / 2**20,
    "tb": 1e12 / 2**20,
}


def parse_size_mib(text: str, *, field: str) -> int:
    """``20GiB`` -> 20480; a bare number is MiB; decimal units (GB) are converted. Rounds up."""
    m = _SIZE.match(text.strip())
    if not m:
        raise InputError(
            f"{text!r} is not a memory size", field=field, fix="write it like 20GiB or 512MiB"
        )
    mib = float(m.group("n")) * _UNIT_MIB[(m.group("unit") or "mib").lower()]
    if mib <= 0:
        raise InputError(f"{text!r} is not a positive size", field=field)
    return int(-(-mib // 1))


def format_gib(mib: int) -> str:
    """An amount as a person checks it against a GPU's size: ``90.0GiB``."""
    return f"{mib / 1024:.1f}GiB"


def format_mib(mib: int) -> str:
    if mib % 1024 == 0:
        return f"{mib // 1024}GiB"
    return f"{mib}MiB"
