"""The GPU a workload asks for (``spec.resources``) as pydantic models: whole GPUs, a fraction,
memory with an optional compute cap, or a MIG profile, each under gpufrac's name or an alias other
schedulers use; and the rules between a request and a sharing mode.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    model_validator,
)

from gpufrac.errors import InputError
from gpufrac.model.catalog import ALIASES, catalog, lookup_model
from gpufrac.model.manifest_fields import kind_of
from gpufrac.model.manifest_types import (
    CpusMilli,
    FractionMilli,
    Hint,
    MemoryMiB,
    Percent,
    Strict,
    one_of_fields,
    problem,
    report,
    words_pattern,
)
from gpufrac.model.mig import parse_profile_name
from gpufrac.model.workload import MILLI, GpuRequest, Sharing

REQUEST_KINDS = ("count", "fraction", "memory", "mig")
# Names other schedulers use, each meaning exactly one gpufrac field (HAMi, then KAI-Scheduler).
GPU_ALIASES = {
    "gpumem": "memory",
    "gpucores": "compute",
    "gpu-fraction": "fraction",
    "gpu-memory": "memory",
}


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


def _one_request_json_schema(schema: dict[str, Any]) -> None:
    """At least one request, and never two kinds of request, nor compute beside
    anything but memory, under any of their names (``not``). A field and its alias both given
    must agree: that the schema cannot check (docs/manifest.md)."""
    names = {k: [k, *(a for a, c in GPU_ALIASES.items() if c == k)] for k in REQUEST_KINDS}
    compute = ["compute", *(a for a, c in GPU_ALIASES.items() if c == "compute")]
    kinds = list(names)
    pairs = [
        (a, b)
        for i, k in enumerate(kinds)
        for j in kinds[i + 1 :]
        for a in names[k]
        for b in names[j]
    ]
    pairs += [(c, b) for c in compute for k in kinds if k != "memory" for b in names[k]]
    no_request = one_of_fields((n for k in kinds for n in names[k]), exactly=False)
    schema["not"] = {"anyOf": [*no_request, *({"required": [a, b]} for a, b in pairs)]}


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
_MIB = Hint(fix="write an integer number of MiB")


class Gpu(Strict):
    """Exactly one of count, fraction, memory or mig (or an alias of one); compute only beside
    memory. A field and its alias may both be given only with the same value."""

    model_config = ConfigDict(json_schema_extra=_one_request_json_schema)

    count: Annotated[int, Field(ge=1)] | None = Field(None, description="Whole GPUs.")
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
    mig: MigRequest | None = Field(
        None,
        description="A MIG GPU instance: 1g.18gb (any GPU model that has it), or "
        "{profile: 1g.10gb, model: A100-80GB}.",
    )
    compute: Percent | None = Field(
        None,
        description="A cap on the share of the GPU's SMs (30% or 30, 1..100); only beside "
        "memory; enforced by MPS.",
    )
    gpumem: Annotated[int, Field(ge=1), _MIB] | None = Field(
        None, description="HAMi's name for memory: an integer number of MiB."
    )
    gpucores: Annotated[int, Field(ge=1, le=100)] | None = Field(
        None, description="HAMi's name for compute: an integer percentage, 1..100."
    )
    gpu_fraction: FractionMilli | None = Field(
        None, alias="gpu-fraction", description="KAI-Scheduler's name for fraction."
    )
    gpu_memory: Annotated[int, Field(ge=1), _MIB] | None = Field(
        None,
        alias="gpu-memory",
        description="KAI-Scheduler's name for memory: an integer number of MiB.",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _one_request(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        gpu = handler(data)
        values: dict[str, int | Mig] = {}
        written: dict[str, str] = {}
        for key in data:  # in the order written: a disagreeing key is the later one
            canonical = GPU_ALIASES.get(key, key)
            value = gpu._value(key)
            if canonical in values and values[canonical] != value:
                report(
                    "Gpu",
                    [
                        (
                            (key,),
                            f"{written[canonical]} and {key} ask for different amounts "
                            f"({_show(canonical, values[canonical])} and "
                            f"{_show(canonical, value)})",
                            f"give only one of {written[canonical]} and {key}: "
                            f"{_alias_note(written[canonical], key)}",
                        )
                    ],
                )
            values.setdefault(canonical, value)
            written.setdefault(canonical, key)
        kinds = [k for k in REQUEST_KINDS if k in values]
        if len(kinds) != 1:
            raise problem(
                f"asks for {' and '.join(kinds)} at once" if kinds else "asks for no GPU",
                "give exactly one of count, fraction, memory, mig (with compute only beside "
                "memory)",
            )
        if "compute" in values and kinds[0] != "memory":
            report(
                "Gpu",
                [
                    (
                        (written["compute"],),
                        f"a compute cap goes with a memory request, not with {kinds[0]}",
                        "remove the compute cap, or ask for memory instead",
                    )
                ],
            )
        return gpu

    def _value(self, key: str) -> int | Mig:
        value = getattr(self, key.replace("-", "_"))
        assert value is not None
        return value  # type: ignore[no-any-return]

    @property
    def compute_key(self) -> str | None:
        """The name the compute cap was given under, if any."""
        return "compute" if self.compute is not None else "gpucores" if self.gpucores else None

    def request(self) -> GpuRequest:
        mig = self.mig
        return GpuRequest(
            count=self.count,
            fraction_milli=self.fraction or self.gpu_fraction,
            memory_mib=self.memory or self.gpumem or self.gpu_memory,
            compute_pct=self.compute or self.gpucores,
            mig_profile=mig.profile if mig else None,
            mig_model=mig.model if mig else None,
        )


def _show(canonical: str, value: int | Mig) -> str:
    if canonical == "memory":
        return f"{value} MiB"
    if canonical == "fraction" and isinstance(value, int):
        return f"{value / MILLI:g} GPU"
    return f"{value}%"


def _alias_note(first: str, second: str) -> str:
    alias = second if second in GPU_ALIASES else first
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


def _never(sharing: tuple[str, ...], *kinds: str) -> dict[str, Any]:
    """A spec that breaks a rule (for a spec's ``not: {anyOf: [...]}``): its sharing is one of
    ``sharing`` and it asks for one of ``kinds`` (under any of their names)."""
    gpu = {"anyOf": [{"required": [n]} for n in _request_names(*kinds)]}
    return {
        "required": ["sharing", "resources"],
        "properties": {
            "sharing": {"pattern": words_pattern(sharing)},
            "resources": {"required": ["gpu"], "properties": {"gpu": gpu}},
        },
    }


# check_sharing's rules, as JSON Schema: the specs that break one (a spec's not: {anyOf: ...});
# sharing left out is auto, which any request may use
SHARING_BROKEN = [
    _never(("mps", "timeslice", "exclusive"), "mig"),
    _never(("mig",), "count"),
    _never(("exclusive",), "fraction", "memory"),
    _never(("timeslice", "mig"), "compute"),
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
    return [(("sharing",), *broken)] if broken else []
