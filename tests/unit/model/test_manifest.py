from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufrac.errors import InputError
from gpufrac.model import manifest
from gpufrac.model.manifest import load_manifest_file, parse_manifests, read_objects
from gpufrac.model.manifest_fields import load_documents
from gpufrac.model.workload import GpuRequest, HealthCheck, WorkloadSpec

EXAMPLES = Path(__file__).parents[3] / "examples"
DELETE = object()
BASE: dict[str, Any] = {
    "apiVersion": "gpufrac/v1",
    "kind": "Workload",
    "metadata": {"name": "w"},
    "spec": {"command": ["python", "-c", "pass"], "resources": {"gpu": {"count": 1}}},
}
SERVICE = {"spec.type": "service"}
HTTP = {"http": {"port": 8000}}


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def dump_all(documents: list[Any]) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False)


def doc(changes: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    """BASE with dotted paths set (``{"spec.resources.gpu": {...}}``) or removed (``DELETE``)."""
    return changed(BASE, {**(changes or {}), **kw})


def changed(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with dotted paths set, or removed where the value is ``DELETE``."""
    out = copy.deepcopy(base)
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return out


def parse_one(changes: dict[str, Any]) -> WorkloadSpec:
    specs = parse_manifests(dump(doc(changes)))
    assert len(specs) == 1
    return specs[0]


def error_of(text: str) -> InputError:
    with pytest.raises(InputError) as exc:
        parse_manifests(text)
    assert exc.value.message
    assert exc.value.fix, f"no fix for {exc.value}"
    return exc.value


def gpu(**fields: Any) -> dict[str, Any]:
    return {"spec.resources.gpu": fields}


# --- defaults and accepted values ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "attribute", "expected"),
    [
        ({}, "tenant", "default"),
        ({}, "labels", {}),
        ({}, "type", "job"),
        ({}, "env", {}),
        ({}, "workdir", None),
        ({}, "user", None),
        ({}, "health", None),
        ({}, "sharing", "auto"),
        ({}, "priority", 50),
        ({}, "restart", "on-failure"),
        (SERVICE, "restart", "always"),
        ({}, "backoff_limit", 6),
        ({}, "deadline_seconds", None),
        ({}, "qos", "throughput"),
        (SERVICE, "qos", "latency"),
        ({}, "weight", 1),
        ({}, "min_share_milli", None),  # the operator's default for its type
        ({}, "command", ("python", "-c", "pass")),
        ({}, "gpu", GpuRequest(count=1)),
        ({**SERVICE, "spec.health": HTTP}, "health", HealthCheck("http", 8000, "/", 5, 0)),
    ],
)
def test_defaults(changes: dict[str, Any], attribute: str, expected: Any) -> None:
    assert getattr(parse_one(changes), attribute) == expected


@pytest.mark.parametrize(
    ("changes", "attribute", "expected"),
    [
        ({"metadata.tenant": "search"}, "tenant", "search"),
        ({"metadata.labels": {"team": "a", "x/y": ""}}, "labels", {"team": "a", "x/y": ""}),
        ({"spec.env": {"A_1": "1", "_b": ""}}, "env", {"A_1": "1", "_b": ""}),
        ({"spec.workdir": "/srv"}, "workdir", "/srv"),
        (
            {"spec.node_selector": {"zone": "eu", "gpufrac.io/pool": "train", "x": ""}},
            "node_selector",
            {"zone": "eu", "gpufrac.io/pool": "train", "x": ""},
        ),
        ({"spec.user": "nobody"}, "user", "nobody"),
        ({"spec.command": ["python", ""]}, "command", ("python", "")),
        ({"spec.priority": "high"}, "priority", 100),
        ({"spec.priority": "normal"}, "priority", 50),
        ({"spec.priority": "low"}, "priority", 0),
        ({"spec.priority": -7}, "priority", -7),
        ({"spec.priority": 1000}, "priority", 1000),
        ({"spec.restart": "never"}, "restart", "never"),
        ({**SERVICE, "spec.restart": "on-failure"}, "restart", "on-failure"),
        ({"spec.restart": "always"}, "restart", "always"),
        ({"spec.backoff_limit": 0}, "backoff_limit", 0),
        ({"spec.deadline_seconds": 1}, "deadline_seconds", 1),
        ({"spec.sharing": "exclusive"}, "sharing", "exclusive"),
        ({**gpu(count=3), "spec.sharing": "timeslice"}, "gpu", GpuRequest(count=3)),
        (gpu(fraction=0.25), "gpu", GpuRequest(fraction_milli=250)),
        (gpu(fraction=0.0005), "gpu", GpuRequest(fraction_milli=1)),  # rounds half up
        (gpu(fraction=0.2345), "gpu", GpuRequest(fraction_milli=235)),
        (gpu(fraction=0.9994), "gpu", GpuRequest(fraction_milli=999)),
        (gpu(memory="12GiB"), "gpu", GpuRequest(memory_mib=12288)),
        (gpu(memory="1.5GiB"), "gpu", GpuRequest(memory_mib=1536)),
        (gpu(memory="1GB"), "gpu", GpuRequest(memory_mib=954)),
        (gpu(memory=512), "gpu", GpuRequest(memory_mib=512)),
        (gpu(memory="8GiB", compute="30%"), "gpu", GpuRequest(memory_mib=8192, compute_pct=30)),
        (gpu(memory="8GiB", compute=100), "gpu", GpuRequest(memory_mib=8192, compute_pct=100)),
        (gpu(mig="1g.18gb"), "gpu", GpuRequest(mig_profile="1g.18gb")),
        (gpu(mig="MIG 1G.18GB+ME"), "gpu", GpuRequest(mig_profile="1g.18gb+me")),
        (
            gpu(mig={"profile": "1g.10gb", "model": "A100-80GB"}),
            "gpu",
            GpuRequest(mig_profile="1g.10gb", mig_model="A100-80GB"),
        ),
        (
            gpu(mig={"profile": "3g.71gb", "model": "h200"}),
            "gpu",
            GpuRequest(mig_profile="3g.71gb", mig_model="H200-141GB"),
        ),
        (gpu(mig={"profile": "2g.35gb"}), "gpu", GpuRequest(mig_profile="2g.35gb")),
        ({**gpu(mig="1g.18gb"), "spec.sharing": "mig"}, "sharing", "mig"),
        ({**gpu(memory="1GiB"), "spec.sharing": "mig"}, "sharing", "mig"),
        ({**gpu(fraction=0.5), "spec.sharing": "mig"}, "sharing", "mig"),
        ({**gpu(memory="1GiB", compute=10), "spec.sharing": "mps"}, "sharing", "mps"),
        # a share of each of several GPUs under MPS: one daemon serves them together
        ({**gpu(count=2, memory="1GiB"), "spec.sharing": "mps"}, "sharing", "mps"),
        ({**gpu(count=2, memory_percent=50, compute=10), "spec.sharing": "mps"}, "sharing", "mps"),
        ({**gpu(memory="1GiB"), "spec.sharing": "timeslice"}, "sharing", "timeslice"),
        (
            {**SERVICE, "spec.health": {"tcp": {"port": 1}}},
            "health",
            HealthCheck("tcp", 1, "/", 5, 0),
        ),
        (
            {
                **SERVICE,
                "spec.health": {
                    "http": {"port": 65535, "path": "/healthz"},
                    "period_seconds": 1,
                    "initial_delay_seconds": 30,
                },
            },
            "health",
            HealthCheck("http", 65535, "/healthz", 1, 30),
        ),
    ],
)
def test_values(changes: dict[str, Any], attribute: str, expected: Any) -> None:
    assert getattr(parse_one(changes), attribute) == expected


# --- aliases --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"gpumem": 8192}, GpuRequest(memory_mib=8192)),
        ({"gpumem": 8192, "gpucores": 25}, GpuRequest(memory_mib=8192, compute_pct=25)),
        ({"memory": "1GiB", "gpucores": 40}, GpuRequest(memory_mib=1024, compute_pct=40)),
        ({"gpu-fraction": 0.5}, GpuRequest(fraction_milli=500)),
        ({"gpu-memory": 4096}, GpuRequest(memory_mib=4096)),
        # the same value under a field and its alias is fine
        ({"memory": "8GiB", "gpumem": 8192}, GpuRequest(memory_mib=8192)),
        ({"memory": "4GiB", "gpu-memory": 4096}, GpuRequest(memory_mib=4096)),
        ({"gpumem": 4096, "gpu-memory": 4096}, GpuRequest(memory_mib=4096)),
        ({"fraction": 0.5, "gpu-fraction": 0.5}, GpuRequest(fraction_milli=500)),
        ({"nvidia.com/mig-1g.10gb": 1, "mig": "1g.10gb"}, GpuRequest(mig_profile="1g.10gb")),
        ({"nvidia.com/mig-MIG 1G.10GB": "1"}, GpuRequest(mig_profile="1g.10gb")),
        ({"nvidia.com/gpu": "1", "gpucores": "30"}, GpuRequest(compute_pct=30)),
        ({"count": 1, "memory_percent": "40%"}, GpuRequest(memory_pct=40)),
        # a share of each of several GPUs (HAMi's basic form, KAI's num-devices)
        ({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000}, GpuRequest(memory_mib=3000, devices=2)),
        ({"count": 3, "memory_percent": "40%"}, GpuRequest(memory_pct=40, devices=3)),
        (
            {"gpu-fraction-num-devices": "2", "gpu-fraction": "0.5"},
            GpuRequest(fraction_milli=500, devices=2),
        ),
        # a compute cap on each of several GPUs (HAMi's nvidia.com/gpu: 2 with gpucores: MPS)
        (
            {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "30"},
            GpuRequest(compute_pct=30, devices=2),
        ),
        (
            {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30},
            GpuRequest(memory_mib=3000, compute_pct=30, devices=2),
        ),
        (
            {"count": 2, "memory": "10GiB", "compute": "30%"},
            GpuRequest(memory_mib=10240, compute_pct=30, devices=2),
        ),
        (
            {"count": 2, "memory_percent": 50, "gpucores": 40},
            GpuRequest(memory_pct=50, compute_pct=40, devices=2),
        ),
        (
            {"memory": "1GiB", "compute": "30%", "gpucores": 30},
            GpuRequest(memory_mib=1024, compute_pct=30),
        ),
    ],
)
def test_aliases(fields: dict[str, Any], expected: GpuRequest) -> None:
    assert parse_one(gpu(**fields)).gpu == expected


# a value each gpufrac field takes, as the field writes it and as other schedulers' users do
CANONICAL_VALUE = {
    "count": (1, "1"),
    "memory": (3000, "3000"),
    "memory_percent": (50, "50"),
    "compute": (30, "30"),
    "fraction": (0.5, "0.5"),
}


@pytest.mark.parametrize(("alias", "means"), sorted(manifest.GPU_ALIASES.items()))
def test_each_alias_means_its_one_field_written_as_a_number_or_a_string(
    alias: str, means: str
) -> None:
    value, text = CANONICAL_VALUE[means]
    # compute and memory_percent alone are requests too; a fraction's count goes beside it
    beside = {"fraction": 0.5} if alias == "gpu-fraction-num-devices" else {}
    expected = parse_one(gpu(**{means: value}, **beside)).gpu
    assert parse_one(gpu(**{alias: value}, **beside)).gpu == expected
    assert parse_one(gpu(**{alias: text}, **beside)).gpu == expected


@pytest.mark.parametrize(
    ("fields", "field", "names"),
    [
        ({"memory": "8GiB", "gpumem": 4096}, "gpumem", ("memory", "gpumem")),
        ({"gpu-memory": 1024, "memory": "2GiB"}, "memory", ("gpu-memory", "memory")),
        ({"gpumem": 1024, "gpu-memory": 2048}, "gpu-memory", ("gpumem", "gpu-memory")),
        ({"fraction": 0.5, "gpu-fraction": 0.25}, "gpu-fraction", ("fraction", "gpu-fraction")),
        (
            {"memory": "1GiB", "compute": 30, "gpucores": 40},
            "gpucores",
            ("compute", "gpucores"),
        ),
    ],
)
def test_field_and_alias_disagreeing_is_an_error_naming_both(
    fields: dict[str, Any], field: str, names: tuple[str, str]
) -> None:
    err = error_of(dump(doc(gpu(**fields))))
    assert err.field == f"spec.resources.gpu.{field}"
    assert all(name in err.message for name in names)


@pytest.mark.parametrize(
    ("field", "value", "message", "fix"),
    [
        ("fraction", 0.0004, "0.0004 comes to nothing", "write 0.0005 or more"),
        ("gpu-fraction", "0.0004", "0.0004 comes to nothing", "write 0.0005 or more"),
        ("fraction", 0.9995, "0.9995 comes to 1 once rounded", "write less than 0.9995"),
        ("fraction", 1.5, "1.5 is out of range", "write a number between 0 and 1"),
    ],
)
def test_a_fraction_between_0_and_1_that_rounds_out_of_range_says_so(
    field: str, value: object, message: str, fix: str
) -> None:
    err = error_of(dump(doc(gpu(**{field: value}))))
    assert err.message.startswith(message) and err.fix is not None and err.fix.startswith(fix)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("two", "is a string ('two'), not a count of 1"),
        (True, "is a boolean (true), not a count of 1"),
        (2, "asks for 2 MIG instances"),
        ("0", "asks for 0 MIG instances"),
    ],
)
def test_a_hami_mig_resource_other_than_1_is_told_to_write_1(value: object, message: str) -> None:
    """Its fix is the one value it takes, not a count of GPUs (2 would be refused in turn)."""
    key = "nvidia.com/mig-1g.10gb"
    err = error_of(dump(doc(gpu(**{key: value}))))
    assert err.field == f"spec.resources.gpu['{key}']"
    assert err.message == message
    assert err.fix == f"a workload gets one MIG instance: write {key}: 1"


# --- errors: each at its exact field -------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        # document
        ({"apiVersion": "gpufrac/v2"}, "apiVersion"),
        ({"spec.node_selector": {"bad key": "x"}}, "spec.node_selector['bad key']"),
        ({"spec.node_selector": {"-zone": "x"}}, "spec.node_selector.-zone"),
        ({"spec.node_selector": {"zone": "eu west"}}, "spec.node_selector.zone"),
        ({"spec.node_selector": {"zone": 3}}, "spec.node_selector.zone"),
        ({"spec.node_selector": ["zone=eu"]}, "spec.node_selector"),
        ({"apiVersion": DELETE}, "apiVersion"),
        ({"kind": "Job"}, "kind"),
        ({"kind": DELETE}, "kind"),
        ({"metadata": DELETE}, "metadata"),
        ({"spec": DELETE}, "spec"),
        ({"status": {}}, "status"),
        ({"metadata": "w"}, "metadata"),
        ({"spec": ["x"]}, "spec"),
        # metadata
        ({"metadata.name": DELETE}, "metadata.name"),
        ({"metadata.uid": "1"}, "metadata.uid"),
        ({"metadata.name": 7}, "metadata.name"),
        ({"metadata.tenant": True}, "metadata.tenant"),
        ({"metadata.tenant": None}, "metadata.tenant"),
        ({"metadata.labels": ["a"]}, "metadata.labels"),
        ({"metadata.labels": {"a": 1}}, "metadata.labels.a"),
        ({"metadata.labels": {"a": True}}, "metadata.labels.a"),
        ({"metadata.labels": {"": "x"}}, "metadata.labels['']"),
        ({"metadata.labels": {"a.b/c": 1}}, "metadata.labels['a.b/c']"),
        ({"spec.env": {"A B": "x"}}, "spec.env['A B']"),
        # spec
        ({"spec.picture": "x"}, "spec.picture"),
        ({"spec.type": "daemon"}, "spec.type"),
        ({"spec.type": True}, "spec.type"),
        ({"spec.command": DELETE}, "spec.command"),
        ({"spec.command": "python app.py"}, "spec.command"),
        ({"spec.command": []}, "spec.command"),
        ({"spec.command": {"a": "b"}}, "spec.command"),
        ({"spec.command": ["python", 3]}, "spec.command[1]"),
        ({"spec.command": ["", "x"]}, "spec.command[0]"),
        ({"spec.env": ["A=1"]}, "spec.env"),
        ({"spec.env": {"PORT": 8000}}, "spec.env.PORT"),
        ({"spec.env": {"DEBUG": True}}, "spec.env.DEBUG"),
        ({"spec.env": {"RATIO": 0.5}}, "spec.env.RATIO"),
        ({"spec.env": {"EMPTY": None}}, "spec.env.EMPTY"),
        ({"spec.env": {"1ABC": "x"}}, "spec.env.1ABC"),
        ({"spec.env": {"A-B": "x"}}, "spec.env.A-B"),
        ({"spec.workdir": 5}, "spec.workdir"),
        ({"spec.workdir": ""}, "spec.workdir"),
        ({"spec.user": 1000}, "spec.user"),
        ({"spec.sharing": "vgpu"}, "spec.sharing"),
        ({"spec.priority": "urgent"}, "spec.priority"),
        ({"spec.priority": True}, "spec.priority"),
        ({"spec.priority": 1.5}, "spec.priority"),
        ({"spec.restart": "sometimes"}, "spec.restart"),
        ({"spec.restart": False}, "spec.restart"),
        ({"spec.backoff_limit": -1}, "spec.backoff_limit"),
        ({"spec.backoff_limit": True}, "spec.backoff_limit"),
        ({"spec.backoff_limit": "3"}, "spec.backoff_limit"),
        ({"spec.deadline_seconds": 0}, "spec.deadline_seconds"),
        ({"spec.deadline_seconds": 1.5}, "spec.deadline_seconds"),
        ({"spec.deadline_seconds": None}, "spec.deadline_seconds"),
        # jobs only / services only
        ({**SERVICE, "spec.backoff_limit": 3}, "spec.backoff_limit"),
        ({**SERVICE, "spec.deadline_seconds": 60}, "spec.deadline_seconds"),
        ({"spec.health": HTTP}, "spec.health"),
        # health
        ({**SERVICE, "spec.health": {}}, "spec.health"),
        ({**SERVICE, "spec.health": {"http": {"port": 1}, "tcp": {"port": 1}}}, "spec.health"),
        ({**SERVICE, "spec.health": {"exec": ["true"]}}, "spec.health.exec"),
        ({**SERVICE, "spec.health": "http"}, "spec.health"),
        ({**SERVICE, "spec.health": {"http": {}}}, "spec.health.http.port"),
        ({**SERVICE, "spec.health": {"http": 8000}}, "spec.health.http"),
        ({**SERVICE, "spec.health": {"http": {"port": 0}}}, "spec.health.http.port"),
        ({**SERVICE, "spec.health": {"http": {"port": 65536}}}, "spec.health.http.port"),
        ({**SERVICE, "spec.health": {"http": {"port": "80"}}}, "spec.health.http.port"),
        ({**SERVICE, "spec.health": {"http": {"port": True}}}, "spec.health.http.port"),
        ({**SERVICE, "spec.health": {"http": {"port": 80, "path": "x"}}}, "spec.health.http.path"),
        ({**SERVICE, "spec.health": {"http": {"port": 80, "path": 1}}}, "spec.health.http.path"),
        ({**SERVICE, "spec.health": {"http": {"port": 80, "host": "a"}}}, "spec.health.http.host"),
        ({**SERVICE, "spec.health": {"tcp": {"port": 80, "path": "/"}}}, "spec.health.tcp.path"),
        ({**SERVICE, "spec.health": {"tcp": {"port": -1}}}, "spec.health.tcp.port"),
        ({**SERVICE, "spec.health": {**HTTP, "period_seconds": 0}}, "spec.health.period_seconds"),
        (
            {**SERVICE, "spec.health": {**HTTP, "initial_delay_seconds": -1}},
            "spec.health.initial_delay_seconds",
        ),
        (
            {**SERVICE, "spec.health": {**HTTP, "initial_delay_seconds": 1.5}},
            "spec.health.initial_delay_seconds",
        ),
        # resources
        ({"spec.resources": DELETE}, "spec.resources"),
        ({"spec.resources": {}}, "spec.resources.gpu"),
        ({"spec.resources": {"gpu": {"count": 1}, "cpu": 2}}, "spec.resources.cpu"),
        ({"spec.resources": "gpu"}, "spec.resources"),
        ({"spec.resources.gpu": 1}, "spec.resources.gpu"),
        ({"spec.resources.gpu": None}, "spec.resources.gpu"),
        (gpu(), "spec.resources.gpu"),
        (gpu(fraction=0.5, mig="1g.18gb"), "spec.resources.gpu.fraction"),
        (gpu(memory=1024, memory_percent=50), "spec.resources.gpu.memory_percent"),
        (gpu(fraction=0.5, memory=1024), "spec.resources.gpu.memory"),
        (gpu(count=1, vram="1GiB"), "spec.resources.gpu.vram"),
        (gpu(count=0), "spec.resources.gpu.count"),
        (gpu(count=True), "spec.resources.gpu.count"),
        (gpu(count=1.5), "spec.resources.gpu.count"),  # 1.0 is 1, as in JSON Schema
        (gpu(count="2"), "spec.resources.gpu.count"),
        (gpu(fraction=0), "spec.resources.gpu.fraction"),
        (gpu(fraction=1), "spec.resources.gpu.fraction"),
        (gpu(fraction=1.5), "spec.resources.gpu.fraction"),
        (gpu(fraction=-0.5), "spec.resources.gpu.fraction"),
        (gpu(fraction=0.0004), "spec.resources.gpu.fraction"),  # rounds to 0 milli-GPU
        (gpu(fraction=0.9996), "spec.resources.gpu.fraction"),  # rounds to a whole GPU
        (gpu(fraction=float("nan")), "spec.resources.gpu.fraction"),
        (gpu(fraction="0.5"), "spec.resources.gpu.fraction"),
        (gpu(fraction=True), "spec.resources.gpu.fraction"),
        (gpu(memory="12 parsecs"), "spec.resources.gpu.memory"),
        (gpu(memory="0GiB"), "spec.resources.gpu.memory"),
        (gpu(memory=0), "spec.resources.gpu.memory"),
        (gpu(memory=1.5), "spec.resources.gpu.memory"),
        (gpu(memory=True), "spec.resources.gpu.memory"),
        (gpu(memory=None), "spec.resources.gpu.memory"),
        (gpu(memory="1GiB", compute="30"), "spec.resources.gpu.compute"),
        (gpu(memory="1GiB", compute="0%"), "spec.resources.gpu.compute"),
        (gpu(memory="1GiB", compute="101%"), "spec.resources.gpu.compute"),
        (gpu(memory="1GiB", compute="30.5%"), "spec.resources.gpu.compute"),
        (gpu(memory="1GiB", compute=0), "spec.resources.gpu.compute"),
        (gpu(memory="1GiB", compute=101), "spec.resources.gpu.compute"),
        (gpu(memory="1GiB", compute=0.3), "spec.resources.gpu.compute"),
        (gpu(memory="1GiB", compute=True), "spec.resources.gpu.compute"),
        (gpu(fraction=0.5, compute="30%"), "spec.resources.gpu.compute"),
        (gpu(mig="1g.18gb", compute=30), "spec.resources.gpu.compute"),
        (gpu(fraction=0.5, gpucores=30), "spec.resources.gpu.gpucores"),
        (gpu(gpumem="1GiB"), "spec.resources.gpu.gpumem"),
        (gpu(gpumem=0), "spec.resources.gpu.gpumem"),
        (gpu(gpumem=True), "spec.resources.gpu.gpumem"),
        (gpu(**{"gpu-memory": "4GiB"}), "spec.resources.gpu.gpu-memory"),
        (gpu(**{"gpu-memory": 1.5}), "spec.resources.gpu.gpu-memory"),
        (gpu(memory="1GiB", gpucores="30%"), "spec.resources.gpu.gpucores"),
        (gpu(memory="1GiB", gpucores=101), "spec.resources.gpu.gpucores"),
        (gpu(memory="1GiB", gpucores=False), "spec.resources.gpu.gpucores"),
        (gpu(**{"gpu-fraction": 1}), "spec.resources.gpu.gpu-fraction"),
        (gpu(**{"gpu-fraction": "half"}), "spec.resources.gpu.gpu-fraction"),
        (gpu(**{"gpu-fraction": "1.0"}), "spec.resources.gpu.gpu-fraction"),
        (gpu(**{"gpu-memory": "2000Mi"}), "spec.resources.gpu.gpu-memory"),
        (gpu(gpucores="101"), "spec.resources.gpu.gpucores"),
        (gpu(**{"nvidia.com/gpumem": "-1"}), "spec.resources.gpu['nvidia.com/gpumem']"),
        (gpu(**{"nvidia.com/mig-1g.10gb": 2}), "spec.resources.gpu['nvidia.com/mig-1g.10gb']"),
        (gpu(**{"nvidia.com/mig-9g.1gb": 1}), "spec.resources.gpu['nvidia.com/mig-9g.1gb']"),
        (
            gpu(**{"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1}),
            "spec.resources.gpu['nvidia.com/mig-2g.20gb']",
        ),
        (gpu(**{"nvidia.com/mig-1g.10gb": 1, "mig": "2g.20gb"}), "spec.resources.gpu.mig"),
        (
            gpu(**{"nvidia.com/mig-1c.2g.20gb": 1}),
            "spec.resources.gpu['nvidia.com/mig-1c.2g.20gb']",
        ),
        (gpu(mig="1g"), "spec.resources.gpu.mig"),
        # any attribute parses (as mig-parted reads names); no GPU model has this one
        (gpu(mig="1g.18gb+xx"), "spec.resources.gpu.mig.profile"),
        (gpu(mig="1g.18gb+me-x"), "spec.resources.gpu.mig"),
        (gpu(mig="1c.3g.71gb"), "spec.resources.gpu.mig"),
        (gpu(mig=7), "spec.resources.gpu.mig"),
        (gpu(mig=["1g.18gb"]), "spec.resources.gpu.mig"),
        (gpu(mig={"model": "h200"}), "spec.resources.gpu.mig.profile"),
        (gpu(mig={"profile": "1g.18gb", "count": 2}), "spec.resources.gpu.mig.count"),
        (gpu(mig={"profile": "bad"}), "spec.resources.gpu.mig.profile"),
        (gpu(mig="9g.999gb"), "spec.resources.gpu.mig.profile"),  # no GPU model has it
        (gpu(mig={"profile": "1g.1gb"}), "spec.resources.gpu.mig.profile"),
        (gpu(mig={"profile": 1}), "spec.resources.gpu.mig.profile"),
        (gpu(mig={"profile": "1g.18gb", "model": "A100-80GB"}), "spec.resources.gpu.mig.profile"),
        (gpu(mig={"profile": "1g.18gb", "model": "v100"}), "spec.resources.gpu.mig.model"),
        (gpu(mig={"profile": "1g.18gb", "model": "a100"}), "spec.resources.gpu.mig.model"),
        (gpu(mig={"profile": "1g.18gb", "model": 100}), "spec.resources.gpu.mig.model"),
        # cross-field rules
        ({**gpu(count=1), "spec.sharing": "mig"}, "spec.sharing"),
        ({**gpu(fraction=0.5), "spec.sharing": "exclusive"}, "spec.sharing"),
        ({**gpu(memory="1GiB"), "spec.sharing": "exclusive"}, "spec.sharing"),
        ({**gpu(memory="1GiB", compute=30), "spec.sharing": "exclusive"}, "spec.sharing"),
        ({**gpu(memory="1GiB", compute=30), "spec.sharing": "timeslice"}, "spec.sharing"),
        ({**gpu(memory="1GiB", gpucores=30), "spec.sharing": "timeslice"}, "spec.sharing"),
        ({**gpu(memory="1GiB", compute="30%"), "spec.sharing": "mig"}, "spec.sharing"),
        ({**gpu(mig="1g.18gb"), "spec.sharing": "mps"}, "spec.sharing"),
        ({**gpu(mig="1g.18gb"), "spec.sharing": "timeslice"}, "spec.sharing"),
        ({**gpu(mig="1g.18gb"), "spec.sharing": "exclusive"}, "spec.sharing"),
        ({**gpu(count=2, fraction=0.5), "spec.sharing": "mig"}, "spec.sharing"),
        ({**gpu(count=2, memory="1GiB", compute=30), "spec.sharing": "mig"}, "spec.sharing"),
        ({**gpu(count=2, memory="1GiB", compute=30), "spec.sharing": "timeslice"}, "spec.sharing"),
        ({**gpu(memory_percent=50), "spec.sharing": "exclusive"}, "spec.sharing"),
    ],
)
def test_errors_name_their_field(changes: dict[str, Any], field: str) -> None:
    err = error_of(dump(doc(changes)))
    assert err.field == field


def test_a_mig_profile_no_gpu_model_has_is_refused_naming_the_known_ones() -> None:
    err = error_of(dump(doc(gpu(mig="9g.999gb"))))
    assert "no GPU model gpufrac knows has the MIG profile 9g.999gb" in err.message
    assert err.fix is not None and "1g.18gb" in err.fix and "7g.141gb" in err.fix


@pytest.mark.parametrize(
    ("value", "milli"), [("10%", 100), ("12.5%", 125), (0.1, 100), (0, 0), ("0%", 0), ("90%", 900)]
)
def test_min_share_values(value: Any, milli: int) -> None:
    assert parse_one({"spec.min_share": value}).min_share_milli == milli


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"spec.qos": "fast"}, "spec.qos"),
        ({"spec.weight": 0}, "spec.weight"),
        ({"spec.weight": 1001}, "spec.weight"),
        ({"spec.weight": 1.5}, "spec.weight"),
        ({"spec.min_share": 10}, "spec.min_share"),
        ({"spec.min_share": "95%"}, "spec.min_share"),
        ({"spec.min_share": "ten"}, "spec.min_share"),
        ({"spec.min_share": True}, "spec.min_share"),
    ],
)
def test_qos_errors_name_their_field(changes: dict[str, Any], field: str) -> None:
    err = error_of(dump(doc(changes)))
    assert err.field == field


def test_unknown_field_error_lists_the_allowed_fields() -> None:
    err = error_of(dump(doc({"spec.resources.gpu.vram": 1})))
    assert err.fix is not None
    for name in ("count", "fraction", "memory", "mig", "compute", "gpumem", "gpu-fraction"):
        assert name in err.fix


@pytest.mark.parametrize(
    "fields", [{}, {"count": 1, "mig": "1g.18gb"}, {"memory": 1, "mig": "1g.18gb"}]
)
def test_zero_or_two_requests_list_the_four(fields: dict[str, Any]) -> None:
    err = error_of(dump(doc(gpu(**fields))))
    assert err.fix is not None
    assert all(kind in err.fix for kind in ("count", "fraction", "memory", "mig"))


def test_plain_string_command_fix_says_to_write_a_list() -> None:
    err = error_of(dump(doc({"spec.command": "python app.py"})))
    assert err.fix is not None and "list" in err.fix


def test_an_env_name_with_a_trailing_newline_is_refused() -> None:
    """``re.match`` with ``$`` takes a trailing newline: ``"A\\n"`` was a valid variable name."""
    assert error_of(dump(doc({"spec.env": {"A\n": "x"}}))).field == "spec.env['A\\n']"


def test_number_in_env_fix_says_to_quote_it() -> None:
    err = error_of(dump(doc({"spec.env": {"PORT": 8000}})))
    assert err.fix is not None and "quote" in err.fix


def test_yaml_is_read_as_yaml_1_2_with_a_warning_where_yaml_1_1_reads_otherwise() -> None:
    # YAML 1.2's core schema, as JSON Schema tools read a file: `no` is a string, true a boolean
    text = dump(doc()).replace("name: w", "name: w\n  tenant: no")
    (read,) = read_objects(text)
    assert read.obj.tenant == "no"
    (warning,) = read.warnings
    assert warning.startswith("metadata.tenant: 'no' is a string ('no') (YAML 1.2")
    assert "a boolean (false) to YAML 1.1 readers: quote it" in warning
    assert not read_objects(text.replace("tenant: no", "tenant: 'no'"))[0].warnings
    assert error_of(text.replace("tenant: no", "tenant: false")).field == "metadata.tenant"


@pytest.mark.parametrize(
    ("written", "value", "yaml11"),
    [
        ("yes", "yes", "a boolean (true)"),
        ("Off", "Off", "a boolean (false)"),
        ("2024-01-01", "2024-01-01", "a date (2024-01-01)"),
        ("1_000", "1_000", "an integer (1000)"),
        ("1:30", "1:30", "an integer (90)"),
        ("0b101", "0b101", "an integer (5)"),
    ],
)
def test_a_yaml_1_1_reading_is_named_by_its_field(written: str, value: str, yaml11: str) -> None:
    text = dump(doc()).replace("name: w", f"name: w\n  labels:\n    on: {written}")
    (read,) = read_objects(text)
    assert read.obj.labels == {"on": value}
    assert [w.split(":", 1)[0] for w in read.warnings] == [
        "metadata.labels.on (the key)",
        "metadata.labels.on",
    ]
    assert f"but {yaml11} to YAML 1.1 readers" in read.warnings[1]


def test_numbers_read_as_yaml_1_2() -> None:
    text = dump(doc({"spec.resources.gpu": {"memory": "1GiB", "compute": 10}}))
    (read,) = read_objects(text.replace("compute: 10", "compute: 010"))
    assert read.obj.gpu.compute_pct == 10  # decimal in YAML 1.2, octal 8 in YAML 1.1
    assert read.warnings == (
        "spec.resources.gpu.compute: '010' is an integer (10) (YAML 1.2, as gpufrac reads it), "
        "but an integer (8) to YAML 1.1 readers: write it as 10 to be read alike everywhere",
    )
    assert read_objects(text.replace("compute: 10", "compute: 0o12"))[0].obj.gpu.compute_pct == 10


# --- DNS labels -----------------------------------------------------------------------------------


@pytest.mark.parametrize("label", ["a", "0", "a-b", "web-1", "1abc", "a" * 63, "x-0-y"])
@pytest.mark.parametrize("where", ["name", "tenant"])
def test_valid_dns_labels(where: str, label: str) -> None:
    assert getattr(parse_one({f"metadata.{where}": label}), where) == label


@pytest.mark.parametrize(
    "label", ["", "A", "Web", "-a", "a-", "a_b", "a.b", "a b", "é", "a" * 64, " a", "web\n"]
)  # "web\n": re.match with $ takes a trailing newline (it was a workload's name)
@pytest.mark.parametrize("where", ["name", "tenant"])
def test_invalid_dns_labels(where: str, label: str) -> None:
    assert error_of(dump(doc({f"metadata.{where}": label}))).field == f"metadata.{where}"


# --- files: several documents, formats, syntax ----------------------------------------------------


def named(name: str, tenant: str = "default", **changes: Any) -> dict[str, Any]:
    return doc({"metadata.name": name, "metadata.tenant": tenant, **changes})


def test_several_documents_in_file_order() -> None:
    text = dump_all([named("a"), named("b"), named("a", "other")])
    assert [(s.tenant, s.name) for s in parse_manifests(text)] == [
        ("default", "a"),
        ("default", "b"),
        ("other", "a"),
    ]


def test_a_bad_third_document_rejects_the_whole_file() -> None:
    text = dump_all([named("a"), named("b"), named("c", **gpu(memory="lots"))])
    result: list[WorkloadSpec] | None = None
    with pytest.raises(InputError) as exc:
        result = parse_manifests(text)
    assert result is None
    assert exc.value.field == "doc[3].spec.resources.gpu.memory"


@pytest.mark.parametrize(
    ("documents", "field"),
    [
        ([named("a"), named("b", **{"spec.bogus": 1})], "doc[2].spec.bogus"),
        ([named("a", **{"metadata.name": "A"}), named("b")], "doc[1].metadata.name"),
        ([named("a"), "just text"], "doc[2]"),
        ([named("a"), named("a")], "doc[2].metadata.name"),
        ([named("a"), named("b"), named("c"), named("b")], "doc[4].metadata.name"),
    ],
)
def test_errors_in_several_documents_are_prefixed(documents: list[Any], field: str) -> None:
    assert error_of(dump_all(documents)).field == field


def test_duplicate_name_says_where_it_was_first() -> None:
    err = error_of(dump_all([named("a", "t"), named("b"), named("a", "t")]))
    assert "doc[1]" in err.message and err.field == "doc[3].metadata.name"


def test_empty_documents_are_skipped_but_count_in_positions() -> None:
    text = dump(named("a")) + "---\n---\n" + dump(named("b", **{"spec.x": 1}))
    assert error_of(text).field == "doc[3].spec.x"
    assert [s.name for s in parse_manifests(dump(named("a")) + "---\n")] == ["a"]


def test_single_document_errors_have_no_prefix() -> None:
    text = "---\n" + dump(named("a", **{"spec.x": 1})) + "---\n"
    assert error_of(text).field == "spec.x"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("", "manifest"),
        ("# nothing here\n", "manifest"),
        ("just text", "manifest"),
        ("[1, 2]", "manifest"),
        ("apiVersion: gpufrac/v1\n  kind: [", "manifest"),
        ("apiVersion: gpufrac/v1\napiVersion: gpufrac/v1\n", "manifest"),
        ('{"apiVersion": "gpufrac/v1", "apiVersion": "gpufrac/v1"}', "manifest"),
    ],
)
def test_file_level_errors_name_the_source(text: str, field: str) -> None:
    assert error_of(text).field == field


def test_source_names_the_file_in_file_level_errors() -> None:
    with pytest.raises(InputError) as exc:
        parse_manifests(":\n  - [", source="jobs.yaml")
    assert exc.value.field == "jobs.yaml"


def test_json_is_accepted_including_tabs() -> None:
    text = json.dumps(doc(gpu(fraction=0.5)), indent="\t")
    assert parse_manifests(text)[0].gpu == GpuRequest(fraction_milli=500)


def test_yaml_flow_mapping_is_not_mistaken_for_json() -> None:
    text = (
        "{apiVersion: gpufrac/v1, kind: Workload, metadata: {name: w},"
        " spec: {command: [a], resources: {gpu: {count: 2}}}}"
    )
    assert parse_manifests(text)[0].gpu == GpuRequest(count=2)


def test_load_manifest_file(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(dump(doc()))
    assert [s.name for s in load_manifest_file(path)] == ["w"]
    path.write_text("kind: [")
    with pytest.raises(InputError) as exc:
        load_manifest_file(path)
    assert exc.value.field == "w.yaml"


@pytest.mark.parametrize(
    "make", [lambda p: None, lambda p: p.mkdir(), lambda p: p.write_bytes(b"\xff\xfe\x00")]
)
def test_unreadable_manifest_file_names_the_path(tmp_path: Path, make: Any) -> None:
    path = tmp_path / "missing.yaml"
    make(path)
    with pytest.raises(InputError) as exc:
        load_manifest_file(path)
    assert exc.value.field == str(path)
    assert exc.value.fix


# --- examples -------------------------------------------------------------------------------------

MANIFEST_EXAMPLES = {
    "whole-gpus.yaml": ["count"],
    "fraction.yaml": ["fraction"],
    "memory-timeslice.yaml": ["memory"],
    "memory-mps.yaml": ["memory"],
    "mig-profile.yaml": ["mig", "mig"],
    "hami-kai-aliases.yaml": [
        "memory",
        "memory",
        "memory",
        "mig",
        "fraction",
        "memory",
        "memory",
        "fraction",
        "memory",
    ],
    "service-with-health.yaml": ["memory"],
    "quickstart.yaml": ["memory", "mig", "memory", "memory", "memory", "memory", "memory"],
}


def test_every_example_is_listed() -> None:
    found = {p.name for p in EXAMPLES.glob("*.yaml")}
    assert found == set(MANIFEST_EXAMPLES)


@pytest.mark.parametrize(("name", "kinds"), sorted(MANIFEST_EXAMPLES.items()))
def test_examples_parse(name: str, kinds: list[str]) -> None:
    path = EXAMPLES / name
    assert path.read_text().startswith("#")
    specs = load_manifest_file(path)
    assert [s.gpu.kind for s in specs] == kinds


def test_example_details() -> None:
    mps = load_manifest_file(EXAMPLES / "memory-mps.yaml")[0]
    assert (mps.gpu.compute_pct, mps.sharing) == (30, "mps")
    mig = load_manifest_file(EXAMPLES / "mig-profile.yaml")
    assert [(s.gpu.mig_profile, s.gpu.mig_model) for s in mig] == [
        ("1g.18gb", None),
        ("3g.40gb", "A100-80GB"),
    ]
    service = load_manifest_file(EXAMPLES / "service-with-health.yaml")[0]
    assert service.type == "service" and service.health is not None
    assert service.health.kind == "http"


# --- docs/manifest.md stays true ------------------------------------------------------------------

DOC = Path(__file__).parents[3] / "docs" / "manifest.md"


def doc_blocks(language: str) -> list[str]:
    parts = DOC.read_text().split("```")
    return [p.removeprefix(language) for p in parts[1::2] if p.startswith(language + "\n")]


def test_docs_worked_example_parses_as_described() -> None:
    example = next(b for b in doc_blocks("yaml") if "nightly-eval" in b)
    embedder, nightly = parse_manifests(example)
    assert embedder.gpu == GpuRequest(memory_mib=12288, compute_pct=30)
    assert (embedder.sharing, embedder.priority, embedder.restart) == ("mps", 100, "always")
    assert embedder.health == HealthCheck("http", 8000, "/healthz", 5, 0)
    assert nightly.gpu == GpuRequest(mig_profile="3g.40gb", mig_model="A100-80GB")
    assert (nightly.priority, nightly.restart, nightly.backoff_limit) == (0, "on-failure", 6)
    assert nightly.deadline_seconds == 7200
    broken = example.replace("compute: 30%}", "compute: 30%, gpumem: 10240}")
    shown = next(b for b in doc_blocks("") if "gpumem" in b)
    with pytest.raises(InputError) as exc:
        parse_manifests(broken)
    assert " ".join(shown.split()) == str(exc.value)


def test_docs_list_every_field_and_alias() -> None:
    text = DOC.read_text()
    for name in manifest.SPEC_FIELDS:
        assert f"`spec.{name}`" in text
    for name in manifest.METADATA_FIELDS:
        assert f"`metadata.{name}`" in text
    for name in (*manifest.REQUEST_KINDS, "compute"):
        assert f"`spec.resources.gpu.{name}`" in text
    for alias, means in manifest.GPU_ALIASES.items():
        assert f"| `{alias}` |" in text and f"| `{means}` |" in text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &a [x, x, x, x, x, x, x, x, x, x]\n"
         + "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n"
                   for p, c in zip("abcdefg", "bcdefgh", strict=True)),
         "expands to more than 100,000 values"),
        ("s: &s " + "x" * 10_000 + "\nl: [" + ", ".join(["*s"] * 200) + "]", "characters"),
        ("[" * 100 + "]" * 100, "nested more than 64"),
        ("[" * 3000 + "]" * 3000, "nested more than 64"),  # past libyaml's own limit (1,000)
        ("a:\n" + "".join(f"{' ' * i}b{i}:\n" for i in range(1, 80)) + " " * 80 + "1",
         "nested more than 64"),  # block style: the scan stops at 65, before any tree
        ('{"a": ' * 5000 + "1" + "}" * 5000, "nested more than 64"),
        ("x: .nan", "not a finite number"),
        ("x: -.inf", "not a finite number"),
        ('{"x": NaN}', "not a finite number"),
        ('{"x": Infinity}', "not a finite number"),
        ("x: " + "9" * 5000, "more than 18 digits"),
        ('{"x": ' + "9" * 5000 + "}", "too many digits"),
        # the hostile review's: any base, any field, and a value that later could not be said
        ("x: 0x" + "f" * 4000, "more than 18 digits"),
        ("x: " + "1" + "0" * 400, "more than 18 digits"),
        ('{"x": 1' + "0" * 400 + "}", "more than 18 digits"),
        ("x: !foo 1", "YAML tag"),
        ("x: !!bool 1", "YAML tag"),
        ('x: !!int "5"', "YAML tag"),
        ("x: !!python/name:os.system x", "YAML tag"),
    ],
)  # fmt: skip
def test_documents_are_bounded(text: str, message: str) -> None:
    with pytest.raises(InputError) as exc:
        load_documents(text, source="body")
    assert message in str(exc.value) and exc.value.fix
    named = ("finite", "18 digits", "YAML tag")  # found at a value: named by its path
    assert exc.value.field == ("x" if any(n in message for n in named) else "body")


def test_a_nan_is_named_by_its_document_and_path() -> None:
    with pytest.raises(InputError) as exc:
        load_documents("a: 1\n---\nb: {c: [1, .NaN]}\n", source="f")
    assert exc.value.field == "doc[2].b.c[1]"


def test_aliases_within_the_bounds_still_work() -> None:
    text = "base: &b {a: 1, b: [1.5, 2]}\nuse: [*b, *b]\n"
    assert load_documents(text, source="x") == [
        {"base": {"a": 1, "b": [1.5, 2]}, "use": [{"a": 1, "b": [1.5, 2]}] * 2}
    ]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('spec: {command: [python, "-c\\0"]}', "spec.command[1]"),
        ('spec: {env: {A: "x\\0y"}}', "spec.env.A"),
        ('{"spec": {"env": {"A\\u0000": "x"}}}', "spec.env['A\\x00']"),
    ],
)
def test_a_nul_character_is_refused_where_it_is(text: str, field: str) -> None:
    with pytest.raises(InputError) as exc:
        load_documents(text, source="f")
    assert exc.value.field == field and "NUL" in exc.value.message


@pytest.mark.parametrize(
    ("where", "field"),
    [
        ('"labels": {"\\ud800": "v"}', "metadata.labels['\\ud800']"),
        ('"labels": {"k": "\\udfff"}', "metadata.labels.k"),
        ('"labels": {"\\u0000": "v"}', "metadata.labels['\\x00']"),
    ],
)
def test_a_lone_surrogate_in_json_is_refused_where_it_is(where: str, field: str) -> None:
    """A JSON \\ud800 escape without its pair is no character: stored, no answer naming the
    workload could be written as UTF-8 (each was a 500). Refused, named by its path."""
    body = (
        '{"apiVersion": "gpufrac/v1", "kind": "Workload", "metadata": {"name": "x", '
        + where
        + '}, "spec": {"command": ["a"], "resources": {"gpu": {"memory": "1Gi"}}}}'
    )
    with pytest.raises(InputError) as exc:
        read_objects(body)
    assert exc.value.field == field
    assert ("surrogate" if "ud" in where else "NUL") in exc.value.message
    assert all(not 0xD800 <= ord(c) <= 0xDFFF for c in str(exc.value.field))


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({"host_memory": "256Mi", "cpus": 0.5, "pids": 64}, (256, 500, 64)),
        ({"host_memory": "2Gi", "cpus": 2}, (2048, 2000, None)),
        ({}, (None, None, None)),
    ],
)
def test_host_limits(resources: dict[str, Any], expected: tuple[int | None, ...]) -> None:
    changes = {f"spec.resources.{k}": v for k, v in resources.items()}
    spec = parse_one(changes)
    assert (spec.host_memory_mib, spec.cpus_milli, spec.pids) == expected


@pytest.mark.parametrize(
    ("key", "value"), [("host_memory", "lots"), ("cpus", 0), ("cpus", "two"), ("pids", 0)]
)
def test_host_limit_errors_name_their_field(key: str, value: Any) -> None:
    err = error_of(dump(doc({f"spec.resources.{key}": value})))
    assert err.field == f"spec.resources.{key}"


def _flow(values: int) -> str:
    return "a: [" + ",".join(["1"] * (values - 3)) + "]\n"  # the mapping, its key, the list: +3


def test_a_manifest_over_its_values_is_too_large_before_any_tree_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound is checked as the text is scanned: the loader that builds the tree is never
    asked for a node, nor is JSON read (a 600 KB flow list took 10 s to build before)."""
    from gpufrac.errors import TooLarge
    from gpufrac.model import manifest_fields

    def built(*_args: object, **_kw: object) -> None:
        raise AssertionError("a tree was built")

    monkeypatch.setattr(manifest_fields.StrictYamlLoader, "check_node", built)
    monkeypatch.setattr(manifest_fields.StrictYamlLoader, "get_node", built)
    monkeypatch.setattr(manifest_fields.json, "loads", built)
    with pytest.raises(TooLarge, match="more than 1,000 values") as e:
        load_documents(_flow(1001), source="body", max_values=1000, bound="max_manifest_nodes")
    assert e.value.field == "body" and "max_manifest_nodes" in e.value.message
    with pytest.raises(TooLarge):
        load_documents(_flow(300_000), source="body", max_values=20_000)
    as_json = '{"a": [' + ",".join(["1"] * 1000) + "]}"
    with pytest.raises(TooLarge):
        load_documents(as_json, source="body", max_values=1000)
    # commas, colons and brackets inside strings are not values
    monkeypatch.undo()
    text = '{"a": "' + ",:[{" * 5000 + '"}'
    assert load_documents(text, source="body", max_values=100) == [{"a": ",:[{" * 5000}]


def test_a_manifest_at_its_bound_of_values_is_read() -> None:
    assert load_documents(_flow(1000), source="body", max_values=1000) == [{"a": [1] * 997}]
    many = "---\n".join(f"k{i}: v\n" for i in range(300))  # 300 documents of 3 values
    assert len(load_documents(many, source="body", max_values=900)) == 300
    with pytest.raises(InputError, match="more than 899 values"):
        load_documents(many, source="body", max_values=899)


@pytest.mark.parametrize(
    "loc",
    [
        ("spec", "resources", "gpu", "nvidia.com/mig-1g.10gb"),
        ("spec", "command", 1),
        ("metadata", "labels", "a'b.c]"),
        ("metadata", "labels", ""),
        ("spec", "node_selector", "zone!"),
        ("doc", 2, "spec", 'q"[x]'),
    ],
)
def test_a_field_path_reads_back_into_its_parts(loc: tuple[str | int, ...]) -> None:
    """What a 422's ``loc`` lists: each key whole (dots, quotes and brackets in it kept), an
    index as its digits."""
    from gpufrac.model.manifest_errors import field_parts, field_path

    assert field_parts(field_path(loc)) == [str(p) for p in loc]
