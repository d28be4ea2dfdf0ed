"""MIG values: profile names, placements, layouts, and the rules a layout must obey.

A profile name means something only together with a GPU model: ``1g.10gb`` is a one-slot profile on
the A100-80GB and a two-slot one on the A100-40GB. So parsing a name checks its syntax only;
``check_layout`` checks it against a model.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from gpufrac.errors import InputError
from gpufrac.model.catalog import GpuModel
from gpufrac.model.numbers import digits_note, is_digits

# ASCII digits ([0-9], not \d: that is every script's). Attributes as mig-parted writes them: one
# sign, then a comma-separated list (``+me``, ``+gfx``, ``+me.all``, ``-me``, ``+me,gfx``).
_NAME = re.compile(
    r"(?:(?P<ci>[0-9]+)c\.)?(?P<g>[0-9]+)g\.(?P<gb>[0-9]+)gb(?:(?P<sign>[+-])(?P<attrs>.*))?"
)
_ATTRIBUTE = re.compile(r"[a-z.][a-z0-9.]*")
AttributeSign = Literal["+", "-"]


@dataclass(frozen=True, slots=True)
class MigProfileName:
    """A parsed profile name: ``1g.18gb``, ``1g.18gb+me``, ``1g.24gb-me``, ``1g.24gb+gfx`` or the
    compute-instance form ``1c.3g.71gb``.

    As in mig-parted, a name has either ``+`` attributes (the profile adds them: ``+me`` media
    extensions, ``+me.all`` all media engines, ``+gfx`` graphics) or ``-`` attributes (it lacks
    them: ``-me``), never both; their order does not matter (they are kept sorted)."""

    gpu_slices: int
    memory_gb: int
    attributes: tuple[str, ...] = ()
    compute_instance_slices: int | None = None
    sign: AttributeSign = "+"

    @property
    def media_extensions(self) -> bool:
        return self.sign == "+" and "me" in self.attributes

    @property
    def base_name(self) -> str:
        """The GPU-instance size without attributes: ``1g.24gb`` for ``1g.24gb+gfx``."""
        return f"{self.gpu_slices}g.{self.memory_gb}gb"

    @property
    def attribute_suffix(self) -> str:
        """``+gfx``, ``-me``, ``+me,gfx`` or the empty string."""
        return self.sign + ",".join(self.attributes) if self.attributes else ""

    @property
    def gpu_instance_name(self) -> str:
        """The GPU-instance part: ``3g.71gb`` for ``1c.3g.71gb``."""
        return self.base_name + self.attribute_suffix

    def __str__(self) -> str:
        prefix = f"{self.compute_instance_slices}c." if self.compute_instance_slices else ""
        return prefix + self.gpu_instance_name


def parse_profile_name(text: str, *, field: str = "profile") -> MigProfileName:
    """Parse a MIG profile name (syntax only; see ``GpuModel.profile`` for meaning).

    Attributes are read as mig-parted reads them (go-nvlib's ``parseMigProfileAttributes``): any
    name of letters, digits and dots that starts with neither a digit nor a dot and ends with no
    dot, each at most once, and ``+`` and ``-`` never together."""
    raw = text.strip().lower()
    if raw.startswith("mig "):
        raw = raw[4:]  # the driver's spelling: "MIG 1g.18gb"
    m = _NAME.fullmatch(raw)
    if not m:
        raise InputError(
            f"{text!r} is not a MIG profile name{digits_note(text)}",
            field=field,
            fix="write a GPU-instance profile like 1g.18gb, 3g.71gb or 1g.18gb+me",
        )
    sign: AttributeSign = "-" if m.group("sign") == "-" else "+"
    attrs = _attributes(text, m.group("attrs"), field) if m.group("sign") else ()
    gi = int(m.group("g"))
    ci = int(m.group("ci")) if m.group("ci") else None
    if gi < 1 or int(m.group("gb")) < 1 or (ci is not None and not 1 <= ci <= gi):
        raise InputError(
            f"{text!r} has impossible slice counts",
            field=field,
            fix="slices and GB are positive, and a compute instance (Nc.) is no larger than "
            "its GPU instance",
        )
    return MigProfileName(gi, int(m.group("gb")), attrs, ci, sign)


def _attributes(text: str, listed: str, field: str) -> tuple[str, ...]:
    fix = (
        "write one sign and a comma-separated list of attributes, like 1g.24gb+gfx, "
        "1g.24gb+me.all or 1g.24gb-me"
    )
    if "+" in listed or "-" in listed:
        raise InputError(
            f"{text!r} has more than one attribute sign (+ and - cannot be combined)",
            field=field,
            fix=fix,
        )
    attrs = listed.split(",")
    for a in attrs:
        if not _ATTRIBUTE.fullmatch(a) or a.startswith(".") or a.endswith("."):
            raise InputError(
                f"attribute {a!r} in {text!r} is not an attribute name",
                field=field,
                fix=fix + " (letters, digits and dots; not starting with a digit or a dot)",
            )
    if len(set(attrs)) != len(attrs):
        raise InputError(f"{text!r} lists an attribute twice", field=field, fix=fix)
    return tuple(sorted(attrs))


@dataclass(frozen=True, slots=True, order=True)
class MigPlacement:
    """One GPU instance in a layout: a profile at a start memory slot."""

    start: int
    profile: str

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "start": self.start}


def parse_layout(text: str, *, field: str = "--layout") -> tuple[MigPlacement, ...]:
    """Parse ``3g.71gb@0,2g.35gb@4,1g.18gb@6`` (an empty string is the empty layout)."""
    placements: list[MigPlacement] = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        if not part:
            if text.strip():
                raise InputError(
                    f"empty entry {i + 1}", field=field, fix="separate entries by one comma"
                )
            continue
        profile, sep, start = part.partition("@")
        if not sep or not is_digits(start.strip()):
            raise InputError(
                f"entry {part!r} has no start slot{digits_note(start)}",
                field=field,
                fix="write each instance as PROFILE@START, for example 3g.71gb@0",
            )
        placements.append(
            MigPlacement(start=int(start), profile=_instance_profile(profile, field=field))
        )
    return tuple(sorted(placements))


def layout_from_json(raw: Any, *, field: str = "instances") -> tuple[MigPlacement, ...]:
    """Read ``[{"profile": ..., "start": ...}, ...]``."""
    if not isinstance(raw, list):
        raise InputError("must be a list of {profile, start} objects", field=field)
    placements = []
    for i, item in enumerate(raw):
        where = f"{field}[{i}]"
        if not isinstance(item, dict) or "profile" not in item or "start" not in item:
            raise InputError("must be an object with 'profile' and 'start'", field=where)
        start = item["start"]
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise InputError(
                f"start {start!r} is not a slot number", field=f"{where}.start", fix="use 0, 1, ..."
            )
        if not isinstance(item["profile"], str):
            raise InputError("must be a profile name string", field=f"{where}.profile")
        placements.append(
            MigPlacement(start, _instance_profile(item["profile"], field=f"{where}.profile"))
        )
    return tuple(sorted(placements))


def format_layout(placements: tuple[MigPlacement, ...] | list[MigPlacement]) -> str:
    return ",".join(str(p) for p in sorted(placements))


def _instance_profile(text: str, *, field: str) -> str:
    name = parse_profile_name(text, field=field)
    if name.compute_instance_slices is not None:
        raise InputError(
            f"{text!r} is a compute-instance profile; a layout lists GPU instances",
            field=field,
            fix=f"place the GPU instance {name.gpu_instance_name} (each gets one full compute "
            "instance)",
        )
    return str(name)


LayoutRule = Literal[
    "unknown_profile", "placement", "overlap", "compute", "max_instances", "media_extensions"
]


@dataclass(frozen=True, slots=True)
class LayoutProblem:
    """Why a layout is invalid: the rule broken and the instances that break it."""

    rule: LayoutRule
    message: str
    instances: tuple[MigPlacement, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "message": self.message,
            "instances": [str(p) for p in self.instances],
        }


def check_layout(model: GpuModel, placements: tuple[MigPlacement, ...]) -> list[LayoutProblem]:
    """Every rule ``placements`` breaks on ``model`` (an empty list means the layout is valid)."""
    problems: list[LayoutProblem] = []
    owner: dict[int, MigPlacement] = {}
    counts: Counter[str] = Counter()
    compute = 0
    media: list[MigPlacement] = []
    for pl in sorted(placements):
        if not model.has_profile(pl.profile):
            problems.append(
                LayoutProblem(
                    "unknown_profile",
                    f"{model.key} has no profile {pl.profile} "
                    f"(it has {', '.join(p.name for p in model.profiles)})",
                    (pl,),
                )
            )
            continue
        prof = model.profile(pl.profile)
        counts[prof.name] += 1
        compute += prof.compute_slices
        if prof.media_extensions:
            media.append(pl)
        if pl.start not in prof.placement_starts:
            allowed = ",".join(str(s) for s in prof.placement_starts)
            problems.append(
                LayoutProblem(
                    "placement",
                    f"{prof.name} cannot start at slot {pl.start} (allowed starts: {allowed})",
                    (pl,),
                )
            )
            continue
        for slot in range(pl.start, pl.start + prof.memory_slots):
            other = owner.get(slot)
            if other is not None:
                problems.append(
                    LayoutProblem(
                        "overlap", f"{other} and {pl} both use memory slot {slot}", (other, pl)
                    )
                )
                break
            owner[slot] = pl
    for name, n in sorted(counts.items()):
        prof = model.profile(name)
        if n > prof.max_instances:
            problems.append(
                LayoutProblem(
                    "max_instances",
                    f"{n} instances of {name}, at most {prof.max_instances} fit on {model.key}",
                    tuple(p for p in sorted(placements) if p.profile == name),
                )
            )
    if compute > model.compute_slices:
        problems.append(
            LayoutProblem(
                "compute",
                f"the instances need {compute} compute slices, {model.key} has "
                f"{model.compute_slices}",
                tuple(sorted(placements)),
            )
        )
    if len(media) > 1:
        problems.append(
            LayoutProblem(
                "media_extensions",
                f"{len(media)} instances with media extensions (+me), at most one per GPU",
                tuple(media),
            )
        )
    return problems


def occupied_slots(model: GpuModel, placements: tuple[MigPlacement, ...]) -> int:
    """Bit mask of the memory slots a (valid) layout occupies."""
    mask = 0
    for pl in placements:
        prof = model.profile(pl.profile)
        mask |= ((1 << prof.memory_slots) - 1) << pl.start
    return mask
