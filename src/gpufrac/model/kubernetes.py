"""Kubernetes objects given where a gpufrac manifest is expected: what gpufrac says of them.

A Pod, Deployment, StatefulSet, Job (and the other kinds with a pod template) is not a gpufrac
manifest. ``kubernetes_refusal`` says which object it is and shows the gpufrac manifest that would
do the same (``equivalent``): the container that asks for a GPU (else the first) as the workload,
its GPU request read from the container's ``resources.limits`` and the pod template's annotations
with the same aliases a manifest accepts (HAMi's ``nvidia.com/gpumem``, KAI's ``gpu-fraction``,
..., ``model.gpu_manifest.GPU_ALIASES``), written under gpufrac's own field names. Pure: a mapping
in, a mapping and notes out.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from gpufrac.errors import InputError
from gpufrac.model.gpu_manifest import GPU_ALIASES, MIG_RESOURCE, Gpu
from gpufrac.model.workload import MILLI, GpuRequest

# each kind with a pod template: where the template is, and the workload type it means
_TEMPLATE_AT: dict[str, tuple[tuple[str, ...], str]] = {
    "Pod": ((), "service"),
    "Deployment": (("spec", "template"), "service"),
    "StatefulSet": (("spec", "template"), "service"),
    "ReplicaSet": (("spec", "template"), "service"),
    "DaemonSet": (("spec", "template"), "service"),
    "Job": (("spec", "template"), "job"),
    "CronJob": (("spec", "jobTemplate", "spec", "template"), "job"),
}
KUBERNETES_KINDS = tuple(_TEMPLATE_AT)
_RESTART = {"Always": "always", "OnFailure": "on-failure", "Never": "never"}
_NOT_A_LABEL = re.compile(r"[^a-z0-9-]+")


@dataclass
class Equivalent:
    """The gpufrac manifest doing what a Kubernetes object does, and what it leaves out."""

    manifest: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        return yaml.safe_dump(self.manifest, sort_keys=False, default_flow_style=None).strip()


_CORE_VERSIONS = frozenset({"v1"})
_GROUPS = frozenset({"apps", "batch", "extensions"})


def is_kubernetes_object(raw: dict[str, Any]) -> bool:
    """A mapping written as a Kubernetes object: any kind but gpufrac's ``Workload`` under a
    Kubernetes API version (``v1``, ``apps/v1``, ``batch/v1``, ``*.k8s.io/*``), or a kind with a
    pod template other than ``Deployment`` (gpufrac has one too) under any version not gpufrac's.
    A ``Workload`` under another version is gpufrac's, its ``apiVersion`` mistyped."""
    version, kind = raw.get("apiVersion"), raw.get("kind")
    if not isinstance(version, str) or version.startswith("gpufrac/") or not isinstance(kind, str):
        return False
    if kind == "Workload":
        return False
    group = version.split("/", 1)[0] if "/" in version else ""
    kubernetes = version in _CORE_VERSIONS or group in _GROUPS or ".k8s.io/" in version
    return kubernetes or (kind in _TEMPLATE_AT and kind != "Deployment")


def kubernetes_refusal(raw: dict[str, Any], api_version: str) -> InputError:
    """The error for a Kubernetes object: what it is, and the gpufrac manifest that does the same
    (or, where its GPU request cannot be read or it runs no pod, why)."""
    kind = str(raw["kind"])
    name = _get(raw, "metadata", "name")
    # the sender's text, with its control characters (a line break, an escape) written out
    what = f"a Kubernetes {_plain(kind)}" + (f" ({_plain(name)})" if isinstance(name, str) else "")
    message = f"is {what} (apiVersion {_plain(str(raw['apiVersion']))}), not a gpufrac manifest"
    if kind not in _TEMPLATE_AT:
        return InputError(
            message,
            field="kind",
            fix=f"gpufrac runs workloads: write a gpufrac manifest (apiVersion: {api_version}, "
            f"kind: Workload); given a {', '.join(KUBERNETES_KINDS)}, gpufrac shows the "
            "manifest that does the same",
        )
    try:
        found = equivalent(raw)
    except InputError as exc:
        return InputError(
            message,
            field="apiVersion",
            fix=f"write a gpufrac manifest (apiVersion: {api_version}); its GPU request could "
            f"not be read: {exc}",
        )
    notes = "".join(f"\n# {n}" for n in found.notes)
    return InputError(
        message,
        field="apiVersion",
        fix=f"write the gpufrac manifest that does the same:{notes}\n{found.text()}\n",
    )


def equivalent(raw: dict[str, Any]) -> Equivalent:
    """The gpufrac ``kind: Workload`` document doing what Kubernetes object ``raw`` does; an
    ``InputError`` where its GPU request is not one gpufrac reads."""
    kind = str(raw["kind"])
    at, default_type = _TEMPLATE_AT[kind]
    template = _get(raw, *at) if at else raw
    pod = _mapping(_get(template, "spec"))
    meta = _mapping(_get(template, "metadata"))
    containers = [c for c in _list(pod.get("containers")) if isinstance(c, dict)]
    notes: list[str] = []
    gpu_containers = [c for c in containers if _gpu_limits(c)]
    container = (gpu_containers or containers or [{}])[0]
    if len(containers) > 1:
        notes.append(
            f"of its {len(containers)} containers, {container.get('name', 'the first')!r} is "
            "the workload: a gpufrac workload runs one command"
        )
    if len(gpu_containers) > 1:
        notes.append("more than one container asks for a GPU: only the first is kept")
    asked = _gpu_request(container, _mapping(meta.get("annotations")))
    spec: dict[str, Any] = {}
    restart = _RESTART.get(str(pod.get("restartPolicy")))
    kind_type = default_type
    if kind == "Pod" and restart in ("on-failure", "never"):
        kind_type = "job"
    spec["type"] = kind_type
    command = [str(x) for x in (*_list(container.get("command")), *_list(container.get("args")))]
    if command:
        spec["command"] = command
    if isinstance(container.get("image"), str):
        spec["image"] = container["image"]
        if container.get("command"):
            notes.append(
                "Kubernetes' command replaces the image's entrypoint; gpufrac's is given to it"
            )
        elif not command:
            notes.append(
                "the Pod runs its image's own entrypoint, but gpufrac runs the command given: "
                "write spec.command as the image's ENTRYPOINT and CMD (podman image inspect "
                "--format '{{.Config.Entrypoint}} {{.Config.Cmd}}' IMAGE)"
            )
    elif not command:
        notes.append("it names no command or image: write spec.command")
    env = {
        str(e["name"]): str(e["value"])
        for e in _list(container.get("env"))
        if isinstance(e, dict) and "name" in e and "value" in e
    }
    if env:
        spec["env"] = env
    if isinstance(container.get("workingDir"), str):
        spec["workdir"] = container["workingDir"]
    if asked is None:
        notes.append("it asks for no GPU: say what it needs in spec.resources.gpu")
        resources: dict[str, Any] = {"gpu": {"count": 1}}
    else:
        resources = {"gpu": asked}
    limits = _mapping(_get(container, "resources", "limits"))
    if isinstance(limits.get("memory"), str | int):
        resources["host_memory"] = limits["memory"]
    cpus = _cpus(limits.get("cpu"))
    if cpus is not None:
        resources["cpus"] = cpus
    spec["resources"] = resources
    if restart is not None and not (kind_type == "service" and restart == "always"):
        spec["restart"] = restart
    job = _mapping(_get(raw, "spec")) if kind == "Job" else {}
    if isinstance(job.get("backoffLimit"), int) and kind_type == "job":
        spec["backoff_limit"] = job["backoffLimit"]
    if isinstance(job.get("activeDeadlineSeconds"), int):
        spec["deadline_seconds"] = job["activeDeadlineSeconds"]
    selector = pod.get("nodeSelector")
    if isinstance(selector, dict) and selector:
        spec["node_selector"] = {str(k): str(v) for k, v in selector.items()}
    replicas = _get(raw, "spec", "replicas")
    if isinstance(replicas, int) and replicas > 1:
        notes.append(
            f"it runs {replicas} replicas: apply one workload per replica (each its own name), "
            "or see kind: Deployment in docs/manifest.md"
        )
    metadata: dict[str, Any] = {"name": _label(_get(raw, "metadata", "name"))}
    namespace = _get(raw, "metadata", "namespace")
    if isinstance(namespace, str) and namespace != "default":
        metadata["tenant"] = _label(namespace)
    manifest = {"apiVersion": "gpufrac/v1", "kind": "Workload", "metadata": metadata}
    return Equivalent({**manifest, "spec": spec}, notes)


def _gpu_limits(container: dict[str, Any]) -> dict[str, Any]:
    """The GPU resources among a container's limits (requests where limits name none)."""
    out: dict[str, Any] = {}
    for part in ("requests", "limits"):  # limits win where both name one
        got = _mapping(_get(container, "resources", part))
        out |= {k: v for k, v in got.items() if k in GPU_ALIASES or str(k).startswith(MIG_RESOURCE)}
    return out


def _gpu_request(container: dict[str, Any], annotations: dict[str, Any]) -> dict[str, Any] | None:
    """A container's GPU request in gpufrac's own field names, read with the aliases a manifest
    accepts from its limits and its pod's annotations; None where it asks for none."""
    written = _gpu_limits(container) | {k: v for k, v in annotations.items() if k in GPU_ALIASES}
    if not written:
        return None
    try:
        request = Gpu.model_validate(written).request()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        fix = (first.get("ctx") or {}).get("fix")
        raise InputError(
            f"{where}: {first['msg']}" + (f" ({fix})" if fix else ""), field="resources"
        ) from None
    return _fields(request)


def _fields(r: GpuRequest) -> dict[str, Any]:
    """A GPU request as a manifest writes it, in gpufrac's own field names."""
    if r.count is not None:
        return {"count": r.count}
    if r.mig_profile is not None:
        return {"mig": r.mig_profile}
    out: dict[str, Any] = {} if r.devices == 1 else {"count": r.devices}  # a share of each
    if r.fraction_milli is not None:
        return {**out, "fraction": r.fraction_milli / MILLI}
    if r.memory_mib is not None:
        out["memory"] = f"{r.memory_mib}Mi"
    if r.memory_pct is not None:
        out["memory_percent"] = f"{r.memory_pct}%"
    if r.compute_pct is not None:
        out["compute"] = f"{r.compute_pct}%"
    return out


def _cpus(value: object) -> float | int | None:
    """A Kubernetes CPU quantity (``2``, ``500m``, ``"1.5"``) as a number of CPUs."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        number: float = value
    elif isinstance(value, str) and len(value) <= 32:
        text = value.strip()
        try:
            number = int(text[:-1]) / 1000 if text.endswith("m") else float(text)
        except (ValueError, OverflowError):
            return None
    else:
        return None
    if not math.isfinite(number) or not 0 < number <= 1e6:  # inf, 1e400, nan: not a CPU count
        return None
    return int(number) if number == int(number) else number


def _label(value: object) -> str:
    """A Kubernetes name as a DNS label: lowercased, each run of other characters a '-'."""
    text = _NOT_A_LABEL.sub("-", str(value).lower()).strip("-")[:63].strip("-")
    return text or "workload"


def _get(raw: object, *path: str) -> Any:
    for key in path:
        if not isinstance(raw, dict):
            return None
        raw = raw.get(key)
    return raw


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _plain(text: str) -> str:
    """``text`` with each control character written as ``\\xNN`` (one line, acted on by no
    terminal)."""
    return "".join(f"\\x{ord(c):02x}" if ord(c) < 32 or 0x7F <= ord(c) <= 0x9F else c for c in text)
