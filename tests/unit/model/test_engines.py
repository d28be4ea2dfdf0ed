"""The engines' memory flags from a workload's budget (model/engines.py)."""

from __future__ import annotations

import pytest

from gpufrac.model.engines import ENGINE_ARGS_ENV, engine_args, fraction_hundredths


@pytest.mark.parametrize(
    ("budget", "visible", "hundredths"),
    [
        (20_000, 143_771, 13),  # a memory request under MPS: of the whole GPU
        (16_384, 16_384, 95),  # a whole MIG instance: capped
        (1, 143_771, 1),  # never zero
        (35_000, 70_000, 50),
    ],
)
def test_fraction_rounds_down_and_is_capped(budget: int, visible: int, hundredths: int) -> None:
    assert fraction_hundredths(budget, visible) == hundredths


def test_vllm_gets_its_flags_when_they_are_absent() -> None:
    out = engine_args("vllm", ["vllm", "serve", "m"], 20_000, 143_771)
    assert out.command == (
        "vllm", "serve", "m",
        "--gpu-memory-utilization", "0.13", "--max-num-seqs", "64",
        "--max-num-batched-tokens", "4096",
    )  # fmt: skip
    assert out.env[ENGINE_ARGS_ENV] == (
        "--gpu-memory-utilization 0.13 --max-num-seqs 64 --max-num-batched-tokens 4096"
    )
    assert out.warnings == ()


def test_a_users_own_value_is_kept_and_one_above_the_slice_warned() -> None:
    out = engine_args(
        "vllm", ["vllm", "serve", "m", "--gpu-memory-utilization=0.9"], 20_000, 143_771
    )
    assert "--gpu-memory-utilization=0.9" in out.command
    assert out.command.count("--gpu-memory-utilization") == 0
    assert len(out.warnings) == 1 and "0.13" in out.warnings[0]
    fine = engine_args(
        "sglang",
        ["python", "-m", "sglang.launch_server", "--mem-fraction-static", "0.1"],
        20_000,
        143_771,
    )
    assert fine.warnings == () and fine.command.count("--mem-fraction-static") == 1


def test_flags_only_for_the_engines_entry_point() -> None:
    wrapped = engine_args("tgi", ["bash", "start.sh"], 8_000, 80_000)
    assert wrapped.command == ("bash", "start.sh")
    assert wrapped.env[ENGINE_ARGS_ENV] == "--cuda-memory-fraction 0.10"
    tgi = engine_args("tgi", ["text-generation-launcher"], 8_000, 80_000)
    assert tgi.command[1:] == ("--cuda-memory-fraction", "0.10")
    # a manifest's command is a tuple: the entry point is told apart all the same
    vllm = engine_args("vllm", ("vllm", "serve", "m"), 8_000, 80_000)
    assert vllm.command[3:5] == ("--gpu-memory-utilization", "0.10")


def test_triton_pool_in_bytes_and_frameworks_by_env() -> None:
    triton = engine_args("triton", ["tritonserver", "--model-repository=/m"], 8_192, 81_920)
    assert triton.command[-2:] == ("--cuda-memory-pool-byte-size", f"0:{2048 * 2**20}")
    torch = engine_args("pytorch", ["python", "train.py"], 8_192, 81_920)
    assert torch.env["GPUFRAC_TORCH_MEMORY_FRACTION"] == "0.10"
    assert torch.command == ("python", "train.py")
    jax = engine_args("jax", ["python", "train.py"], 8_192, 81_920)
    assert jax.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.10"
    assert jax.env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
