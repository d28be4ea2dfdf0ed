from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufrac.errors import InputError
from gpufrac.model.settings import OperatorSettings, TenantQuota, load_settings, parse_settings

EXAMPLES = Path(__file__).parents[3] / "examples"


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def error_of(text: str) -> InputError:
    with pytest.raises(InputError) as exc:
        parse_settings(text)
    assert exc.value.message
    assert exc.value.fix, f"no fix for {exc.value}"
    return exc.value


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n", "{}"])
def test_empty_settings_are_the_defaults(text: str) -> None:
    assert parse_settings(text) == OperatorSettings()


@pytest.mark.parametrize(
    ("attribute", "expected"),
    [("tenants", {}), ("mps_share_tenants", False), ("placement_policy", "binpack")],
)
def test_defaults(attribute: str, expected: Any) -> None:
    assert getattr(parse_settings("tenants: {}\n"), attribute) == expected
    assert getattr(OperatorSettings(), attribute) == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"mps_share_tenants": True}, OperatorSettings(mps_share_tenants=True)),
        ({"placement_policy": "spread"}, OperatorSettings(placement_policy="spread")),
        ({"placement_policy": "binpack"}, OperatorSettings()),
        ({"max_priority": 100}, OperatorSettings(max_priority=100)),
        (
            {"tenants": {"a": {"max_priority": 10, "preemption": "own-tenant"}}},
            OperatorSettings(tenants={"a": TenantQuota(max_priority=10, preemption="own-tenant")}),
        ),
        ({"api_max_body": "4MiB"}, OperatorSettings(api_max_body_mib=4)),
        ({"workload_users": "tenant"}, OperatorSettings(workload_users="tenant")),
        ({"tenant_uids": [300000, 300100]}, OperatorSettings(tenant_uids=(300000, 300100))),
        (
            {"tenants": {"a": {"users": ["alice"]}}},
            OperatorSettings(tenants={"a": TenantQuota(users=("alice",))}),
        ),
        ({"tenants": {"a": {}}}, OperatorSettings(tenants={"a": TenantQuota(None, None)})),
        ({"tenants": {"a": {"gpus": 4}}}, OperatorSettings(tenants={"a": TenantQuota(None, 4000)})),
        (
            {"tenants": {"a": {"gpus": 2.5}}},
            OperatorSettings(tenants={"a": TenantQuota(None, 2500)}),
        ),
        (
            {"tenants": {"a": {"gpus": 0.0015}}},
            OperatorSettings(tenants={"a": TenantQuota(None, 2)}),
        ),
        (
            {"tenants": {"a": {"gpu_memory": "200GiB"}}},
            OperatorSettings(tenants={"a": TenantQuota(204800, None)}),
        ),
        (
            {"tenants": {"a": {"gpu_memory": "1TiB"}}},
            OperatorSettings(tenants={"a": TenantQuota(1048576, None)}),
        ),
        (
            {"tenants": {"a": {"gpu_memory": 512}}},
            OperatorSettings(tenants={"a": TenantQuota(512, None)}),
        ),
        (
            {"tenants": {"s": {"gpu_memory": "1GiB", "gpus": 1}, "r-2": {"gpus": 0.5}}},
            OperatorSettings(tenants={"s": TenantQuota(1024, 1000), "r-2": TenantQuota(None, 500)}),
        ),
    ],
)
def test_values(data: dict[str, Any], expected: OperatorSettings) -> None:
    assert parse_settings(dump(data)) == expected


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"quotas": {}}, "quotas"),
        ({"tenants": ["a"]}, "tenants"),
        ({"tenants": None}, "tenants"),
        ({"tenants": {"Search": {}}}, "tenants.Search"),
        ({"tenants": {"a_b": {}}}, "tenants.a_b"),
        ({"tenants": {"a": None}}, "tenants.a"),
        ({"tenants": {"a": 4}}, "tenants.a"),
        ({"tenants": {"a": {"cpus": 4}}}, "tenants.a.cpus"),
        ({"tenants": {"a": {"gpus": 0}}}, "tenants.a.gpus"),
        ({"tenants": {"a": {"gpus": -1}}}, "tenants.a.gpus"),
        ({"tenants": {"a": {"gpus": 0.0004}}}, "tenants.a.gpus"),
        ({"tenants": {"a": {"gpus": True}}}, "tenants.a.gpus"),
        ({"tenants": {"a": {"gpus": "4"}}}, "tenants.a.gpus"),
        ({"tenants": {"a": {"gpus": None}}}, "tenants.a.gpus"),
        ({"tenants": {"a": {"gpu_memory": "lots"}}}, "tenants.a.gpu_memory"),
        ({"tenants": {"a": {"gpu_memory": 0}}}, "tenants.a.gpu_memory"),
        ({"tenants": {"a": {"gpu_memory": 1.5}}}, "tenants.a.gpu_memory"),
        ({"tenants": {"a": {"gpu_memory": False}}}, "tenants.a.gpu_memory"),
        ({"mps_share_tenants": "yes"}, "mps_share_tenants"),
        ({"mps_share_tenants": 1}, "mps_share_tenants"),
        ({"mps_share_tenants": None}, "mps_share_tenants"),
        ({"placement_policy": "random"}, "placement_policy"),
        ({"placement_policy": 1}, "placement_policy"),
        ({"max_priority": "high"}, "max_priority"),
        ({"max_priority": 10**10}, "max_priority"),
        ({"tenants": {"a": {"max_priority": 1.5}}}, "tenants.a.max_priority"),
        ({"tenants": {"a": {"preemption": "always"}}}, "tenants.a.preemption"),
        ({"api_max_body": "2GiB"}, "api_max_body"),
        ({"api_max_body": "lots"}, "api_max_body"),
        ({"workload_users": "root"}, "workload_users"),
        ({"tenant_uids": [5]}, "tenant_uids"),
        ({"tenant_uids": [300000, 200000]}, "tenant_uids[1]"),
        ({"tenants": {"a": {"users": "alice"}}}, "tenants.a.users"),
        ({"tenants": {"a": {"users": [1]}}}, "tenants.a.users[0]"),
        ({"max_workloads": 0}, "max_workloads"),
        ({"tenants": {"a": {"max_workloads": "many"}}}, "tenants.a.max_workloads"),
        ({"node": {"name": "GPU_A"}}, "node.name"),
        ({"node": {"labels": {"zone": 1}}}, "node.labels.zone"),
        ({"node": {"labels": {"a b": "x"}}}, "node.labels['a b']"),
        ({"node": {"zone": "eu"}}, "node.zone"),
    ],
)
def test_errors_name_their_field(data: dict[str, Any], field: str) -> None:
    assert error_of(dump(data)).field == field


def test_node_name_and_labels() -> None:
    got = parse_settings(dump({"node": {"name": "gpu-a", "labels": {"gpufrac.io/pool": "a100"}}}))
    assert (got.node_name, got.node_labels) == ("gpu-a", {"gpufrac.io/pool": "a100"})
    assert (OperatorSettings().node_name, OperatorSettings().node_labels) == (None, {})


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("- binpack\n", "gpufrac.yaml"),
        ("just text", "gpufrac.yaml"),
        ("tenants: {a: {}}\ntenants: {}\n", "gpufrac.yaml"),
        ("tenants: [\n", "gpufrac.yaml"),
        ("placement_policy: spread\n---\nplacement_policy: binpack\n", "gpufrac.yaml"),
    ],
)
def test_file_level_errors_name_the_source(text: str, field: str) -> None:
    assert error_of(text).field == field


def test_unknown_field_error_lists_the_allowed_fields() -> None:
    err = error_of("tenant: {}\n")
    assert err.fix is not None
    assert all(name in err.fix for name in ("tenants", "mps_share_tenants", "placement_policy"))


def test_load_settings_missing_file_is_the_defaults(tmp_path: Path) -> None:
    assert load_settings(tmp_path) == OperatorSettings()
    assert load_settings(tmp_path / "no-such-dir") == OperatorSettings()


def test_load_settings_reads_the_data_dir(tmp_path: Path) -> None:
    (tmp_path / "gpufrac.yaml").write_text("placement_policy: spread\n")
    assert load_settings(tmp_path).placement_policy == "spread"
    (tmp_path / "gpufrac.yaml").write_text("placement_policy: nearest\n")
    with pytest.raises(InputError) as exc:
        load_settings(tmp_path)
    assert exc.value.field == "placement_policy"


def test_unreadable_settings_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "gpufrac.yaml"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(InputError) as exc:
        load_settings(tmp_path)
    assert exc.value.field == str(path)


def test_example_settings_parse() -> None:
    path = EXAMPLES / "operator" / "gpufrac.yaml"
    assert path.read_text().startswith("#")
    settings = parse_settings(path.read_text())
    assert settings.tenants["search"] == TenantQuota(gpu_memory_mib=400 * 1024, gpus_milli=4000)
    assert settings.tenants["research"] == TenantQuota(gpu_memory_mib=1024 * 1024, gpus_milli=None)
    assert (settings.mps_share_tenants, settings.placement_policy) == (False, "binpack")


def test_the_qos_quantum_is_a_setting() -> None:
    assert parse_settings("").qos_quantum_ms == 10
    assert parse_settings("qos_quantum_ms: 25").qos_quantum_ms == 25
    with pytest.raises(InputError) as exc:
        parse_settings("qos_quantum_ms: 0")
    assert exc.value.field == "qos_quantum_ms"


def test_the_qos_preempt_mode_is_a_setting() -> None:
    assert parse_settings("").qos_preempt == "overlap"
    assert parse_settings("qos_preempt: drain").qos_preempt == "drain"
    with pytest.raises(InputError) as exc:
        parse_settings("qos_preempt: never")
    assert exc.value.field == "qos_preempt"


def test_a_tenants_workload_bound_is_its_own_or_the_operators() -> None:
    settings = parse_settings(dump({"max_workloads": 50, "tenants": {"a": {"max_workloads": 5}}}))
    assert settings.workload_cap("a") == (5, "tenants.a.max_workloads")
    assert settings.workload_cap("b") == (50, "max_workloads")
    assert parse_settings("").workload_cap("b") == (1000, "max_workloads")


def test_a_tenant_without_a_preemption_setting_evicts_only_its_own() -> None:
    """Cross-tenant eviction is the operator's decision: the default is own-tenant, and each tenant
    the default changed is named once at start with the setting that keeps the old behaviour."""
    from gpufrac.model.settings import preemption_notes

    s = parse_settings("tenants:\n  a: {gpus: 1}\n  b: {preemption: lower-priority}\n")
    assert s.preemption("a", "lower-priority") == "own-tenant"
    assert s.preemption("c", "lower-priority") == "own-tenant"  # not listed at all
    assert s.preemption("b", "lower-priority") == "lower-priority"
    assert s.preemption("b", "never") == "never"
    notes = preemption_notes(s, ["c", "b", "c"])
    assert [n.split(":")[0] for n in notes] == ["tenant a", "tenant c"]
    assert "set tenants.a.preemption: lower-priority in gpufrac.yaml" in notes[0]
