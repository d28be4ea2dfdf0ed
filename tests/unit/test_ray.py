"""``gpufrac.ray``'s lease as a person sees it (the scenario itself: tests/integration)."""

from __future__ import annotations

from gpufrac.ray import Lease


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
