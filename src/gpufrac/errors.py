"""Errors every layer shares.

``InputError`` is bad input from a user: it names the field, says what is wrong and how to fix it.
The CLI turns it into exit code 2; the API (later) into a 422.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


class GpufracError(Exception):
    """Base of gpufrac's own errors."""


class InputError(GpufracError, ValueError):
    """Bad input. ``field`` is where it came from (``--layout``, ``spec.resources.gpu``)."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None) -> None:
        self.message = message
        self.field = field
        self.fix = fix
        self.errors: tuple[InputError, ...] = (self,)  # several, for one that reports them all
        super().__init__(self.line())

    def line(self) -> str:
        text = f"{self.field}: {self.message}" if self.field else self.message
        if self.fix:
            text += f" ({self.fix})"
        return text

    def __str__(self) -> str:
        return "\n".join(e.line() for e in self.errors)

    def at(self, field: str) -> InputError:
        """The same error, located at ``field`` (prefixed when it already has one)."""
        if len(self.errors) > 1:
            return InputError.many([e.at(field) for e in self.errors])
        if not self.field:
            located = field
        else:
            located = field + ("" if self.field.startswith("[") else ".") + self.field
        return InputError(self.message, field=located, fix=self.fix)

    @classmethod
    def many(cls, errors: Sequence[InputError]) -> InputError:
        """One error that reports each of ``errors`` (all the problems of a manifest at once)."""
        flat = [e for err in errors for e in err.errors]
        if len(flat) == 1:
            return flat[0]
        first = flat[0]
        out = cls(first.message, field=first.field, fix=first.fix)
        out.errors = tuple(flat)
        out.args = (str(out),)
        return out


class TooLarge(InputError):
    """Input over a bound on its size or cost (bytes, values): refused before it is read further.
    The API answers it 413."""


class Problems:
    """Collects the ``InputError`` of each independent check, to report them all at once."""

    def __init__(self) -> None:
        self.found: list[InputError] = []

    def check(self, read: Callable[[], T], default: T) -> T:
        """``read()``, or ``default`` (the error kept) if it is bad input."""
        try:
            return read()
        except InputError as e:
            self.found.extend(e.errors)
            return default

    def raise_any(self) -> None:
        if self.found:
            raise InputError.many(self.found)


class Refused(GpufracError):
    """A request refused as it stands (a bound it would break, a change not allowed now): nothing
    was changed. The API answers 409 with the message."""


class Unavailable(GpufracError):
    """What a request needs cannot be reached now (a node that does not answer): nothing was
    changed; try again. The API answers 503 with the message."""


class Unsupported(GpufracError):
    """A capability this server lacks (MIG layouts set through a cluster's control plane, Ray
    leases on one machine). The API answers 501 (``application/problem+json``) naming it."""

    def __init__(self, capability: str, detail: str) -> None:
        self.capability = capability
        self.detail = detail
        super().__init__(detail)


class Busy(GpufracError):
    """Too many requests of one kind are under way at once (a tenant's log reads, or those from
    one node): this one was not started; try again in ``retry_after_s``. The API answers 429
    (``application/problem+json``, with ``Retry-After``)."""

    def __init__(self, detail: str, *, retry_after_s: int) -> None:
        self.detail = detail
        self.retry_after_s = retry_after_s
        super().__init__(detail)


class TimedOut(GpufracError):
    """What a request waited for did not come within its deadline (a node that did not send a
    workload's logs in time): nothing was changed; try again. The API answers 504
    (``application/problem+json``)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)
