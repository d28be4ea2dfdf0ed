"""Errors every layer shares.

``InputError`` is bad input from a user: it names the field, says what is wrong and how to fix it.
The CLI turns it into exit code 2; the API (later) into a 422.
"""

from __future__ import annotations


class GpufracError(Exception):
    """Base of gpufrac's own errors."""


class InputError(GpufracError, ValueError):
    """Bad input. ``field`` is where it came from (``--layout``, ``spec.resources.gpu``)."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None) -> None:
        self.message = message
        self.field = field
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.field}: {self.message}" if self.field else self.message
        if self.fix:
            text += f" ({self.fix})"
        return text

    def at(self, field: str) -> InputError:
        """The same error, located at ``field`` (prefixed when it already has one)."""
        if not self.field:
            located = field
        else:
            located = field + ("" if self.field.startswith("[") else ".") + self.field
        return InputError(self.message, field=located, fix=self.fix)
