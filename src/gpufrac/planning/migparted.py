"""NVIDIA mig-parted config files: read, resolve against a fleet, export, write and check. Pure.

A mig-parted file (``version: v1``) names configs; each config is a list of entries, and each entry
selects GPUs (``devices: all`` or a list of indices, narrowed by an optional ``device-filter`` of
PCI device ids) and says whether MIG is on and which GPU instances to create (profile -> count).
GPUs no entry selects are left alone. gpufrac turns a config into one target layout per selected
GPU.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import yaml

from gpufrac.errors import InputError
from gpufrac.model.catalog import GpuModel
from gpufrac.model.gpu import MIG_UNSUPPORTED, GpuState
from gpufrac.model.manifest_fields import StrictYamlLoader
from gpufrac.model.mig import MigPlacement, parse_profile_name
from gpufrac.planning.patterns import layout_for_counts

VERSION = "v1"
_ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")
_PCI_ID = re.compile(r"^0x[0-9a-f]{8}$", re.IGNORECASE)
_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True, slots=True)
class MigPartedEntry:
    """One entry of a config: which GPUs, MIG on or off, and the GPU instances (sorted by
    profile)."""

    devices: tuple[int, ...] | None  # None: all GPUs
    device_filter: tuple[str, ...]  # PCI device ids, "0x" + upper-case hex; empty: no filter
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


# --- reading -------------------------------------------------------------------------------------


def parse_migparted(text: str, *, source: str = "config") -> MigPartedConfig:
    """Read a mig-parted config (YAML or JSON). Every problem is an InputError naming its field."""
    try:
        raw = yaml.load(
            text, Loader=StrictYamlLoader
        )  # a SafeLoader subclass: as safe as safe_load
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML: {exc}", field=source) from None
    if not isinstance(raw, dict):
        raise InputError(
            "must be a mapping with 'version' and 'mig-configs'",
            field=source,
            fix="start the file with 'version: v1' and 'mig-configs:'",
        )
    _unknown_keys(raw, ("version", "mig-configs"), "")
    version = raw.get("version")
    if version != VERSION:
        raise InputError(
            f"unsupported version {version!r}" if "version" in raw else "missing",
            field="version",
            fix="gpufrac reads mig-parted configs of version v1: write 'version: v1'",
        )
    configs = raw.get("mig-configs")
    if not isinstance(configs, dict):
        raise InputError(
            "must be a mapping of config name to a list of entries", field="mig-configs"
        )
    out: dict[str, tuple[MigPartedEntry, ...]] = {}
    for name, entries in configs.items():
        if not isinstance(name, str) or not name.strip():
            raise InputError(f"config name {name!r} is not a name", field="mig-configs")
        where = f"mig-configs.{name}"
        if not isinstance(entries, list):
            raise InputError("must be a list of entries", field=where, fix="write '- devices: all'")
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
    mig_devices = _mig_devices(raw.get("mig-devices"), f"{where}.mig-devices")
    if mig_devices and not enabled:
        raise InputError(
            "mig-devices given with mig-enabled: false",
            field=f"{where}.mig-devices",
            fix="remove mig-devices, or set mig-enabled: true",
        )
    return MigPartedEntry(
        devices=_devices(raw, where),
        device_filter=_device_filter(raw.get("device-filter"), f"{where}.device-filter"),
        mig_enabled=enabled,
        mig_devices=mig_devices,
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
        if index in value[:i]:
            raise InputError(f"GPU {index} is listed twice", field=f"{field}[{i}]")
    return tuple(sorted(value))


def _device_filter(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not items:
        raise InputError("is an empty list", field=field, fix="remove it to select every model")
    ids = set()
    for i, item in enumerate(items):
        where = f"{field}[{i}]" if isinstance(value, list) else field
        if isinstance(item, int) and not isinstance(item, bool) and 0 <= item < 1 << 32:
            item = f"0x{item:08X}"  # YAML reads an unquoted 0x233510DE as an integer
        if not isinstance(item, str) or not _PCI_ID.match(item.strip()):
            raise InputError(
                f"{item!r} is not a PCI device id",
                field=where,
                fix="write device id and vendor as 0xDDDDVVVV, for example 0x233510DE (H200)",
            )
        ids.add(_pci_id(item))
    return tuple(sorted(ids))


def _pci_id(text: str) -> str:
    """``0x233510de`` -> ``0x233510DE``."""
    text = text.strip()
    return "0x" + text[2:].upper() if text[:2].lower() == "0x" else text.upper()


def _mig_devices(value: Any, field: str) -> tuple[tuple[str, int], ...]:
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
    return tuple(sorted(counts.items()))


# --- resolving -----------------------------------------------------------------------------------


def resolve_config(
    config: MigPartedConfig, name: str, gpus: list[GpuState], models: dict[str, GpuModel]
) -> list[DeviceTarget]:
    """The target of every GPU config ``name`` selects, by index; ``models`` maps GPU uuid -> model.

    A GPU without MIG support that an entry with ``mig-enabled: false`` selects is left out: it has
    no MIG mode to set. Asking such a GPU for MIG is an error.
    """
    if name not in config.configs:
        raise InputError(
            f"no config named {name!r}",
            field="mig-configs",
            fix=f"use one of: {', '.join(sorted(config.configs)) or '(the file has none)'}",
        )
    by_index = {g.index: g for g in gpus}
    owner: dict[int, int] = {}
    targets: list[DeviceTarget] = []
    for i, entry in enumerate(config.configs[name]):
        where = f"mig-configs.{name}[{i}]"
        for gpu in _selected(entry, by_index, where):
            if gpu.index in owner:
                raise InputError(
                    f"GPU {gpu.index} is also selected by entry [{owner[gpu.index]}]",
                    field=where,
                    fix="select each GPU in one entry only",
                )
            owner[gpu.index] = i
            target = _target(entry, gpu, models.get(gpu.uuid), where)
            if target is not None:
                targets.append(target)
    return sorted(targets, key=lambda t: t.index)


def _selected(entry: MigPartedEntry, by_index: dict[int, GpuState], where: str) -> list[GpuState]:
    if entry.devices is None:
        chosen = [by_index[k] for k in sorted(by_index)]
    else:
        for k, index in enumerate(entry.devices):
            if index not in by_index:
                raise InputError(
                    f"there is no GPU {index}",
                    field=f"{where}.devices[{k}]",
                    fix=f"existing GPU indices: {', '.join(map(str, sorted(by_index))) or 'none'}",
                )
        chosen = [by_index[index] for index in entry.devices]
    if entry.device_filter:
        chosen = [g for g in chosen if _pci_id(g.pci_device_id) in entry.device_filter]
    return chosen


def _target(
    entry: MigPartedEntry, gpu: GpuState, model: GpuModel | None, where: str
) -> DeviceTarget | None:
    unsupported = gpu.mig_current == MIG_UNSUPPORTED
    if not entry.mig_enabled:  # a GPU without MIG has no MIG to switch off: leave it alone
        return None if unsupported else DeviceTarget(gpu.index, gpu.uuid, False, ())
    if unsupported or model is None:
        why = "does not support MIG" if unsupported else "has no known MIG geometry"
        raise InputError(
            f"GPU {gpu.index} ({gpu.name}) {why}",
            field=f"{where}.mig-enabled",
            fix="narrow devices, or add a device-filter for the MIG-capable models",
        )
    counts: dict[str, int] = {}
    for profile, n in entry.counts.items():
        try:
            counts[model.profile(profile).name] = n
        except InputError as exc:
            raise exc.at(f"{where}.mig-devices.{profile}") from None
    layout = layout_for_counts(model, counts) if counts else ()
    if layout is None:
        raise InputError(
            f"{_format_counts(counts)} do not fit together on one {model.key} (GPU {gpu.index})",
            field=f"{where}.mig-devices",
            fix=_why_not(model, counts),
        )
    return DeviceTarget(gpu.index, gpu.uuid, True, layout)


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
    config: MigPartedConfig, name: str, gpus: list[GpuState], models: dict[str, GpuModel]
) -> dict[int, tuple[bool, dict[str, int]]]:
    """Per selected GPU index: (MIG enabled, instances per profile without zero counts)."""
    return {
        t.index: (t.mig_enabled, dict(Counter(p.profile for p in t.layout)))
        for t in resolve_config(config, name, gpus, models)
    }


def assert_config(
    config: MigPartedConfig, name: str, gpus: list[GpuState], models: dict[str, GpuModel]
) -> list[str]:
    """How the live GPUs differ from config ``name`` (MIG mode, instance counts); empty: they
    match."""
    by_index = {g.index: g for g in gpus}
    problems = []
    for index, (enabled, wanted) in device_states(config, name, gpus, models).items():
        gpu = by_index[index]
        label = f"GPU {index} ({gpu.uuid})"
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
    """The config as mig-parted YAML (``parse_migparted`` reads it back to an equal config)."""
    lines = [f"version: {config.version}", "mig-configs:"]
    if not config.configs:
        lines[-1] += " {}"
    for name, entries in config.configs.items():
        lines.append(f"  {_key(name)}:" + ("" if entries else " []"))
        for e in entries:
            devices = "all" if e.devices is None else "[" + ", ".join(map(str, e.devices)) + "]"
            lines.append(f"    - devices: {devices}")
            if e.device_filter:
                ids = [f'"{d}"' for d in e.device_filter]
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
