"""GPU models and their MIG geometry: the catalog shipped with gpufrac.

The catalog is read from ``data/mig-geometry.json`` (a copy of the project's reference data). It
serves planning and simulation; on a real GPU the driver's own profile table wins (see
``devices.nvml``). Unknown values (for example B200 per-profile memory) stay ``None``: never
invented. GPUs of which NVIDIA's MIG user guide publishes only profile names, fractions and instance
counts are in a partial catalog (``partial_catalog``): enough to check a profile name, not to plan;
a GPU the guide lists but whose profile table gpufrac's copy of it lacks is there without profiles.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from gpufrac.errors import InputError


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of one GPU model (for example ``3g.71gb`` on the H200)."""

    name: str
    profile_id: int
    compute_slices: int
    memory_slots: int
    max_instances: int
    placement_starts: tuple[int, ...]
    memory_mib: int | None
    sm_count: int | None
    media_extensions: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "profile_id": self.profile_id,
            "compute_slices": self.compute_slices,
            "memory_slots": self.memory_slots,
            "max_instances": self.max_instances,
            "placement_starts": list(self.placement_starts),
            "memory_mib": self.memory_mib,
            "sm_count": self.sm_count,
            "media_extensions": self.media_extensions,
        }


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model and how it can be cut into MIG instances."""

    key: str
    match_names: tuple[str, ...]
    memory_total_mib: int
    sm_count: int
    memory_slots: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]
    pci_device_ids: tuple[str, ...]
    source: str
    verified: bool
    from_driver: bool

    def profile(self, name: str) -> MigProfile:
        """The profile called ``name`` (case-insensitive), or an InputError listing the choices."""
        wanted = name.strip().lower()
        for p in self.profiles:
            if p.name == wanted:
                return p
        raise InputError(
            f"profile {name!r} does not exist on {self.key}",
            fix=f"use one of: {', '.join(p.name for p in self.profiles)}",
        )

    def has_profile(self, name: str) -> bool:
        wanted = name.strip().lower()
        return any(p.name == wanted for p in self.profiles)

    def profile_by_id(self, profile_id: int) -> MigProfile | None:
        for p in self.profiles:
            if p.profile_id == profile_id:
                return p
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.key,
            "match_names": list(self.match_names),
            "memory_total_mib": self.memory_total_mib,
            "sm_count": self.sm_count,
            "memory_slots": self.memory_slots,
            "compute_slices": self.compute_slices,
            "pci_device_ids": list(self.pci_device_ids),
            "source": self.source,
            "verified": self.verified,
            "from_driver": self.from_driver,
            "profiles": [p.to_json() for p in self.profiles],
        }


# Short names people type. Each maps to exactly one catalog key.
ALIASES: dict[str, str] = {
    "h200": "H200-141GB",
    "h100": "H100-80GB",
    "h100-nvl": "H100-NVL-94GB",
    "h100-96gb": "H100-96GB",
    "gh200": "H100-96GB",
    "a100-80gb": "A100-80GB",
    "a100-40gb": "A100-40GB",
    "a30": "A30-24GB",
    "b200": "B200-180GB",
}


def _profile_from_json(raw: dict[str, Any]) -> MigProfile:
    return MigProfile(
        name=str(raw["name"]).lower(),
        profile_id=int(raw["profile_id"]),
        compute_slices=int(raw["compute_slices"]),
        memory_slots=int(raw["memory_slots"]),
        max_instances=int(raw["max_instances"]),
        placement_starts=tuple(int(s) for s in raw["placement_starts"]),
        memory_mib=None if raw.get("memory_mib") is None else int(raw["memory_mib"]),
        sm_count=None if raw.get("sm_count") is None else int(raw["sm_count"]),
        media_extensions=bool(raw.get("media_extensions", False)),
    )


def model_from_json(key: str, raw: dict[str, Any]) -> GpuModel:
    source = str(raw.get("source", ""))
    return GpuModel(
        key=key,
        match_names=tuple(raw.get("match_names", ())),
        memory_total_mib=int(raw["memory_total_mib"]),
        sm_count=int(raw["sm_count"]),
        memory_slots=int(raw["memory_slots"]),
        compute_slices=int(raw["compute_slices"]),
        profiles=tuple(_profile_from_json(p) for p in raw["profiles"]),
        pci_device_ids=tuple(raw.get("pci_device_ids", ())),
        source=source,
        verified=bool(raw.get("verified", True)),
        from_driver=source.startswith("driver reading"),
    )


@cache
def _reference() -> dict[str, Any]:
    text = resources.files("gpufrac.model").joinpath("data/mig-geometry.json").read_text("utf-8")
    raw: dict[str, Any] = json.loads(text)
    return raw


@cache
def catalog() -> dict[str, GpuModel]:
    """Every GPU model gpufrac knows, by catalog key (``H200-141GB``, ...)."""
    return {key: model_from_json(key, entry) for key, entry in _reference()["gpus"].items()}


@dataclass(frozen=True, slots=True)
class PartialProfile:
    """A profile as NVIDIA's MIG user guide lists it: name, fractions of the GPU, instances."""

    name: str
    memory_fraction: str  # "1/4", "1/2", "1" (the guide's "Full")
    sm_fraction: str
    max_instances: int


@dataclass(frozen=True, slots=True)
class PartialGpuModel:
    """A MIG GPU whose geometry is only partly published: its profile names are known, its profile
    ids and placements are not, so its layouts cannot be planned. ``profiles`` is None where no
    profile table of the GPU was in the copies of NVIDIA's MIG user guide the data came from
    (``profile_table_missing`` says what was checked): then no profile name can be checked. The
    size and instance count are None where no copy of the guide's Supported GPUs table lists it
    (the B300 and GB300 are named only in its Deployment Considerations; the GH200 144G only in
    NVIDIA mig-parted's default config)."""

    key: str
    product: str
    pci_device_ids: tuple[str, ...]
    memory_gb: int | None  # the guide's "Memory Size"; None where no copy of its table lists it
    max_gpu_instances: int | None
    profiles: tuple[PartialProfile, ...] | None
    source: str
    profile_table_missing: str | None = None

    def has_profile(self, name: str) -> bool:
        """Whether the guide's table lists ``name``; False where the table is not known."""
        wanted = name.strip().lower()
        return any(p.name == wanted for p in self.profiles or ())


@cache
def partial_catalog() -> dict[str, PartialGpuModel]:
    """The GPUs of the partial catalog, by key (``RTX-PRO-6000-96GB``, ``GB200-186GB``, ``B300``,
    ...)."""
    return {
        key: PartialGpuModel(
            key=key,
            product=str(raw["product"]),
            pci_device_ids=tuple(str(i).upper().replace("0X", "0x") for i in raw["pci_device_ids"]),
            memory_gb=None if raw["memory_gb"] is None else int(raw["memory_gb"]),
            max_gpu_instances=(
                None if raw["max_gpu_instances"] is None else int(raw["max_gpu_instances"])
            ),
            profiles=None
            if raw["profiles"] is None
            else tuple(
                PartialProfile(
                    str(p["name"]).lower(),
                    str(p["memory_fraction"]),
                    str(p["sm_fraction"]),
                    int(p["max_instances"]),
                )
                for p in raw["profiles"]
            ),
            source=str(raw["source"]),
            profile_table_missing=(
                None
                if raw.get("profile_table_missing") is None
                else str(raw["profile_table_missing"])
            ),
        )
        for key, raw in _reference().get("partial_gpus", {}).items()
    }


def partial_model_for_pci_id(pci_device_id: str) -> PartialGpuModel | None:
    """The partial-catalog GPU of this PCI device id (``0x2BB510DE``, any case), if any."""
    wanted = pci_device_id.strip().upper()
    for model in partial_catalog().values():
        if wanted in (i.upper() for i in model.pci_device_ids):
            return model
    return None


def lookup_model(name: str) -> GpuModel:
    """Find a GPU model by catalog key or alias, case-insensitive.

    An ambiguous prefix (``a100``) is an error that lists the choices.
    """
    models = catalog()
    wanted = name.strip().lower()
    if not wanted:
        raise InputError("empty GPU model name", fix=f"use one of: {', '.join(_choices())}")
    for key, model in models.items():
        if key.lower() == wanted:
            return model
    if wanted in ALIASES:
        return models[ALIASES[wanted]]
    candidates = sorted(
        {k for k in models if k.lower().startswith(wanted)}
        | {a for a in ALIASES if a.startswith(wanted)}
    )
    if len({ALIASES.get(c, c) for c in candidates}) > 1:
        raise InputError(
            f"GPU model {name!r} is ambiguous", fix=f"say which: {', '.join(candidates)}"
        )
    if candidates:
        target = candidates[0]
        return models[ALIASES.get(target, target)]
    raise InputError(f"unknown GPU model {name!r}", fix=f"use one of: {', '.join(_choices())}")


def model_for_product_name(product_name: str) -> GpuModel | None:
    """The catalog model whose ``match_names`` holds exactly this product name, if any."""
    for model in catalog().values():
        if product_name in model.match_names:
            return model
    return None


def _choices() -> list[str]:
    return sorted(ALIASES) + sorted(catalog())


def compare_profile_tables(catalog_model: GpuModel, driver: GpuModel) -> list[str]:
    """Human-readable differences between a catalog entry and a driver's profile table."""
    diffs = []
    fields = ("profile_id", "compute_slices", "memory_slots", "max_instances", "placement_starts")
    for prof in catalog_model.profiles:
        other = next((p for p in driver.profiles if p.name == prof.name), None)
        if other is None:
            diffs.append(f"driver has no profile {prof.name} (catalog: {catalog_model.key})")
            continue
        for f in (*fields, "memory_mib", "sm_count"):
            a, b = getattr(prof, f), getattr(other, f)
            if a is not None and a != b:
                diffs.append(f"{prof.name}.{f}: catalog {a}, driver {b}")
    for prof in driver.profiles:
        if not catalog_model.has_profile(prof.name):
            diffs.append(f"driver has profile {prof.name}, the catalog does not")
    return diffs
