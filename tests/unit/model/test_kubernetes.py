"""A Kubernetes object given as a manifest: gpufrac says what it is and shows the gpufrac manifest
that does the same, its GPU request read from the pod template's limits and annotations with the
aliases a manifest accepts (HAMi's and KAI's, string values included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufrac.cli.app import app
from gpufrac.errors import InputError
from gpufrac.model.manifest import parse_manifests
from gpufrac.model.workload import GpuRequest, WorkloadSpec


def pod(
    limits: dict[str, Any] | None = None, annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A pod template (or a Pod's body) with one container."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "ubuntu:22.04",
        "command": ["python", "train.py"],
    }
    if limits is not None:
        container["resources"] = {"limits": limits}
    out: dict[str, Any] = {"spec": {"containers": [container], **spec}}
    if annotations is not None:
        out["metadata"] = {"annotations": annotations}
    return out


def obj(kind: str, template: dict[str, Any], api: str = "apps/v1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api,
        "kind": kind,
        "metadata": {"name": "gpu-app"},
        "spec": {**spec, "template": template},
    }


def refusal(raw: dict[str, Any]) -> InputError:
    with pytest.raises(InputError) as exc:
        parse_manifests(yaml.safe_dump(raw))
    return exc.value


def shown(err: InputError) -> WorkloadSpec:
    """The gpufrac manifest the error shows, read as a manifest."""
    assert err.fix is not None
    text = err.fix.split("does the same:\n", 1)[1]
    (spec,) = parse_manifests(text)
    assert isinstance(spec, WorkloadSpec)
    return spec


HAMI_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "gpu-pod"},
    **pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
}


@pytest.mark.parametrize(
    ("raw", "kind", "gpu"),
    [
        (HAMI_POD, "Pod", GpuRequest(memory_mib=3000, compute_pct=30)),
        (
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p"},
                **pod({"nvidia.com/gpu": 1}),
            },
            "Pod",
            GpuRequest(count=1),
        ),
        (
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p"},
                **pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}),
            },
            "Pod",
            GpuRequest(memory_pct=50),
        ),
        (
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p"},
                **pod({"nvidia.com/mig-1g.10gb": 1}),
            },
            "Pod",
            GpuRequest(mig_profile="1g.10gb"),
        ),
        (
            obj("Deployment", pod(annotations={"gpu-fraction": "0.5"}), replicas=2),
            "Deployment",
            GpuRequest(fraction_milli=500),
        ),
        (obj("StatefulSet", pod({"nvidia.com/gpu": "2"})), "StatefulSet", GpuRequest(count=2)),
        # HAMi's vGPUs on two GPUs, KAI's fraction of two: a share of each of two GPUs
        (
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p"},
                **pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": "3000"}),
            },
            "Pod",
            GpuRequest(memory_mib=3000, devices=2),
        ),
        # HAMi's README example: two vGPUs of 3000 MiB and 30% of the cores each (MPS)
        (
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p"},
                **pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}),
            },
            "Pod",
            GpuRequest(memory_mib=3000, compute_pct=30, devices=2),
        ),
        (
            obj(
                "Deployment",
                pod(annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}),
            ),
            "Deployment",
            GpuRequest(fraction_milli=500, devices=2),
        ),
        (
            obj(
                "Job",
                pod(annotations={"gpu-memory": "2000"}, restartPolicy="Never"),
                api="batch/v1",
                backoffLimit=3,
            ),
            "Job",
            GpuRequest(memory_mib=2000),
        ),
        (
            obj(
                "Job",
                pod(
                    {"nvidia.com/gpu": "1"},
                    annotations={"gpu-fraction": "0.25", "gpu-fraction-num-devices": "1"},
                ),
                api="batch/v1",
            ),
            "Job",
            GpuRequest(fraction_milli=250),
        ),
    ],
)
def test_kubernetes_object_is_named_and_its_gpufrac_manifest_shown(
    raw: dict[str, Any], kind: str, gpu: GpuRequest
) -> None:
    err = refusal(raw)
    assert err.field == "apiVersion"
    assert f"is a Kubernetes {kind}" in err.message and "not a gpufrac manifest" in err.message
    spec = shown(err)
    assert spec.gpu == gpu
    assert spec.image == "ubuntu:22.04" and spec.command == ("python", "train.py")
    assert spec.type == ("job" if kind == "Job" else "service")


def test_job_settings_carry_over_and_replicas_are_noted() -> None:
    job = shown(
        refusal(
            obj(
                "Job",
                pod(annotations={"gpu-memory": "2000"}, restartPolicy="Never"),
                api="batch/v1",
                backoffLimit=3,
            )
        )
    )
    assert (job.restart, job.backoff_limit) == ("never", 3)
    err = refusal(obj("Deployment", pod({"nvidia.com/gpu": 1}), replicas=3))
    assert err.fix is not None and "runs 3 replicas" in err.fix


def test_the_gpu_container_is_the_workload_and_host_limits_carry_over() -> None:
    template = pod(annotations={"gpu-fraction": "0.5"})
    template["spec"]["containers"] = [
        {"name": "sidecar", "image": "busybox"},
        {
            "name": "main",
            "image": "vllm:x",
            "args": ["--model", "m"],
            "env": [{"name": "A", "value": "1"}],
            "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "8Gi", "cpu": "500m"}},
        },
    ]
    spec = shown(refusal(obj("Deployment", template)))
    assert (spec.image, spec.command, spec.env) == ("vllm:x", ("--model", "m"), {"A": "1"})
    assert (spec.host_memory_mib, spec.cpus_milli) == (8192, 500)
    assert spec.gpu == GpuRequest(fraction_milli=500)


def test_an_unreadable_gpu_request_is_said_and_nothing_shown() -> None:
    raw = {**HAMI_POD, **pod({"nvidia.com/gpumem": "3GiB"})}
    err = refusal(raw)
    assert "is a Kubernetes Pod" in err.message
    assert err.fix is not None and "nvidia.com/gpumem" in err.fix and "3GiB" in err.fix
    assert "does the same" not in err.fix


def test_another_kubernetes_kind_is_named() -> None:
    err = refusal({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}})
    assert "is a Kubernetes Service" in err.message
    assert err.fix is not None and "kind: Workload" in err.fix


def test_validate_says_so_through_the_cli(tmp_path: Path) -> None:
    f = tmp_path / "pod.yaml"
    f.write_text(yaml.safe_dump(HAMI_POD))
    r = CliRunner().invoke(app, ["validate", str(f)])
    assert r.exit_code == 2
    out = " ".join(r.stderr.split())
    assert "is a Kubernetes Pod (gpu-pod)" in out and "apiVersion: gpufrac/v1" in out
    assert "memory: 3000Mi" in out and "compute: 30%" in out


def test_docs_show_what_is_said() -> None:
    doc = Path(__file__).parents[3] / "docs" / "manifest.md"
    block = next(b for b in doc.read_text().split("```")[1::2] if "validate pod.yaml" in b)
    said = block.split("$ gpufrac validate pod.yaml\n", 1)[1].removeprefix("error: pod.yaml: ")
    raw = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-pod"},
        **pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
    }
    raw["spec"]["containers"][0]["image"] = "ubuntu:22.04"
    assert " ".join(said.split()) == " ".join(str(refusal(raw)).split())


@pytest.mark.parametrize(
    "raw",
    [
        {"apiVersion": "v1", "kind": "Workload", "metadata": {"name": "w"}},
        {"apiVersion": "gpufrac/v2", "kind": "Deployment", "metadata": {"name": "w"}},
        {"apiVersion": "acme/v1", "kind": "Deployment", "metadata": {"name": "w"}},
    ],
)
def test_a_gpufrac_document_with_a_mistyped_api_version_is_not_called_kubernetes(
    raw: dict[str, Any],
) -> None:
    err = refusal(raw)
    assert "Kubernetes" not in str(err)
    assert err.field == "apiVersion" and err.fix == "write apiVersion: gpufrac/v1"


def test_a_pod_that_runs_its_images_entrypoint_is_told_to_write_the_command() -> None:
    body = pod({"nvidia.com/gpu": 1})
    del body["spec"]["containers"][0]["command"]
    err = refusal({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, **body})
    assert err.fix is not None and "write spec.command as the image's ENTRYPOINT and CMD" in err.fix


def test_a_name_with_control_characters_is_said_without_them() -> None:
    body = pod({"nvidia.com/gpu": 1})
    name = "\x1b[2J\x1b[31mPWN\x1b[0m\nerror: all good"
    err = refusal({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, **body})
    assert "\\x1b[2J" in err.message and "\\x0aerror: all good" in err.message
    assert not any(ord(c) < 32 for c in err.message)


def test_a_cpu_limit_that_is_no_finite_number_is_left_out() -> None:
    for cpu in ("inf", "nan", "-1", "1" + "0" * 40):
        shown_spec = shown(refusal(obj("Deployment", pod({"nvidia.com/gpu": 1, "cpu": cpu}))))
        assert shown_spec.cpus_milli is None, cpu
