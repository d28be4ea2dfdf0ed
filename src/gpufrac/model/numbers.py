"""Numbers in what people write (manifests, the settings file, labels, command-line values): ASCII
digits only.

Python reads far more than ``0-9`` as digits: ``int("١٢")`` and ``int("１２")`` are 12,
``float("٣.٥")`` is 3.5, ``str.isdigit`` is true for ``"²"`` (which ``int`` then refuses), and
``\\d`` in a ``re`` pattern matches every script's digits. None of that is what a manifest means
(the JSON Schema's ``[0-9]`` and every other tool refuse it), so every reader of a number from text
goes through here: ASCII digits, a clear error otherwise naming the field and the character that
is not one.
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal

from gpufrac.errors import InputError

# ASCII whitespace, also in JSON Schema patterns (ECMAScript's \s is wider, as Python's is)
SPACE = r"[ \t\n\r\f\v]"
WHOLE = r"[0-9]+"
DECIMAL = r"[0-9]+(?:\.[0-9]+)?"
_WHOLE = re.compile(WHOLE)
_DECIMAL = re.compile(DECIMAL)


def is_digits(text: str) -> bool:
    """``text`` is one or more ASCII digits 0-9 and nothing else (``"١٢".isdigit()`` is true)."""
    return _WHOLE.fullmatch(text) is not None


def is_decimal(text: str) -> bool:
    """``text`` is ASCII digits with an optional fraction (``2``, ``2.5``) and nothing else."""
    return _DECIMAL.fullmatch(text) is not None


def digits_or_none(text: object) -> int | None:
    """The whole number ``text`` is in ASCII digits, else None (a value of the agent's own
    making read back: a label, a file, an environment variable)."""
    return int(text) if isinstance(text, str) and is_digits(text) else None


def foreign_digit(text: str) -> str | None:
    """The first character of ``text`` that Python could take for a digit but is not 0-9, as a
    message names it (``'١' (ARABIC-INDIC DIGIT ONE)``); None if there is none."""
    for ch in text:
        if not ch.isascii() and ch.isnumeric():
            return f"{ch!r} ({unicodedata.name(ch, 'a non-ASCII digit')})"
    return None


def digits_note(text: str) -> str:
    """What to add to a refusal of ``text`` when it holds a non-ASCII digit: ``: '١' (...) is not
    an ASCII digit``; empty otherwise."""
    found = foreign_digit(text)
    return "" if found is None else f": {found} is not an ASCII digit (write 0-9)"


def read_decimal(text: str, *, field: str, what: str, fix: str) -> Decimal:
    """A number of ASCII digits with an optional fraction (``30``, ``2.5``): no sign, exponent,
    ``_``, ``inf`` or ``nan``, and no other script's digits."""
    stripped = text.strip(" \t\n\r\f\v")
    if _DECIMAL.fullmatch(stripped) is None:
        raise InputError(f"{text!r} is not {what}{digits_note(text)}", field=field, fix=fix)
    return Decimal(stripped)
