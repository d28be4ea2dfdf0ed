"""The dashboard's history ring: columns aligned with the times, bounded, filtered by tenant."""

from __future__ import annotations

from gpufrac.model.caller import ADMIN, Caller
from gpufrac.runtime.history import Reading, Ring, entitled


def gpu(used: int) -> Reading:
    return Reading(
        "gpu",
        "GPU-a",
        None,
        {"index": 0},
        {"memory_used_mib": used, "utilization_gpu": None, "reserved_memory_mib": 0},
    )


def wl(tenant: str, name: str, used: int) -> Reading:
    return Reading(
        "workload", f"{tenant}/{name}", tenant, {"tenant": tenant}, {"memory_used_mib": used}
    )


def test_series_line_up_with_the_times_and_a_late_track_is_padded() -> None:
    ring = Ring(10)
    ring.add(1.0, [gpu(0)])
    ring.add(2.0, [gpu(5), wl("a", "x", 7)])
    ring.add(3.0, [gpu(6)])
    out = ring.view(ADMIN)
    assert out["times"] == [1.0, 2.0, 3.0]
    assert out["gpus"][0]["series"]["memory_used_mib"] == [0, 5, 6]
    (w,) = out["workloads"]
    assert w["key"] == "a/x" and w["series"]["memory_used_mib"] == [None, 7, None]
    assert w["series"]["sm_percent"] == [None, None, None]  # every metric of its kind


def test_since_gives_only_newer_samples_and_skips_tracks_with_nothing_new() -> None:
    ring = Ring(10)
    ring.add(1.0, [gpu(1), wl("a", "x", 7)])
    ring.add(2.0, [gpu(2)])
    out = ring.view(ADMIN, since=1.0)
    assert out["times"] == [2.0]
    assert out["gpus"][0]["series"]["memory_used_mib"] == [2]
    assert out["workloads"] == []
    assert ring.view(ADMIN, since=2.0)["times"] == []


def test_the_ring_is_bounded_and_a_track_gone_for_a_window_is_dropped() -> None:
    ring = Ring(3)
    ring.add(0.0, [gpu(0), wl("a", "x", 1)])
    for t in range(1, 10):
        ring.add(float(t), [gpu(t)])
    out = ring.view(ADMIN)
    assert out["times"] == [7.0, 8.0, 9.0]
    assert out["gpus"][0]["series"]["memory_used_mib"] == [7, 8, 9]
    assert out["workloads"] == [] and len(ring.tracks) == 1


def test_a_tenant_sees_whole_gpus_and_only_its_own_tracks() -> None:
    ring = Ring(5)
    ring.add(1.0, [gpu(3), wl("a", "x", 1), wl("b", "y", 2)])
    out = ring.view(Caller("a"))
    assert [w["key"] for w in out["workloads"]] == ["a/x"]
    assert len(out["gpus"]) == 1
    assert [w["key"] for w in ring.view(ADMIN)["workloads"]] == ["a/x", "b/y"]


def member(domain: str, rank: int, weight: int, min_milli: int, active: bool) -> dict[str, object]:
    return {
        "domain": domain,
        "active": active,
        "qos": {"rank": rank, "weight": weight, "min_share_milli": min_milli},
    }


def test_entitled_shares_follow_the_arbiter_classes() -> None:
    got = entitled(
        {
            "t/hi1": member("g", 200, 3, 0, True),
            "t/hi2": member("g", 200, 1, 0, True),
            "t/low": member("g", 100, 1, 100, True),
            "t/idle": member("g", 200, 1, 0, False),
            "t/alone": member("h", 100, 1, 0, True),
        }
    )
    assert got == {"t/hi1": 0.75, "t/hi2": 0.25, "t/low": 0.1, "t/idle": None, "t/alone": 1.0}


def test_workloads_that_come_and_go_fast_hold_a_bounded_number_of_tracks() -> None:
    from gpufrac.runtime.history import MAX_GONE_TRACKS

    ring = Ring(180)
    for i in range(1000):  # a new workload name in every sample, gone by the next
        ring.add(float(i), [gpu(i), wl("a", f"w{i}", i)])
    assert len(ring.tracks) <= 1 + 1 + MAX_GONE_TRACKS  # the GPU, the newest, the recently gone
    kept = {key for kind, key in ring.tracks if kind == "workload"}
    assert "a/w999" in kept and "a/w998" in kept and "a/w0" not in kept  # the longest gone go first
