"""The JSON Schemas generated from the manifest and settings models: the committed files match
them, every example passes them (and the parser), and they refuse what the parser refuses."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest

from gpufrac.model.manifest import parse_objects
from gpufrac.model.manifest_fields import load_documents
from gpufrac.model.schema import (
    MANIFEST_SCHEMA_FILE,
    SETTINGS_SCHEMA_FILE,
    manifest_json_schema,
    schema_text,
    settings_json_schema,
)
from gpufrac.model.settings import parse_settings

ROOT = Path(__file__).parents[3]
SCHEMAS = ROOT / "schemas"
EXAMPLES = ROOT / "examples"
MODELINE = "# yaml-language-server: $schema="
# Files under examples/ that are neither manifests nor gpufrac.yaml: NVIDIA mig-parted configs.
NOT_OURS = ("mig-parted",)
MANIFEST = jsonschema_rs.validator_for(manifest_json_schema())
SETTINGS = jsonschema_rs.validator_for(settings_json_schema())
WORKLOAD: dict[str, Any] = {
    "apiVersion": "gpufrac/v1",
    "kind": "Workload",
    "metadata": {"name": "w"},
    "spec": {"command": ["python", "-c", "pass"], "resources": {"gpu": {"memory": "12GiB"}}},
}
DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "gpufrac/v1",
    "kind": "Deployment",
    "metadata": {"name": "d"},
    "spec": {"template": {"model": "m.mod:make", "resources": {"gpu": {"fraction": 0.25}}}},
}


def examples() -> list[Path]:
    found = sorted(EXAMPLES.rglob("*.yaml"))
    return [p for p in found if not any(part in NOT_OURS for part in p.parts)]


def is_settings(path: Path) -> bool:
    return path.name == "gpufrac.yaml"


@pytest.mark.parametrize(
    ("name", "generate"),
    [(MANIFEST_SCHEMA_FILE, manifest_json_schema), (SETTINGS_SCHEMA_FILE, settings_json_schema)],
)
def test_committed_schemas_are_the_generated_ones(name: str, generate: Any) -> None:
    assert (SCHEMAS / name).read_text() == schema_text(generate()), (
        f"schemas/{name} is stale: run gpufrac schema{' --settings' if 'settings' in name else ''}"
        f" -o schemas/{name}"
    )


def test_examples_are_found() -> None:
    names = {p.relative_to(EXAMPLES).as_posix() for p in examples()}
    assert {"quickstart.yaml", "serving/deployment.yaml", "operator/gpufrac.yaml"} <= names


@pytest.mark.parametrize("path", examples(), ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_every_example_validates_against_its_schema(path: Path) -> None:
    text = path.read_text()
    first = text.splitlines()[0]
    assert first.startswith(MODELINE), f"{path} has no yaml-language-server modeline"
    schema_file = (path.parent / first.removeprefix(MODELINE)).resolve()
    expected = SETTINGS_SCHEMA_FILE if is_settings(path) else MANIFEST_SCHEMA_FILE
    assert schema_file == (SCHEMAS / expected).resolve()
    validator = SETTINGS if is_settings(path) else MANIFEST
    documents = [d for d in load_documents(text, source=path.name) if d is not None]
    assert documents
    for document in documents:
        errors = [e.message for e in validator.iter_errors(document)]
        assert not errors, f"{path}: {errors}"
    if is_settings(path):
        parse_settings(text)
    else:
        assert len(parse_objects(text)) == len(documents)


def changed(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


@pytest.mark.parametrize(
    ("base", "path", "value"),
    [
        (WORKLOAD, "spec.picture", "x"),  # an unknown field
        (WORKLOAD, "spec.resources.gpu.vram", 1),
        (WORKLOAD, "spec.resources.gpu.memory", "12 parsecs"),  # a bad unit
        (WORKLOAD, "spec.resources.gpu.memory", "12XB"),
        (WORKLOAD, "spec.resources.gpu.memory", 0),
        (WORKLOAD, "spec.resources.gpu.compute", "101%"),
        (WORKLOAD, "spec.resources.gpu.compute", "30"),
        (WORKLOAD, "spec.resources.gpu", {"fraction": 1}),
        (WORKLOAD, "spec.resources.gpu", {}),
        (WORKLOAD, "spec.resources.gpu", {"mig": "1c.3g.71gb"}),
        (WORKLOAD, "spec.min_share", "95%"),
        (WORKLOAD, "spec.priority", "urgent"),
        (WORKLOAD, "spec.priority", True),
        (WORKLOAD, "spec.command", "python app.py"),
        (WORKLOAD, "spec.command", []),
        (WORKLOAD, "spec.env", {"1ABC": "x"}),
        (WORKLOAD, "spec.env", {"PORT": 8000}),
        (WORKLOAD, "spec.deadline_seconds", None),  # null is never a value
        (WORKLOAD, "spec.health", {"http": {"port": 80}, "tcp": {"port": 80}}),
        (WORKLOAD, "metadata.name", "Web"),
        (WORKLOAD, "kind", "Job"),
        (WORKLOAD, "apiVersion", "gpufrac/v2"),
        (WORKLOAD, "spec.resources.gpu", {"gpu-memory": "2000Mi"}),
        (WORKLOAD, "spec.resources.gpu", {"gpu-fraction": "half"}),
        (WORKLOAD, "spec.resources.gpu", {"nvidia.com/mig-1g.10gb": 2}),
        (DEPLOYMENT, "spec.template.model", "my_models"),
        (DEPLOYMENT, "spec.template.health", {"tcp": {"port": 80}}),
        (DEPLOYMENT, "spec.autoscale", {"max": 3}),
        (DEPLOYMENT, "metadata.name", "a" * 51),
        # not image references: never an engine's option
        (WORKLOAD, "spec.image", "-h"),
        (WORKLOAD, "spec.image", "--privileged"),
        (WORKLOAD, "spec.image", "localhost/x:1 -v"),
        (DEPLOYMENT, "spec.template.image", "-v"),
        # what gpufrac hands every workload itself
        (WORKLOAD, "spec.env", {"CUDA_VISIBLE_DEVICES": "0"}),
        (WORKLOAD, "spec.env", {"GPUFRAC_ARBITER": "/tmp/x"}),
        (WORKLOAD, "spec.env", {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=100G"}),
        (DEPLOYMENT, "spec.template.env", {"NVIDIA_VISIBLE_DEVICES": "all"}),
    ],
)
def test_the_schema_refuses_what_the_parser_refuses(
    base: dict[str, Any], path: str, value: Any
) -> None:
    document = changed(base, path, value)
    assert not MANIFEST.is_valid(document)
    with pytest.raises(ValueError):
        parse_objects(json.dumps(document))


@pytest.mark.parametrize(
    ("base", "path", "value"),
    [
        (WORKLOAD, "spec.resources.gpu", {"memory": 512, "compute": "30%"}),
        (WORKLOAD, "spec.resources.gpu", {"gpumem": 8192, "gpucores": 25}),
        (WORKLOAD, "spec.resources.gpu", {"mig": "MIG 1g.18gb+me"}),
        (WORKLOAD, "spec.resources.gpu", {"mig": {"profile": "1g.10gb", "model": "A100-80GB"}}),
        (WORKLOAD, "spec.resources.gpu", {"gpu-fraction": 0.5}),
        # HAMi's limits and KAI's annotations as their users write them, strings included
        (WORKLOAD, "spec.resources.gpu", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
        (WORKLOAD, "spec.resources.gpu", {"nvidia.com/gpumem-percentage": 50}),
        (WORKLOAD, "spec.resources.gpu", {"nvidia.com/gpucores": "30"}),
        (WORKLOAD, "spec.resources.gpu", {"nvidia.com/mig-1g.10gb": 1}),
        (WORKLOAD, "spec.resources.gpu", {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "1"}),
        (WORKLOAD, "spec.resources.gpu", {"gpu-memory": "2000"}),
        (WORKLOAD, "spec.resources.gpu", {"memory_percent": "40%", "compute": "60%"}),
        (WORKLOAD, "spec.min_share", "12.5%"),
        (WORKLOAD, "spec.priority", -7),
        (WORKLOAD, "spec.env", {"A_1": "1"}),
        (WORKLOAD, "spec.image", "nvcr.io/nvidia/tritonserver:24.05-py3"),
        (WORKLOAD, "spec.image", "localhost:5000/team/model@sha256:" + "ab" * 32),
        (WORKLOAD, "spec.env", {"GPUFRAC_TORCH_MEMORY_FRACTION": "0.3", "CUDA_MPS": "x"}),
        (WORKLOAD, "metadata.labels", {"app.kubernetes.io/name": "x"}),
        (DEPLOYMENT, "spec.autoscale", {"min_replicas": 0, "p99_latency_ms": 100}),
    ],
)
def test_the_schema_accepts_what_the_parser_accepts(
    base: dict[str, Any], path: str, value: Any
) -> None:
    document = changed(base, path, value)
    assert MANIFEST.is_valid(document), [e.message for e in MANIFEST.iter_errors(document)]
    assert len(parse_objects(json.dumps(document))) == 1


@pytest.mark.parametrize(
    ("settings", "valid"),
    [
        ({"tenants": {"search": {"gpu_memory": "200GiB", "gpus": 2.5}}}, True),
        ({"tenants": {"Search": {}}}, False),  # not a DNS label
        ({"tenants": {"a": {"cpus": 4}}}, False),
        ({"tenant": {}}, False),
        ({"api_max_body": "lots"}, False),
        ({"placement_policy": "random"}, False),
        ({"tenant_uids": [5]}, False),
        ({"job_min_share": "10%", "api_max_body": "4MiB"}, True),
    ],
)
def test_the_settings_schema(settings: dict[str, Any], valid: bool) -> None:
    assert SETTINGS.is_valid(settings) is valid


def test_the_schema_describes_the_main_fields() -> None:
    spec = manifest_json_schema()["$defs"]["WorkloadSpecFields"]["properties"]
    for name in ("command", "resources", "sharing", "priority", "qos", "min_share"):
        assert spec[name].get("description"), name
