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
    resolve_config,
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
    )


def mixed_fleet() -> list[GpuState]:
    """4 H200 (indices 0-3) and one A30 (index 4)."""
    return [gpu(i) for i in range(4)] + [gpu(4, "A30-24GB", A30_PCI)]


def models_for(gpus: list[GpuState]) -> dict[str, GpuModel]:
    return {g.uuid: lookup_model(g.model) for g in gpus if g.model}


def resolve(text: str, name: str, gpus: list[GpuState] | None = None) -> list[DeviceTarget]:
    fleet = mixed_fleet() if gpus is None else gpus
    return resolve_config(parse_migparted(text), name, fleet, models_for(fleet))


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
        for target in resolve_config(config, name, node, models_for(node)):
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
    text += ' "device-filter": ["0x20B710DE", "0x233510de"], "mig-devices": {"3G.71GB": 0}}]}}'
    entry = parse_migparted(text).configs["a"][0]
    assert entry == MigPartedEntry((1, 3), (A30_PCI, H200_PCI), True, (("3g.71gb", 0),))
    assert entry.counts == {}


def test_unquoted_hex_device_filter_is_read_as_the_id() -> None:
    text = entry_yaml(OK + "      device-filter: [0x233510de, 0x20B710DE]\n")
    assert parse_migparted(text).configs["a"][0].device_filter == (A30_PCI, H200_PCI)


def entry_yaml(body: str, name: str = "a") -> str:
    return f"version: v1\nmig-configs:\n  {name}:\n{body}"


OK = "    - devices: all\n      mig-enabled: true\n"


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
        (entry_yaml(OK.replace("all", "[2, 2]")), "mig-configs.a[0].devices[1]", "twice"),
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
            entry_yaml(OK + "      device-filter: []\n"),
            "mig-configs.a[0].device-filter",
            "empty list",
        ),
        (
            entry_yaml(OK + "      device-filter: [0x233510DE, -1]\n"),
            "mig-configs.a[0].device-filter[1]",
            "-1 is not a PCI device id",
        ),
        (
            entry_yaml(OK + "      device-filter: {id: 0x233510DE}\n"),
            "mig-configs.a[0].device-filter",
            "PCI device id",
        ),
        (
            entry_yaml(
                "    - devices: all\n      mig-enabled: false\n      mig-devices: {1g.18gb: 1}\n"
            ),
            "mig-configs.a[0].mig-devices",
            "mig-enabled: false",
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
    listed = entry_yaml(OK.replace("all", "[1, 4]") + f"      device-filter: '{A30_PCI}'\n")
    assert [t.index for t in resolve(listed, "a")] == [4]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (OK.replace("all", "[0]"), {0: (True, {})}),
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
        (entry_yaml(OK.replace("all", "[1, 9]")), "a", "mig-configs.a[0].devices[1]", "no GPU 9"),
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
            entry_yaml(OK.replace("all", "[0, 1]") + OK.replace("all", "[1]")),
            "a",
            "mig-configs.a[1]",
            "GPU 1 is also selected by entry [0]",
        ),
        (
            entry_yaml(OK + f"      device-filter: {H200_PCI}\n" + OK),
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
        resolve(entry_yaml(OK.replace("all", "[7]")), "a")
    assert err.value.fix is not None and "0, 1, 2, 3, 4" in err.value.fix
    with pytest.raises(InputError) as err:
        resolve(entry_yaml(OK.replace("all", "[4]") + "      mig-devices: {1g.18gb: 1}\n"), "a")
    assert err.value.fix is not None and "1g.6gb" in err.value.fix
    with pytest.raises(InputError) as err:
        resolve(entry_yaml(OK.replace("all", "[0]") + "      mig-devices: {1g.18gb: 8}\n"), "a")
    assert err.value.fix is not None and "at most 7" in err.value.fix


def test_asking_mig_of_a_gpu_without_mig_is_an_error() -> None:
    fleet = [gpu(0), gpu(1, "L40S", "0x26B910DE", mig="unsupported")]
    with pytest.raises(InputError) as err:
        resolve(entry_yaml(OK), "a", fleet)
    assert err.value.field == "mig-configs.a[0].mig-enabled"
    assert "GPU 1" in err.value.message and "does not support MIG" in err.value.message
    models = {"GPU-1": lookup_model("H200-141GB")}  # no model known for GPU-0
    off = parse_migparted(entry_yaml("    - devices: all\n      mig-enabled: false\n"))
    assert device_states(off, "a", fleet, models) == {0: (False, {})}
    with pytest.raises(InputError) as err:
        resolve_config(parse_migparted(entry_yaml(OK)), "a", fleet, models)
    assert "GPU 0" in err.value.message and "no known MIG geometry" in err.value.message


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
            name: (MigPartedEntry(None, ("0x20B710DE", H200_PCI), True, (("1g.6gb", 0),)),),
            "plain": (MigPartedEntry(None, (H200_PCI,), False, ()),),
            "empty": (),
        },
    )
    assert parse_migparted(dump_migparted(config)) == config
    assert parse_migparted(dump_migparted(MigPartedConfig("v1", {}))) == MigPartedConfig("v1", {})


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
