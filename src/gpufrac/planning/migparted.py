"""NVIDIA mig-parted config files: read, resolve against a fleet, export, write and check. Pure.

A mig-parted file (``version: v1``) names configs; each config is a list of entries, and each entry
selects GPUs (``devices: all`` or a list of indices, narrowed by an optional ``device-filter`` of
PCI ids) and says whether MIG is on and which GPU instances to create (profile -> count). GPUs no
entry selects are left alone. gpufrac turns a config into one target layout per selected GPU.

Files are read as mig-parted reads them (its ``api/spec/v1`` package, ``cmd/.../assert`` and
``apply``): what its spec validation refuses is refused here with the same rule, and what it accepts
is accepted; where gpufrac refuses more (a malformed ``device-filter``, which mig-parted silently
never matches; a GPU selected by two entries; a compute-instance profile) the error says so.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import yaml

from gpufrac.errors import InputError
from gpufrac.model.catalog import GpuModel, partial_model_for_pci_id
from gpufrac.model.gpu import MIG_UNSUPPORTED, GpuState
from gpufrac.model.manifest_fields import StrictYamlLoader
from gpufrac.model.mig import MigPlacement, MigProfileName, parse_profile_name
from gpufrac.planning.patterns import layout_for_counts

VERSION = "v1"
_ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")
# one half of a device id: 0x + 8 hex digits (device << 16 | vendor), as NVIDIA writes them
_PCI_HALF = re.compile(r"^0x[0-9a-f]{8}$", re.IGNORECASE)
_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_FILTER_FIX = (
    "write the device and vendor id as '0xDDDDVVVV' (for example '0x233510DE', H200), or with "
    "the subsystem as '0xDDDDVVVV:0xSSSSVVVV'; quote it, as mig-parted reads only strings"
)


@dataclass(frozen=True, slots=True)
class MigPartedEntry:
    """One entry of a config: which GPUs, MIG on or off, and the GPU instances (sorted by
    profile)."""

    devices: tuple[int, ...] | None  # None: all GPUs
    # PCI ids "0xDDDDVVVV" or "0xDDDDVVVV:0xSSSSVVVV" (with the subsystem), upper-case hex;
    # empty: no filter
    device_filter: tuple[str, ...]
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...]  # (profile, count), zero counts kept as written

    @property
    def counts(self) -> dict[str, int]:
        """Instances per profile, zero counts dropped."""
        return {name: n for name, n in self.mig_devices if n}


@dataclass(frozen=True, slots=True)
class MigPartedConfig:
    version: str
    configs: dict[str, tuple[MigPartedEntry, ...]]


@dataclass(frozen=True, slots=True)
class DeviceTarget:
    """What a config asks of one GPU."""

    index: int
    uuid: str
    mig_enabled: bool
    layout: tuple[MigPlacement, ...]


@dataclass(frozen=True, slots=True)
class Resolution:
    """A config resolved against a node: the target of each GPU it applies to, and a note for
    each GPU or index it skips (with why), as mig-parted skips them."""

    name: str
    targets: tuple[DeviceTarget, ...]
    notes: tuple[str, ...]


# --- reading -------------------------------------------------------------------------------------

MAX_VALUES = 100_000  # the manifest reader's bound: aliases may not multiply a file past it
MAX_WHOLE = 10**18


def _bounded(raw: object, source: str) -> None:
    """Refuse a file whose value, aliases expanded, holds more than ``MAX_VALUES`` values, or a
    whole number of more than 18 digits (it could not be said back: a hostile review's 0xfff...)."""
    stack: list[object] = [raw]
    seen = 0
    while stack:
        v = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise InputError(
                f"expands to more than {MAX_VALUES:,} values",
                field=source,
                fix="write the values out; YAML aliases (*name) may not multiply a file",
            )
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= MAX_WHOLE:
            raise InputError(
                "holds a whole number of more than 18 digits",
                field=source,
                fix="write GPU indexes, counts and ids as they are (small numbers)",
            )
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def parse_migparted(text: str, *, source: str = "config") -> MigPartedConfig:
    """Read a mig-parted config (YAML or JSON). Every problem is an InputError naming its field.

    Mirrors mig-parted's ``Spec.UnmarshalJSON``: ``version`` must be ``v1``, no other top-level key
    than ``mig-configs``, which (when given) holds at least one config, each of at least one
    entry. A file of ``version: v1`` alone is valid and holds no config."""
    try:
        raw = yaml.load(
            text, Loader=StrictYamlLoader
        )  # a SafeLoader subclass: as safe as safe_load
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML: {exc}", field=source) from None
    _bounded(raw, source)
    if not isinstance(raw, dict):
        raise InputError(
            "must be a mapping with 'version' and 'mig-configs'",
            field=source,
            fix="start the file with 'version: v1' and 'mig-configs:'",
        )
    version = raw.get("version")
    if version != VERSION:
        raise InputError(
            f"unsupported version {version!r}" if "version" in raw else "missing",
            field="version",
            fix="gpufrac reads mig-parted configs of version v1: write 'version: v1'",
        )
    _unknown_keys(raw, ("version", "mig-configs"), "")
    configs = raw.get("mig-configs", {})
    if not isinstance(configs, dict):
        raise InputError(
            "must be a mapping of config name to a list of entries", field="mig-configs"
        )
    if "mig-configs" in raw and not configs:
        raise InputError(
            "holds no config; mig-parted requires at least one",
            field="mig-configs",
            fix="add a config, e.g. 'all-disabled: [{devices: all, mig-enabled: false}]', or "
            "remove 'mig-configs'",
        )
    out: dict[str, tuple[MigPartedEntry, ...]] = {}
    for name, entries in configs.items():
        if not isinstance(name, str) or not name.strip():
            raise InputError(f"config name {name!r} is not a name", field="mig-configs")
        where = f"mig-configs.{name}"
        if not isinstance(entries, list):
            raise InputError("must be a list of entries", field=where, fix="write '- devices: all'")
        if not entries:
            raise InputError(
                "has no entry; mig-parted requires at least one",
                field=where,
                fix="add an entry like '- devices: all' with 'mig-enabled: false'",
            )
        out[name] = tuple(_entry(e, f"{where}[{i}]") for i, e in enumerate(entries))
    return MigPartedConfig(version=VERSION, configs=out)


def _unknown_keys(raw: dict[Any, Any], known: tuple[str, ...], where: str) -> None:
    for key in raw:
        if key not in known:
            raise InputError(
                f"unknown key {key!r}",
                field=f"{where}.{key}" if where else str(key),
                fix=f"known keys here: {', '.join(known)}",
            )


def _entry(raw: Any, where: str) -> MigPartedEntry:
    """One entry, as mig-parted's ``MigConfigSpec.UnmarshalJSON`` reads it."""
    if not isinstance(raw, dict):
        raise InputError("must be a mapping with devices and mig-enabled", field=where)
    _unknown_keys(raw, _ENTRY_KEYS, where)
    enabled = raw.get("mig-enabled")
    if not isinstance(enabled, bool):
        raise InputError(
            "missing" if "mig-enabled" not in raw else f"{enabled!r} is not true or false",
            field=f"{where}.mig-enabled",
            fix="write mig-enabled: true or mig-enabled: false",
        )
    devices = _devices(raw, where)
    device_filter = _device_filter(raw.get("device-filter"), f"{where}.device-filter")
    mig_devices = _mig_devices(raw.get("mig-devices"), f"{where}.mig-devices")
    if enabled and raw.get("mig-devices") is None:
        raise InputError(
            "missing; mig-parted requires mig-devices when mig-enabled is true",
            field=f"{where}.mig-devices",
            fix="list the GPU instances, or write 'mig-devices: {}' for MIG on with none",
        )
    if mig_devices and not enabled:
        raise InputError(
            "mig-devices given with mig-enabled: false",
            field=f"{where}.mig-devices",
            fix="remove mig-devices, or set mig-enabled: true",
        )
    return MigPartedEntry(
        devices=devices, device_filter=device_filter, mig_enabled=enabled, mig_devices=mig_devices
    )


def _devices(raw: dict[str, Any], where: str) -> tuple[int, ...] | None:
    field, value = f"{where}.devices", raw.get("devices")
    fix = "write devices: all, or a list of GPU indices like [0, 1]"
    if value == "all":
        return None
    if not isinstance(value, list):
        raise InputError(
            "missing" if "devices" not in raw else f"{value!r} is invalid", field=field, fix=fix
        )
    for i, index in enumerate(value):
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise InputError(f"{index!r} is not a GPU index", field=f"{field}[{i}]", fix=fix)
    return tuple(sorted(set(value)))  # mig-parted matches an index listed twice once


def _device_filter(value: Any, field: str) -> tuple[str, ...]:
    """``device-filter``: one string or a list of strings (mig-parted reads nothing else); an
    empty string or list filters nothing."""
    if value is None or value == "":
        return ()
    items = value if isinstance(value, list) else [value]
    ids = set()
    for i, item in enumerate(items):
        where = f"{field}[{i}]" if isinstance(value, list) else field
        if not isinstance(item, str):
            raise InputError(
                f"{item!r} is not a string"
                + (" (YAML reads an unquoted 0x... as a number)" if isinstance(item, int) else ""),
                field=where,
                fix=_FILTER_FIX,
            )
        ids.add(pci_filter_id(item, field=where))
    return tuple(sorted(ids))


def pci_filter_id(text: str, *, field: str = "device-filter") -> str:
    """``0x233510de`` -> ``0x233510DE``; ``0x233510de:0x16a110de`` keeps its subsystem half.

    Both halves as mig-parted's ``NewDeviceIDFromString`` reads them (device << 16 | vendor)."""
    parts = text.strip().split(":")
    if len(parts) > 2 or not all(_PCI_HALF.match(p) for p in parts):
        raise InputError(f"{text!r} is not a PCI device id", field=field, fix=_FILTER_FIX)
    return ":".join(f"0x{int(p, 16):08X}" for p in parts)


def _filter_matches(entry: MigPartedEntry, gpu: GpuState) -> bool:
    """mig-parted's ``MatchesDeviceFilter``: no filter matches every GPU; a filter without a
    subsystem matches device and vendor; one with a subsystem must match all four."""
    if not entry.device_filter:
        return True
    primary = _normal_id(gpu.pci_device_id)
    subsystem = _normal_id(gpu.pci_subsystem_id)
    for wanted in entry.device_filter:
        device, _, sub = wanted.partition(":")
        if device == primary and (not sub or sub == subsystem):
            return True
    return False


def _normal_id(text: str) -> str:
    try:
        return pci_filter_id(text)
    except InputError:
        return text  # "unknown": matches no filter


def _mig_devices(value: Any, field: str) -> tuple[tuple[str, int], ...]:
    """``mig-devices``, checked as mig-parted's ``MigConfig.AssertValidFormat`` checks it: every
    name a profile name, no negative count, and not every count 0."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InputError("must be a mapping of profile name to count", field=field)
    counts: dict[str, int] = {}
    for key, n in value.items():
        where = f"{field}.{key}"
        if not isinstance(key, str):
            raise InputError(f"{key!r} is not a profile name", field=where)
        name = parse_profile_name(key, field=where)
        if name.compute_instance_slices is not None:
            raise InputError(
                f"{key!r} is a compute-instance profile; gpufrac configs list GPU instances only",
                field=where,
                fix=f"use {name.gpu_instance_name} (each GPU instance gets one full compute "
                "instance)",
            )
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise InputError(f"count {n!r} is not a whole number >= 0", field=where)
        if str(name) in counts:
            raise InputError(f"profile {name} is listed twice", field=where)
        counts[str(name)] = n
    if counts and not any(counts.values()):
        raise InputError(
            "every count is 0; mig-parted refuses that",
            field=field,
            fix="give at least one profile a count above 0, or write 'mig-devices: {}' for MIG "
            "on with no instances",
        )
    return tuple(sorted(counts.items()))


# --- resolving -----------------------------------------------------------------------------------


def selected_config(config: MigPartedConfig, name: str | None) -> str:
    """The config to use: ``name``, or the file's only config when no name is given (as
    mig-parted's ``GetSelectedMigConfig``)."""
    if name is None or name == "":
        if len(config.configs) == 1:
            return next(iter(config.configs))
        raise InputError(
            "which config?"
            if config.configs
            else "the file holds no config (it has no 'mig-configs')",
            field="--selected-config",
            fix=f"pass -c NAME, one of: {', '.join(sorted(config.configs))}"
            if config.configs
            else "add a config under 'mig-configs'",
        )
    if name not in config.configs:
        raise InputError(
            f"no config named {name!r}",
            field="mig-configs",
            fix=f"use one of: {', '.join(sorted(config.configs)) or '(the file has none)'}",
        )
    return name


def resolve_config(
    config: MigPartedConfig, name: str | None, gpus: list[GpuState], models: dict[str, GpuModel]
) -> Resolution:
    """The target of every GPU config ``name`` applies to; ``models`` maps GPU uuid -> model.

    As mig-parted walks a config (``WalkSelectedMigConfigForEachGPU`` and ``apply``): an entry
    applies to the GPUs its ``devices`` and ``device-filter`` both match; an index the node does
    not have is skipped, and so is a GPU without MIG selected by ``devices: all``. gpufrac also
    skips, with a note, a GPU whose model has no MIG geometry it knows. Asking MIG of a GPU without
    MIG by its index, or a profile a selected GPU lacks, is an error.
    """
    name = selected_config(config, name)
    by_index = {g.index: g for g in gpus}
    owner: dict[int, int] = {}
    targets: list[DeviceTarget] = []
    notes: list[str] = []
    for i, entry in enumerate(config.configs[name]):
        where = f"mig-configs.{name}[{i}]"
        chosen = _selected(entry, by_index, where, notes)
        for gpu in chosen:
            if gpu.index in owner:
                raise InputError(
                    f"GPU {gpu.index} is also selected by entry [{owner[gpu.index]}]",
                    field=where,
                    fix="select each GPU in one entry only (gpufrac refuses what mig-parted "
                    "would apply twice, the later entry winning)",
                )
            owner[gpu.index] = i
            target = _target(entry, gpu, models.get(gpu.uuid), where, notes)
            if target is not None:
                targets.append(target)
    return Resolution(name, tuple(sorted(targets, key=lambda t: t.index)), tuple(notes))


def _selected(
    entry: MigPartedEntry, by_index: dict[int, GpuState], where: str, notes: list[str]
) -> list[GpuState]:
    if entry.devices is None:
        chosen = [by_index[k] for k in sorted(by_index)]
    else:
        missing = [index for index in entry.devices if index not in by_index]
        if missing:
            have = ", ".join(map(str, sorted(by_index))) or "none"
            notes.append(
                f"{where}.devices: GPU {', '.join(map(str, missing))} not on this node (it has "
                f"GPU {have}); skipped"
            )
        chosen = [by_index[index] for index in entry.devices if index in by_index]
    matching = [g for g in chosen if _filter_matches(entry, g)]
    if chosen and not matching:
        notes.append(
            f"{where}: device-filter {', '.join(entry.device_filter)} matches none of the "
            f"selected GPUs ({_ids(chosen)}); skipped"
        )
    return matching


def _ids(gpus: list[GpuState]) -> str:
    return ", ".join(sorted({g.pci_device_id for g in gpus}))


def _target(
    entry: MigPartedEntry, gpu: GpuState, model: GpuModel | None, where: str, notes: list[str]
) -> DeviceTarget | None:
    unsupported = gpu.mig_current == MIG_UNSUPPORTED
    if not entry.mig_enabled:  # a GPU without MIG has no MIG to switch off: leave it alone
        return None if unsupported else DeviceTarget(gpu.index, gpu.uuid, False, ())
    label = f"GPU {gpu.index} ({gpu.name}, {gpu.pci_device_id})"
    if model is None and gpu.health != "ok":
        raise InputError(
            f"{label} has health {gpu.health}: its MIG state cannot be set",
            field=f"{where}.mig-enabled",
            fix="wait for the GPU to recover, or narrow devices to leave it out",
        )
    if unsupported:
        if entry.devices is None:  # mig-parted's apply skips a non-MIG GPU under devices: all
            notes.append(f"{where}: {label} does not support MIG; skipped, as for devices: all")
            return None
        raise InputError(
            f"{label} does not support MIG",
            field=f"{where}.mig-enabled",
            fix="narrow devices, or add a device-filter for the MIG-capable models",
        )
    if model is None:
        if not entry.counts:  # MIG on with no instances needs no geometry
            return DeviceTarget(gpu.index, gpu.uuid, True, ())
        notes.append(_unplannable(entry, gpu, label, where))
        return None
    counts: dict[str, int] = {}
    for profile, n in entry.counts.items():
        field = f"{where}.mig-devices.{profile}"
        counts[_model_profile(model, parse_profile_name(profile), field)] = n
    layout = layout_for_counts(model, counts) if counts else ()
    if layout is None:
        raise InputError(
            f"{_format_counts(counts)} do not fit together on one {model.key} (GPU {gpu.index})",
            field=f"{where}.mig-devices",
            fix=_why_not(model, counts),
        )
    return DeviceTarget(gpu.index, gpu.uuid, True, layout)


def _unplannable(entry: MigPartedEntry, gpu: GpuState, label: str, where: str) -> str:
    """The note for a GPU whose MIG geometry gpufrac lacks; a profile that its partial catalog
    entry (NVIDIA's MIG user guide) shows it does not have is an error, as on any model."""
    partial = partial_model_for_pci_id(gpu.pci_device_id)
    if partial is None:
        return (
            f"{where}: {label} has no MIG geometry in gpufrac's catalog; skipped (its MIG "
            "devices cannot be planned)"
        )
    if partial.profiles is None:
        return (
            f"{where}: {label} is an {partial.product}, whose catalog entry is partial (no profile "
            "table: the copy of NVIDIA's MIG user guide gpufrac's data was taken from has none for "
            f"it): gpufrac can neither check nor create its {_format_counts(entry.counts)}; "
            "skipped (nvidia-mig-parted creates them through the driver)"
        )
    for profile in entry.counts:
        if not partial.has_profile(profile):
            raise InputError(
                f"profile {profile!r} does not exist on {partial.key}",
                field=f"{where}.mig-devices.{profile}",
                fix=f"use one of: {', '.join(p.name for p in partial.profiles)}",
            )
    return (
        f"{where}: {label} is an {partial.product}, whose catalog entry is partial (profile names "
        "from NVIDIA's MIG user guide; no profile ids or placements): gpufrac cannot create its "
        f"{_format_counts(entry.counts)}; skipped (nvidia-mig-parted creates them through the "
        "driver)"
    )


def _model_profile(model: GpuModel, name: MigProfileName, field: str) -> str:
    """The catalog name of profile ``name`` on ``model``; a profile whose attributes gpufrac has
    no profile of on this model (``+gfx``, ``-me``, ``+me.all``) is refused with why."""
    if model.has_profile(str(name)):
        return model.profile(str(name)).name
    if name.attribute_suffix and model.has_profile(name.base_name):
        raise InputError(
            f"{name} cannot be created on {model.key}: gpufrac's catalog has {name.base_name} "
            f"there but no {name.attribute_suffix} variant of it, so gpufrac has no profile to "
            "create it with",
            field=field,
            fix=f"use {name.base_name} or one of: "
            f"{', '.join(p.name for p in model.profiles)}; or apply this config with "
            "nvidia-mig-parted, which creates it through the driver",
        )
    try:
        return model.profile(str(name)).name
    except InputError as exc:
        raise exc.at(field) from None


def _why_not(model: GpuModel, counts: dict[str, int]) -> str:
    for name, n in counts.items():
        if n > model.profile(name).max_instances:
            return f"at most {model.profile(name).max_instances} {name} fit on one {model.key}"
    compute = sum(model.profile(p).compute_slices * n for p, n in counts.items())
    return (
        f"they use {compute} of {model.compute_slices} compute slices; the memory slots must "
        "fit too"
    )


def device_states(
    config: MigPartedConfig, name: str | None, gpus: list[GpuState], models: dict[str, GpuModel]
) -> dict[int, tuple[bool, dict[str, int]]]:
    """Per selected GPU index: (MIG enabled, instances per profile without zero counts)."""
    return {
        t.index: (t.mig_enabled, dict(Counter(p.profile for p in t.layout)))
        for t in resolve_config(config, name, gpus, models).targets
    }


def assert_config(
    config: MigPartedConfig, name: str | None, gpus: list[GpuState], models: dict[str, GpuModel]
) -> list[str]:
    """How the live GPUs differ from config ``name`` (MIG mode, instance counts); empty: they
    match. The GPUs the config skips (see ``resolve_config``) are not checked."""
    return target_mismatches(resolve_config(config, name, gpus, models), gpus)


def target_mismatches(resolution: Resolution, gpus: list[GpuState]) -> list[str]:
    """How the live GPUs differ from a resolved config; empty: they match."""
    by_index = {g.index: g for g in gpus}
    name = resolution.name
    problems = []
    for t in resolution.targets:
        gpu, enabled = by_index[t.index], t.mig_enabled
        wanted = dict(Counter(p.profile for p in t.layout))
        label = f"GPU {t.index} ({gpu.uuid})"
        if gpu.health != "ok":
            problems.append(f"{label}: health is {gpu.health}, its state cannot be checked")
            continue
        if gpu.mig_enabled != enabled:
            want = "enabled" if enabled else "disabled"
            problems.append(f"{label}: MIG mode is {gpu.mig_current}, config {name} wants {want}")
            continue
        live = dict(Counter(i.profile.lower() for i in gpu.instances))
        if enabled and live != wanted:
            problems.append(
                f"{label}: MIG devices are {_format_counts(live)}, "
                f"config {name} wants {_format_counts(wanted)}"
            )
    return problems


def _format_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n}x {p}" for p, n in sorted(counts.items()) if n) or "none"


# --- exporting and writing -----------------------------------------------------------------------


def export_config(gpus: list[GpuState], name: str = "current") -> MigPartedConfig:
    """The live state as a config: GPUs with the same mode and counts share one entry."""
    groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[int]] = {}
    for gpu in sorted(gpus, key=lambda g: g.index):
        if gpu.health != "ok" or gpu.mig_current == MIG_UNSUPPORTED:
            continue
        counts = Counter(i.profile.lower() for i in gpu.instances) if gpu.mig_enabled else Counter()
        groups.setdefault((gpu.mig_enabled, tuple(sorted(counts.items()))), []).append(gpu.index)
    entries = tuple(
        MigPartedEntry(tuple(indices), (), enabled, counts)
        for (enabled, counts), indices in groups.items()
    )
    return MigPartedConfig(version=VERSION, configs={name: entries})


def dump_migparted(config: MigPartedConfig) -> str:
    """The config as mig-parted YAML (``parse_migparted`` reads it back to an equal config).

    A config without entries cannot be written: mig-parted refuses it."""
    lines = [f"version: {config.version}"] + (["mig-configs:"] if config.configs else [])
    for name, entries in config.configs.items():
        if not entries:
            raise InputError(
                f"config {name!r} has no entry, and mig-parted requires one",
                field="mig-configs",
                fix="export a node with at least one healthy MIG-capable GPU",
            )
        lines.append(f"  {_key(name)}:")
        for e in entries:
            devices = "all" if e.devices is None else "[" + ", ".join(map(str, e.devices)) + "]"
            lines.append(f"    - devices: {devices}")
            if e.device_filter:
                ids = [f'"{d}"' for d in e.device_filter]  # quoted: mig-parted reads strings
                lines.append(
                    "      device-filter: "
                    f"{ids[0] if len(ids) == 1 else '[' + ', '.join(ids) + ']'}"
                )
            lines.append(f"      mig-enabled: {'true' if e.mig_enabled else 'false'}")
            if e.mig_enabled:
                lines.append("      mig-devices:" + ("" if e.mig_devices else " {}"))
                lines.extend(f'        "{p}": {n}' for p, n in e.mig_devices)
    return "\n".join(lines) + "\n"


def _key(name: str) -> str:
    """``name`` as a YAML key: plain where it reads back as the same string, quoted otherwise."""
    if _PLAIN.match(name) and yaml.safe_load(name) == name:
        return name
    return json.dumps(name)  # a JSON string is a YAML double-quoted scalar
