"""Small models for the serving examples: each factory returns what gpufrac's replica server serves.

``echo_sum``: a plain callable (the sum of a list of numbers), trivial on purpose, so a benchmark
measures the serving path rather than the model. ``slow_sum``: the same, 20 ms per request, so a little
traffic is enough load to make the autoscaler act. ``torch_mlp``: a PyTorch module, on the GPU when
there is one (needs PyTorch).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def echo_sum() -> Callable[[list[float]], float]:
    return lambda inputs: sum(inputs)


def slow_sum() -> Callable[[list[float]], float]:
    def run(inputs: list[float]) -> float:
        time.sleep(0.02)
        return sum(inputs)

    return run


def torch_mlp() -> Any:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    return model.cuda() if torch.cuda.is_available() else model
