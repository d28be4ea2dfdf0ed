"""Small JSON bodies of the control API, read strictly: a body that is not JSON, not an object, or
has a field the endpoint does not know is a 422 naming it, never a 500 and never ignored."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from gpufrac.errors import InputError
from gpufrac.model.manifest_fields import parse_json


async def json_object(request: Request, fields: tuple[str, ...], *, example: str) -> dict[str, Any]:
    """The request's body as a JSON object with only ``fields``; anything else is a 422."""
    raw = parse_json(await request.body() or b"null", source="body", fix=f"send {example}")
    if not isinstance(raw, dict):
        raise InputError("must be a JSON object", field="body", fix=f"send {example}")
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise InputError(
            f"unknown field(s) {', '.join(map(repr, unknown))}",
            field="body",
            fix=f"use only {', '.join(fields)}",
        )
    return raw
