"""``kind: Deployment`` documents: parsing, errors located at their field, replicas and JSON."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufrac.errors import InputError
from gpufrac.model.deployment import (
    LABEL,
    TEMPLATE_LABEL,
    Autoscale,
    DeploymentSpec,
    deployment_from_json,
    deployment_to_json,
)
from gpufrac.model.manifest import load_manifest_file, parse_manifests, parse_objects
from gpufrac.model.manifest_fields import read_dns_label
from gpufrac.model.workload import GpuRequest, WorkloadSpec
from tests.unit.model.test_manifest import DELETE, changed

EXAMPLE = Path(__file__).parents[3] / "examples" / "serving" / "deployment.yaml"
MODEL = "my_models.text:make"
BASE: dict[str, Any] = {
    "apiVersion": "gpufrac/v1",
    "kind": "Deployment",
    "metadata": {"name": "d"},
    "spec": {"template": {"model": MODEL, "resources": {"gpu": {"fraction": 0.25}}}},
}
COMMAND = {"spec.template.model": DELETE, "spec.template.command": ["srv", "--port", "$PORT"]}
WORKLOAD: dict[str, Any] = {
    "apiVersion": "gpufrac/v1",
    "kind": "Workload",
    "metadata": {"name": "w"},
    "spec": {"command": ["python", "-c", "pass"], "resources": {"gpu": {"count": 1}}},
}


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def doc(changes: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    """BASE with dotted paths set (``{"spec.replicas": 2}``) or removed (``DELETE``)."""
    return changed(BASE, {**(changes or {}), **kw})


def parse_one(changes: dict[str, Any] | None = None) -> DeploymentSpec:
    objects = parse_objects(dump(doc(changes)))
    assert len(objects) == 1
    assert isinstance(objects[0], DeploymentSpec)
    return objects[0]


def error_of(text: str) -> InputError:
    with pytest.raises(InputError) as exc:
        parse_objects(text)
    assert exc.value.message
    assert exc.value.fix, f"no fix for {exc.value}"
    return exc.value


# --- the worked example ---------------------------------------------------------------------------


def test_example_deployment_parses() -> None:
    assert EXAMPLE.read_text().startswith("#")
    objects = load_manifest_file(EXAMPLE)
    assert len(objects) == 1
    d = objects[0]
    assert isinstance(d, DeploymentSpec)
    assert (d.tenant, d.name, d.key) == ("default", "summer", "default/summer")
    assert d.model == "examples.serving.models:slow_sum"
    assert d.replicas is None
    assert d.autoscale == Autoscale(
        min_replicas=1,
        max_replicas=4,
        target_in_flight=2,
        scale_up_delay_seconds=2,
        scale_down_delay_seconds=5,
        scale_to_zero_delay_seconds=30,
        traffic_history_seconds=5,
    )
    assert (d.max_concurrency, d.queue_limit, d.timeout_seconds) == (4, 64, 30)
    t = d.template
    assert t.gpu == GpuRequest(fraction_milli=250)
    assert (t.type, t.sharing, t.priority, t.restart) == ("service", "timeslice", 100, "always")


def test_example_model_factory_exists() -> None:
    d = load_manifest_file(EXAMPLE)[0]
    assert isinstance(d, DeploymentSpec) and d.model is not None
    module, _, factory = d.model.partition(":")
    path = EXAMPLE.parents[2] / (module.replace(".", "/") + ".py")
    assert f"def {factory}(" in path.read_text()


# --- defaults and accepted values -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "attribute", "expected"),
    [
        ({}, "tenant", "default"),
        ({}, "labels", {}),
        ({}, "model", MODEL),
        ({}, "replicas", 1),
        ({}, "autoscale", None),
        ({}, "max_batch_size", 1),
        ({}, "max_wait_ms", 5.0),
        ({}, "readiness_path", None),
        ({}, "max_concurrency", 8),
        ({}, "queue_limit", 256),
        ({}, "timeout_seconds", 60.0),
        (COMMAND, "model", None),
        ({"metadata.tenant": "search"}, "tenant", "search"),
        ({"metadata.labels": {"team": "a"}}, "labels", {"team": "a"}),
        ({"spec.replicas": 0}, "replicas", 0),
        ({"spec.replicas": 1000}, "replicas", 1000),
        ({"spec.autoscale": {}}, "autoscale", Autoscale()),
        ({"spec.autoscale": {}}, "replicas", None),
        ({"spec.template.max_batch_size": 32}, "max_batch_size", 32),
        ({"spec.template.max_wait_ms": 0}, "max_wait_ms", 0.0),
        ({"spec.template.max_wait_ms": 2.5}, "max_wait_ms", 2.5),
        ({"spec.readiness_path": "/ready"}, "readiness_path", "/ready"),
        ({"spec.max_concurrency": 1}, "max_concurrency", 1),
        ({"spec.queue_limit": 0}, "queue_limit", 0),
        ({"spec.timeout_seconds": 0.5}, "timeout_seconds", 0.5),
        ({"metadata.name": "a" * 50}, "name", "a" * 50),
    ],
)
def test_values(changes: dict[str, Any], attribute: str, expected: Any) -> None:
    assert getattr(parse_one(changes), attribute) == expected


@pytest.mark.parametrize(
    ("autoscale", "expected"),
    [
        ({"min_replicas": 0}, Autoscale(min_replicas=0, max_replicas=4)),
        # max_replicas defaults to at least min_replicas
        ({"min_replicas": 6}, Autoscale(min_replicas=6, max_replicas=6)),
        ({"min_replicas": 2, "max_replicas": 2}, Autoscale(min_replicas=2, max_replicas=2)),
        ({"target_in_flight": 1}, Autoscale(target_in_flight=1)),
        ({"p99_latency_ms": 250}, Autoscale(p99_latency_ms=250)),
        (
            {
                "scale_up_delay_seconds": 0,
                "scale_down_delay_seconds": 0.5,
                "scale_to_zero_delay_seconds": 0,
                "traffic_history_seconds": 1,
            },
            Autoscale(
                scale_up_delay_seconds=0,
                scale_down_delay_seconds=0.5,
                scale_to_zero_delay_seconds=0,
                traffic_history_seconds=1,
            ),
        ),
    ],
)
def test_autoscale_values(autoscale: dict[str, Any], expected: Autoscale) -> None:
    assert parse_one({"spec.autoscale": autoscale}).autoscale == expected


@pytest.mark.parametrize(
    ("changes", "attribute", "expected"),
    [
        ({}, "type", "service"),
        ({}, "restart", "always"),
        ({}, "qos", "latency"),
        ({}, "health", None),
        ({}, "gpu", GpuRequest(fraction_milli=250)),
        (COMMAND, "command", ("srv", "--port", "$PORT")),
        ({"spec.template.env": {"HF_HOME": "/cache"}}, "env", {"HF_HOME": "/cache"}),
        ({"spec.template.priority": "high"}, "priority", 100),
        ({"spec.template.sharing": "timeslice"}, "sharing", "timeslice"),
        ({"spec.template.weight": 3}, "weight", 3),
        ({"spec.template.workdir": "/srv"}, "workdir", "/srv"),
    ],
)
def test_template_values(changes: dict[str, Any], attribute: str, expected: Any) -> None:
    assert getattr(parse_one(changes).template, attribute) == expected


# --- replicas -------------------------------------------------------------------------------------


def test_model_replica() -> None:
    d = parse_one(
        {
            "spec.template.max_batch_size": 16,
            "spec.template.max_wait_ms": 2.5,
            "spec.template.env": {"HF_HOME": "/cache"},
            "metadata.labels": {"team": "a"},
        }
    )
    r = d.replica_spec(3, 9123)
    assert isinstance(r, WorkloadSpec)
    assert r.name.startswith("d-") and r.name.endswith("-3")
    assert d.template_hash in r.name
    assert r.env == {"HF_HOME": "/cache", "PORT": "9123"}
    assert r.labels == {"team": "a", LABEL: "d", TEMPLATE_LABEL: d.template_hash}
    assert r.health is not None
    assert (r.health.kind, r.health.port, r.health.path) == ("http", 9123, "/healthz")
    assert (r.type, r.restart, r.tenant) == ("service", "always", "default")
    assert r.gpu == GpuRequest(fraction_milli=250)
    # the replica server serves the model with the batching settings
    assert MODEL in r.command
    assert "gpufrac.serving.replica" in r.command
    args = list(r.command)
    assert args[args.index("--max-batch-size") + 1] == "16"
    assert float(args[args.index("--max-wait-ms") + 1]) == 2.5


def test_command_replica_is_checked_by_tcp() -> None:
    d = parse_one(COMMAND)
    r = d.replica_spec(0, 8001)
    assert r.command == ("srv", "--port", "$PORT")
    assert r.env["PORT"] == "8001"
    assert r.health is not None
    assert (r.health.kind, r.health.port) == ("tcp", 8001)


@pytest.mark.parametrize("changes", [{}, COMMAND])
def test_readiness_path_makes_an_http_check(changes: dict[str, Any]) -> None:
    d = parse_one({**changes, "spec.readiness_path": "/ready"})
    health = d.replica_spec(1, 7000).health
    assert health is not None
    assert (health.kind, health.port, health.path) == ("http", 7000, "/ready")


def test_replicas_of_a_tenant_stay_in_their_tenant() -> None:
    d = parse_one({"metadata.tenant": "search"})
    r = d.replica_spec(0, 9000)
    assert (d.key, r.tenant) == ("search/d", "search")


@pytest.mark.parametrize("index", [0, 7, 999])
def test_longest_replica_name_is_a_dns_label(index: int) -> None:
    d = parse_one({"metadata.name": "a" * 50, "spec.replicas": 1000})
    name = d.replica_spec(index, 65535).name
    assert read_dns_label(name, "name") == name


def test_replicas_differ_only_by_index_and_port() -> None:
    d = parse_one()
    a, b = d.replica_spec(0, 9000), d.replica_spec(1, 9001)
    assert a.name != b.name
    assert a.labels == b.labels
    assert a.health is not None and b.health is not None
    assert (a.health.port, b.health.port) == (9000, 9001)
    assert (a.env["PORT"], b.env["PORT"]) == ("9000", "9001")
    assert (a.command, a.gpu, a.priority) == (b.command, b.gpu, b.priority)


def test_template_restart_is_honoured_or_rejected() -> None:
    changes = {"spec.template.restart": "never"}
    try:
        d = parse_one(changes)
    except InputError as exc:
        assert exc.field == "spec.template.restart"
        return
    assert d.replica_spec(0, 9000).restart == "never"


# --- template_hash --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"spec.template.resources.gpu": {"fraction": 0.5}},
        {"spec.template.env": {"A": "1"}},
        {"spec.template.priority": "low"},
        {"spec.template.sharing": "timeslice"},
        {"spec.template.model": "my_models.text:other"},
        {"spec.template.max_batch_size": 8},
        {"spec.template.max_wait_ms": 1},
        {"spec.readiness_path": "/ready"},
        COMMAND,
    ],
)
def test_template_hash_changes_with_the_template(changes: dict[str, Any]) -> None:
    assert parse_one(changes).template_hash != parse_one().template_hash


@pytest.mark.parametrize(
    "changes",
    [
        {"spec.replicas": 5},
        {"spec.replicas": 0},
        {"spec.autoscale": {"max_replicas": 9}},
        {"spec.autoscale": {"min_replicas": 0, "p99_latency_ms": 100}},
        {"spec.max_concurrency": 2},
        {"spec.queue_limit": 1},
        {"spec.timeout_seconds": 5},
    ],
)
def test_template_hash_ignores_scaling_and_gateway_settings(changes: dict[str, Any]) -> None:
    d = parse_one(changes)
    assert d.template_hash == parse_one().template_hash
    # a replica beyond autoscale's min_replicas never evicts anyone; nothing else about it changes
    assert replace(
        d.replica_spec(0, 9000), preemption="lower-priority"
    ) == parse_one().replica_spec(0, 9000)


def test_replicas_beyond_min_replicas_never_evict() -> None:
    d = parse_one(
        {
            "spec.autoscale": {"min_replicas": 1, "max_replicas": 3, "p99_latency_ms": 100},
        }
    )
    assert [d.replica_spec(i, 9000 + i).preemption for i in range(3)] == [
        "lower-priority",
        "never",
        "never",
    ]
    assert (
        parse_one({"spec.template.preemption": "never"}).replica_spec(0, 9000).preemption == "never"
    )


def test_template_hash_is_stable_and_labels_the_replica() -> None:
    a, b = parse_one(), parse_one()
    assert a.template_hash == b.template_hash
    assert a.replica_spec(0, 1).labels[TEMPLATE_LABEL] == a.template_hash


# --- JSON -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {},
        COMMAND,
        {"spec.autoscale": {"min_replicas": 0, "max_replicas": 3, "p99_latency_ms": 150}},
        {
            "metadata.tenant": "t",
            "metadata.labels": {"a": "b"},
            "spec.readiness_path": "/ready",
            "spec.template.env": {"X": "1"},
            "spec.template.max_batch_size": 4,
            "spec.replicas": 0,
        },
    ],
)
def test_json_round_trip(changes: dict[str, Any]) -> None:
    d = parse_one(changes)
    back = deployment_from_json(json.loads(json.dumps(deployment_to_json(d))))
    assert back == d
    assert back.template_hash == d.template_hash
    assert back.replica_spec(2, 9002) == d.replica_spec(2, 9002)


def test_example_json_round_trip() -> None:
    d = load_manifest_file(EXAMPLE)[0]
    assert isinstance(d, DeploymentSpec)
    assert deployment_from_json(json.loads(json.dumps(deployment_to_json(d)))) == d


# --- errors: each at its exact field --------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        # model / command
        ({"spec.template.command": ["srv"]}, "spec.template"),
        ({"spec.template.model": DELETE}, "spec.template"),
        ({"spec.template.model": "my_models"}, "spec.template.model"),
        ({"spec.template.model": "my_models.text"}, "spec.template.model"),
        ({"spec.template.model": "my_models:"}, "spec.template.model"),
        ({"spec.template.model": ":make"}, "spec.template.model"),
        ({"spec.template.model": "my models:make"}, "spec.template.model"),
        ({"spec.template.model": "my/models:make"}, "spec.template.model"),
        ({"spec.template.model": "1models:make"}, "spec.template.model"),
        ({"spec.template.model": "a:b:c"}, "spec.template.model"),
        ({"spec.template.model": 5}, "spec.template.model"),
        ({"spec.template.model": ""}, "spec.template.model"),
        # batching is for model: templates
        ({**COMMAND, "spec.template.max_batch_size": 4}, "spec.template.max_batch_size"),
        ({**COMMAND, "spec.template.max_wait_ms": 4}, "spec.template.max_wait_ms"),
        ({"spec.template.max_batch_size": 0}, "spec.template.max_batch_size"),
        ({"spec.template.max_batch_size": 4097}, "spec.template.max_batch_size"),
        ({"spec.template.max_batch_size": 2.5}, "spec.template.max_batch_size"),
        ({"spec.template.max_wait_ms": -1}, "spec.template.max_wait_ms"),
        ({"spec.template.max_wait_ms": "5ms"}, "spec.template.max_wait_ms"),
        ({"spec.template.max_wait_ms": True}, "spec.template.max_wait_ms"),
        # workload fields that do not apply to a replica
        ({"spec.template.health": {"tcp": {"port": 80}}}, "spec.template.health"),
        ({"spec.template.type": "service"}, "spec.template.type"),
        ({"spec.template.backoff_limit": 3}, "spec.template.backoff_limit"),
        ({"spec.template.deadline_seconds": 60}, "spec.template.deadline_seconds"),
        ({"spec.template.picture": "x"}, "spec.template.picture"),
        # workload errors inside the template are located under spec.template
        ({"spec.template.resources": DELETE}, "spec.template.resources"),
        ({"spec.template.resources.gpu": {"count": 0}}, "spec.template.resources.gpu.count"),
        ({"spec.template.resources.gpu": {}}, "spec.template.resources.gpu"),
        ({**COMMAND, "spec.template.command": "srv --port 80"}, "spec.template.command"),
        ({**COMMAND, "spec.template.command": ["srv", 80]}, "spec.template.command[1]"),
        ({"spec.template.env": {"PORT": 8000}}, "spec.template.env.PORT"),
        ({"spec.template.priority": "urgent"}, "spec.template.priority"),
        ({"spec.template.sharing": "vgpu"}, "spec.template.sharing"),
        # the template itself
        ({"spec.template": DELETE}, "spec.template"),
        ({"spec.template": "my_models.text:make"}, "spec.template"),
        # replicas and autoscale
        ({"spec.replicas": 2, "spec.autoscale": {}}, "spec"),
        ({"spec.replicas": -1}, "spec.replicas"),
        ({"spec.replicas": 1001}, "spec.replicas"),
        ({"spec.replicas": "2"}, "spec.replicas"),
        ({"spec.replicas": True}, "spec.replicas"),
        ({"spec.replicas": 1.5}, "spec.replicas"),
        ({"spec.autoscale": 3}, "spec.autoscale"),
        ({"spec.autoscale": {"max": 3}}, "spec.autoscale.max"),
        ({"spec.autoscale": {"min_replicas": 5, "max_replicas": 2}}, "spec.autoscale.max_replicas"),
        ({"spec.autoscale": {"max_replicas": 0}}, "spec.autoscale.max_replicas"),
        ({"spec.autoscale": {"max_replicas": 1001}}, "spec.autoscale.max_replicas"),
        ({"spec.autoscale": {"min_replicas": -1}}, "spec.autoscale.min_replicas"),
        ({"spec.autoscale": {"min_replicas": 1.5}}, "spec.autoscale.min_replicas"),
        ({"spec.autoscale": {"target_in_flight": 0}}, "spec.autoscale.target_in_flight"),
        (
            {"spec.autoscale": {"scale_up_delay_seconds": -1}},
            "spec.autoscale.scale_up_delay_seconds",
        ),
        (
            {"spec.autoscale": {"scale_down_delay_seconds": -0.5}},
            "spec.autoscale.scale_down_delay_seconds",
        ),
        (
            {"spec.autoscale": {"scale_to_zero_delay_seconds": -60}},
            "spec.autoscale.scale_to_zero_delay_seconds",
        ),
        (
            {"spec.autoscale": {"traffic_history_seconds": -1}},
            "spec.autoscale.traffic_history_seconds",
        ),
        (
            {"spec.autoscale": {"traffic_history_seconds": 0}},
            "spec.autoscale.traffic_history_seconds",
        ),
        (
            {"spec.autoscale": {"scale_up_delay_seconds": "5s"}},
            "spec.autoscale.scale_up_delay_seconds",
        ),
        ({"spec.autoscale": {"p99_latency_ms": 0}}, "spec.autoscale.p99_latency_ms"),
        ({"spec.autoscale": {"p99_latency_ms": -5}}, "spec.autoscale.p99_latency_ms"),
        # gateway settings
        ({"spec.readiness_path": "healthz"}, "spec.readiness_path"),
        ({"spec.readiness_path": 8000}, "spec.readiness_path"),
        ({"spec.max_concurrency": 0}, "spec.max_concurrency"),
        ({"spec.queue_limit": -1}, "spec.queue_limit"),
        ({"spec.timeout_seconds": 0}, "spec.timeout_seconds"),
        ({"spec.timeout_seconds": -1}, "spec.timeout_seconds"),
        ({"spec.bogus": 1}, "spec.bogus"),
        ({"spec.command": ["srv"]}, "spec.command"),
        ({"spec": DELETE}, "spec"),
        # metadata
        ({"metadata.name": "a" * 51}, "metadata.name"),
        ({"metadata.name": "a" * 63}, "metadata.name"),
        ({"metadata.name": "Summer"}, "metadata.name"),
    ],
)
def test_errors_name_their_field(changes: dict[str, Any], field: str) -> None:
    assert error_of(dump(doc(changes))).field == field


def test_model_and_command_fix_names_both() -> None:
    err = error_of(dump(doc({"spec.template.command": ["srv"]})))
    assert err.fix is not None and "model" in err.fix and "command" in err.fix
    err = error_of(dump(doc({"spec.template.model": DELETE})))
    assert err.fix is not None and "model" in err.fix and "command" in err.fix


def test_bad_model_ref_fix_shows_the_form() -> None:
    err = error_of(dump(doc({"spec.template.model": "my_models"})))
    assert "my_models" in err.message
    assert err.fix is not None and ":" in err.fix


def test_long_name_fix_says_how_long() -> None:
    err = error_of(dump(doc({"metadata.name": "a" * 51})))
    assert "51" in err.message
    assert err.fix is not None and "50" in err.fix


def test_replicas_and_autoscale_fix_names_both() -> None:
    err = error_of(dump(doc({"spec.replicas": 2, "spec.autoscale": {}})))
    assert err.fix is not None and "replicas" in err.fix and "autoscale" in err.fix


def test_min_above_max_fix_gives_the_range() -> None:
    err = error_of(dump(doc({"spec.autoscale": {"min_replicas": 5, "max_replicas": 2}})))
    assert err.fix is not None and "5" in err.fix


@pytest.mark.parametrize("name", ["health", "type", "backoff_limit", "deadline_seconds"])
def test_template_unknown_field_fix_lists_what_is_allowed(name: str) -> None:
    err = error_of(dump(doc({f"spec.template.{name}": 1})))
    assert err.fix is not None
    for allowed in ("model", "command", "resources", "max_batch_size"):
        assert allowed in err.fix
    assert name not in err.fix.replace("max_batch_size", "")


# --- several documents, and parse_manifests -------------------------------------------------------


def test_workloads_and_deployments_in_file_order() -> None:
    text = yaml.safe_dump_all([WORKLOAD, doc(), doc({"metadata.name": "e", **COMMAND})])
    objects = parse_objects(text)
    assert [type(o) for o in objects] == [WorkloadSpec, DeploymentSpec, DeploymentSpec]
    assert [o.name for o in objects] == ["w", "d", "e"]


@pytest.mark.parametrize(
    ("documents", "field"),
    [
        ([WORKLOAD, doc({"spec.template.resources.gpu": {"count": 0}})],
         "doc[2].spec.template.resources.gpu.count"),
        ([doc(), doc({"spec.replicas": -1, "metadata.name": "e"})], "doc[2].spec.replicas"),
        ([doc(), doc()], "doc[2].metadata.name"),
    ],
)  # fmt: skip
def test_errors_in_several_documents_are_prefixed(documents: list[Any], field: str) -> None:
    assert error_of(yaml.safe_dump_all(documents)).field == field


def test_same_name_in_two_tenants_is_fine() -> None:
    text = yaml.safe_dump_all([doc(), doc({"metadata.tenant": "other"})])
    assert [o.key for o in parse_objects(text)] == ["default/d", "other/d"]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("documents", "source"),
    [([BASE], "manifest"), ([WORKLOAD, BASE], "manifest"), ([BASE], "serve.yaml")],
)
def test_parse_manifests_rejects_a_deployment(documents: list[Any], source: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_manifests(yaml.safe_dump_all(documents), source=source)
    assert exc.value.field == source
    assert "'d'" in exc.value.message
    assert exc.value.fix is not None and "apply" in exc.value.fix


def test_parse_manifests_still_takes_workloads() -> None:
    assert [w.name for w in parse_manifests(dump(WORKLOAD))] == ["w"]


def test_every_problem_of_a_deployment_is_reported_at_once() -> None:
    err = error_of(
        dump(
            doc(
                {
                    "metadata.name": "Bad_Name",
                    "spec.replicas": -1,
                    "spec.timeout_seconds": "abc",
                    "spec.template.priority": "ultra",
                    "spec.template.resources": {"gpu": {"fraction": 3}},
                }
            )
        )
    )
    fields = {e.field for e in err.errors}
    assert fields == {
        "metadata.name",
        "spec.replicas",
        "spec.timeout_seconds",
        "spec.template.priority",
        "spec.template.resources.gpu.fraction",
    }
