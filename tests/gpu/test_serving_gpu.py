"""The replica server's PyTorch adapter on a real GPU. Written without a GPU at hand (none was lent
to the session that wrote it): `make gpu-check` runs it."""

from __future__ import annotations

import pytest

from gpufrac.serving.replica import adapt

pytestmark = pytest.mark.gpu


def test_a_torch_module_on_the_gpu_is_served_as_lists() -> None:
    torch = pytest.importorskip("torch")
    layer = torch.nn.Linear(3, 2).cuda()
    with torch.no_grad():
        layer.weight.fill_(1.0)
        layer.bias.zero_()
    run = adapt(layer)
    assert run([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]]) == [[6.0, 6.0], [1.0, 1.0]]
