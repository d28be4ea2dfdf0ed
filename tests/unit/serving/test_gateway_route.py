"""The gateway's routing and bookkeeping, without a network: picking a replica, the wait queue,
configuration from the agent and the statistics the autoscaler reads."""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

import pytest

from gpufrac.serving.gateway import WINDOW_SECONDS, Gateway, Replica, Route, route_of
from gpufrac.serving.http11 import HttpError, Request


@pytest.fixture(autouse=True)
def seeded() -> Iterator[None]:
    """Picks use the random module: seed it for repeatable runs, and leave it as it was."""
    state = random.getstate()
    random.seed(20240611)
    yield
    random.setstate(state)


def make_route(
    outstanding: list[int], *, busy: list[float] | None = None, max_concurrency: int = 4
) -> Route:
    route = Route("m", max_concurrency=max_concurrency)
    for i, n in enumerate(outstanding):
        rid = f"r{i}"
        route.replicas[rid] = Replica(rid, "127.0.0.1", 9000 + i, outstanding=n)
        if busy is not None:
            route.replicas[rid].busy = busy[i]
    return route


def replica_msg(rid: str, port: int, busy: float = 0.0) -> dict[str, Any]:
    return {"id": rid, "port": port, "busy": busy}


# --- pick -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "outstanding",
    [
        [4, 4, 4, 0, 4, 4, 4, 4, 4, 4],
        [4, 3, 4, 2, 4, 0, 4, 1, 4, 4],
        [0, 4] * 10,
        [3, 3, 3, 4, 4],
    ],
)
def test_pick_never_chooses_a_full_replica(outstanding: list[int]) -> None:
    route = make_route(outstanding, max_concurrency=4)
    for _ in range(2000):
        r = route.pick(0.0)
        assert r is not None
        assert r.outstanding < route.max_concurrency


def test_pick_skips_replicas_marked_down_until_their_time() -> None:
    route = make_route([0, 0, 0, 0])
    route.replicas["r0"].down_until = 10.0
    route.replicas["r2"].down_until = 10.0
    seen = {route.pick(5.0).id for _ in range(500)}  # type: ignore[union-attr]
    assert seen == {"r1", "r3"}
    seen = {route.pick(10.0).id for _ in range(500)}  # type: ignore[union-attr]
    assert seen == {"r0", "r1", "r2", "r3"}


def test_pick_skips_the_replica_to_avoid() -> None:
    route = make_route([0, 0, 0])
    avoid = route.replicas["r1"]
    seen = {route.pick(0.0, avoid=avoid).id for _ in range(500)}  # type: ignore[union-attr]
    assert seen == {"r0", "r2"}


@pytest.mark.parametrize(
    ("outstanding", "down", "avoid", "expected"),
    [
        ([4, 1, 4], [], None, "r1"),
        ([0, 0, 0], ["r0", "r2"], None, "r1"),
        ([0, 0], [], "r0", "r1"),
        ([2, 0, 4], ["r1"], None, "r0"),
    ],
)
def test_pick_the_one_free_replica(
    outstanding: list[int], down: list[str], avoid: str | None, expected: str
) -> None:
    route = make_route(outstanding)
    for rid in down:
        route.replicas[rid].down_until = 100.0
    skip = route.replicas[avoid] if avoid else None
    assert {route.pick(1.0, avoid=skip).id for _ in range(50)} == {expected}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("outstanding", "down", "avoid"),
    [
        ([], [], None),
        ([4, 4, 4], [], None),
        ([0, 0], ["r0", "r1"], None),
        ([0], [], "r0"),
        ([4, 0], ["r1"], None),
    ],
)
def test_pick_none_when_nothing_is_free(
    outstanding: list[int], down: list[str], avoid: str | None
) -> None:
    route = make_route(outstanding)
    for rid in down:
        route.replicas[rid].down_until = 100.0
    assert route.pick(1.0, avoid=route.replicas[avoid] if avoid else None) is None


@pytest.mark.parametrize("busy_one", ["r0", "r1"])
def test_pick_prefers_the_replica_whose_gpu_is_not_busy(busy_one: str) -> None:
    route = make_route([1, 1])
    route.replicas[busy_one].busy = 1.0
    other = "r1" if busy_one == "r0" else "r0"
    assert {route.pick(0.0).id for _ in range(200)} == {other}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("outstanding", "expected"), [([0, 3], "r0"), ([3, 0], "r1"), ([2, 1], "r1")]
)
def test_pick_prefers_fewer_outstanding(outstanding: list[int], expected: str) -> None:
    route = make_route(outstanding)
    assert {route.pick(0.0).id for _ in range(200)} == {expected}  # type: ignore[union-attr]


def test_busy_weighs_against_outstanding() -> None:
    # (0 + 1) x (1 + 1.0) = 2 is more than (0 + 1) x 1 but less than (2 + 1) x 1
    route = make_route([0, 2], busy=[1.0, 0.0])
    assert {route.pick(0.0).id for _ in range(200)} == {"r0"}  # type: ignore[union-attr]


def spread(route: Route, picks: int, held: int) -> Counter[str]:
    """Pick ``picks`` times, keeping the last ``held`` requests outstanding and releasing the
    rest."""
    counts: Counter[str] = Counter()
    in_flight: deque[Replica] = deque()
    for _ in range(picks):
        r = route.pick(0.0)
        assert r is not None
        r.outstanding += 1
        counts[r.id] += 1
        in_flight.append(r)
        while len(in_flight) > held:
            in_flight.popleft().outstanding -= 1
    return counts


@pytest.mark.parametrize(
    ("replicas", "held", "tolerance"),
    [(2, 0, 0.05), (4, 0, 0.05), (4, 12, 0.02), (5, 20, 0.02), (8, 8, 0.03)],
)
def test_equal_replicas_share_the_load_evenly(replicas: int, held: int, tolerance: float) -> None:
    route = make_route([0] * replicas, max_concurrency=8)
    picks = 20_000
    counts = spread(route, picks, held)
    share = picks / replicas
    assert set(counts) == set(route.replicas)
    for rid, n in counts.items():
        assert abs(n - share) <= tolerance * share, (rid, n, share)
    assert sum(r.outstanding for r in route.replicas.values()) == held


def test_busier_gpus_get_fewer_requests() -> None:
    route = make_route([0, 0, 0], busy=[0.0, 0.5, 1.0], max_concurrency=8)
    counts = spread(route, 20_000, 12)
    assert counts["r0"] > counts["r1"] > counts["r2"] > 0


# --- wake: the FIFO wait queue --------------------------------------------------------------------


def test_wake_hands_free_slots_to_the_oldest_waiters() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        route = make_route([0], max_concurrency=2)
        waiters = [loop.create_future() for _ in range(4)]
        route.waiters.extend(waiters)
        route.wake()
        assert [f.done() for f in waiters] == [True, True, False, False]
        assert all(f.result() is route.replicas["r0"] for f in waiters[:2])
        assert route.replicas["r0"].outstanding == 2
        route.replicas["r0"].outstanding -= 1  # one answered
        route.wake()
        assert [f.done() for f in waiters] == [True, True, True, False]
        assert route.replicas["r0"].outstanding == 2
        assert list(route.waiters) == [waiters[3]]

    asyncio.run(main())


def test_wake_skips_waiters_that_gave_up() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        route = make_route([0], max_concurrency=1)
        gone, waiting = loop.create_future(), loop.create_future()
        gone.cancel()
        route.waiters.extend([gone, waiting])
        route.wake()
        assert waiting.done() and waiting.result() is route.replicas["r0"]
        assert route.replicas["r0"].outstanding == 1  # the cancelled one took no slot
        assert not route.waiters

    asyncio.run(main())


def test_wake_spreads_waiters_over_replicas_and_keeps_the_rest_waiting() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        route = make_route([0, 0, 0], max_concurrency=1)
        route.replicas["r2"].down_until = time.monotonic() + 60
        waiters = [loop.create_future() for _ in range(3)]
        route.waiters.extend(waiters)
        route.wake()
        assert [f.done() for f in waiters] == [True, True, False]
        assert {waiters[0].result().id, waiters[1].result().id} == {"r0", "r1"}
        assert [r.outstanding for r in route.replicas.values()] == [1, 1, 0]

    asyncio.run(main())


def test_wake_with_no_replica_leaves_everyone_waiting() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        route = make_route([])
        waiters = [loop.create_future() for _ in range(3)]
        route.waiters.extend(waiters)
        route.wake()
        assert not any(f.done() for f in waiters)
        assert len(route.waiters) == 3

    asyncio.run(main())


# --- configure / remove / stats -------------------------------------------------------------------


def test_configure_sets_the_route() -> None:
    gw = Gateway()
    gw.configure(
        {
            "name": "m",
            "replicas": [replica_msg("a", 9001, 0.25), {"id": "b", "port": 9002}],
            "max_concurrency": 3,
            "queue_limit": 10,
            "timeout_s": 2.5,
            "cold_start_timeout_s": 30,
        }
    )
    route = gw.routes["m"]
    assert (route.max_concurrency, route.queue_limit) == (3, 10)
    assert (route.timeout_s, route.cold_start_timeout_s) == (2.5, 30.0)
    assert {rid: (r.host, r.port, r.busy) for rid, r in route.replicas.items()} == {
        "a": ("127.0.0.1", 9001, 0.25),
        "b": ("127.0.0.1", 9002, 0.0),
    }
    stats = gw.stats()["m"]
    assert (stats["in_flight"], stats["queued"], stats["p99_ms"]) == (0, 0, None)
    assert set(stats["replicas"]) == {"a", "b"}


def test_reconfigure_keeps_a_replica_and_its_requests() -> None:
    gw = Gateway()
    gw.configure({"name": "m", "replicas": [replica_msg("a", 9001)]})
    gw.routes["m"].replicas["a"].outstanding = 2
    gw.configure({"name": "m", "replicas": [replica_msg("a", 9001, 0.75), replica_msg("b", 9002)]})
    route = gw.routes["m"]
    assert route.replicas["a"].outstanding == 2
    assert route.replicas["a"].busy == 0.75
    assert gw.stats()["m"]["in_flight"] == 2


def test_removed_replica_is_reported_until_its_requests_are_answered() -> None:
    gw = Gateway()
    gw.configure({"name": "m", "replicas": [replica_msg("a", 9001), replica_msg("b", 9002)]})
    a = gw.routes["m"].replicas["a"]
    a.outstanding = 2
    gw.configure({"name": "m", "replicas": [replica_msg("b", 9002)]})
    assert a.retired
    for _ in range(3):  # asked again and again while requests remain
        stats = gw.stats()["m"]
        assert stats["retiring"] == {"a": {"outstanding": 2}}
        assert set(stats["replicas"]) == {"b"}
    assert {gw.routes["m"].pick(0.0).id for _ in range(50)} == {"b"}  # type: ignore[union-attr]
    a.outstanding = 1
    assert gw.stats()["m"]["retiring"] == {"a": {"outstanding": 1}}
    a.outstanding = 0
    first = gw.stats()["m"]["retiring"]
    assert first in ({}, {"a": {"outstanding": 0}})
    assert gw.stats()["m"]["retiring"] == {}


def test_removed_idle_replica_is_not_retiring() -> None:
    gw = Gateway()
    gw.configure({"name": "m", "replicas": [replica_msg("a", 9001)]})
    gw.configure({"name": "m", "replicas": []})
    stats = gw.stats()["m"]
    assert (stats["retiring"], stats["replicas"]) == ({}, {})


def test_configure_wakes_requests_waiting_for_a_cold_start() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        gw = Gateway()
        gw.configure({"name": "m", "replicas": [], "max_concurrency": 1})
        waiters = [loop.create_future() for _ in range(2)]
        gw.routes["m"].waiters.extend(waiters)
        assert gw.stats()["m"]["queued"] == 2
        gw.configure({"name": "m", "replicas": [replica_msg("a", 9001)], "max_concurrency": 1})
        assert waiters[0].done() and waiters[0].result().id == "a"
        assert not waiters[1].done()
        stats = gw.stats()["m"]
        assert (stats["in_flight"], stats["queued"]) == (1, 1)

    asyncio.run(main())


def test_queued_counts_only_live_waiters() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        gw = Gateway()
        gw.configure({"name": "m", "replicas": []})
        waiters = [loop.create_future() for _ in range(3)]
        waiters[1].cancel()
        gw.routes["m"].waiters.extend(waiters)
        assert gw.stats()["m"]["queued"] == 2

    asyncio.run(main())


def test_remove_fails_the_waiters_and_drops_the_route() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        gw = Gateway()
        gw.configure({"name": "m", "replicas": []})
        gw.configure({"name": "other", "replicas": [replica_msg("x", 9100)]})
        waiter = loop.create_future()
        gw.routes["m"].waiters.append(waiter)
        gw.remove("m")
        assert waiter.done()
        exc = waiter.exception()
        assert isinstance(exc, HttpError) and exc.status == 404
        assert set(gw.stats()) == {"other", ""}  # "": refusals of no deployment
        gw.remove("m")  # again: nothing to do
        gw.remove("never-there")

    asyncio.run(main())


def test_stats_p99_and_rate_over_the_window() -> None:
    gw = Gateway()
    gw.configure({"name": "m", "replicas": [replica_msg("a", 9001)]})
    route = gw.routes["m"]
    now = time.monotonic()
    route.done.append((now - WINDOW_SECONDS - 5, 30.0))  # long ago: outside the window
    latencies = [ms / 1000 for ms in range(1, 101)]
    random.shuffle(latencies)
    route.done.extend((now, s) for s in latencies)
    stats = gw.stats()["m"]
    assert 99 <= stats["p99_ms"] <= 100
    assert stats["rate"] == pytest.approx(100 / WINDOW_SECONDS)


def test_stats_p99_of_one_request_is_its_latency() -> None:
    gw = Gateway()
    gw.configure({"name": "m", "replicas": [replica_msg("a", 9001)]})
    gw.routes["m"].done.append((time.monotonic(), 0.25))
    assert gw.stats()["m"]["p99_ms"] == pytest.approx(250)


# --- requests that never reach a replica ----------------------------------------------------------


class FakeClient:
    def __init__(self) -> None:
        self.sent = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent += data

    def send(self, data: bytes, req: Request) -> None:
        self.write(data)

    def close(self) -> None:
        self.closed = True


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def serve(gw: Gateway, target: str) -> FakeClient:
    client = FakeClient()
    req = Request("POST", target, [], b"", True)

    async def main() -> None:
        await asyncio.wait_for(gw.serve(client, req), 5)  # type: ignore[arg-type]

    asyncio.run(main())
    return client


@pytest.mark.parametrize("target", ["/predict", "/serve/none/predict", "/serve/"])
def test_unknown_deployment_is_404(target: str) -> None:
    gw = Gateway()
    gw.configure({"name": "m", "replicas": []})
    assert status_of(serve(gw, target).sent) == 404


def test_refusals_are_counted_once_under_the_deployment_they_name() -> None:
    """401 and 404 by deployment where the gateway has it (whoever asked), else apart from every
    deployment: a name a client made up is never a label."""
    gw = Gateway()
    tok = {"own": "t", "other": "u"}
    gw.set_tokens({"tokens": {hashlib.sha256(k.encode()).hexdigest(): v for k, v in tok.items()}})
    gw.configure({"name": "t.m", "tenant": "t", "replicas": []})

    def ask(target: str, token: str | None) -> int:
        headers = [] if token is None else [(b"authorization", f"Bearer {token}".encode())]
        refused = gw.refusal(target, headers)
        assert refused is not None
        return refused[0]

    assert ask("/serve/t.m/x", None) == 401
    assert ask("/serve/t.m/x", "bad") == 401
    assert ask("/serve/t.m/x", "other") == 404  # another tenant's: as if there were none
    assert ask("/serve/made-up/x", None) == 401
    assert ask("/serve/made-up/x", "own") == 404
    assert ask("/elsewhere", "own") == 404
    stats = gw.stats()
    assert stats["t.m"]["codes"] == {"401": 2, "404": 1}
    assert stats[""] == {"codes": {"401": 1, "404": 2}}
    assert set(stats) == {"t.m", ""}


def full_gateway(queue_limit: int) -> Gateway:
    gw = Gateway()
    gw.configure(
        {
            "name": "m",
            "replicas": [replica_msg("a", 9001)],
            "max_concurrency": 1,
            "queue_limit": queue_limit,
            "timeout_s": 0.2,
        }
    )
    gw.routes["m"].replicas["a"].outstanding = 1  # its one slot is taken
    return gw


def test_a_full_queue_is_429_with_retry_after() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        gw = full_gateway(queue_limit=1)
        gw.routes["m"].waiters.append(loop.create_future())  # the queue's one place is taken
        client = FakeClient()
        await asyncio.wait_for(gw.serve(client, Request("GET", "/serve/m/x", [], b"", True)), 5)  # type: ignore[arg-type]
        assert status_of(client.sent) == 429
        assert b"retry-after:" in client.sent.lower()
        assert gw.stats()["m"]["rejected"] == 1

    asyncio.run(main())


def test_a_request_with_no_free_slot_waits_then_gives_up() -> None:
    gw = full_gateway(queue_limit=4)
    started = time.monotonic()
    client = serve(gw, "/serve/m/x")
    assert status_of(client.sent) == 503  # after timeout_s in the queue
    assert time.monotonic() - started >= 0.2
    assert gw.stats()["m"]["queued"] == 0
    assert gw.routes["m"].replicas["a"].outstanding == 1


def test_queue_limit_zero_rejects_at_once() -> None:
    gw = full_gateway(queue_limit=0)
    client = serve(gw, "/serve/m/x")
    assert status_of(client.sent) == 429


@pytest.mark.parametrize(
    ("target", "name", "rest"),
    [
        ("/serve/m/predict", "m", "/predict"),
        ("/serve/m/predict?x=1", "m", "/predict?x=1"),
        ("/serve/m?x=1", "m", "/?x=1"),  # a query straight after the name is not part of it
        ("/serve/m", "m", "/"),
        ("/serve/a.m/", "a.m", "/"),
    ],
)
def test_a_target_names_its_deployment_and_what_the_replica_gets(
    target: str, name: str, rest: str
) -> None:
    assert route_of(target) == (name, rest)
