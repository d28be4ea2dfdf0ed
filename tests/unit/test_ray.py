"""``gpufrac.ray``'s lease as a person sees it (the scenario itself: tests/integration)."""

from __future__ import annotations

import pytest

from gpufrac.ray import RAY_GPU_TOKEN, Lease, pool, ray_gpu_request


def test_a_lease_prints_what_it_holds_and_never_its_token() -> None:
    view = {
        "tenant": "ml",
        "name": "ray-0123456789ab",
        "node": "gpu-a",
        "env": {"CUDA_VISIBLE_DEVICES": "MIG-1234", "GPUFRAC_ATTEMPT": "1"},
    }
    held = Lease("http://head:8470", {"authorization": "Bearer secret"}, view, ttl_s=3600)
    try:
        # before: <gpufrac.ray.Lease object at 0x...>
        assert repr(held) == (
            "<Lease ml/ray-0123456789ab on node gpu-a: CUDA_VISIBLE_DEVICES=MIG-1234 "
            "(held, ttl 3600 s) from http://head:8470>"
        )
        assert "secret" not in repr(held) and str(held) == repr(held)
    finally:
        held.released = True  # nothing to give back to a control plane that is not there
        held.release()
    assert "(released)" in repr(held)


def test_a_leased_task_asks_ray_for_a_token_gpu_or_whole_gpus_for_several_devices() -> None:
    # a token of Ray's GPU counter: Ray assigns the worker a GPU id, which it maps onto the
    # worker's CUDA_VISIBLE_DEVICES (the lease's device): ray.get_gpu_ids() == ["MIG-..."]
    assert ray_gpu_request(["MIG-1234"], 1.0, "gpu-a") == RAY_GPU_TOKEN == 0.0001
    assert ray_gpu_request(["GPU-a", "GPU-b"], 8.0, "gpu-a") == 2.0  # ids only for whole GPUs
    with pytest.raises(ValueError, match=r"gpufrac.io/node=gpu-a has 0 GPUs.*ray start --num-gpus"):
        ray_gpu_request(["MIG-1234"], 0.0, "gpu-a")
    with pytest.raises(ValueError, match="has 1 GPUs"):
        ray_gpu_request(["GPU-a", "GPU-b"], 1.0, "gpu-a")


def test_a_lease_knows_its_devices() -> None:
    view = {"tenant": "ml", "name": "ray-1", "node": "gpu-a", "env": {}}
    held = Lease("http://head:8470", {}, view, ttl_s=3600)
    held.released = True
    held.release()
    assert held.devices == []
    held.env["CUDA_VISIBLE_DEVICES"] = "GPU-a,GPU-b"
    assert held.devices == ["GPU-a", "GPU-b"]


@pytest.mark.parametrize("size", [0, -1, 1.5, "2"])
def test_a_pool_needs_a_whole_number_of_leases(size: object) -> None:
    with pytest.raises(ValueError, match=r"pool size .*: give a whole number of leases"):
        pool({"memory": "10GiB"}, size=size, server="http://127.0.0.1:9")  # type: ignore[arg-type]
