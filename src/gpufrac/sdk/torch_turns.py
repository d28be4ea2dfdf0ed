"""PyTorch integration: yield points inside a step, at module boundaries.

``yield_points(model)`` registers a forward pre-hook and a backward pre-hook on each of the model's
top-level children (or the ``modules`` given). Each hook calls ``checkpoint()`` on the turn this
process holds (``gpu_turn``): the work queued ahead of the GPU stays at most ``max_in_flight``
modules long, and when a more important workload asks for the GPU, the step gives its turn back at
the next module boundary instead of at the end of the step. Outside a turn the hooks do nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpufrac.sdk.turns import current_turn


def _checkpoint(*_: Any) -> None:
    turn = current_turn()
    if turn is not None:
        turn.checkpoint()


def yield_points(model: Any, modules: Iterable[Any] | None = None) -> list[Any]:
    """Add yield points to a ``torch.nn.Module``; returns the hook handles (``.remove()`` them to
    undo)."""
    chosen = list(modules) if modules is not None else list(model.children()) or [model]
    handles = []
    for module in chosen:
        handles.append(module.register_forward_pre_hook(_checkpoint))
        handles.append(module.register_full_backward_pre_hook(_checkpoint))
    return handles
