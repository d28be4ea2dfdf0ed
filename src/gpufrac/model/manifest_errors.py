"""pydantic's validation errors as gpufrac's: each an ``InputError`` naming the field, what is wrong
and how to fix it.

A pydantic error has a location (``("spec", "resources", "gpu", "memory")``), a type
(``int_type``, ``extra_forbidden``, ...), the input and a context. The location becomes the field
path (``spec.resources.gpu.memory``, ``metadata.labels['app.io/name']``, ``spec.command[1]``); the
type and input become the message; the fix comes from the error (gpufrac's own problems carry
theirs), the field's ``Hint``, or the field's type and bounds, read from the model at that
location (the fields allowed there, with a "did you mean" for an unknown one).
"""

from __future__ import annotations

import ast
import difflib
import inspect
import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, BeforeValidator, PlainValidator, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticCustomError

from gpufrac.errors import InputError
from gpufrac.model.manifest_fields import join, kind_of
from gpufrac.model.manifest_types import NULL, PROBLEM, Hint, shown

Loc = tuple[str | int, ...]


def input_error(exc: ValidationError, root: Any) -> InputError:
    """Every error of ``exc`` (from validating a value of type ``root``), as one ``InputError``."""
    return InputError.many([_one(e, root) for e in exc.errors(include_url=False)])


def noted(raw: Any, notes: list[tuple[str, str, str]]) -> list[str]:
    """The warnings validation kept (``manifest_types.note``: a field's name, the value as written,
    the warning), each as ``PATH: warning``, the path found in ``raw``, the document as loaded
    (where the value was written under that name)."""
    out = []
    for name, value, warning in notes:
        paths = _paths_of(raw, name, value, ()) or [(name,)]
        out += [f"{field_path(p)}: {warning}" for p in paths[:1]]
    return out


def _paths_of(node: Any, name: str, value: str, at: Loc) -> list[Loc]:
    if isinstance(node, dict):
        found = [(*at, name)] if node.get(name) == value else []
        for k, v in node.items():
            if isinstance(v, dict | list) and isinstance(k, str):
                found += _paths_of(v, name, value, (*at, k))
        return found
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _paths_of(v, name, value, (*at, i))]
    return []


def field_path(loc: Loc) -> str:
    """``("spec", "command", 1)`` -> ``spec.command[1]``."""
    where = ""
    for part in loc:
        where = f"{where}[{part}]" if isinstance(part, int) else join(where, part)
    return where


_NO_CHARACTER = re.compile("[\ud800-\udfff]")


def field_parts(path: str) -> list[str]:
    """A field path's parts, the inverse of ``field_path`` (indexes as their digits):
    ``spec.resources.gpu['nvidia.com/mig-1g.10gb']`` -> ``spec``, ``resources``, ``gpu``,
    ``nvidia.com/mig-1g.10gb`` (a quoted key whole, its dots kept)."""
    out: list[str] = []
    i, n = 0, len(path)
    while i < n:
        if path[i] == ".":
            i += 1
        elif path.startswith(("['", '["'), i):
            quote, j = path[i + 1], i + 2
            while j < n and path[j] != quote:
                j += 2 if path[j] == "\\" else 1
            try:
                key = str(ast.literal_eval(path[i + 1 : j + 1]))
            except (ValueError, SyntaxError):
                key = path[i + 2 : j]
            # a key that is no text (a lone surrogate) stays as its escape: JSON holds no such
            out.append(
                key if key.isprintable() or not _NO_CHARACTER.search(key) else path[i + 2 : j]
            )
            i = j + 2  # past the quote and its ]
        elif path[i] == "[":
            j = path.find("]", i)
            j = n if j < 0 else j
            out.append(path[i + 1 : j])
            i = j + 1
        else:
            j = i
            while j < n and path[j] not in ".[":
                j += 1
            out.append(path[i:j])
            i = j
    return out


def _one(e: ErrorDetails, root: Any) -> InputError:
    loc: Loc = tuple(e["loc"])
    if loc and loc[-1] == "[key]":  # a mapping's key: named like its value
        loc = loc[:-1]
    ctx = e.get("ctx") or {}
    if e["type"] == PROBLEM:
        message, fix = str(ctx["message"]), str(ctx["fix"])
    else:
        message, fix = _describe(e["type"], ctx, e["input"], loc, root) or (
            e["msg"],
            "see docs/manifest.md",
        )
    return InputError(message, field=field_path(loc) or None, fix=fix)


def _describe(
    kind: str, ctx: dict[str, Any], value: Any, loc: Loc, root: Any
) -> tuple[str, str] | None:
    """The message and fix of one of pydantic's own error types (None: one not met here)."""
    tp, meta = _type_at(root, loc)
    hints = [m for m in meta if isinstance(m, Hint)]  # the type's, then the field's
    hint = Hint(
        fix=next((h.fix for h in reversed(hints) if h.fix), ""),
        missing=next((h.missing for h in reversed(hints) if h.missing), ""),
    )
    scalar = value is not None and not isinstance(value, list | dict)
    unquote = " without quotes" if isinstance(value, str) else ""
    number = "whole number" if tp is int else "number"
    if kind == NULL:
        return _null(tp, meta, loc, root)
    match kind:
        case "missing":
            return "is required", hint.missing or f"add {loc[-1]}"
        case "extra_forbidden":
            allowed = fields_of(_type_at(root, loc[:-1])[0])
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint_text = f"did you mean {close[0]!r}? " if close else ""
            return (
                f"unknown field {loc[-1]!r}",
                f"{hint_text}allowed fields here: {', '.join(allowed)}",
            )
        case "model_type" | "model_attributes_type" | "dict_type":
            fields = fields_of(tp)
            default = f"write a mapping with some of: {', '.join(fields)}" if fields else ""
            return (
                f"must be a mapping, not {kind_of(value)}",
                hint.fix or default or "write a mapping",
            )
        case "list_type":
            return f"must be a list, not {kind_of(value)}", hint.fix or "write a list: [a, b]"
        case "string_type":
            in_map = get_origin(_type_at(root, loc[:-1])[0]) is dict
            quote = f'quote the value: {loc[-1]}: "{_plain(value)}"' if in_map else "quote it"
            quote = quote if scalar else ""
            fix = "; ".join(f for f in (quote, hint.fix) if f) or "write a string"
            return f"must be a string, not {kind_of(value)}", fix
        case "bool_type":
            return (
                f"must be true or false, not {kind_of(value)}",
                "write true or false without quotes",
            )
        case "int_type":
            fix = hint.fix or f"write a whole number{_bounds(meta)}"
            return f"must be an integer, not {kind_of(value)}", fix + unquote
        case "float_type":
            fix = hint.fix or f"write a number{_bounds(meta)}"
            return f"must be a number, not {kind_of(value)}", fix + unquote
        case "literal_error":
            choices = [str(a) for a in get_args(tp)] or [str(ctx.get("expected"))]
            return f"{kind_of(value)} is not a valid choice", f"use one of: {', '.join(choices)}"
        case "greater_than" | "greater_than_equal" | "less_than" | "less_than_equal":
            return (
                f"{shown(value) if isinstance(value, int) else value} is out of range",
                hint.fix or f"write a {number}{_bounds(meta)}",
            )
        case "too_short" | "too_long" | "string_too_short" | "string_too_long":
            lo, hi = ctx.get("min_length"), ctx.get("max_length")
            size = "non-empty" if kind.endswith("too_short") and lo == 1 else "shorter"
            what = f"{size} list" if isinstance(value, list) else f"{size} string"
            rule = f"{lo}" if lo is not None else f"at most {hi}"
            return f"must be a {what}", hint.fix or f"give {rule} item(s)"
    return None


def _null(tp: Any, meta: list[Any], loc: Loc, root: Any) -> tuple[str, str] | None:
    """A null where a value of ``tp`` belongs, told as that type's own error about it."""
    for m in meta:
        if isinstance(m, PlainValidator | BeforeValidator):
            # a validator that takes pydantic's ValidationInfo is called without one
            with_info = len(inspect.signature(m.func).parameters) > 1
            try:
                m.func(None, None) if with_info else m.func(None)  # type: ignore[call-arg,arg-type]
            except PydanticCustomError as exc:
                ctx = exc.context or {}
                return str(ctx["message"]), str(ctx["fix"])
    kind = next((k for t, k in _TYPE_ERRORS if tp is t or _is(tp, t)), "model_type")
    if get_origin(tp) is Literal:
        kind = "literal_error"
    return _describe(kind, {}, None, loc, root)


_TYPE_ERRORS = (
    (bool, "bool_type"),
    (int, "int_type"),
    (float, "float_type"),
    (str, "string_type"),
    (list, "list_type"),
    (dict, "dict_type"),
)


def _is(tp: Any, t: type) -> bool:
    return get_origin(tp) is t


def _plain(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _bounds(meta: list[Any]) -> str:
    lo = hi = None
    for m in meta:
        if isinstance(m, annotated_types.Ge):
            lo = f"{m.ge}"
        elif isinstance(m, annotated_types.Gt):
            lo = f"above {m.gt}"
        elif isinstance(m, annotated_types.Le):
            hi = f"{m.le}"
        elif isinstance(m, annotated_types.Lt):
            hi = f"below {m.lt}"
    if lo is not None and hi is not None:
        return f" from {lo} to {hi}" if not lo.startswith("above") else f" {lo} and at most {hi}"
    if lo is not None:
        return f" of at least {lo}" if not lo.startswith("above") else f" {lo}"
    if hi is not None:
        return f" of at most {hi}"
    return ""


# --- the type at a location -----------------------------------------------------------------------


def fields_of(tp: Any) -> list[str]:
    """The fields a model allows, by the names written in files."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [f.alias or name for name, f in tp.model_fields.items()]
    return []


def _type_at(root: Any, loc: Loc) -> tuple[Any, list[Any]]:
    """The type at ``loc`` inside ``root`` and its metadata (``Hint``, bounds), or ``(None, [])``
    when the location is not in the model."""
    tp, meta = _unwrap(root)
    for part in loc:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = _field(tp, part)
            if field is None:
                return None, []
            tp, meta = _unwrap(field.annotation)
            meta = [*_flat(field.metadata), *meta]
        elif get_origin(tp) in (dict, list, tuple):
            tp, meta = _unwrap(get_args(tp)[-1])
        else:
            return None, []
    return tp, meta


def _field(model: type[BaseModel], key: str | int) -> FieldInfo | None:
    for name, field in model.model_fields.items():
        if (field.alias or name) == key:
            return field
    return None


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """``Annotated[X, ...]`` and ``X | None`` to ``X``, with the metadata gathered."""
    meta: list[Any] = []
    while True:
        if get_origin(tp) is Annotated:
            args = get_args(tp)
            tp, meta = args[0], [*meta, *_flat(args[1:])]
        elif get_origin(tp) in (Union, types.UnionType):
            members = [a for a in get_args(tp) if _unwrap_none(a) is not type(None)]
            tp = members[0]
        else:
            return tp, meta


def _unwrap_none(tp: Any) -> Any:
    return get_args(tp)[0] if get_origin(tp) is Annotated else tp


def _flat(metadata: Any) -> list[Any]:
    """Metadata with ``Field(ge=1)`` spread into its constraints."""
    out: list[Any] = []
    for m in metadata:
        out.extend(_flat(m.metadata) if isinstance(m, FieldInfo) else [m])
    return out
