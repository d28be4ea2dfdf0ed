"""The share of its device a workload's PyTorch may hold: the engine's fraction where one was
handed (``spec.engine: pytorch``), else the memory limit over the device."""

from __future__ import annotations

import pytest

from gpufrac.sdk import torch_memory_fraction

GIB = 1 << 30
F, L = "GPUFRAC_TORCH_MEMORY_FRACTION", "GPUFRAC_GPU_MEMORY_LIMIT_MIB"


@pytest.mark.parametrize(
    ("env", "total", "share"),
    [
        ({F: "0.42", L: "1024"}, 10 * GIB, 0.42),
        ({L: "2560"}, 10 * GIB, 0.25),
        ({L: "20480"}, 10 * GIB, 1.0),  # never above the device
        ({F: "nan", L: "5120"}, 10 * GIB, 0.5),
        ({F: "1.5"}, 10 * GIB, None),  # not a share: no limit known
        ({F: "٠.٥"}, 10 * GIB, None),  # ASCII digits only
        ({}, 10 * GIB, None),
    ],
)  # fmt: skip
def test_the_engines_fraction_first_then_the_limit(
    env: dict[str, str], total: int, share: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (F, L):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert torch_memory_fraction(total) == share
