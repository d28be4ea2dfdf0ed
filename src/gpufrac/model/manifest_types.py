"""The value types of manifests and the settings file, as pydantic types: names, units, choices.

Each type validates what a user writes (strictly: ``"8"`` is not a number, ``true`` is not an
integer) and gives the JSON Schema an editor checks it with. A unit (``12GiB``, ``30%``, ``0.25``
of a GPU) comes out in fixed point: MiB, percent, milli-GPU. A bad value raises a ``problem``:
the message and the fix ``model.manifest_errors`` turns into an ``InputError``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from gpufrac.errors import InputError
from gpufrac.model.manifest_fields import DNS_LABEL_FIX, kind_of, read_dns_label
from gpufrac.model.numbers import DECIMAL, SPACE, WHOLE, digits_note
from gpufrac.model.units import MAX_SIZE_MIB, MAX_SIZE_TEXT, SIZE_FIX, SIZE_PATTERN, read_size
from gpufrac.model.workload import (
    HANDED_ENV,
    HANDED_ENV_PREFIXES,
    MAX_PRIORITY,
    MILLI,
    PRIORITY_NAMES,
    handed_env,
)

T = TypeVar("T")
PROBLEM = "gpufrac"  # the pydantic error type of every problem raised here
NULL = "null"  # the error type of a null value: model.manifest_errors tells it by the field's type
MAX_SHARE_MILLI = 900  # at most 90% of a GPU's busy time: the rest stays with the arbiter's classes


@dataclass(frozen=True, slots=True)
class Hint:
    """Annotated metadata: the fix for a field given a value of the wrong type (``fix``) or left
    out while required (``missing``); without one, the error message says a generic fix."""

    fix: str = ""
    missing: str = ""


def problem(message: str, fix: str) -> PydanticCustomError:
    """A validation error carrying gpufrac's own message and fix."""
    return PydanticCustomError(PROBLEM, "{message}", {"message": message, "fix": fix})


def report(title: str, problems: list[tuple[tuple[str | int, ...], str, str]]) -> None:
    """Raise every ``(location, message, fix)`` at once, locations relative to the value being
    validated (a model's cross-field rules, each naming its own field)."""
    if problems:
        details = [
            InitErrorDetails(type=problem(message, fix), loc=loc, input=None)
            for loc, message, fix in problems
        ]
        raise ValidationError.from_exception_data(title, details)


class Strict(BaseModel):
    """A mapping of a user-written file: unknown fields and null values are errors, and nothing
    is coerced. A field typed ``X | None`` may be left out (``None``), never given as null: the
    JSON Schema (``model.schema``) shows it as ``X``."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="wrap")
    @classmethod
    def _not_null(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if value is None:
            raise PydanticCustomError(NULL, "is empty (null)")
        return handler(value)


def _via(read: Callable[[Any, str], T]) -> Callable[[Any], T]:
    """A validator made of one of ``model.manifest_fields``' readers (its ``InputError``, a
    problem)."""

    def check(value: Any) -> T:
        try:
            return read(value, "")
        except InputError as exc:
            raise problem(exc.message, exc.fix or "") from None

    return check


def _lower(value: object) -> object:
    """Choices are words in any case: ``MPS`` is ``mps``."""
    return value.strip().lower() if isinstance(value, str) else value


WORD = _lower  # how the JSON Schema generator (model.schema) knows a Word
Word = BeforeValidator(_lower)


def one_of_fields(names: Iterable[str], *, exactly: bool) -> list[dict[str, Any]]:
    """What breaks "at least one of ``names`` is given" (and with ``exactly``, "no two"), as
    alternatives for an object's ``not: {anyOf: [...]}``: every rule of an object in one such
    ``not``, rather than a ``oneOf`` of ``required`` beside its properties (client generators,
    openapi-python-client, read that as a union and type the object as ``Any``) or several
    ``if``/``then`` (schemathesis then gives up generating it)."""
    names = list(names)
    none: dict[str, Any] = {
        "properties": {n: {"not": {}} for n in names}
    }  # {"not": {}} is false, as tools read
    two = [{"required": [a, b]} for i, a in enumerate(names) for b in names[i + 1 :]]
    return [none, *two] if exactly else [none]


def no_default(schema: dict[str, Any]) -> None:
    """A field's ``json_schema_extra``: its default left out of the JSON Schema, where giving the
    field is not the same as leaving it out (``backoff_limit`` is for jobs only: a client that
    sends the default for a service would be refused). Its description says the default."""
    schema.pop("default", None)


def any_case(word: str) -> str:
    """A JSON Schema (ECMA-262) pattern for ``word`` in any case (it has no case-insensitive
    flag): ``1g.10gb`` -> ``1[Gg]\\.10[Gg][Bb]``."""
    return "".join(
        f"[{c.upper()}{c.lower()}]" if c.isalpha() else f"\\{c}" if c in _SPECIAL else c
        for c in word
    )


_SPECIAL = set("\\^$.|?*+()[]{}/")  # escaped; no other (``\-`` is an error to ECMA's u flag)


def words_pattern(names: Iterable[str], prefix: str = "") -> str:
    """A JSON Schema pattern for one of ``names`` in any case, with spaces around it (as the
    reader strips them)."""
    alternatives = "|".join(any_case(n) for n in sorted(names, key=lambda n: (-len(n), n)))
    return rf"^\s*{prefix}({alternatives})\s*$"


# --- names ----------------------------------------------------------------------------------------

DNS_LABEL_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
DnsLabel = Annotated[
    str,
    AfterValidator(_via(read_dns_label)),
    Hint(fix=DNS_LABEL_FIX),
    WithJsonSchema({"type": "string", "pattern": DNS_LABEL_PATTERN}),
]


def _text(value: str) -> str:
    if not value.strip():
        raise problem("must not be empty", "write a non-empty string")
    return value


Text = Annotated[
    str, AfterValidator(_text), WithJsonSchema({"type": "string", "pattern": r"\S"})
]  # a string that is not empty or blank

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# An image reference as container engines read one (the distribution reference grammar):
# [registry[:port]/]path[:tag][@digest], or an image id. Nothing else reaches an engine's
# command line (a name starting with '-' would be read as an option).
_DOMAIN_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REF = re.compile(
    rf"^(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)


def _image_ref(value: str) -> str:
    if len(value) > 255 or not _IMAGE_REF.fullmatch(value):
        raise problem(
            f"{value!r} is not an image reference",
            "write one as `podman images` lists it: [REGISTRY/]NAME[:TAG][@DIGEST], e.g. "
            "localhost/my-model:1",
        )
    return value


ImageRef = Annotated[
    str,
    AfterValidator(_image_ref),
    WithJsonSchema({"type": "string", "pattern": _IMAGE_REF.pattern, "maxLength": 255}),
]


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):  # match() and $ take a trailing newline
        raise problem(f"{value!r} is not a valid name", f"names must match {_ENV_NAME.pattern}")
    return value


EnvName = Annotated[
    str, AfterValidator(_env_name), WithJsonSchema({"type": "string", "pattern": _ENV_NAME.pattern})
]


def _not_handed(value: str) -> str:
    if handed_env(value):
        raise problem(
            f"{value} is set by gpufrac for every workload (its GPU, limits, QoS or MPS share, "
            "from where it is placed); a manifest cannot set it",
            f"remove {value}: the workload gets gpufrac's value (docs/agent.md, what a workload "
            "is handed)",
        )
    return value


# a workload's own variable: a valid name that gpufrac does not hand every workload itself
WorkloadEnvName = Annotated[
    str,
    AfterValidator(_env_name),
    AfterValidator(_not_handed),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": _ENV_NAME.pattern,
            "not": {
                "anyOf": [
                    {"enum": sorted(HANDED_ENV)},
                    *({"pattern": f"^{p}"} for p in HANDED_ENV_PREFIXES),
                ]
            },
        }
    ),
]


# the label keys gpufrac sets itself on a deployment's replicas (model/deployment.py: LABEL,
# TEMPLATE_LABEL; written out here, below that module): never a user's, or a job could pass for a
# replica (moved as one, or retired by a deployment of that name)
RESERVED_LABELS = ("gpufrac.io/deployment", "gpufrac.io/template")


def _label_key(value: str) -> str:
    if not value:
        raise problem(f"{value!r} is not a valid name", "names must be non-empty strings")
    if value.lower() in RESERVED_LABELS:
        raise problem(
            f"{value!r} is gpufrac's own label (it marks a deployment's replicas)",
            "use another label (a deployment's replicas get it from gpufrac)",
        )
    return value


def _any_case(text: str) -> str:
    """A JSON Schema (ECMA) pattern for ``text`` in any case."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in text)


LabelKey = Annotated[
    str,
    AfterValidator(_label_key),
    WithJsonSchema(
        {
            "type": "string",
            "minLength": 1,
            "not": {"pattern": f"^({'|'.join(_any_case(k) for k in RESERVED_LABELS)})$"},
        }
    ),
]


# a node's label, as Kubernetes writes them (what operators already put on their nodes): an optional
# DNS-subdomain prefix and '/', then a name of at most 63 letters, digits, '-', '_' or '.' that
# begins and ends with a letter or digit; a value is such a name, or empty
_LABEL_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
NODE_LABEL_KEY_PATTERN = rf"^([a-z0-9]([a-z0-9.-]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$"
NODE_LABEL_VALUE_PATTERN = rf"^({_LABEL_NAME})?$"
_NODE_LABEL_FIX = (
    "write a label as Kubernetes does: [prefix/]name, the name up to 63 letters, digits, '-', "
    "'_' or '.', starting and ending with a letter or digit (gpufrac.io/pool, zone)"
)


def _node_label_key(value: str) -> str:
    if not re.fullmatch(NODE_LABEL_KEY_PATTERN, value):
        raise problem(f"{value!r} is not a node label name", _NODE_LABEL_FIX)
    return value


def _node_label_value(value: str) -> str:
    if not re.fullmatch(NODE_LABEL_VALUE_PATTERN, value):
        raise problem(
            f"{value!r} is not a node label value",
            "write at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter "
            "or digit, or an empty string (quote numbers and booleans)",
        )
    return value


NodeLabelKey = Annotated[
    str,
    AfterValidator(_node_label_key),
    WithJsonSchema({"type": "string", "pattern": NODE_LABEL_KEY_PATTERN}),
]
NodeLabelValue = Annotated[
    str,
    AfterValidator(_node_label_value),
    WithJsonSchema({"type": "string", "pattern": NODE_LABEL_VALUE_PATTERN}),
]


def _absolute_path(value: str) -> str:
    if not value.startswith("/"):
        raise problem(f"{value!r} does not start with '/'", f"write /{value}")
    return value


UrlPath = Annotated[
    str, AfterValidator(_absolute_path), WithJsonSchema({"type": "string", "pattern": "^/"})
]

# --- numbers with units ---------------------------------------------------------------------------

NOTES = "notes"  # the validation context's list of (field name, value, warning): see ``note``


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def note(info: ValidationInfo | None, value: str, warning: str) -> None:
    """A warning about a value that was read (an old unit spelling), for the caller to show: kept
    in the validation context's ``NOTES`` list, when it gave one, with the field's name and the
    value as written, so that the caller can name where it is (``manifest_errors.noted``)."""
    context = None if info is None else info.context
    notes = context.get(NOTES) if isinstance(context, dict) else None
    if isinstance(notes, list):
        assert info is not None
        notes.append((info.field_name or "", value, warning))


def _memory_mib(value: object, info: ValidationInfo | None) -> int:
    """A Kubernetes quantity (``12Gi``, ``512Mi``, ``16G`` decimal; rounded up to whole MiB;
    ``model.units``), or an integer meaning MiB."""
    if is_int(value):
        assert isinstance(value, int)
        if value < 1:
            raise problem(f"{value} MiB is not a positive size", SIZE_FIX)
        if value > MAX_SIZE_MIB:  # as for a size written as text
            raise problem(f"{value} MiB is too large", "give at most 1048576Ti")
        return value
    if isinstance(value, str):
        try:
            size = read_size(value, field="")
        except InputError as exc:
            raise problem(exc.message, exc.fix or SIZE_FIX) from None
        if size.warning is not None:
            note(info, value, size.warning)
        return size.mib
    raise problem(f"must be a memory size, not {kind_of(value)}", SIZE_FIX)


# what ``read_size`` refuses as no size at all: a zero in any unit (0Gi, 0.0, +00Mi)
NONZERO_SIZE = rf"^(?!{SPACE}*\+?(0+\.?0*|\.0+){SPACE}*[A-Za-z]*{SPACE}*$)"
MemoryMiB = Annotated[
    int,
    PlainValidator(_memory_mib),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": MAX_SIZE_MIB},
                {
                    "type": "string",
                    "pattern": NONZERO_SIZE + SIZE_PATTERN.removeprefix("^"),
                    "maxLength": MAX_SIZE_TEXT,
                },
            ]
        }
    ),
]


def _body_limit(value: object, info: ValidationInfo | None) -> int:
    mib = _memory_mib(value, info)
    if not 1 <= mib <= 1024:
        raise problem(f"{mib} MiB is out of range", "give 1MiB to 1GiB")
    return mib


BodyLimitMiB = Annotated[
    int,
    PlainValidator(_body_limit),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": 1024},
                {"type": "string", "pattern": SIZE_PATTERN},
            ]
        }
    ),
]

_PERCENT = re.compile(rf"{SPACE}*({WHOLE}){SPACE}*%{SPACE}*")  # ASCII digits only (not \d)
PERCENT_PATTERN = rf"^{SPACE}*0*(100|[1-9][0-9]?){SPACE}*%{SPACE}*$"  # leading zeros read


def _percent(value: object) -> int:
    """``30%`` or ``30``: a whole percentage from 1 to 100."""
    fix = "write it like 30% or 30, from 1 to 100"
    match = _PERCENT.fullmatch(value) if isinstance(value, str) else None
    if isinstance(value, str) and not match:
        raise problem(f"{kind_of(value)} is not a percentage{digits_note(value)}", fix)
    if match:
        value = int(match.group(1))
    if not is_int(value):
        raise problem(f"must be an integer, not {kind_of(value)}", fix)
    assert isinstance(value, int)
    if not 1 <= value <= 100:
        raise problem(f"{shown(value)} is out of range", fix)
    return value


Percent = Annotated[
    int,
    PlainValidator(_percent),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": 100},
                {"type": "string", "pattern": PERCENT_PATTERN},
            ]
        }
    ),
]


def milli(value: object, *, maximum: int | None, fix: str) -> int:
    """A positive number of GPUs to milli-GPU (``0.25`` -> 250), rounded to the nearest (half
    up); a ``Decimal`` is a number read from a string, exactly as written."""
    if not isinstance(value, int | float | Decimal) or isinstance(value, bool):
        raise problem(f"must be a number, not {kind_of(value)}", fix)
    try:
        out = int((Decimal(str(value)) * 1000).to_integral_value(rounding=ROUND_HALF_UP))
    except (InvalidOperation, ValueError, OverflowError):
        raise problem(f"{value} is not a finite number", fix) from None
    # within the range as written, outside it once rounded to thousandths: say so
    if value > 0 and out < 1:
        raise problem(
            f"{value} comes to nothing: amounts are counted in thousandths, rounded",
            "write 0.0005 or more (a thousandth, once rounded)",
        )
    if maximum is not None and out > maximum and value <= maximum / 1000 + 0.001:
        raise problem(
            f"{value} comes to {out / 1000:g} once rounded to thousandths, above "
            f"{maximum / 1000:g}",
            f"write less than {(maximum + 0.5) / 1000:g}",
        )
    if out < 1 or (maximum is not None and out > maximum):
        raise problem(f"{value} is out of range", fix)
    return out


def _fraction(value: object) -> int:
    return milli(value, maximum=MILLI - 1, fix="write a number between 0 and 1, like 0.25")


# The least number that is one milli once rounded (half up), and the first beyond 999 milli:
# 0.0001 comes to nothing and 0.9999 to a whole GPU, so the schema refuses both, as the reader does.
LEAST_MILLI = 0.0005
FractionMilli = Annotated[
    int,
    PlainValidator(_fraction),
    WithJsonSchema({"type": "number", "minimum": LEAST_MILLI, "exclusiveMaximum": 0.9995}),
]


def _gpus(value: object) -> int:
    return milli(value, maximum=None, fix="write a positive number of GPUs, like 4 or 2.5")


GpusMilli = Annotated[
    int, PlainValidator(_gpus), WithJsonSchema({"type": "number", "minimum": LEAST_MILLI})
]


def _cpus(value: object) -> int:
    return milli(value, maximum=None, fix="write a positive number of CPUs, like 2 or 0.5")


CpusMilli = Annotated[
    int, PlainValidator(_cpus), WithJsonSchema({"type": "number", "minimum": LEAST_MILLI})
]

_PERCENT_DECIMAL = re.compile(rf"{SPACE}*({DECIMAL}){SPACE}*%{SPACE}*")
SHARE_PATTERN = rf"^{SPACE}*0*(90(\.0+)?|[1-8]?[0-9](\.[0-9]+)?){SPACE}*%{SPACE}*$"


def _share(value: object) -> int:
    """``10%`` or ``0.1`` to thousandths of a GPU's busy time, rounded (half up): from 0 to 90%
    as written (``90.04%`` is above it, as the JSON Schema says; a share that rounds to less than
    a thousandth is none)."""
    fix = "write a percentage like 10%, or a number between 0 and 0.9"
    match = _PERCENT_DECIMAL.fullmatch(value) if isinstance(value, str) else None
    if match:
        exact = Decimal(match.group(1)) / 100
    elif isinstance(value, str):
        raise problem(f"{kind_of(value)} is not a share{digits_note(value)}", fix)
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise problem(f"{kind_of(value)} is not a share", fix)
    else:
        try:
            exact = Decimal(str(value))
        except InvalidOperation:
            raise problem(f"{value} is not a finite number", fix) from None
    if not exact.is_finite() or not 0 <= exact <= Decimal(MAX_SHARE_MILLI) / 1000:
        raise problem(f"{value} is out of range", fix)
    return int((exact * 1000).to_integral_value(rounding=ROUND_HALF_UP))


ShareMilli = Annotated[
    int,
    PlainValidator(_share),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0, "maximum": 0.9},
                {"type": "string", "pattern": SHARE_PATTERN},
            ]
        }
    ),
]


def _priority(value: object) -> int:
    if isinstance(value, str) and value in PRIORITY_NAMES:
        return PRIORITY_NAMES[value]
    if is_int(value):
        assert isinstance(value, int)
        if abs(value) > MAX_PRIORITY:
            bound = f"{MAX_PRIORITY:_}"
            raise problem(
                f"{shown(value)} is out of range", f"write an integer from -{bound} to {bound}"
            )
        return value
    raise problem(
        f"{kind_of(value)} is not a priority",
        "write high, normal or low, or an integer (higher is more important)",
    )


Priority = Annotated[
    int,
    PlainValidator(_priority),
    WithJsonSchema(
        {
            "anyOf": [
                {"enum": list(PRIORITY_NAMES)},
                {"type": "integer", "minimum": -MAX_PRIORITY, "maximum": MAX_PRIORITY},
            ]
        }
    ),
]


def shown(value: int) -> str:
    """An integer as a message shows it: in digits, or by its size when it has very many."""
    return (
        str(value)
        if abs(value) < 10**30
        else f"an integer of about {value.bit_length() * 3 // 10} digits"
    )
