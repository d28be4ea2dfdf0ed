"""Reading user-written files: a strict YAML/JSON loader, field paths, and a few field readers.

The loader serves manifests (``model.manifest``), the operator's settings file (``model.settings``)
and the API's files and bodies: duplicate keys, NaN and infinity, NUL characters and documents
that expand beyond bounds are errors. Manifests and settings are then validated by their pydantic
models; the small readers here serve what is read field by field elsewhere (the API's token file
and query flags). Every reader takes a value and the path it was found at, and raises an
``InputError`` naming that path, what is wrong and how to fix it. Nothing is coerced: ``"8"`` is
not a number and ``8`` is not a string.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpufrac.errors import InputError, Problems, TooLarge

C = TypeVar("C", bound=str)

_DNS_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_/-]+$")
DNS_LABEL_FIX = (
    "use 1-63 lowercase letters a-z, digits 0-9 and '-', starting and ending with a letter or digit"
)


# libyaml's scanner and parser (C) where PyYAML has it, the pure-Python ones otherwise: the same
# YAML, read some 30 times faster (a 600 KB flow list took 10 s in pure Python)
_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictYamlLoader(_BaseLoader):  # type: ignore[valid-type,misc]
    """``yaml.safe_load`` that refuses duplicate keys instead of keeping the last one silently."""


def _mapping_without_duplicates(loader: StrictYamlLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    mapping: dict[Any, Any] = loader.construct_mapping(node)
    return mapping


StrictYamlLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates
)

_BOOL_TAG = "tag:yaml.org,2002:bool"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_NULL_TAG = "tag:yaml.org,2002:null"
_STR_TAG = "tag:yaml.org,2002:str"
# YAML 1.2's core schema (yaml.org/spec/1.2.2, 10.3.2): what a plain scalar is, when it is not a
# string. In YAML 1.1 (PyYAML's default) yes/no/on/off are booleans too, 017 is octal, 1_000 an
# integer, 2024-01-01 a date and 1:30 a number; in 1.2 each is a string (017 the integer 17).
_CORE_SCALARS = (
    (_BOOL_TAG, r"true|True|TRUE|false|False|FALSE", "tTfF"),
    (_NULL_TAG, r"~|null|Null|NULL|", "~nN"),
    (_INT_TAG, r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    (
        _FLOAT_TAG,
        r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
        "-+.0123456789",
    ),
)


class CoreYamlLoader(StrictYamlLoader):
    """``StrictYamlLoader`` reading YAML 1.2's core schema, as JSON Schema tools and editors do
    (``yes`` is a string, ``017`` the integer 17): libyaml still parses; only how a plain scalar
    is typed differs. Merge keys (``<<: *base``) are kept."""

    yaml_implicit_resolvers: dict[str, list[tuple[str, re.Pattern[str]]]] = {}  # noqa: RUF012


for _tag, _regex, _first in _CORE_SCALARS:
    CoreYamlLoader.add_implicit_resolver(_tag, re.compile(rf"^(?:{_regex})$"), list(_first))
CoreYamlLoader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])
CoreYamlLoader.add_implicit_resolver(_NULL_TAG, re.compile(r"^$"), [""])


def _core_int(loader: CoreYamlLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


CoreYamlLoader.add_constructor(_INT_TAG, _core_int)

_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_YAML11_TYPED = (_BOOL_TAG, _INT_TAG, _FLOAT_TAG, _NULL_TAG, _TIMESTAMP_TAG, _STR_TAG)
_YAML11_FIRST = frozenset(yaml.resolver.Resolver.yaml_implicit_resolvers)
_YAML11 = yaml.resolver.Resolver()  # how a YAML 1.1 reader (PyYAML's default, Go's yaml.v2) types


def _yaml11_differs(node: yaml.ScalarNode) -> str | None:
    """How a YAML 1.1 reader would read a plain scalar that YAML 1.2 reads otherwise (``yes``: a
    boolean, ``017``: the octal 15), or None where both read it alike."""
    if node.style:  # quoted, literal or folded: a string in both (libyaml: "" is plain)
        return None
    if node.tag == _STR_TAG and node.value[:1] not in _YAML11_FIRST:
        return None  # a string to both: no YAML 1.1 type starts with its first character
    tag = _YAML11.resolve(yaml.ScalarNode, node.value, (True, False))  # type: ignore[no-untyped-call]
    if (tag == node.tag and tag != _INT_TAG) or tag not in _YAML11_TYPED:
        return None
    try:
        value = yaml.SafeLoader.yaml_constructors[tag](_SAFE, yaml.ScalarNode(tag, node.value))
    except (ValueError, yaml.YAMLError):  # a date that is no date (2024-13-45): 1.1 fails it
        return None
    if tag == node.tag and value == _core_int(_CORE, node):
        return None
    what = kind_of(value) if tag != _TIMESTAMP_TAG else f"a date ({value})"
    core = _core_value(node)
    fix = "quote it" if isinstance(core, str) else f"write it as {core}"
    return (
        f"{node.value!r} is {kind_of(core)} (YAML 1.2, as gpufrac reads it), but {what} to "
        f"YAML 1.1 readers: {fix} to be read alike everywhere"
    )


def _core_value(node: yaml.ScalarNode) -> object:
    return CoreYamlLoader.yaml_constructors[node.tag](_CORE, node)


_SAFE = yaml.SafeLoader("")
_CORE = CoreYamlLoader("")


# Bounds on what a document may grow to: YAML aliases repeat a node wherever they are used (a small
# text can stand for an enormous value), and nesting has no end of its own.
MAX_NODES = 100_000
MAX_DEPTH = 64
MAX_ALIAS_GROWTH = 1 << 20  # characters aliases may add beyond the text's own


def _not_finite(where: str) -> InputError:
    return InputError(
        "is not a finite number", field=where or None, fix="write a number (no NaN or infinity)"
    )


MAX_INT_DIGITS = 18  # a whole number of at most 18 digits (any base): every bound is below it
_CORE_SCALAR_TAGS = frozenset({_BOOL_TAG, _INT_TAG, _FLOAT_TAG, _NULL_TAG, _STR_TAG})
_CORE_NODE_TAGS = frozenset({"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"})


def _too_large(where: str) -> InputError:
    return InputError(
        f"is a whole number of more than {MAX_INT_DIGITS} digits",
        field=where or None,
        fix="write a number within the field's range",
    )


def _tagged(where: str, tag: str) -> InputError:
    return InputError(
        f"has the YAML tag {tag!r}, which gpufrac does not read",
        field=where or None,
        fix="remove the tag (!, !!): write a plain value, quoted where it is text",
    )


def _int_digits(text: str) -> int:
    """How many digits a YAML 1.2 integer literal has (its sign and 0x/0o left out)."""
    t = text.lstrip("+-")
    return len(t[2:] if t[:2] in ("0x", "0o") else t)


def _nul(where: str) -> InputError:
    return InputError(
        "holds a NUL character (\\0)", field=where or None, fix="remove it: no program takes one"
    )


_SURROGATE = re.compile("[\ud800-\udfff]")


def _bad_text(text: str, where: str) -> InputError | None:
    """A NUL character, or a lone UTF-16 surrogate (a JSON or YAML ``\\ud800`` escape without its
    pair: no character, so no UTF-8 can hold it and nothing could show the value), in ``text``."""
    if "\x00" in text:
        return _nul(where)
    if _SURROGATE.search(text):
        return InputError(
            "holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair), which is"
            " no character",
            field=where or None,
            fix="write the character itself, or both halves of its surrogate pair",
        )
    return None


def _check_document(node: yaml.Node, max_chars: int, notes: list[str] | None = None) -> None:
    """Refuse a document whose value, with every alias expanded, has more than ``MAX_NODES`` nodes
    or ``max_chars`` characters of scalars, or is nested more than ``MAX_DEPTH`` deep (the walk
    stops at the first bound it passes, so a bomb costs no more than the bound), or holds a NaN, an
    infinity or a NUL character (named by its path). ``notes`` gets a ``PATH: warning`` for each
    plain scalar a YAML 1.1 reader reads otherwise (``yes``: a string here, a boolean there)."""
    count = chars = 0
    found: set[tuple[int, int, str]] = set()  # (line, column, warning), an alias's once per path
    stack: list[tuple[yaml.Node, int, str, bool]] = [(node, 1, "", False)]
    while stack:
        n, depth, where, is_key = stack.pop()
        count += 1
        if count > MAX_NODES or chars > max_chars:
            what = f"{MAX_NODES:,} values" if count > MAX_NODES else f"{max_chars:,} characters"
            raise InputError(
                f"expands to more than {what}",
                fix="write the values out; YAML aliases (*name) may not multiply a document",
            )
        if depth > MAX_DEPTH:
            raise InputError(
                f"is nested more than {MAX_DEPTH} levels deep", fix="flatten the document"
            )
        if isinstance(n, yaml.ScalarNode):
            chars += len(n.value)
            if n.tag not in _CORE_SCALAR_TAGS or (n.tag != _STR_TAG and _explicit(n)):
                raise _tagged(
                    where, n.tag
                )  # a tag the reader has no value for: no constructor runs
            if n.tag == _INT_TAG and _int_digits(n.value) > MAX_INT_DIGITS:
                raise _too_large(where)
            if n.tag == _FLOAT_TAG and not math.isfinite(_yaml_float(n.value)):
                raise _not_finite(where)
            if bad := _bad_text(n.value, join(where, n.value) if is_key else where):
                raise bad
            if notes is not None and (differs := _yaml11_differs(n)):
                at = f"{join(where, n.value)} (the key)" if is_key else where
                found.add((n.start_mark.line, n.start_mark.column, f"{at}: {differs}"))
        elif n.tag not in _CORE_NODE_TAGS:
            raise _tagged(where, n.tag)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(
                (child, depth + 1, f"{where}[{i}]", False) for i, child in enumerate(n.value)
            )
        elif isinstance(n, yaml.MappingNode):
            for key, value in n.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                stack.append((key, depth + 1, where, True))
                stack.append((value, depth + 1, join(where, name), False))
    if notes is not None:
        notes.extend(warning for *_, warning in sorted(found))


def _yaml_float(text: str) -> float:
    """The value of a YAML 1.1 float scalar (``.nan``, ``-.Inf``, ``1_000.5``, ``1e3``)."""
    t = text.replace("_", "").lower()
    if t in (".nan",):
        return math.nan
    if t.lstrip("+-") == ".inf":
        return -math.inf if t.startswith("-") else math.inf
    try:
        return float(t)
    except ValueError:
        return 0.0  # sexagesimal (1:30.5) and other finite forms


def _check_json(value: Any) -> None:
    """Refuse a NaN, an infinity or a NUL character anywhere in a loaded JSON value, named by its
    path."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, where = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise _not_finite(where)
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**MAX_INT_DIGITS:
            raise _too_large(where)
        if isinstance(v, str) and (bad := _bad_text(v, where)):
            raise bad
        if isinstance(v, dict):
            for k in v:
                if bad := _bad_text(k, join(where, k)):
                    raise bad
            stack.extend((x, join(where, k)) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{where}[{i}]") for i, x in enumerate(v))


def _load_yaml(text: str, notes: list[list[str]] | None) -> list[Any]:
    loader = CoreYamlLoader(text)
    try:
        documents: list[Any] = []
        while loader.check_node():
            node = loader.get_node()
            if notes is not None:
                notes.append([])
            if node is not None:
                try:
                    _check_document(
                        node, len(text) + MAX_ALIAS_GROWTH, notes[-1] if notes is not None else None
                    )
                except InputError as exc:
                    if exc.field and (documents or loader.check_node()):
                        raise exc.at(f"doc[{len(documents) + 1}]") from None
                    raise
            documents.append(loader.construct_document(node) if node is not None else None)
        return documents
    finally:
        loader.dispose()


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InputError(
                f"not valid JSON: duplicate key {key!r}", fix="give each key once per object"
            )
        out[key] = value
    return out


_READABLE = "check that the path names a readable UTF-8 text file"


def read_text_file(path: Path, *, field: str, what: str = "", fix: str = _READABLE) -> str:
    """The text of a UTF-8 file; any failure to read it is an ``InputError`` naming ``field``."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        reason = exc.strerror or str(exc)
    except UnicodeDecodeError as exc:
        reason = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    raise InputError(f"cannot read {what or path}: {reason}", field=field, fix=fix)


def _json(text: str, source: str) -> Any:
    """``json.loads``, strictly: a duplicate key, NaN or Infinity, nesting deeper than Python
    recurses or an integer of more digits than it converts is an ``InputError`` at ``source``
    (a syntax error is left as ``json.JSONDecodeError``)."""
    try:
        value = json.loads(text, object_pairs_hook=_json_object)
        _check_json(value)
        return value
    except json.JSONDecodeError:
        raise
    except (InputError, RecursionError, ValueError) as exc:
        raise _located(exc, source, "JSON") from None


def _too_deep(source: str) -> InputError:
    return InputError(
        f"is nested more than {MAX_DEPTH} levels deep", field=source, fix="flatten it"
    )


def _located(exc: Exception, source: str, language: str) -> InputError:
    """What went wrong reading a document, as an ``InputError`` located at ``source`` unless it
    already names its field: too deep for Python to follow, or an integer of more digits than it
    converts (``ValueError``)."""
    if isinstance(exc, InputError):
        return exc if exc.field else exc.at(source)
    if isinstance(exc, RecursionError):
        return _too_deep(source)
    return InputError(
        f"not valid {language}: a number has too many digits",
        field=source,
        fix="write a smaller number",
    )


def parse_json(text: str | bytes, *, source: str, fix: str) -> Any:
    """A JSON text (a request's body), strictly; any problem is an ``InputError`` at ``source``."""
    try:
        return _json(text if isinstance(text, str) else text.decode("utf-8"), source)
    except UnicodeDecodeError:
        raise InputError("is not UTF-8", field=source, fix=fix) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"is not JSON ({exc})", field=source, fix=fix) from None


def load_documents(
    text: str,
    *,
    source: str,
    max_values: int = MAX_NODES,
    bound: str = "",
    notes: list[list[str]] | None = None,
) -> list[Any]:
    """Every document of a YAML stream (``---`` between documents), or the one object of a JSON
    file.

    YAML is read as YAML 1.2 (its core schema, as JSON Schema tools and editors read it): ``yes``,
    ``no``, ``on`` and ``off`` are strings. ``notes``, when given, gets one list per document of
    ``PATH: warning`` for each value a YAML 1.1 reader would read otherwise.

    Empty documents come back as ``None``, so positions match the file as written. A text of more
    than ``max_values`` values (scalars, lists, mappings, aliases, counted as the text is scanned,
    before any tree is built) is ``TooLarge``, whose fix names ``bound`` (the operator's setting).
    """
    _count_values(text, max_values, source, bound)
    if text.lstrip().startswith("{"):
        try:
            document = _json(text, source)
            if notes is not None:
                notes.append([])
            return [document]
        except json.JSONDecodeError:
            pass  # YAML flow style ({name: x}) is not JSON: read it as YAML below
    try:
        # A SafeLoader subclass: as safe as yaml.safe_load_all, with bounds on size and depth.
        return _load_yaml(text, notes)
    except (InputError, RecursionError, ValueError) as exc:
        raise _located(exc, source, "YAML") from None
    except yaml.YAMLError as exc:
        if "duplicate key" in str(exc):
            fix = "give each key once per mapping"
        else:
            fix = "check the indentation and quoting there"
        raise InputError(f"not valid YAML: {exc}", field=source, fix=fix) from None


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NODE_EVENTS = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent, yaml.AliasEvent)
_OPENING_EVENTS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSING_EVENTS = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _count_values(text: str, most: int, source: str, bound: str) -> None:
    """Refuse a text of more than ``most`` values before it is parsed into anything: YAML by its
    parser's events, one at a time (stopping at the first beyond the bound, or at the first list or
    mapping nested more than ``MAX_DEPTH`` deep: libyaml's own limit, 1,000, would otherwise answer
    first, in its words), JSON by counting its structure outside strings (a C-speed upper bound:
    each value but the first follows a ``,``, ``:``, ``[`` or ``{``). A text that is not well
    formed is left to the parse that follows, which says where."""
    if text.lstrip().startswith("{"):
        bare = _JSON_STRING.sub("", text)
        count = 1 + sum(bare.count(c) for c in ",:[{")
        if count <= most:
            return
    else:
        count = depth = 0
        loader = _BaseLoader(text)
        try:
            while loader.check_event():
                event = loader.get_event()  # type: ignore[no-untyped-call]
                if isinstance(event, _NODE_EVENTS):
                    count += 1
                    if count > most:
                        break
                if isinstance(event, _OPENING_EVENTS):
                    depth += 1
                    if depth > MAX_DEPTH:
                        raise _too_deep(source)
                elif isinstance(event, _CLOSING_EVENTS):
                    depth -= 1
            else:
                return
        except yaml.YAMLError as exc:
            # libyaml's scanner reads a run of openings ahead of the first event (each may start a
            # key) and stops at its own depth limit before the count above sees any of them
            if "maximum nesting depth" in str(exc):
                raise _too_deep(source) from None
            return
        finally:
            loader.dispose()
    setting = f" (the operator's {bound} in gpufrac.yaml)" if bound else ""
    raise TooLarge(
        f"holds more than {most:,} values{setting}",
        field=source,
        fix="split it into several manifests",
    )


def whole_numbers(value: Any) -> Any:
    """``value`` with every number that is whole written as an integer: ``2.0`` is ``2``, as JSON
    (and JSON Schema, whose ``integer`` takes ``2.0``) has one kind of number. Nothing else is
    changed: ``"2"`` stays a string, ``2.5`` a fraction, ``true`` a boolean."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value


def join(where: str, key: object) -> str:
    """The path of ``key`` inside ``where``: ``spec.env``; ``metadata.labels['app.io/name']`` for a
    key that is not a plain word (empty, not a string, or holding dots or spaces)."""
    if isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
        return f"{where}.{key}" if where else key
    return f"{where}[{key!r}]"


def kind_of(value: object) -> str:
    """How a value reads in an error message: ``a boolean``, ``a list``, ..."""
    if value is None:
        return "empty (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__} ({value})"


def read_mapping(
    value: object,
    where: str,
    allowed: tuple[str, ...],
    *,
    what: str = "a mapping",
    problems: Problems | None = None,
) -> dict[str, Any]:
    """A mapping whose keys are all in ``allowed`` (an unknown key is an error listing them). With
    ``problems``, unknown keys are recorded there and left out, so the known ones are still read
    (every problem of a document is reported at once)."""
    if not isinstance(value, dict):
        raise InputError(
            f"must be {what}, not {kind_of(value)}",
            field=where,
            fix=f"write a mapping with some of: {', '.join(allowed)}",
        )
    unknown = []
    for key in value:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            unknown.append(
                InputError(
                    f"unknown field {key!r}",
                    field=join(where, key),
                    fix=f"{hint}allowed fields here: {', '.join(allowed)}",
                )
            )
    if unknown and problems is None:
        raise unknown[0]
    if unknown and problems is not None:
        problems.found.extend(unknown)
        return {k: v for k, v in value.items() if k in allowed}
    return value


def read_str(value: object, field: str, *, fix: str | None = None) -> str:
    """A non-empty string."""
    if not isinstance(value, str):
        scalar = value is not None and not isinstance(value, list | dict)
        hint = "quote it" + (f"; {fix}" if fix else "") if scalar else fix
        raise InputError(f"must be a string, not {kind_of(value)}", field=field, fix=hint)
    if not value.strip():
        raise InputError("must not be empty", field=field, fix=fix or "write a non-empty string")
    return value


def read_choice(value: object, field: str, choices: tuple[C, ...]) -> C:
    """One of a closed set of words (``choices``, the ``get_args`` of a ``Literal``), in any
    case."""
    fix = f"use one of: {', '.join(choices)}"
    word = value.strip().lower() if isinstance(value, str) else value
    for choice in choices:
        if word == choice:
            return choice
    raise InputError(f"{kind_of(value)} is not a valid choice", field=field, fix=fix)


def read_bool(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(
            f"must be true or false, not {kind_of(value)}",
            field=field,
            fix="write true or false without quotes",
        )
    return value


def read_dns_label(value: object, field: str) -> str:
    """A DNS label: 1-63 characters of a-z, 0-9 and '-', starting and ending alphanumeric."""
    text = read_str(value, field, fix=DNS_LABEL_FIX)
    if len(text) > 63:
        raise InputError(f"{text!r} is longer than 63 characters", field=field, fix=DNS_LABEL_FIX)
    if not _DNS_LABEL.fullmatch(text):  # match() and $ take a trailing newline
        raise InputError(f"{text!r} is not a DNS label", field=field, fix=DNS_LABEL_FIX)
    return text


def _explicit(n: yaml.ScalarNode) -> bool:
    """Whether a scalar's tag was written (``!!bool 1``) rather than resolved from its text: a plain
    scalar resolves to the tag its text implies, so a tag that differs was written."""
    if n.style:
        return n.tag != _STR_TAG  # quoted: a string, unless a tag was written
    resolved = CoreYamlLoader.resolve(_CORE, yaml.ScalarNode, n.value, (True, False))
    return bool(resolved != n.tag)
