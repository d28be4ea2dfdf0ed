"""The GPU a workload asks for (``spec.resources``) as pydantic models: whole GPUs, a fraction,
memory with an optional compute cap, or a MIG profile, each under gpufrac's name or an alias other
schedulers use; and the rules between a request and a sharing mode.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PlainValidator,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gpufrac.errors import InputError
from gpufrac.model.catalog import ALIASES, catalog, lookup_model
from gpufrac.model.manifest_fields import MAX_INT_DIGITS, kind_of
from gpufrac.model.manifest_types import (
    LEAST_MILLI,
    CpusMilli,
    FractionMilli,
    Hint,
    MemoryMiB,
    Percent,
    Strict,
    milli,
    problem,
    report,
    words_pattern,
)
from gpufrac.model.mig import parse_profile_name
from gpufrac.model.numbers import digits_note, is_decimal, is_digits
from gpufrac.model.units import MAX_SIZE_MIB
from gpufrac.model.workload import MILLI, GpuRequest, Sharing

REQUEST_KINDS = ("count", "fraction", "memory", "mig")
MAX_COUNT = 10**MAX_INT_DIGITS - 1  # as large a count as a manifest can write (18 digits)
# Names other schedulers use, each meaning exactly one gpufrac field: HAMi's resource names, bare
# or under nvidia.com/ as a pod's limits write them, then KAI-Scheduler's pod annotations.
GPU_ALIASES = {
    "nvidia.com/gpu": "count",
    "gpumem": "memory",
    "nvidia.com/gpumem": "memory",
    "gpumem-percentage": "memory_percent",
    "nvidia.com/gpumem-percentage": "memory_percent",
    "gpucores": "compute",
    "nvidia.com/gpucores": "compute",
    "gpu-fraction": "fraction",
    "gpu-memory": "memory",
    "gpu-fraction-num-devices": "count",
}
# HAMi's MIG resource, nvidia.com/mig-1g.10gb: 1, means mig: 1g.10gb.
MIG_RESOURCE = "nvidia.com/mig-"
# What may go beside count: a share of each of its GPUs (HAMi's nvidia.com/gpu: N with gpumem,
# KAI's gpu-fraction-num-devices with gpu-fraction).
PER_GPU = ("fraction", "memory", "memory_percent", "compute")


def _profiles_pattern(names: Iterable[str]) -> str:
    return words_pattern(names, prefix="([Mm][Ii][Gg] )?")


def _model_names() -> dict[str, set[str]]:
    """Every name the reader takes for each GPU model (``lookup_model``): its key, its aliases and
    every unambiguous prefix of them, in lower case."""
    out: dict[str, set[str]] = {key: set() for key in catalog()}
    words = {w.lower() for w in catalog()} | set(ALIASES)
    for word in words:
        for end in range(1, len(word) + 1):
            try:
                out[lookup_model(word[:end]).key].add(word[:end])
            except InputError:
                continue  # ambiguous
    return out


# A GPU-instance profile some GPU model gpufrac knows has (1g.18gb, 1g.18gb+me, any case, a leading
# "MIG "): the JSON Schema refuses the rest (+gfx, 5g.99gb), as the reader does.
PROFILE_PATTERN = _profiles_pattern({p.name for m in catalog().values() for p in m.profiles})


def _mig_json_schema(schema: dict[str, Any]) -> None:
    """The model a profile is asked on, by the names the reader takes, and its profiles."""
    names = _model_names()
    schema["properties"]["model"]["pattern"] = words_pattern(set().union(*names.values()))
    schema["allOf"] = [  # no model, or a model and one of its profiles
        {
            "anyOf": [
                {"not": {"required": ["model"]}},
                *(
                    {
                        "required": ["model"],
                        "properties": {
                            "model": {"pattern": words_pattern(names[key])},
                            "profile": {
                                "pattern": _profiles_pattern(p.name for p in model.profiles)
                            },
                        },
                    }
                    for key, model in catalog().items()
                ),
            ]
        }
    ]


Broken = list[tuple[tuple[str | int, ...], str, str]]  # (where, message, fix) of each rule broken


def _profile(text: str) -> str:
    """A GPU-instance profile name, canonical (``MIG 1G.18GB`` -> ``1g.18gb``)."""
    try:
        name = parse_profile_name(text)
    except InputError as exc:
        raise problem(exc.message, exc.fix or "") from None
    if name.compute_instance_slices is not None:
        raise problem(
            f"{text!r} is a compute-instance profile",
            f"ask for the GPU instance {name.gpu_instance_name}: a workload gets a whole GPU "
            "instance",
        )
    return str(name)


def _gpu_model(name: str) -> str:
    """A GPU model by catalog key, alias or unambiguous prefix, as its catalog key."""
    try:
        return lookup_model(name).key
    except InputError as exc:
        raise problem(exc.message, exc.fix or "") from None


class Mig(Strict):
    """A MIG GPU instance of a profile, on any GPU model that has it or on one model."""

    model_config = ConfigDict(json_schema_extra=_mig_json_schema)

    profile: Annotated[str, AfterValidator(_profile), Hint(missing="write profile: 1g.18gb")] = (
        Field(
            description="A GPU-instance profile (1g.18gb, 1g.18gb+me; case-insensitive, a leading "
            "'MIG ' dropped). A compute-instance name (1c.3g.71gb) is an error.",
            json_schema_extra={"pattern": PROFILE_PATTERN},
        )
    )
    model: Annotated[str, AfterValidator(_gpu_model)] | None = Field(
        None,
        description="A GPU model by catalog key or alias (A100-80GB, h200, or an unambiguous "
        "prefix); the profile must exist on it.",
    )

    @model_validator(mode="after")
    def _profile_on_model(self) -> Self:
        gpu = catalog()[self.model] if self.model is not None else None
        known = sorted({p.name for m in catalog().values() for p in m.profiles}, key=_profile_order)
        if gpu is None and self.profile not in known:
            report(
                "Mig",
                [
                    (
                        ("profile",),
                        f"no GPU model gpufrac knows has the MIG profile {self.profile}",
                        f"use one of: {', '.join(known)}",
                    )
                ],
            )
        if gpu is not None and not gpu.has_profile(self.profile):
            report(
                "Mig",
                [
                    (
                        ("profile",),
                        f"{gpu.key} has no MIG profile {self.profile}",
                        f"use one of: {', '.join(p.name for p in gpu.profiles)}",
                    )
                ],
            )
        return self


def _profile_order(name: str) -> tuple[int, int, str]:
    """Profiles by slices, then memory: 1g.5gb, 1g.10gb, ..., 7g.80gb."""
    slices, _, rest = name.partition("g.")
    memory = rest.split("gb", 1)[0]
    return (int(slices), int(memory) if memory.isdigit() else 0, name)


def _mig_short_form(value: object) -> object:
    """``mig: 1g.18gb`` is ``mig: {profile: 1g.18gb}``, with its errors at ``mig``."""
    if isinstance(value, str):
        return {"profile": _profile(value)}
    if not isinstance(value, dict):
        raise problem(
            f"must be a string, not {kind_of(value)}",
            "write a profile name like 1g.18gb, or {profile: 1g.18gb, model: H200}",
        )
    return value


MigRequest = Annotated[
    Mig,
    BeforeValidator(
        _mig_short_form,
        json_schema_input_type=Annotated[str, Field(pattern=PROFILE_PATTERN)] | Mig,
    ),
]


def _written_number(value: object, *, low: int, high: int | None, unit: str) -> int:
    """A whole number as other schedulers' users write it: an integer, or the same digits in a
    string (a Kubernetes annotation value is always a string, a limit often one: ``"2000"``)."""
    fix = f"write a whole number{unit}, {low}..{high}" if high else f"write a whole number{unit}"
    if isinstance(value, str):
        if not is_digits(value):
            raise problem(f"{kind_of(value)} is not a whole number{digits_note(value)}", fix)
        digits = value.lstrip("0") or "0"
        if len(digits) > MAX_INT_DIGITS:  # as a number of so many digits is refused
            raise problem(f"is a whole number of more than {MAX_INT_DIGITS} digits", fix)
        value = int(digits)
    if not isinstance(value, int) or isinstance(value, bool):
        raise problem(f"must be a whole number, not {kind_of(value)}", fix)
    if value < low or (high is not None and value > high):
        raise problem(f"{value} is out of range", fix)
    return value


# The largest MiB an alias may name: twelve digits (about 0.9 EiB, far beyond any GPU), so that its
# string form's pattern states the same range as the number's bounds.
MAX_ALIAS_MIB = 10**12 - 1
assert MAX_ALIAS_MIB <= MAX_SIZE_MIB


def _alias_mib(value: object) -> int:
    return _written_number(value, low=1, high=MAX_ALIAS_MIB, unit=' of MiB (2000 or "2000")')


def _alias_percent(value: object) -> int:
    return _written_number(value, low=1, high=100, unit=' percent (30 or "30")')


def _alias_count(value: object) -> int:
    return _written_number(value, low=1, high=None, unit=' of GPUs (2 or "2")')


def _alias_fraction(value: object) -> int:
    """KAI's gpu-fraction: a number, or the same in a string (``"0.5"``)."""
    fix = 'write a number between 0 and 1, like 0.5 or "0.5"'
    if isinstance(value, str):
        if not is_decimal(value):
            raise problem(f"{kind_of(value)} is not a number{digits_note(value)}", fix)
        # exactly as written (a float would round 0.00049999999999999999 up to 0.0005)
        value = Decimal(value) if "." in value else int(value)
    return milli(value, maximum=MILLI - 1, fix=fix)


def _digits_or(schema: dict[str, Any], pattern: str = r"^[0-9]+$") -> WithJsonSchema:
    return WithJsonSchema({"anyOf": [schema, {"type": "string", "pattern": pattern}]})


# Each string form's pattern states the number's range, as the reader reads the digits (leading
# zeros allowed): 1..999999999999 MiB, 1..100 percent, 1 GPU or more, and a fraction that rounds
# to 1..999 milli-GPU (not below 0.0005, not from 0.9995 up; a digit before the point, as YAML and
# JSON write numbers).
AliasMiB = Annotated[
    int,
    PlainValidator(_alias_mib),
    _digits_or(
        {"type": "integer", "minimum": 1, "maximum": MAX_ALIAS_MIB}, r"^0*[1-9][0-9]{0,11}$"
    ),
]
AliasPercent = Annotated[
    int,
    PlainValidator(_alias_percent),
    _digits_or({"type": "integer", "minimum": 1, "maximum": 100}, r"^0*([1-9][0-9]?|100)$"),
]
AliasCount = Annotated[
    int,
    PlainValidator(_alias_count),
    _digits_or({"type": "integer", "minimum": 1, "maximum": MAX_COUNT}, r"^0*[1-9][0-9]{0,17}$"),
]
AliasFraction = Annotated[
    int,
    PlainValidator(_alias_fraction),
    _digits_or(
        {"type": "number", "minimum": LEAST_MILLI, "exclusiveMaximum": 0.9995},
        r"^0+\.(?!(0{1,3}|000[0-4][0-9]*)$)(?!999[5-9])[0-9]+$",
    ),
]


def _mig_resources(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``data`` with HAMi's MIG resource (``nvidia.com/mig-1g.10gb: 1``) written as ``mig``, and
    the keys so read with the profile each names; a count other than 1 or a second MIG resource
    is an error at its key."""
    found = {k: v for k, v in data.items() if isinstance(k, str) and k.startswith(MIG_RESOURCE)}
    if not found:
        return data, {}
    broken: Broken = []
    profiles: dict[str, str] = {}
    for key, value in found.items():
        try:
            profiles[key] = _profile(key.removeprefix(MIG_RESOURCE))
            if not any(m.has_profile(profiles[key]) for m in catalog().values()):
                raise problem(
                    f"no GPU model gpufrac knows has the MIG profile {profiles[key]}",
                    "use one of: "
                    + ", ".join(
                        MIG_RESOURCE + p
                        for p in sorted(
                            {p.name for m in catalog().values() for p in m.profiles},
                            key=_profile_order,
                        )
                    ),
                )
            if isinstance(value, bool) or value not in (1, "1"):
                asked = (
                    f"asks for {value} MIG instances"
                    if isinstance(value, int | str)
                    and not isinstance(value, bool)
                    and is_digits(str(value))
                    else f"is {kind_of(value)}, not a count of 1"
                )
                raise problem(asked, f"a workload gets one MIG instance: write {key}: 1")
        except PydanticCustomError as exc:
            broken.append(((key,), str(exc), str((exc.context or {}).get("fix", ""))))
    if len(found) > 1 and not broken:
        second = list(found)[1]
        broken.append(
            (
                (second,),
                f"asks for a second MIG instance ({', '.join(found)})",
                "a workload gets one MIG instance: keep one nvidia.com/mig-... key",
            )
        )
    report("Gpu", broken)
    out = {k: v for k, v in data.items() if k not in found}
    if "mig" not in out:
        out["mig"] = next(iter(profiles.values()))
    return out, profiles


MIG_KEY = r"^nvidia\.com/mig-"  # HAMi's MIG resource keys, each asking for 1


def _gpu_json_schema(schema: dict[str, Any]) -> None:
    """The reader's rules of a request (``_combination``) under every name a field goes by, in one
    ``not: {anyOf: [...]}`` (what generated clients and schemathesis read best): a request of
    some kind; mig alone; memory or memory_percent, not both; fraction without memory,
    memory_percent or compute. A field and its alias both given must agree, and one HAMi MIG
    resource key at most: beyond a schema."""
    names = {
        k: [k, *(a for a, c in GPU_ALIASES.items() if c == k)]
        for k in (*REQUEST_KINDS, "memory_percent", "compute")
    }

    def pairs(left: list[str], right: list[str]) -> list[dict[str, Any]]:
        return [{"required": [a, b]} for a in left for b in right]

    mig_key = {"not": {"propertyNames": {"not": {"pattern": MIG_KEY}}}}  # some key is one
    others = [n for k, ns in names.items() if k != "mig" for n in ns]
    broken: list[dict[str, Any]] = [
        {  # no request at all
            "properties": {n: {"not": {}} for ns in names.values() for n in ns},
            "propertyNames": {"not": {"pattern": MIG_KEY}},
        },
        *pairs(names["memory"], names["memory_percent"]),
        *pairs(names["mig"], others),
        *({"required": [o], **mig_key} for o in others),
        *pairs(names["fraction"], [*names["memory"], *names["memory_percent"], *names["compute"]]),
    ]
    schema["not"] = {"anyOf": broken}
    # a key naming a profile some model has (any other nvidia.com/mig-... key is refused, as
    # an unknown field, by additionalProperties), asking for 1
    key = r"^nvidia\.com/mig-" + PROFILE_PATTERN.removeprefix("^")
    schema["patternProperties"] = {key: {"enum": [1, "1"]}}


class Gpu(Strict):
    """One GPU request: whole GPUs (count), a share of one GPU (fraction, memory or
    memory_percent, optionally with compute; or compute alone), or a MIG profile; or an alias of
    one. Beside count, a share means a share of each of its GPUs. A field and its alias may both
    be given only with the same value."""

    model_config = ConfigDict(json_schema_extra=_gpu_json_schema)

    count: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = Field(
        None,
        description="Whole GPUs; beside fraction, memory, memory_percent or compute, that many "
        "GPUs of one node each with the share (with compute: under MPS, one daemon serving "
        "them all).",
    )
    fraction: FractionMilli | None = Field(
        None,
        description="A share of one GPU, 0 < f < 1 (0.25), stored in milli-GPU rounded to the "
        "nearest.",
    )
    memory: MemoryMiB | None = Field(
        None,
        description="GPU memory as a Kubernetes quantity: 12Gi, 512Mi, 1.5Gi (binary; 12GiB too), "
        "16G (decimal; rounded up to whole MiB), or an integer meaning MiB.",
    )
    memory_percent: Percent | None = Field(
        None,
        description="GPU memory as a percentage of the memory of the GPU it is placed on (50% or "
        "50, 1..100).",
    )
    mig: MigRequest | None = Field(
        None,
        description="A MIG GPU instance: 1g.18gb (any GPU model that has it), or "
        "{profile: 1g.10gb, model: A100-80GB}.",
    )
    compute: Percent | None = Field(
        None,
        description="A cap on the share of the GPU's SMs (30% or 30, 1..100), enforced by MPS; "
        "beside memory or memory_percent, or alone (then with the GPU's whole memory); beside "
        "count, on each of its GPUs.",
    )
    nvidia_gpu: AliasCount | None = Field(
        None, alias="nvidia.com/gpu", description="HAMi's (and Kubernetes') name for count."
    )
    gpumem: AliasMiB | None = Field(
        None, description="HAMi's name for memory: a whole number of MiB (string or integer)."
    )
    nvidia_gpumem: AliasMiB | None = Field(
        None, alias="nvidia.com/gpumem", description="HAMi's resource name for memory, in MiB."
    )
    gpumem_percentage: AliasPercent | None = Field(
        None, alias="gpumem-percentage", description="HAMi's name for memory_percent."
    )
    nvidia_gpumem_percentage: AliasPercent | None = Field(
        None,
        alias="nvidia.com/gpumem-percentage",
        description="HAMi's resource name for memory_percent.",
    )
    gpucores: AliasPercent | None = Field(
        None, description="HAMi's name for compute: a whole percentage, 1..100."
    )
    nvidia_gpucores: AliasPercent | None = Field(
        None, alias="nvidia.com/gpucores", description="HAMi's resource name for compute."
    )
    gpu_fraction: AliasFraction | None = Field(
        None,
        alias="gpu-fraction",
        description='KAI-Scheduler\'s name for fraction (a number or a string: "0.5").',
    )
    gpu_memory: AliasMiB | None = Field(
        None,
        alias="gpu-memory",
        description="KAI-Scheduler's name for memory: a whole number of MiB (string or integer).",
    )
    gpu_fraction_num_devices: AliasCount | None = Field(
        None,
        alias="gpu-fraction-num-devices",
        description="KAI-Scheduler's name for count beside gpu-fraction: that many GPUs, each "
        "with the fraction.",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _one_request(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        if not isinstance(data, dict):
            return handler(data)
        clean, mig_keys = _mig_resources(data)
        gpu = handler(clean)
        values: dict[str, int | Mig] = {}
        written: dict[str, str] = {}
        for key in data:  # in the order written: a disagreeing key is the later one
            canonical = "mig" if key in mig_keys else GPU_ALIASES.get(key, str(key))
            value = (
                Mig.model_validate({"profile": mig_keys[key]})
                if key in mig_keys
                else gpu._value(key)
            )
            if canonical in values and values[canonical] != value:
                report(
                    "Gpu",
                    [
                        (
                            (key,),
                            f"{written[canonical]} and {key} ask for different "
                            f"{'MIG profiles' if canonical == 'mig' else 'amounts'} "
                            f"({_show(canonical, values[canonical])} and "
                            f"{_show(canonical, value)})",
                            f"give only one of {written[canonical]} and {key}: "
                            f"{_alias_note(written[canonical], key)}",
                        )
                    ],
                )
            values.setdefault(canonical, value)
            written.setdefault(canonical, key)
        report("Gpu", _combination(values, written))
        return gpu

    def _value(self, key: str) -> int | Mig:
        name = _FIELD_OF.get(key, key)
        value = getattr(self, name)
        assert value is not None
        return value  # type: ignore[no-any-return]

    def _canonical(self) -> dict[str, Any]:
        """Each gpufrac field given, under its own name or an alias, with its value."""
        out: dict[str, Any] = {}
        for name in self.model_fields_set:
            info = type(self).model_fields[name]
            out[GPU_ALIASES.get(info.alias or name, name)] = getattr(self, name)
        return out

    @property
    def compute_key(self) -> str | None:
        """The name the compute cap was given under, if any."""
        for name in ("compute", "gpucores", "nvidia_gpucores"):
            if getattr(self, name) is not None:
                return type(self).model_fields[name].alias or name
        return None

    def request(self) -> GpuRequest:
        given = self._canonical()
        mig = given.get("mig")
        shared = any(k in given for k in PER_GPU)
        return GpuRequest(
            count=None if shared else given.get("count"),  # beside a share: its GPUs (devices)
            fraction_milli=given.get("fraction"),
            memory_mib=given.get("memory"),
            compute_pct=given.get("compute"),
            mig_profile=mig.profile if mig else None,
            mig_model=mig.model if mig else None,
            memory_pct=given.get("memory_percent"),
            devices=given.get("count", 1) if shared else 1,
        )


_FIELD_OF = {alias: name for name, info in Gpu.model_fields.items() if (alias := info.alias)}


def _combination(values: dict[str, int | Mig], written: dict[str, str]) -> Broken:
    """The rules between the fields of one request, each broken rule at the field it names."""
    kinds = [k for k in (*REQUEST_KINDS, "memory_percent") if k in values]
    if not kinds and "compute" not in values:
        raise problem(
            "asks for no GPU",
            "give one of count, fraction, memory, memory_percent, mig or compute",
        )
    broken: Broken = []
    if "memory" in values and "memory_percent" in values:
        broken.append(
            (
                (written["memory_percent"],),
                f"{written['memory']} and {written['memory_percent']} both ask for memory",
                f"give memory as an amount ({written['memory']}) or as a percentage "
                f"({written['memory_percent']}), not both",
            )
        )
    if "mig" in values and len(values) > 1:
        mig = written["mig"]
        for other in (k for k in values if k != "mig"):
            broken.append(
                (
                    (written[other],),
                    f"a MIG profile ({mig}) is a whole instance: {written[other]} cannot go "
                    "beside it",
                    f"remove {written[other]}, or ask for count, fraction or memory instead of "
                    f"{mig}",
                )
            )
    elif "fraction" in values and ({"memory", "memory_percent", "compute"} & set(values)):
        other = next(k for k in ("memory", "memory_percent", "compute") if k in values)
        broken.append(
            (
                (written[other],),
                f"a fraction is already a share of memory and compute, not with {written[other]}",
                f"give either {written['fraction']} or {written[other]}",
            )
        )
    return broken


def _show(canonical: str, value: int | Mig) -> str:
    if canonical == "memory":
        return f"{value} MiB"
    if canonical == "fraction" and isinstance(value, int):
        return f"{value / MILLI:g} GPU"
    if canonical == "count":
        return f"{value} GPUs"
    if isinstance(value, Mig):
        return value.profile
    return f"{value}%"


def _alias_note(first: str, second: str) -> str:
    alias = second if second in GPU_ALIASES or second.startswith(MIG_RESOURCE) else first
    if alias.startswith(MIG_RESOURCE):
        return f"{alias}: 1 is another way to write mig: {alias.removeprefix(MIG_RESOURCE)}"
    return f"{alias} is another name for {GPU_ALIASES[alias]}"


class Resources(Strict):
    gpu: Annotated[Gpu, Hint(missing="write gpu: {count: 1}")] = Field(
        description="What it asks of a GPU."
    )
    host_memory: MemoryMiB | None = Field(
        None,
        description="Host memory all its processes may use together, as a Kubernetes quantity "
        "(8Gi); over it the workload is stopped and reported. Applied through its cgroup "
        "(docs/agent.md, Cgroups).",
    )
    cpus: CpusMilli | None = Field(
        None,
        description="Host CPUs its processes may use together (2, 0.5), through its cgroup's "
        "CPU quota.",
    )
    pids: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="How many processes and threads it may have at once (its cgroup's pids.max).",
    )


def _request_names(*kinds: str) -> list[str]:
    return [n for k in kinds for n in (k, *(a for a, c in GPU_ALIASES.items() if c == k))]


def _never(
    sharing: tuple[str, ...], *kinds: str, gpu: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A spec that breaks a rule (for a spec's ``not: {anyOf: [...]}``): its sharing is one of
    ``sharing`` and it asks for one of ``kinds`` (under any of their names), its request matching
    ``gpu`` too where given."""
    asks = {"anyOf": [{"required": [n]} for n in _request_names(*kinds)]}
    return {
        "required": ["sharing", "resources"],
        "properties": {
            "sharing": {"pattern": words_pattern(sharing)},
            "resources": {
                "required": ["gpu"],
                "properties": {"gpu": asks if gpu is None else {"allOf": [asks, gpu]}},
            },
        },
    }


_SHARES = {"anyOf": [{"required": [n]} for n in _request_names(*PER_GPU)]}
# a share of several GPUs: some name of count, not 1, beside a share
_SEVERAL = {
    "allOf": [
        _SHARES,
        {
            "anyOf": [
                {"required": [n], "properties": {n: {"not": {"enum": [1, "1"]}}}}
                for n in _request_names("count")
            ]
        },
    ]
}

# check_sharing's rules, as JSON Schema: the specs that break one (a spec's not: {anyOf: ...});
# sharing left out is auto, which any request may use
SHARING_BROKEN = [
    _never(("mps", "timeslice", "exclusive"), "mig"),
    _never(("mig",), "count", gpu={"not": _SHARES}),  # whole GPUs (count beside no share)
    _never(("exclusive",), *PER_GPU),
    _never(("timeslice", "mig"), "compute"),
    _never(("mig",), "count", gpu=_SEVERAL),
]


def check_sharing(gpu: Gpu, sharing: Sharing) -> Broken:
    """The rules between a GPU request and a sharing mode, broken (at ``sharing``)."""
    kind = gpu.request().kind
    compute_key = gpu.compute_key
    broken: tuple[str, str] | None = None
    if kind == "mig" and sharing not in ("auto", "mig"):
        broken = (
            f"a mig request cannot use sharing: {sharing}",
            "set sharing: mig or auto, or ask for memory or a fraction instead of a MIG profile",
        )
    elif sharing == "mig" and kind == "count":
        broken = (
            "sharing: mig cuts a GPU, but count asks for whole GPUs",
            "ask for mig, memory or a fraction, or set sharing: exclusive or auto",
        )
    elif sharing == "exclusive" and kind in ("fraction", "memory"):
        broken = (
            f"sharing: exclusive means whole GPUs, but the request is a {kind}",
            "ask for whole GPUs with count, or choose another sharing mode",
        )
    elif compute_key is not None and sharing in ("timeslice", "mig"):
        broken = (
            f"a compute cap ({compute_key}) cannot be enforced with sharing: {sharing}",
            f"a compute cap needs MPS: set sharing: mps or auto, or remove {compute_key}",
        )
    elif gpu.request().devices > 1 and sharing == "mig":
        n = gpu.request().devices
        broken = (
            f"a share of each of {n} GPUs cannot use sharing: mig: a MIG instance is a whole "
            "instance of one GPU",
            f"set sharing: timeslice, mps or auto (a share of each of {n} GPUs is time-sliced, "
            "or under MPS with a compute cap), or ask for one GPU (count: 1)",
        )
    return [(("sharing",), *broken)] if broken else []
