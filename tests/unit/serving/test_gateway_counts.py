"""The gateway's counters for ``/metrics``: answers by status code and a latency histogram per
replica, and per deployment what the gateway answered itself and its cold starts; and what the
autoscaler's decisions count as."""

from __future__ import annotations

import asyncio

import pytest

from gpufrac.serving.autoscaler import ScaleDecision, directions
from gpufrac.serving.gateway import Gateway
from gpufrac.serving.http11 import Request
from gpufrac.serving.routing import LATENCY_BUCKETS, Replica
from tests.unit.serving.test_gateway_route import FakeClient, full_gateway, status_of


@pytest.mark.parametrize(
    ("seconds", "bucket"),
    [(0.0, 0), (0.005, 0), (0.0051, 1), (0.3, 6), (60.0, 12), (61.0, 13), (1e9, 13)],
)
def test_a_latency_falls_in_the_first_bucket_it_is_not_above(seconds: float, bucket: int) -> None:
    r = Replica("a", "127.0.0.1", 9001)
    r.observe(200, seconds)
    assert len(r.latency) == len(LATENCY_BUCKETS) + 1
    assert r.latency[bucket] == 1 and sum(r.latency) == 1
    assert r.latency_sum == seconds


def test_counts_by_code_reach_the_stats_also_for_a_retiring_replica() -> None:
    gw = Gateway()
    gw.configure({"name": "m", "replicas": [{"id": "a", "port": 9001}, {"id": "b", "port": 9002}]})
    a, b = gw.routes["m"].replicas["a"], gw.routes["m"].replicas["b"]
    for code in (200, 200, 503):
        a.observe(code, 0.02)
    b.observe(200, 2.0)
    a.outstanding = 1
    gw.configure({"name": "m", "replicas": [{"id": "b", "port": 9002}]})  # a retires
    counts = gw.stats()["m"]["counts"]
    assert counts["a"]["codes"] == {"200": 2, "503": 1}
    assert counts["a"]["latency"][LATENCY_BUCKETS.index(0.025)] == 3
    assert counts["b"]["codes"] == {"200": 1} and counts["b"]["latency_sum"] == 2.0


def test_answers_of_the_gateway_itself_are_counted_per_deployment() -> None:
    async def main() -> Gateway:
        loop = asyncio.get_running_loop()
        gw = full_gateway(queue_limit=1)
        waiting = loop.create_future()
        gw.routes["m"].waiters.append(waiting)  # the queue's one place is taken
        client = FakeClient()
        req = Request("GET", "/serve/m/x", [], b"", True)
        await asyncio.wait_for(gw.serve(client, req), 5)  # type: ignore[arg-type]
        assert status_of(client.sent) == 429
        gw.routes["m"].waiters.clear()
        await asyncio.wait_for(gw.serve(FakeClient(), req), 5)  # type: ignore[arg-type]
        return gw  # the second waited timeout_s for a slot: 503

    stats = asyncio.run(main()).stats()["m"]
    assert stats["codes"] == {"429": 1, "503": 1}
    assert stats["rejected"] == 1 and stats["cold_starts"] == 0
    assert stats["counts"]["a"]["codes"] == {}  # no replica answered


def test_a_request_waiting_for_a_first_replica_is_a_cold_start() -> None:
    gw = Gateway()
    gw.configure({"name": "m", "replicas": [], "timeout_s": 0.1, "cold_start_timeout_s": 0.1})
    client = FakeClient()

    async def main() -> None:
        req = Request("GET", "/serve/m/x", [], b"", True)
        await asyncio.wait_for(gw.serve(client, req), 5)  # type: ignore[arg-type]

    asyncio.run(main())
    assert status_of(client.sent) == 503
    stats = gw.stats()["m"]
    assert stats["cold_starts"] == 1 and stats["codes"] == {"503": 1}


@pytest.mark.parametrize(
    ("current", "was_boosted", "decision", "expected"),
    [
        (1, False, ScaleDecision(3, False, "load 6"), ["up"]),
        (3, False, ScaleDecision(1, False, "load averaged 1"), ["down"]),
        (0, False, ScaleDecision(1, False, "cold start"), ["up"]),
        (2, False, ScaleDecision(2, True, "QoS weight x2 first"), ["boost"]),
        (2, True, ScaleDecision(2, False, "load fell"), ["unboost"]),
        (2, True, ScaleDecision(2, True, ""), []),
    ],
)
def test_what_an_autoscaler_decision_counts_as(
    current: int, was_boosted: bool, decision: ScaleDecision, expected: list[str]
) -> None:
    assert directions(current, was_boosted, decision) == expected
