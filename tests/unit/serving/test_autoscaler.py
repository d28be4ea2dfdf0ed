"""The autoscaler's decisions, driven by an explicit clock: each tick is one reconcile pass."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from gpufrac.model.deployment import Autoscale
from gpufrac.serving.autoscaler import ScaleDecision, ScaleState, decide


def policy(**changes: float | int | None) -> Autoscale:
    fields: dict[str, float | int | None] = {
        "min_replicas": 1,
        "max_replicas": 8,
        "target_in_flight": 4,
        "scale_up_delay_seconds": 5,
        "scale_down_delay_seconds": 10,
        "scale_to_zero_delay_seconds": 30,
        "traffic_history_seconds": 1,
    }
    return Autoscale(**{**fields, **changes})  # type: ignore[arg-type]


@dataclass
class Sim:
    """One deployment under the autoscaler: the count it decides is the count it gets next tick."""

    policy: Autoscale
    current: int
    can_boost: bool = False
    dt: float = 1.0
    now: float = 0.0
    state: ScaleState = field(default_factory=ScaleState)
    log: list[tuple[float, ScaleDecision]] = field(default_factory=list)

    def tick(self, in_flight: int = 0, queued: int = 0, p99: float | None = None) -> ScaleDecision:
        d = decide(
            self.policy,
            self.state,
            self.now,
            self.current,
            in_flight,
            queued,
            p99,
            can_boost=self.can_boost,
        )
        self.log.append((self.now, d))
        self.current = d.replicas
        self.now += self.dt
        return d

    def run(
        self, seconds: float, in_flight: int = 0, queued: int = 0, p99: float | None = None
    ) -> list[ScaleDecision]:
        return [self.tick(in_flight, queued, p99) for _ in range(round(seconds / self.dt))]

    def first(self, since: float, replicas: int | None = None) -> float | None:
        """When, at or after ``since``, the count first became ``replicas`` (or first changed)."""
        previous: int | None = None
        for at, d in self.log:
            if at >= since:
                if replicas is not None and d.replicas == replicas:
                    return at
                if replicas is None and previous is not None and d.replicas != previous:
                    return at
            previous = d.replicas
        return None

    def counts(self, since: float = 0.0) -> list[int]:
        return [d.replicas for at, d in self.log if at >= since]


# --- up -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("delay", "dt"), [(0, 1.0), (2, 1.0), (5, 0.5), (12.5, 0.5), (3, 2.0)])
def test_scale_up_waits_for_the_delay(delay: float, dt: float) -> None:
    sim = Sim(policy(scale_up_delay_seconds=delay), current=1, dt=dt)
    sim.run(30, in_flight=16)
    up = sim.first(0.0, replicas=4)
    assert up == math.ceil(delay / dt) * dt
    assert up is not None
    assert all(d.replicas == 1 for at, d in sim.log if at < up)


def test_load_that_dips_below_target_restarts_the_up_delay() -> None:
    sim = Sim(policy(scale_up_delay_seconds=5), current=1)
    for _ in range(10):  # 4 s above target, 1 s below, over and over: never 5 s in a row
        sim.run(4, in_flight=12)
        sim.run(1, in_flight=0)
    assert set(sim.counts()) == {1}
    sim.run(6, in_flight=12)
    assert sim.current == 3


def test_load_at_target_is_not_above_it() -> None:
    sim = Sim(policy(), current=2)
    sim.run(60, in_flight=8)
    assert set(sim.counts()) == {2}


@pytest.mark.parametrize(
    ("load", "target", "maximum", "expected"),
    [
        (16, 4, 8, 4),
        (17, 4, 8, 5),
        (5, 4, 8, 2),
        (100, 4, 8, 8),
        (1000, 1, 3, 3),
        (7, 1, 1000, 7),
    ],
)
def test_scale_up_to_what_the_load_needs_at_most_max(
    load: int, target: int, maximum: int, expected: int
) -> None:
    sim = Sim(policy(target_in_flight=target, max_replicas=maximum), current=1)
    sim.run(60, in_flight=load // 2, queued=load - load // 2)
    assert sim.current == expected
    assert max(sim.counts()) == expected


@pytest.mark.parametrize("can_boost", [False, True])
def test_never_above_max_replicas(can_boost: bool) -> None:
    sim = Sim(policy(max_replicas=3, p99_latency_ms=100), current=1, can_boost=can_boost)
    sim.run(120, in_flight=500, queued=500, p99=10_000)
    assert max(sim.counts()) == 3
    assert sim.current == 3


def test_a_count_above_max_comes_back_to_max() -> None:
    sim = Sim(policy(max_replicas=4), current=6)
    sim.run(120, in_flight=100)
    assert sim.current <= 4


# --- the QoS boost first --------------------------------------------------------------------------


def test_boost_comes_before_a_new_replica() -> None:
    sim = Sim(policy(scale_up_delay_seconds=3), current=1, can_boost=True)
    sim.run(20, in_flight=16)
    boosts = [at for at, d in sim.log if d.boosted]
    assert boosts and boosts[0] == 3.0
    assert sim.log[3][1].replicas == 1  # the boost alone, no replica yet
    up = sim.first(0.0, replicas=4)
    assert up is not None and up >= boosts[0] + 3  # a full delay again after the boost
    assert sim.log[-1][1].boosted and sim.current == 4


def test_without_boost_the_first_step_adds_replicas() -> None:
    sim = Sim(policy(scale_up_delay_seconds=3), current=1, can_boost=False)
    sim.run(20, in_flight=16)
    assert not any(d.boosted for _, d in sim.log)
    assert sim.first(0.0, replicas=4) == 3.0


def test_boost_goes_back_before_replicas_go() -> None:
    p = policy(scale_up_delay_seconds=1, scale_down_delay_seconds=5)
    sim = Sim(p, current=1, can_boost=True)
    sim.run(10, in_flight=16)
    assert sim.current == 4 and sim.state.boosted
    drop = sim.now
    sim.run(60, in_flight=0)
    unboost = next(at for at, d in sim.log if at >= drop and not d.boosted)
    assert unboost >= drop + 5
    assert dict(sim.log)[unboost].replicas == 4  # the weight first, the same replicas
    down = sim.first(drop, replicas=1)
    assert down is not None and down >= unboost + 5
    assert sim.current == 1 and not sim.log[-1][1].boosted


def test_every_change_says_why() -> None:
    sim = Sim(policy(scale_up_delay_seconds=1, min_replicas=0), current=0, can_boost=True)
    sim.run(5, queued=1)
    sim.run(20, in_flight=30, p99=10.0)
    sim.run(200)
    before = (0, False)
    for _, d in sim.log:
        if (d.replicas, d.boosted) != before:
            assert d.why, d
        before = (d.replicas, d.boosted)
    assert sim.current == 0


# --- from zero and to the floor -------------------------------------------------------------------


@pytest.mark.parametrize(("in_flight", "queued"), [(0, 1), (1, 0), (0, 50)])
@pytest.mark.parametrize("can_boost", [False, True])
def test_a_waiting_request_starts_a_replica_at_once(
    in_flight: int, queued: int, can_boost: bool
) -> None:
    sim = Sim(policy(min_replicas=0, scale_up_delay_seconds=100), current=0, can_boost=can_boost)
    d = sim.tick(in_flight, queued)
    assert d.replicas == 1
    assert d.why


def test_no_request_no_replica() -> None:
    sim = Sim(policy(min_replicas=0, scale_up_delay_seconds=0), current=0)
    sim.run(1000)
    assert set(sim.counts()) == {0}


@pytest.mark.parametrize(("minimum", "current"), [(1, 0), (2, 0), (3, 1), (5, 4)])
def test_below_min_replicas_comes_up_at_once(minimum: int, current: int) -> None:
    sim = Sim(policy(min_replicas=minimum, scale_up_delay_seconds=100), current=current)
    assert sim.tick().replicas == minimum


# --- down -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [0, 3, 10, 45])
def test_scale_down_waits_for_the_delay(delay: float) -> None:
    sim = Sim(policy(scale_down_delay_seconds=delay, scale_up_delay_seconds=0), current=1)
    sim.run(10, in_flight=16)
    assert sim.current == 4
    drop = sim.now
    sim.run(delay + 20, in_flight=4)
    down = sim.first(drop)
    assert down is not None
    assert drop + delay <= down <= drop + delay + 2  # + the 1 s traffic history and one tick
    assert sim.current == 1


@pytest.mark.parametrize(("history", "scales_down"), [(0.5, True), (10, False), (60, False)])
def test_scale_down_reads_the_average_over_the_history(history: float, scales_down: bool) -> None:
    sim = Sim(
        policy(traffic_history_seconds=history, scale_down_delay_seconds=0),
        current=4,
    )
    sim.run(30, in_flight=16)
    sim.tick(in_flight=0)  # one quiet pass: only a short history sees no traffic
    sim.run(3, in_flight=16)
    assert (min(sim.counts()) < 4) == scales_down


def test_a_longer_history_scales_down_later() -> None:
    def time_to_one(history: float) -> float:
        sim = Sim(policy(traffic_history_seconds=history, scale_down_delay_seconds=2), current=4)
        sim.run(60, in_flight=16)
        drop = sim.now
        sim.run(200, in_flight=0)
        at = sim.first(drop, replicas=1)
        assert at is not None
        return at - drop

    assert time_to_one(1) < time_to_one(20) < time_to_one(60)


@pytest.mark.parametrize("minimum", [1, 2, 5])
def test_never_below_min_replicas(minimum: int) -> None:
    sim = Sim(policy(min_replicas=minimum, max_replicas=8), current=8)
    sim.run(1000)
    assert min(sim.counts()) == minimum
    assert sim.current == minimum


def test_traffic_keeps_one_replica() -> None:
    sim = Sim(policy(min_replicas=0, scale_to_zero_delay_seconds=0), current=3)
    sim.run(500, in_flight=1)
    assert sim.current == 1
    assert min(sim.counts()) == 1


@pytest.mark.parametrize("minimum", [1, 2])
def test_never_to_zero_unless_min_replicas_is_zero(minimum: int) -> None:
    sim = Sim(policy(min_replicas=minimum, scale_to_zero_delay_seconds=0), current=minimum)
    sim.run(5, in_flight=1)
    sim.run(2000)
    assert min(sim.counts()) == minimum


ZERO_TIMINGS = [(0, 10), (5, 30), (30, 5), (0, 0), (2, 3)]
LATE_ZERO_TIMINGS = [(10, 60), (40, 60), (5, 7)]


def idle_sim(down: float, zero: float) -> tuple[Sim, float]:
    p = policy(min_replicas=0, scale_down_delay_seconds=down, scale_to_zero_delay_seconds=zero)
    sim = Sim(p, current=1)
    sim.run(5, in_flight=1)
    idle = sim.now
    sim.run(500)
    return sim, idle


@pytest.mark.parametrize(("down", "zero"), ZERO_TIMINGS + LATE_ZERO_TIMINGS)
def test_to_zero_only_after_the_zero_delay(down: float, zero: float) -> None:
    sim, idle = idle_sim(down, zero)
    at = sim.first(idle, replicas=0)
    assert at is not None
    assert at - idle >= max(down, zero)
    assert sim.current == 0


@pytest.mark.parametrize(("down", "zero"), ZERO_TIMINGS)
def test_to_zero_soon_after_the_zero_delay(down: float, zero: float) -> None:
    sim, idle = idle_sim(down, zero)
    at = sim.first(idle, replicas=0)
    assert at is not None
    assert at - idle <= max(down, zero) + 2  # + the 1 s traffic history and one tick


@pytest.mark.parametrize(("down", "zero"), LATE_ZERO_TIMINGS)
def test_to_zero_soon_after_the_zero_delay_when_down_is_shorter(down: float, zero: float) -> None:
    sim, idle = idle_sim(down, zero)
    at = sim.first(idle, replicas=0)
    assert at is not None
    assert at - idle <= max(down, zero) + 2


def test_a_request_restarts_the_zero_clock() -> None:
    sim = Sim(policy(min_replicas=0, scale_down_delay_seconds=0, scale_to_zero_delay_seconds=30), 1)
    sim.run(20)
    assert sim.current == 1
    sim.tick(in_flight=1)
    last = sim.now
    sim.run(100)
    at = sim.first(last, replicas=0)
    assert at is not None and at - last >= 30


def test_cold_start_after_zero() -> None:
    sim = Sim(policy(min_replicas=0, scale_down_delay_seconds=0, scale_to_zero_delay_seconds=5), 1)
    sim.run(20)
    assert sim.current == 0
    assert sim.tick(queued=1).replicas == 1


# --- the p99 objective ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p99", "grows"),
    [(None, False), (50.0, False), (100.0, False), (101.0, True), (900.0, True)],
)  # fmt: skip
def test_p99_above_the_objective_adds_replicas(p99: float | None, grows: bool) -> None:
    sim = Sim(policy(p99_latency_ms=100, scale_up_delay_seconds=2, max_replicas=4), current=1)
    sim.run(3, in_flight=1, p99=p99)
    assert (sim.current == 2) == grows  # one more, though the load alone needs one
    sim.run(60, in_flight=1, p99=p99)
    assert max(sim.counts()) == (4 if grows else 1)  # up to max_replicas, never past it


def test_no_scale_down_while_the_p99_is_over_the_objective() -> None:
    sim = Sim(policy(p99_latency_ms=100, scale_up_delay_seconds=2, max_replicas=4), current=1)
    sim.run(60, in_flight=1, p99=500)
    counts = sim.counts()
    assert counts == sorted(counts)
    assert sim.current == 4


def test_p99_without_an_objective_is_ignored() -> None:
    sim = Sim(policy(scale_up_delay_seconds=0), current=1)
    sim.run(30, in_flight=1, p99=60_000)
    assert set(sim.counts()) == {1}


def test_p99_boosts_first() -> None:
    sim = Sim(policy(p99_latency_ms=100, scale_up_delay_seconds=2), current=1, can_boost=True)
    sim.run(3, in_flight=1, p99=500)
    assert (sim.current, sim.state.boosted) == (1, True)
    sim.run(3, in_flight=1, p99=500)
    assert sim.current == 2
