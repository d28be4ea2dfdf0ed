"""Engines that see their slice: the GPU memory flags of an inference engine or framework, from
the workload's budget (pure arithmetic, no I/O).

An engine sizes its memory as a fraction of the device it sees, or in bytes; on a shared GPU it
would take far more than its slice. ``engine_args`` works the workload's share out of the
*visible* device (the MIG instance on MIG, the whole GPU under MPS, time-slicing or exclusive
use): ``fraction = floor_to_hundredths(budget / visible)``, at most ``MAX_FRACTION`` (the CUDA
context and the engine's activations live outside its pool):

* vLLM: ``--gpu-memory-utilization F``, and explicit ``--max-num-seqs`` and
  ``--max-num-batched-tokens`` sized by the budget (``VLLM_BATCH``): its defaults are sized for a
  whole large GPU and its start-up profile and CUDA graphs take more than a small slice;
* SGLang: ``--mem-fraction-static F``; TGI: ``--cuda-memory-fraction F``;
* Triton: ``--cuda-memory-pool-byte-size 0:BYTES`` (device 0: the one it sees), a quarter of the
  budget in bytes (its pool holds inputs and outputs between models, the models' own memory
  comes out of the rest);
* PyTorch: no flag; ``GPUFRAC_TORCH_MEMORY_FRACTION=F``, which ``gpufrac.sdk.cap_torch_memory``
  passes to ``torch.cuda.set_per_process_memory_fraction``;
* JAX: ``XLA_PYTHON_CLIENT_MEM_FRACTION=F`` and ``XLA_PYTHON_CLIENT_PREALLOCATE=true`` (it
  preallocates its slice at start and never grows past it).

Flags are added to the command only when it is the engine's known entry point and the flag is
absent; they are always exported as ``GPUFRAC_ENGINE_ARGS`` (shell-quoted), so a wrapper script
can pass them on. A value the user gave above the slice is kept, with a warning.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import assert_never

from gpufrac.model.workload import Engine

MAX_FRACTION_HUNDREDTHS = 95  # at most 0.95 of the visible device
TRITON_POOL_SHARE = 4  # a quarter of the budget
# (budget up to MiB, max-num-seqs, max-num-batched-tokens), first match
VLLM_BATCH: tuple[tuple[int, int, int], ...] = (
    (8 * 1024, 16, 2048),
    (24 * 1024, 64, 4096),
    (48 * 1024, 128, 8192),
)
VLLM_BATCH_LARGE = (256, 8192)
ENGINE_ARGS_ENV = "GPUFRAC_ENGINE_ARGS"


@dataclass(frozen=True, slots=True)
class EngineArgs:
    """What a workload's engine is told: ``command`` (its own, with the flags it lacked where
    it is the engine's entry point), ``env`` to add, and ``warnings`` to show."""

    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def fraction_hundredths(budget_mib: int, visible_mib: int) -> int:
    """The workload's share of the visible device, in hundredths, rounded down (never above
    its budget), between 1 and ``MAX_FRACTION_HUNDREDTHS``."""
    if visible_mib <= 0 or budget_mib <= 0:
        return 1
    return max(1, min(MAX_FRACTION_HUNDREDTHS, budget_mib * 100 // visible_mib))


def _decimal(hundredths: int) -> str:
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def vllm_batch(budget_mib: int) -> tuple[int, int]:
    """``--max-num-seqs`` and ``--max-num-batched-tokens`` for a budget."""
    for up_to, seqs, tokens in VLLM_BATCH:
        if budget_mib <= up_to:
            return seqs, tokens
    return VLLM_BATCH_LARGE


def is_entry_point(engine: Engine, command: Sequence[str]) -> bool:
    """Whether ``command`` starts the engine's server itself (flags can be added to it)."""
    if not command:
        return False
    program = command[0].rsplit("/", 1)[-1]
    module = command[2] if len(command) > 2 and command[1] == "-m" else None
    python = program.startswith("python")
    match engine:
        case "vllm":
            return (program == "vllm" and list(command[1:2]) == ["serve"]) or (
                python and module == "vllm.entrypoints.openai.api_server"
            )
        case "sglang":
            return python and module == "sglang.launch_server"
        case "tgi":
            return program == "text-generation-launcher"
        case "triton":
            return program == "tritonserver"
        case "pytorch" | "jax":
            return False  # a framework, no server: its env says it
        case _:
            assert_never(engine)


def flags_for(engine: Engine, budget_mib: int, visible_mib: int) -> list[tuple[str, str]]:
    """The engine's flags and their values for the budget (empty for a framework)."""
    hundredths = fraction_hundredths(budget_mib, visible_mib)
    match engine:
        case "vllm":
            seqs, tokens = vllm_batch(budget_mib)
            return [
                ("--gpu-memory-utilization", _decimal(hundredths)),
                ("--max-num-seqs", str(seqs)),
                ("--max-num-batched-tokens", str(tokens)),
            ]
        case "sglang":
            return [("--mem-fraction-static", _decimal(hundredths))]
        case "tgi":
            return [("--cuda-memory-fraction", _decimal(hundredths))]
        case "triton":
            return [
                ("--cuda-memory-pool-byte-size", f"0:{budget_mib * 2**20 // TRITON_POOL_SHARE}")
            ]
        case "pytorch" | "jax":
            return []
        case _:
            assert_never(engine)


def env_for(engine: Engine, budget_mib: int, visible_mib: int) -> dict[str, str]:
    share = _decimal(fraction_hundredths(budget_mib, visible_mib))
    match engine:
        case "pytorch":
            return {"GPUFRAC_TORCH_MEMORY_FRACTION": share}
        case "jax":
            return {
                "XLA_PYTHON_CLIENT_MEM_FRACTION": share,
                "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
            }
        case "vllm" | "sglang" | "tgi" | "triton":
            return {}
        case _:
            assert_never(engine)


def given(command: Sequence[str], flag: str) -> str | None:
    """The value the command gives ``flag`` (``--flag V`` or ``--flag=V``), or None."""
    for i, arg in enumerate(command):
        if arg == flag and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _above(flag: str, value: str, ours: str) -> bool:
    """Whether a user's value asks for more than ours (both numbers; Triton's ``DEV:BYTES``)."""
    try:
        if flag == "--cuda-memory-pool-byte-size":
            return int(value.rsplit(":", 1)[-1]) > int(ours.rsplit(":", 1)[-1])
        if flag in ("--max-num-seqs", "--max-num-batched-tokens"):
            return False  # a batch size is the user's choice, not memory asked for
        return float(value) > float(ours)
    except ValueError:
        return False


def engine_args(
    engine: Engine, command: Sequence[str], budget_mib: int, visible_mib: int
) -> EngineArgs:
    """What ``engine`` is told for a budget of ``budget_mib`` on a visible device of
    ``visible_mib`` (see the module's docstring for the arithmetic)."""
    flags = flags_for(engine, budget_mib, visible_mib)
    env = env_for(engine, budget_mib, visible_mib)
    env[ENGINE_ARGS_ENV] = shlex.join(a for pair in flags for a in pair)
    entry = is_entry_point(engine, command)
    out = list(command)
    warnings: list[str] = []
    for flag, ours in flags:
        theirs = given(command, flag)
        if theirs is None:
            if entry:
                out += [flag, ours]
        elif _above(flag, theirs, ours):
            warnings.append(
                f"{flag} {theirs} asks for more than the workload's slice ({ours}: "
                f"{budget_mib} MiB of the {visible_mib} MiB it sees); it is kept, and the engine "
                "may run out of memory or take others' memory"
            )
    return EngineArgs(tuple(out), env, tuple(warnings))
