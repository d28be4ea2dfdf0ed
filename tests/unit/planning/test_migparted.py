from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpufrac.errors import InputError
from gpufrac.model.catalog import GpuModel, lookup_model
from gpufrac.model.gpu import GpuState, MigInstanceState
from gpufrac.model.mig import check_layout
from gpufrac.planning.migparted import (
    DeviceTarget,
    MigPartedConfig,
    MigPartedEntry,
    assert_config,
    device_states,
    dump_migparted,
    export_config,
    parse_migparted,
    pci_filter_id,
    resolve_config,
    selected_config,
)

EXAMPLES = sorted((Path(__file__).parents[3] / "examples" / "mig-parted").glob("*.yaml"))
H200_PCI, A30_PCI = "0x233510DE", "0x20B710DE"

SAMPLE = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.18gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.18gb": 7
  custom-config:
    - devices: [0,1]
      mig-enabled: false
    - devices: [2]
      device-filter: "0x233510de"
      mig-enabled: true
      mig-devices:
        "1g.18gb": 2
        "2g.35gb": 1
        "3g.71gb": 1
"""


def inst(profile: str, start: int, gi: int = 1) -> MigInstanceState:
    return MigInstanceState(profile, start, gi, f"MIG-{profile}-{start}", False)


def gpu(
    index: int,
    model: str = "H200-141GB",
    pci: str = H200_PCI,
    mig: str = "enabled",
    instances: tuple[MigInstanceState, ...] = (),
    health: str = "ok",
    subsystem: str = "0x00000000",
) -> GpuState:
    return GpuState(
        uuid=f"GPU-{index}",
        index=index,
        name=f"NVIDIA {model}",
        model=model if mig != "unsupported" else None,
        pci_device_id=pci,
        memory_total_mib=143771,
        memory_used_mib=0,
        utilization_gpu=0,
        mig_current=mig,
        mig_pending=mig,
        instances=instances,
        health=health,
        pci_subsystem_id=subsystem,
    )


def mixed_fleet() -> list[GpuState]:
    """4 H200 (indices 0-3) and one A30 (index 4)."""
    return [gpu(i) for i in range(4)] + [gpu(4, "A30-24GB", A30_PCI)]


def models_for(gpus: list[GpuState]) -> dict[str, GpuModel]:
    return {g.uuid: lookup_model(g.model) for g in gpus if g.model}


def resolve(text: str, name: str | None, gpus: list[GpuState] | None = None) -> list[DeviceTarget]:
    fleet = mixed_fleet() if gpus is None else gpus
    return list(resolve_config(parse_migparted(text), name, fleet, models_for(fleet)).targets)


def notes(text: str, name: str | None, gpus: list[GpuState] | None = None) -> tuple[str, ...]:
    fleet = mixed_fleet() if gpus is None else gpus
    return resolve_config(parse_migparted(text), name, fleet, models_for(fleet)).notes


def counts(target: DeviceTarget) -> dict[str, int]:
    return dict(Counter(p.profile for p in target.layout))


# --- parsing
# ---------------------------------------------------------------------------------------


def test_there_are_examples_for_each_feature() -> None:
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses_resolves_and_round_trips(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("# Feature:")
    config = parse_migparted(text, source=str(path))
    assert config.version == "v1" and config.configs
    assert parse_migparted(dump_migparted(config)) == config
    node = [gpu(i) for i in range(8)]  # the examples are written for an 8x H200 node
    for name in config.configs:
        for target in resolve_config(config, name, node, models_for(node)).targets:
            assert not check_layout(lookup_model("H200-141GB"), target.layout)


def test_parse_sample() -> None:
    config = parse_migparted(SAMPLE)
    assert config == MigPartedConfig(
        "v1",
        {
            "all-disabled": (MigPartedEntry(None, (), False, ()),),
            "all-1g.18gb": (MigPartedEntry(None, (), True, (("1g.18gb", 7),)),),
            "custom-config": (
                MigPartedEntry((0, 1), (), False, ()),
                MigPartedEntry(
                    (2,), (H200_PCI,), True, (("1g.18gb", 2), ("2g.35gb", 1), ("3g.71gb", 1))
                ),
            ),
        },
    )


def test_json_is_accepted() -> None:
    text = '{"version": "v1", "mig-configs": {"a": [{"devices": [3, 1], "mig-enabled": true,'
    text += ' "device-filter": ["0x20B710DE", "0x233510de"], "mig-devices": {"3G.71GB": 0,'
    text += ' "1g.18gb": 1}}]}}'
    entry = parse_migparted(text).configs["a"][0]
    assert entry == MigPartedEntry(
        (1, 3), (A30_PCI, H200_PCI), True, (("1g.18gb", 1), ("3g.71gb", 0))
    )
    assert entry.counts == {"1g.18gb": 1}


def entry_yaml(body: str, name: str = "a") -> str:
    return f"version: v1\nmig-configs:\n  {name}:\n{body}"


OK = "    - devices: all\n      mig-enabled: true\n"
E = "      mig-devices: {}\n"


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("version: v1\nmig-configs: {a: [}\n", "config", "not valid YAML"),
        ("- 1\n- 2\n", "config", "must be a mapping"),
        ("mig-configs: {}\n", "version", "missing"),
        ("version: v2\nmig-configs: {}\n", "version", "unsupported version 'v2'"),
        ("version: 1\nmig-configs: {}\n", "version", "unsupported version 1"),
        ("version: v1\nmig-config: {}\n", "mig-config", "unknown key"),
        ("version: v1\nmig-configs: [a]\n", "mig-configs", "mapping"),
        ("version: v1\nmig-configs:\n  1: []\n", "mig-configs", "not a name"),
        (entry_yaml("    devices: all\n"), "mig-configs.a", "list of entries"),
        (entry_yaml("    - all\n"), "mig-configs.a[0]", "must be a mapping"),
        (entry_yaml(OK + "      mig-device: {}\n"), "mig-configs.a[0].mig-device", "unknown key"),
        (entry_yaml("    - devices: all\n"), "mig-configs.a[0].mig-enabled", "missing"),
        (entry_yaml("    - mig-enabled: false\n"), "mig-configs.a[0].devices", "missing"),
        (
            entry_yaml("    - devices: all\n      mig-enabled: sure\n"),
            "mig-configs.a[0].mig-enabled",
            "not true or false",
        ),
        (entry_yaml("    - mig-enabled: true\n"), "mig-configs.a[0].devices", "missing"),
        (entry_yaml(OK.replace("all", "some")), "mig-configs.a[0].devices", "invalid"),
        (entry_yaml(OK.replace("all", "0")), "mig-configs.a[0].devices", "invalid"),
        (entry_yaml(OK.replace("all", "[0, -1]")), "mig-configs.a[0].devices[1]", "GPU index"),
        (entry_yaml(OK.replace("all", "[true]")), "mig-configs.a[0].devices[0]", "GPU index"),
        (
            entry_yaml(OK + "      device-filter: H200\n"),
            "mig-configs.a[0].device-filter",
            "not a PCI device id",
        ),
        (
            entry_yaml(OK + "      device-filter: ['0x233510DE', '0x2335']\n"),
            "mig-configs.a[0].device-filter[1]",
            "not a PCI device id",
        ),
        (
            entry_yaml(OK + "      device-filter: ['0x233510DE', -1]\n"),
            "mig-configs.a[0].device-filter[1]",
            "-1 is not a string",
        ),
        (
            entry_yaml(OK + "      device-filter: {id: '0x233510DE'}\n"),
            "mig-configs.a[0].device-filter",
            "is not a string",
        ),
        (
            entry_yaml(
                "    - devices: all\n      mig-enabled: false\n      mig-devices: {1g.18gb: 1}\n"
            ),
            "mig-configs.a[0].mig-devices",
            "mig-enabled: false",
        ),
        (
            entry_yaml(OK + "      mig-devices: {1g.18gb: 1}\n      device-filter: 0x233510DE\n"),
            "mig-configs.a[0].device-filter",
            "unquoted 0x... as a number",
        ),
        (
            entry_yaml(OK + "      mig-devices: [1g.18gb]\n"),
            "mig-configs.a[0].mig-devices",
            "mapping",
        ),
        (
            entry_yaml(OK + "      mig-devices: {1g.18gb: -1}\n"),
            "mig-configs.a[0].mig-devices.1g.18gb",
            "count -1",
        ),
        (
            entry_yaml(OK + "      mig-devices: {1g.18gb: '2'}\n"),
            "mig-configs.a[0].mig-devices.1g.18gb",
            "count '2'",
        ),
        (
            entry_yaml(OK + "      mig-devices: {1c.3g.71gb: 1}\n"),
            "mig-configs.a[0].mig-devices.1c.3g.71gb",
            "compute-instance profile",
        ),
        (
            entry_yaml(OK + "      mig-devices: {big: 1}\n"),
            "mig-configs.a[0].mig-devices.big",
            "not a MIG profile name",
        ),
        (
            entry_yaml(OK + "      mig-devices: {1g.18gb: 1, 1G.18GB: 2}\n"),
            "mig-configs.a[0].mig-devices.1G.18GB",
            "twice",
        ),
        (
            SAMPLE.replace('"1g.18gb": 2', '"1g.18gb": two'),
            "mig-configs.custom-config[1].mig-devices.1g.18gb",
            "count 'two'",
        ),
        ("version: v1\nversion: v1\nmig-configs: {}\n", "config", "duplicate key 'version'"),
        (SAMPLE + "  all-disabled: []\n", "config", "duplicate key 'all-disabled'"),
    ],
)
def test_parse_errors_name_the_field(text: str, field: str, words: str) -> None:
    with pytest.raises(InputError) as err:
        parse_migparted(text)
    assert err.value.field == field
    assert words in err.value.message


def test_compute_instance_error_says_what_to_use_and_source_names_the_file() -> None:
    with pytest.raises(InputError) as err:
        parse_migparted(entry_yaml(OK + "      mig-devices: {1c.3g.71gb: 1}\n"))
    assert err.value.fix is not None and "use 3g.71gb" in err.value.fix
    with pytest.raises(InputError) as err:
        parse_migparted("a: [", source="/etc/mig.yaml")
    assert err.value.field == "/etc/mig.yaml"


# --- resolving
# -------------------------------------------------------------------------------------


def test_resolve_custom_config_on_a_fleet() -> None:
    targets = resolve(SAMPLE, "custom-config")
    assert [(t.index, t.uuid, t.mig_enabled) for t in targets] == [
        (0, "GPU-0", False),
        (1, "GPU-1", False),
        (2, "GPU-2", True),
    ]  # GPUs 3 and 4 are selected by no entry: untouched
    assert targets[0].layout == ()
    assert counts(targets[2]) == {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    assert not check_layout(lookup_model("H200-141GB"), targets[2].layout)


def test_device_filter_selects_matching_gpus_only() -> None:
    text = (Path(EXAMPLES[0]).parent / "device-filter-list.yaml").read_text()
    targets = {t.index: counts(t) for t in resolve(text, "mixed-inference")}
    h200 = {"1g.18gb": 4, "3g.71gb": 1}
    assert targets == {0: h200, 1: h200, 2: h200, 3: h200, 4: {"1g.6gb": 4}}
    single = (Path(EXAMPLES[0]).parent / "device-filter.yaml").read_text()
    assert [t.index for t in resolve(single, "h200-1g.18gb")] == [0, 1, 2, 3]
    a30_only = entry_yaml(
        OK + "      device-filter: '0x20b710de'\n      mig-devices: {2g.12gb: 2}\n"
    )
    assert [(t.index, counts(t)) for t in resolve(a30_only, "a")] == [(4, {"2g.12gb": 2})]
    listed = entry_yaml(
        OK.replace("all", "[1, 4]") + f"      device-filter: '{A30_PCI}'\n      mig-devices: {{}}\n"
    )
    assert [t.index for t in resolve(listed, "a")] == [4]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (OK.replace("all", "[0]") + "      mig-devices: {}\n", {0: (True, {})}),
        (
            OK.replace("all", "[1]") + "      mig-devices: {1g.18gb: 0, 7g.141gb: 1}\n",
            {1: (True, {"7g.141gb": 1})},
        ),
        ("    - devices: [3, 4]\n      mig-enabled: false\n", {3: (False, {}), 4: (False, {})}),
    ],
)
def test_device_states(body: str, expected: dict[int, tuple[bool, dict[str, int]]]) -> None:
    fleet = mixed_fleet()
    config = parse_migparted(entry_yaml(body))
    assert device_states(config, "a", fleet, models_for(fleet)) == expected


def test_gpu_without_mig_is_left_out_when_disabling() -> None:
    fleet = [gpu(0), gpu(1, "L40S", "0x26B910DE", mig="unsupported")]
    text = entry_yaml("    - devices: all\n      mig-enabled: false\n")
    assert [t.index for t in resolve(text, "a", fleet)] == [0]


@pytest.mark.parametrize(
    ("text", "name", "field", "words"),
    [
        (SAMPLE, "custom", "mig-configs", "no config named 'custom'"),
        (
            entry_yaml(OK.replace("all", "[0]") + "      mig-devices: {1g.18gb: 8}\n"),
            "a",
            "mig-configs.a[0].mig-devices",
            "do not fit together on one H200-141GB",
        ),
        (
            entry_yaml(OK.replace("all", "[0]") + "      mig-devices: {3g.71gb: 2, 1g.18gb: 1}\n"),
            "a",
            "mig-configs.a[0].mig-devices",
            "do not fit",
        ),
        (SAMPLE, "all-1g.18gb", "mig-configs.all-1g.18gb[0].mig-devices.1g.18gb", "A30-24GB"),
        (
            entry_yaml(OK.replace("all", "[4]") + "      mig-devices: {1g.18gb: 1}\n"),
            "a",
            "mig-configs.a[0].mig-devices.1g.18gb",
            "does not exist on A30-24GB",
        ),
        (
            entry_yaml(OK.replace("all", "[0, 1]") + E + OK.replace("all", "[1]") + E),
            "a",
            "mig-configs.a[1]",
            "GPU 1 is also selected by entry [0]",
        ),
        (
            entry_yaml(OK + f"      device-filter: '{H200_PCI}'\n" + E + OK + E),
            "a",
            "mig-configs.a[1]",
            "GPU 0 is also selected",
        ),
    ],
)
def test_resolve_errors_name_the_field(text: str, name: str, field: str, words: str) -> None:
    with pytest.raises(InputError) as err:
        resolve(text, name)
    assert err.value.field == field
    assert words in err.value.message


def test_resolve_error_fixes_list_the_choices() -> None:
    with pytest.raises(InputError) as err:
        resolve(SAMPLE, "nope")
    assert err.value.fix == "use one of: all-1g.18gb, all-disabled, custom-config"
    with pytest.raises(InputError) as err:
        resolve(entry_yaml(OK.replace("all", "[4]") + "      mig-devices: {1g.18gb: 1}\n"), "a")
    assert err.value.fix is not None and "1g.6gb" in err.value.fix
    with pytest.raises(InputError) as err:
        resolve(entry_yaml(OK.replace("all", "[0]") + "      mig-devices: {1g.18gb: 8}\n"), "a")
    assert err.value.fix is not None and "at most 7" in err.value.fix


def test_gpu_without_mig_asked_by_index_is_an_error_and_by_all_is_skipped() -> None:
    """mig-parted's apply: a non-MIG-capable GPU is skipped under ``devices: all`` and an error
    when its index asks for MIG."""
    fleet = [gpu(0), gpu(1, "L40S", "0x26B910DE", mig="unsupported")]
    with pytest.raises(InputError) as err:
        resolve(entry_yaml(OK.replace("all", "[0, 1]") + E), "a", fleet)
    assert err.value.field == "mig-configs.a[0].mig-enabled"
    assert "GPU 1" in err.value.message and "does not support MIG" in err.value.message
    assert [t.index for t in resolve(entry_yaml(OK + E), "a", fleet)] == [0]
    (note,) = notes(entry_yaml(OK + E), "a", fleet)
    assert note.startswith("mig-configs.a[0]: GPU 1 (NVIDIA L40S, 0x26B910DE) does not support MIG")


def test_gpu_of_unknown_geometry_is_skipped_with_a_note() -> None:
    fleet = [gpu(0), gpu(1)]
    models = {"GPU-1": lookup_model("H200-141GB")}  # no model known for GPU-0
    off = parse_migparted(entry_yaml("    - devices: all\n      mig-enabled: false\n"))
    assert device_states(off, "a", fleet, models) == {0: (False, {}), 1: (False, {})}
    cut = parse_migparted(entry_yaml(OK + "      mig-devices: {1g.18gb: 7}\n"))
    resolution = resolve_config(cut, "a", fleet, models)
    assert [(t.index, len(t.layout)) for t in resolution.targets] == [(1, 7)]
    assert resolution.notes == (
        "mig-configs.a[0]: GPU 0 (NVIDIA H200-141GB, 0x233510DE) has no MIG geometry in "
        "gpufrac's catalog; skipped (its MIG devices cannot be planned)",
    )
    on = parse_migparted(entry_yaml(OK + E))  # MIG on without instances needs no geometry
    assert [t.index for t in resolve_config(on, "a", fleet, models).targets] == [0, 1]
    lost = [gpu(0), gpu(1, health="lost")]
    with pytest.raises(InputError, match=r"GPU 1 .* has health lost") as err:
        resolve_config(cut, "a", lost, {"GPU-0": lookup_model("H200-141GB")})
    assert err.value.field == "mig-configs.a[0].mig-enabled"


# --- export, dump, assert
# --------------------------------------------------------------------------

SEVEN = tuple(inst("1g.18gb", s, s + 1) for s in range(7))
MIXED = (inst("3g.71gb", 4), inst("2g.35gb", 2), inst("1g.18gb", 0), inst("1g.18gb", 1))


def live_fleet() -> list[GpuState]:
    return [
        gpu(3, instances=SEVEN),
        gpu(0, instances=SEVEN),
        gpu(1, instances=MIXED),
        gpu(2, mig="disabled"),
        gpu(4, "A30-24GB", A30_PCI, mig="disabled"),
        gpu(5, instances=SEVEN, health="lost"),
        gpu(6, "L40S", "0x26B910DE", mig="unsupported"),
        gpu(7, mig="enabled"),
    ]


def test_export_groups_identical_gpus() -> None:
    config = export_config(live_fleet(), "snapshot")
    assert config == MigPartedConfig(
        "v1",
        {
            "snapshot": (
                MigPartedEntry((0, 3), (), True, (("1g.18gb", 7),)),
                MigPartedEntry((1,), (), True, (("1g.18gb", 2), ("2g.35gb", 1), ("3g.71gb", 1))),
                MigPartedEntry((2, 4), (), False, ()),
                MigPartedEntry((7,), (), True, ()),
            )
        },
    )
    assert export_config([]).configs == {"current": ()}


def test_export_then_assert_matches_and_dump_round_trips() -> None:
    fleet = live_fleet()
    config = export_config(fleet)
    text = dump_migparted(config)
    assert text.startswith("version: v1\nmig-configs:\n  current:\n    - devices: [0, 3]\n")
    assert '        "1g.18gb": 7\n' in text
    assert parse_migparted(text) == config
    healthy = [g for g in fleet if g.health == "ok"]
    assert assert_config(config, "current", healthy, models_for(healthy)) == []


@pytest.mark.parametrize("name", ["yes", "1.0", "null", "has space", "a: b", 'q"uote', "ünï", "-x"])
def test_dump_quotes_names_that_need_it(name: str) -> None:
    config = MigPartedConfig(
        "v1",
        {
            name: (
                MigPartedEntry(
                    None, ("0x20B710DE", H200_PCI), True, (("1g.6gb", 0), ("2g.12gb", 1))
                ),
            ),
            "plain": (MigPartedEntry(None, (H200_PCI,), False, ()),),
        },
    )
    assert parse_migparted(dump_migparted(config)) == config
    assert parse_migparted(dump_migparted(MigPartedConfig("v1", {}))) == MigPartedConfig("v1", {})


def test_a_config_without_entries_is_not_written() -> None:
    """mig-parted refuses a config of no entries, so dump does not write one."""
    with pytest.raises(InputError, match="has no entry"):
        dump_migparted(export_config([]))


def test_assert_reports_mode_and_count_mismatches() -> None:
    fleet = [
        gpu(0, instances=SEVEN),
        gpu(1, instances=MIXED),
        gpu(2, mig="disabled"),
        gpu(3, instances=SEVEN, health="lost"),
        gpu(4, "A30-24GB", A30_PCI, mig="disabled"),
    ]
    config = parse_migparted(SAMPLE)
    problems = assert_config(config, "all-1g.18gb", fleet[:4], models_for(fleet))
    assert problems == [
        "GPU 1 (GPU-1): MIG devices are 2x 1g.18gb, 1x 2g.35gb, 1x 3g.71gb, "
        "config all-1g.18gb wants 7x 1g.18gb",
        "GPU 2 (GPU-2): MIG mode is disabled, config all-1g.18gb wants enabled",
        "GPU 3 (GPU-3): health is lost, its state cannot be checked",
    ]
    problems = assert_config(config, "custom-config", fleet, models_for(fleet))
    assert problems == [
        "GPU 0 (GPU-0): MIG mode is enabled, config custom-config wants disabled",
        "GPU 1 (GPU-1): MIG mode is enabled, config custom-config wants disabled",
        "GPU 2 (GPU-2): MIG mode is disabled, config custom-config wants enabled",
    ]


def test_assert_compares_counts_not_placements() -> None:
    moved = (inst("3g.71gb", 0), inst("2g.35gb", 4), inst("1g.18gb", 6), inst("1g.18gb", 7))
    fleet = [gpu(0, mig="disabled"), gpu(1, mig="disabled"), gpu(2, instances=moved)]
    config = parse_migparted(SAMPLE)
    assert assert_config(config, "custom-config", fleet, models_for(fleet)) == []
    fewer = [*fleet[:2], gpu(2, instances=moved[:3])]
    assert assert_config(config, "custom-config", fewer, models_for(fewer)) == [
        "GPU 2 (GPU-2): MIG devices are 1x 1g.18gb, 1x 2g.35gb, 1x 3g.71gb, "
        "config custom-config wants 2x 1g.18gb, 1x 2g.35gb, 1x 3g.71gb"
    ]


# --- read as mig-parted reads them: each test names the mig-parted function it mirrors -----------

# A file in every form NVIDIA's published configs use: each profile attribute (+me, +gfx, +me.all,
# -me), a device-filter as one string, as a list (with and without spaces inside the brackets) and
# with a subsystem, MIG on with no instances, and a config written for more GPUs than a node has.
PUBLISHED_FORMS = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false

  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}

  all-1g.24gb.gfx:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.24gb+gfx": 4

  all-1g.24gb.me.all:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.24gb+me.all": 1

  all-1g.24gb-me:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.24gb-me": 4

  all-1g.18gb.me:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.18gb+me": 1

  all-balanced:
    - device-filter: ["0x2BB510DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.24gb+gfx": 2
        "2g.48gb-me": 1
    - device-filter: [ "0x233510DE", "0x233B10DE" ]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.18gb": 2
        "2g.35gb": 1
        "3g.71gb": 1
    - device-filter: "0x20B710DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.6gb": 2
        "2g.12gb": 1

  by-board:
    - device-filter: "0x233510DE:0x17F010DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "7g.141gb": 1
    - device-filter: ["0x233510DE:0x00000000"]
      devices: all
      mig-enabled: true
      mig-devices:
        "3g.71gb": 2

  eight-gpus:
    - devices: [0, 1, 2, 3, 4, 5, 6, 7]
      mig-enabled: true
      mig-devices:
        "1g.18gb": 7
"""


def h200_node(n: int) -> list[GpuState]:
    return [gpu(i) for i in range(n)]


def both(wanted: dict[str, int]) -> list[tuple[int, dict[str, int]]]:
    """GPUs 0 and 1, each with these instances."""
    return [(0, wanted), (1, wanted)]


def test_published_forms_parse_every_attribute() -> None:
    """go-nvlib's parseMigProfile: any attribute, one sign, is a valid profile name."""
    config = parse_migparted(PUBLISHED_FORMS)
    names = {p for entries in config.configs.values() for e in entries for p, _ in e.mig_devices}
    assert {"1g.24gb+gfx", "1g.24gb+me.all", "1g.24gb-me", "1g.18gb+me", "2g.48gb-me"} <= names
    assert parse_migparted(dump_migparted(config)) == config


def test_every_published_form_applies_to_what_it_matches_or_says_why_not() -> None:
    """mig-parted's WalkSelectedMigConfigForEachGPU on a 2x H200 node, config by config."""
    node, config = h200_node(2), parse_migparted(PUBLISHED_FORMS)
    applied = {}
    for name in config.configs:
        try:
            resolution = resolve_config(config, name, node, models_for(node))
        except InputError as err:
            applied[name] = err.message
            continue
        applied[name] = [
            (t.index, dict(Counter(p.profile for p in t.layout))) for t in resolution.targets
        ]
    assert applied["all-disabled"] == both({})
    assert applied["all-enabled"] == both({})
    assert applied["all-1g.18gb.me"] == both({"1g.18gb+me": 1})
    assert applied["all-balanced"] == both({"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1})
    assert applied["by-board"] == both({"3g.71gb": 2})  # the subsystem 0x00000000 entry
    assert applied["eight-gpus"] == both({"1g.18gb": 7})
    for name in ("all-1g.24gb.gfx", "all-1g.24gb.me.all", "all-1g.24gb-me"):
        assert "does not exist on H200-141GB" in applied[name]  # as mig-parted's SetMigConfig
    notes_of = resolve_config(config, "all-balanced", node, models_for(node)).notes
    assert [n.split(":")[0] for n in notes_of] == [
        "mig-configs.all-balanced[0]",
        "mig-configs.all-balanced[2]",
    ]
    assert "0x2BB510DE matches none of the selected GPUs (0x233510DE); skipped" in notes_of[0]


def test_indexes_beyond_the_node_are_skipped_with_a_note() -> None:
    """mig-parted's MatchesDevices is asked only for the indexes the node has: others are never
    matched, so an 8-GPU config on a 2-GPU node cuts the two GPUs it has."""
    node, config = h200_node(2), parse_migparted(PUBLISHED_FORMS)
    resolution = resolve_config(config, "eight-gpus", node, models_for(node))
    assert [t.index for t in resolution.targets] == [0, 1]
    assert resolution.notes == (
        "mig-configs.eight-gpus[0].devices: GPU 2, 3, 4, 5, 6, 7 not on this node (it has GPU 0, "
        "1); skipped",
    )
    assert notes(entry_yaml(OK.replace("all", "[1, 9]") + E), "a") == (
        "mig-configs.a[0].devices: GPU 9 not on this node (it has GPU 0, 1, 2, 3, 4); skipped",
    )
    assert parse_migparted(entry_yaml(OK.replace("all", "[2, 2]") + E)).configs["a"][0].devices == (
        2,
    )


@pytest.mark.parametrize(
    ("wanted", "device", "subsystem", "matches"),
    [
        ("0x233510DE", "0x233510DE", "0x17F010DE", True),  # no subsystem: any board
        ("0x233510de", "0x233510DE", "unknown", True),
        ("0x233510DE:0x17F010DE", "0x233510DE", "0x17F010DE", True),
        ("0x233510DE:0x17f010de", "0x233510DE", "0x17F010DE", True),
        ("0x233510DE:0x17F010DE", "0x233510DE", "0x180010DE", False),  # another board
        ("0x233510DE:0x17F010DE", "0x233510DE", "unknown", False),
        ("0x233510DE:0x17F010DE", "0x20B710DE", "0x17F010DE", False),
    ],
)
def test_device_filter_forms_match_as_device_id_matches(
    wanted: str, device: str, subsystem: str, matches: bool
) -> None:
    """mig-parted's MatchesDeviceFilter and DeviceID.Matches: without a subsystem, device and
    vendor must match; with one, all four ids."""
    fleet = [gpu(0, pci=device, subsystem=subsystem)]
    text = entry_yaml(OK + f"      device-filter: '{wanted}'\n" + E)
    assert bool(resolve(text, "a", fleet)) is matches


@pytest.mark.parametrize("empty", ["''", "[]"])
def test_an_empty_device_filter_filters_nothing(empty: str) -> None:
    """mig-parted's MatchesDeviceFilter: an empty string or list matches every GPU."""
    text = entry_yaml(OK + f"      device-filter: {empty}\n" + E)
    assert [t.index for t in resolve(text, "a")] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "text", ["H200", "0x2335", "0x233510DE:", "0x233510DE:0x17F0", "0x1:0x2:0x3", "233510DE"]
)
def test_a_malformed_device_filter_is_refused(text: str) -> None:
    """mig-parted's NewDeviceIDFromString would leave such a filter matching nothing, silently;
    gpufrac refuses it, naming the form."""
    with pytest.raises(InputError) as err:
        pci_filter_id(text, field="device-filter")
    assert err.value.field == "device-filter" and "0xDDDDVVVV:0xSSSSVVVV" in (err.value.fix or "")


def test_the_only_config_is_the_default() -> None:
    """mig-parted's GetSelectedMigConfig: -c may be left out when the file has one config."""
    one = parse_migparted(entry_yaml(OK + "      mig-devices: {3g.71gb: 2}\n", name="only"))
    assert selected_config(one, None) == "only"
    assert [
        t.index for t in resolve_config(one, None, h200_node(1), models_for(h200_node(1))).targets
    ] == [0]
    two = parse_migparted(SAMPLE)
    with pytest.raises(InputError) as err:
        selected_config(two, None)
    assert err.value.field == "--selected-config"
    assert err.value.fix == "pass -c NAME, one of: all-1g.18gb, all-disabled, custom-config"
    with pytest.raises(InputError, match="no config named 'x'"):
        selected_config(one, "x")
    with pytest.raises(InputError, match="holds no config"):
        selected_config(parse_migparted("version: v1\n"), None)


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [  # mig-parted's Spec.UnmarshalJSON
        ("mig-configs: {a: [{devices: all, mig-enabled: false}]}\n", "version", "missing"),
        ("version: v2\n", "version", "unsupported version 'v2'"),
        ("version: v1\nbogus: field\n", "bogus", "unknown key"),
        ("version: v1\nmig-configs: {}\n", "mig-configs", "holds no config"),
        ("version: v1\nmig-configs: {a: []}\n", "mig-configs.a", "has no entry"),
        # mig-parted's MigConfigSpec.UnmarshalJSON
        (entry_yaml("    - mig-enabled: false\n"), "mig-configs.a[0].devices", "missing"),
        (entry_yaml("    - devices: all\n"), "mig-configs.a[0].mig-enabled", "missing"),
        (
            entry_yaml("    - devices: bogus\n      mig-enabled: false\n"),
            "mig-configs.a[0].devices",
            "'bogus' is invalid",
        ),
        (
            entry_yaml("    - devices: {}\n      mig-enabled: false\n"),
            "mig-configs.a[0].devices",
            "is invalid",
        ),
        (entry_yaml(OK), "mig-configs.a[0].mig-devices", "mig-parted requires mig-devices"),
        (
            entry_yaml(OK + "      mig-devices: null\n"),
            "mig-configs.a[0].mig-devices",
            "mig-parted requires mig-devices",
        ),
        (
            entry_yaml(
                "    - devices: all\n      mig-enabled: false\n      mig-devices: {1g.18gb: 1}\n"
            ),
            "mig-configs.a[0].mig-devices",
            "mig-enabled: false",
        ),
        (
            entry_yaml("    - devices: all\n      mig-enabled: false\n      bogus: field\n"),
            "mig-configs.a[0].bogus",
            "unknown key",
        ),
        (
            entry_yaml(OK + E + "      device-filter: [0x233510DE]\n"),
            "mig-configs.a[0].device-filter[0]",
            "not a string",
        ),
        # mig-parted's MigConfig.AssertValidFormat
        (
            entry_yaml(OK + "      mig-devices: {bogus: 2}\n"),
            "mig-configs.a[0].mig-devices.bogus",
            "not a MIG profile name",
        ),
        (
            entry_yaml(OK + "      mig-devices: {1g.18gb: -1}\n"),
            "mig-configs.a[0].mig-devices.1g.18gb",
            "count -1",
        ),
        (
            entry_yaml(OK + "      mig-devices: {1g.18gb: 0, 3g.71gb: 0}\n"),
            "mig-configs.a[0].mig-devices",
            "every count is 0",
        ),
        (
            entry_yaml(OK + "      mig-devices: {1g.24gb+me-gfx: 1}\n"),
            "mig-configs.a[0].mig-devices.1g.24gb+me-gfx",
            "more than one attribute sign",
        ),
    ],
)
def test_refused_as_mig_parted_spec_validation_refuses(text: str, field: str, words: str) -> None:
    with pytest.raises(InputError) as err:
        parse_migparted(text)
    assert err.value.field == field
    assert words in err.value.message


def test_accepted_as_mig_parted_spec_validation_accepts() -> None:
    """mig-parted's Spec.UnmarshalJSON and MigConfigSpec.UnmarshalJSON: a file of only the version,
    mig-devices {} with MIG on or off, and a zero count beside a non-zero one."""
    assert parse_migparted("version: v1\n").configs == {}
    off = parse_migparted(entry_yaml("    - devices: all\n      mig-enabled: false\n" + E))
    assert off.configs["a"] == (MigPartedEntry(None, (), False, ()),)
    mixed = parse_migparted(entry_yaml(OK + "      mig-devices: {1g.18gb: 0, 3g.71gb: 2}\n"))
    assert mixed.configs["a"][0].counts == {"3g.71gb": 2}


def test_an_attribute_gpufrac_cannot_create_is_refused_with_the_reason() -> None:
    """Where the profile's size exists on the model but gpufrac has no variant with the attribute,
    the error says gpufrac cannot create it (mig-parted's resolveMigProfileOnDevice would look it
    up in the driver's table)."""
    for attr in ("+gfx", "-me", "+me.all"):
        text = entry_yaml(OK + f"      mig-devices: {{'1g.18gb{attr}': 1}}\n")
        with pytest.raises(InputError) as err:
            resolve(text, "a", h200_node(1))
        assert err.value.field == f"mig-configs.a[0].mig-devices.1g.18gb{attr}"
        assert err.value.message.startswith(f"1g.18gb{attr} cannot be created on H200-141GB")
        assert err.value.fix is not None and err.value.fix.startswith("use 1g.18gb or one of")
    media = entry_yaml(OK + "      mig-devices: {1g.18gb+me: 1, 1g.18gb: 6}\n")
    assert counts(resolve(media, "a", h200_node(1))[0]) == {"1g.18gb+me": 1, "1g.18gb": 6}


def test_a_gpu_of_the_partial_catalog_has_its_names_checked_and_is_skipped() -> None:
    """An RTX PRO 6000 (partial catalog: names from NVIDIA's MIG user guide, no placements) beside
    an H200: the attributes it has are recognised, its instances cannot be created here, so its
    entry is skipped with the reason; a profile it does not have is an error."""
    rtx = GpuState(
        uuid="GPU-9",
        index=1,
        name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        model=None,
        pci_device_id="0x2BB510DE",
        memory_total_mib=97887,
        memory_used_mib=0,
        utilization_gpu=0,
        mig_current="enabled",
        mig_pending="enabled",
    )
    node = [gpu(0), rtx]
    resolution = resolve_config(
        parse_migparted(PUBLISHED_FORMS), "all-balanced", node, models_for(node)
    )
    assert [t.index for t in resolution.targets] == [0]
    rtx_note = next(n for n in resolution.notes if n.startswith("mig-configs.all-balanced[0]"))
    assert "partial" in rtx_note and "create its 2x 1g.24gb+gfx, 1x 2g.48gb-me; skipped" in rtx_note
    with pytest.raises(InputError) as err:
        resolve(entry_yaml(OK + "      mig-devices: {1g.18gb: 1}\n"), "a", [rtx])
    assert err.value.message == "profile '1g.18gb' does not exist on RTX-PRO-6000-96GB"
    assert err.value.fix is not None and "1g.24gb+me.all" in err.value.fix


# The GB200 HGX and GB300 entries of NVIDIA's mig-parted config-default.yaml ``all-balanced``
# (deployments/systemd), as written there.
GB200_BALANCED = """
version: v1
mig-configs:
  all-balanced:
    - device-filter: ["0x294110DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.23gb": 2
        "2g.47gb": 1
        "3g.93gb": 1
    - device-filter: ["0x31C210DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.35gb": 2
        "2g.70gb": 1
        "3g.139gb": 1
"""


def blackwell_gpu(index: int, name: str, pci: str) -> GpuState:
    return GpuState(
        uuid=f"GPU-{index}",
        index=index,
        name=name,
        model=None,
        pci_device_id=pci,
        memory_total_mib=190464,
        memory_used_mib=0,
        utilization_gpu=0,
        mig_current="enabled",
        mig_pending="enabled",
    )


def test_a_partial_gpu_without_a_profile_table_is_skipped_with_what_is_missing() -> None:
    """A GB200 (partial catalog: the guide lists it, its profile table is not in gpufrac's data)
    and a GB300 (partial, with no numbers at all) beside an H200: both entries are skipped, each
    note saying the table is missing and that its profiles can be neither checked nor created;
    a GPU in neither catalog gets the no-geometry note."""
    gb200 = blackwell_gpu(1, "NVIDIA GB200", "0x294110DE")
    gb300 = blackwell_gpu(2, "NVIDIA GB300", "0x31C210DE")
    node = [gpu(0), gb200, gb300]
    resolution = resolve_config(
        parse_migparted(GB200_BALANCED), "all-balanced", node, models_for(node)
    )
    assert resolution.targets == ()
    gb200_note, gb300_note = resolution.notes
    assert gb200_note.startswith("mig-configs.all-balanced[0]") and "NVIDIA GB200" in gb200_note
    assert "partial (no profile table" in gb200_note
    assert "neither check nor create its 2x 1g.23gb, 1x 2g.47gb, 1x 3g.93gb; skipped" in gb200_note
    assert gb300_note.startswith("mig-configs.all-balanced[1]") and "NVIDIA GB300" in gb300_note
    assert "neither check nor create its 2x 1g.35gb, 1x 2g.70gb, 1x 3g.139gb" in gb300_note
    unknown = blackwell_gpu(3, "NVIDIA Future", "0x99AA10DE")
    none = resolve_config(
        parse_migparted(entry_yaml(OK + "      mig-devices: {1g.18gb: 1}\n")), "a", [unknown], {}
    )
    assert none.targets == ()
    assert "has no MIG geometry in gpufrac's catalog; skipped" in none.notes[0]
    # with no table there is nothing to check a name against: any name is skipped, not refused
    odd = resolve_config(
        parse_migparted(entry_yaml(OK + "      mig-devices: {1g.18gb: 1}\n")), "a", [gb200], {}
    )
    assert odd.targets == () and "neither check nor create its 1x 1g.18gb" in odd.notes[0]
