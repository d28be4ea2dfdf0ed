"""A container mount outside the operator's allowed paths is refused, naming its field."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufrac.errors import InputError
from gpufrac.model.settings import ContainerSettings, OperatorSettings
from gpufrac.model.workload import GpuRequest, VolumeMount, WorkloadSpec


def spec(**kw: object) -> WorkloadSpec:
    return replace(WorkloadSpec("w", GpuRequest(count=1), ("true",)), **kw)  # type: ignore[arg-type]


def test_mounts_outside_the_allowed_paths_are_refused_by_field() -> None:
    settings = OperatorSettings(containers=ContainerSettings(allowed_mounts=("/data",)))
    settings.check_mounts((VolumeMount("/data/models", "/m"),))
    with pytest.raises(InputError) as e:
        settings.check_mounts((VolumeMount("/data/models", "/m"), VolumeMount("/etc", "/e")))
    assert e.value.field == "spec.mounts[1].source"
    with pytest.raises(InputError):
        settings.check_mounts((VolumeMount("/database", "/m"),))  # not below /data
