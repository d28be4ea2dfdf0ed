"""Small JSON bodies of the control API, read strictly into their models (``api/schemas.py``): a
body that is not JSON, not an object, has a field the endpoint does not know or a value of the
wrong type is a 422 naming the field and the fix, never a 500 and never ignored.

The text is read by the same bounded JSON reader as manifests (depth, number length), then checked
by pydantic; its errors are turned into ``InputError`` so they answer like every other bad input.
"""

from __future__ import annotations

from typing import Any, TypeVar, get_args

from fastapi import Request
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gpufrac.errors import InputError
from gpufrac.model.manifest_fields import parse_json, whole_numbers

B = TypeVar("B", bound=BaseModel)
Loc = tuple[int | str, ...]


async def read_body(request: Request, model: type[B], *, example: str) -> B:
    """The request's body as ``model``; anything else is a 422 (``InputError``)."""
    raw = parse_json(await request.body() or b"null", source="body", fix=f"send {example}")
    if not isinstance(raw, dict):
        raise InputError("must be a JSON object", field="body", fix=f"send {example}")
    try:
        return model.model_validate(whole_numbers(raw))  # 2.0 is 2, as in JSON Schema
    except ValidationError as e:
        raise body_error(e, model, example=example) from None


def body_error(e: ValidationError, model: type[BaseModel], *, example: str) -> InputError:
    """pydantic's errors as one ``InputError``: unknown fields first (per object, as one problem
    naming them and the fields there are), then each other problem at its field."""
    unknown: dict[Loc, list[str]] = {}
    problems = []
    for err in e.errors(include_url=False):
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            unknown.setdefault(loc[:-1], []).append(str(loc[-1]))
            continue
        message, fix = _explained(err)
        problems.append(InputError(message, field=_field(loc), fix=fix or f"send {example}"))
    for where, names in reversed(unknown.items()):
        problems.insert(
            0,
            InputError(
                f"unknown field(s) {', '.join(map(repr, sorted(names)))}",
                field=_field(where) if where else "body",
                fix=f"use only {', '.join(_model_at(model, where).model_fields)}",
            ),
        )
    return InputError.many(problems)


def _explained(err: ErrorDetails) -> tuple[str, str | None]:
    """What is wrong, and the fix (None: send an example)."""
    got = _kind(err["input"])
    ctx = err.get("ctx") or {}
    match err["type"]:
        case "bool_type":
            return f"must be true or false, not {got}", "write true or false without quotes"
        case "int_type":
            return f"must be a whole number, not {got}", None
        case "string_type":
            return f"must be a string, not {got}", None
        case "list_type":
            return f"must be a list, not {got}", None
        case "model_type" | "model_attributes_type" | "dict_type":
            return f"must be an object, not {got}", None
        case "greater_than_equal":
            return f"{err['input']!r} is below {ctx.get('ge')}", f"give {ctx.get('ge')} or more"
        case "less_than_equal":
            return f"{err['input']!r} is above {ctx.get('le')}", f"give {ctx.get('le')} or less"
        case "missing":
            return "is missing", None
        case _:
            return err["msg"], None


def _field(loc: Loc) -> str:
    """``("instances", 0, "start")`` as ``instances[0].start``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel]:
    """The model of the object at ``loc`` (a nested one, or one in a list)."""
    for part in loc:
        if isinstance(part, int):
            continue
        annotation: Any = model.model_fields[part].annotation
        found = [a for a in (annotation, *get_args(annotation)) if _is_model(a)]
        if not found:
            return model
        model = found[0]
    return model


def _is_model(x: Any) -> bool:
    return isinstance(x, type) and issubclass(x, BaseModel)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
