"""The autoscaler's decision for one deployment: pure, with the clock and the traffic passed in.

Each reconcile pass gives it the gateway's reading (requests in flight and waiting, p99 latency) and
the replica count now; it answers the count wanted and why. The rules, in the names hosted platforms
use (docs/serving.md):

* **up**: when in-flight plus queued requests per replica stay above ``target_in_flight`` (or the
  p99 above ``p99_latency_ms``) for ``scale_up_delay_seconds``, to as many replicas as the load
  needs (at most ``max_replicas``). From zero replicas, a waiting request starts one at once (a cold
  start; the gateway holds the request meanwhile).
* **boost first**: before adding a replica, it first raises the replicas' QoS weight on their GPU
  (``BOOST`` times) where they share it with other workloads (``can_boost``), so a busy deployment
  takes more of a GPU it shares before it takes another slice;
  the weight goes back down when the load is below target for ``scale_down_delay_seconds``.
* **down**: when the load averaged over ``traffic_history_seconds`` needs fewer replicas for
  ``scale_down_delay_seconds``, to that many (at least ``min_replicas``, and at least 1 while there
  is any traffic); to zero only after ``scale_to_zero_delay_seconds`` (and at least
  ``scale_down_delay_seconds``) without any request, and only if ``min_replicas`` is 0.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, get_args

from gpufrac.model.deployment import Autoscale

BOOST = 2
ScaleDirection = Literal["up", "down", "boost", "unboost"]
SCALE_DIRECTIONS: tuple[ScaleDirection, ...] = get_args(ScaleDirection)


@dataclass(slots=True)
class ScaleState:
    """What the autoscaler remembers about one deployment between passes."""

    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (at, load)
    above_since: float | None = None
    below_since: float | None = None
    idle_since: float | None = None
    boosted: bool = False


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    replicas: int
    boosted: bool
    why: str


def decide(
    policy: Autoscale,
    state: ScaleState,
    now: float,
    current: int,
    in_flight: int,
    queued: int,
    p99_ms: float | None,
    *,
    can_boost: bool,
) -> ScaleDecision:
    load = float(in_flight + queued)
    state.samples.append((now, load))
    while state.samples and state.samples[0][0] < now - policy.traffic_history_seconds:
        state.samples.popleft()
    average = sum(x for _, x in state.samples) / len(state.samples)
    if load > 0:
        state.idle_since = None
    elif state.idle_since is None:
        state.idle_since = now
    floor = policy.min_replicas
    if current < floor:
        return ScaleDecision(floor, state.boosted, f"below min_replicas {floor}")
    if current > policy.max_replicas:
        return ScaleDecision(
            policy.max_replicas, state.boosted, f"above max_replicas {policy.max_replicas}"
        )
    if current == 0:
        if queued or in_flight:
            return ScaleDecision(1, state.boosted, "a request is waiting: cold start")
        return ScaleDecision(0, state.boosted, "")
    needed = min(policy.max_replicas, max(1, math.ceil(load / policy.target_in_flight)))
    slow = (
        policy.p99_latency_ms is not None and p99_ms is not None and p99_ms > policy.p99_latency_ms
    )
    if needed > current or (slow and current < policy.max_replicas):
        state.below_since = None
        if state.above_since is None:
            state.above_since = now
        if now - state.above_since < policy.scale_up_delay_seconds:
            return ScaleDecision(current, state.boosted, "")
        state.above_since = None
        if can_boost and not state.boosted:
            state.boosted = True
            return ScaleDecision(current, True, f"load {load:g}: QoS weight x{BOOST} first")
        want = max(needed, current + 1) if slow else needed
        why = f"p99 {p99_ms:.0f} ms over {policy.p99_latency_ms:g} ms" if slow else f"load {load:g}"
        return ScaleDecision(min(want, policy.max_replicas), state.boosted, why)
    state.above_since = None
    if slow:  # at max_replicas and still missing the objective: nothing to give back
        state.below_since = None
        return ScaleDecision(current, state.boosted, "")
    quiet = max(policy.scale_to_zero_delay_seconds, policy.scale_down_delay_seconds)
    idle = state.idle_since is not None and now - state.idle_since >= quiet
    if current == 1 and floor == 0 and idle and not state.boosted:
        state.below_since = None  # the last replica goes on the idle clock alone
        return ScaleDecision(0, False, f"no request for {quiet:g}s")
    wanted = max(floor, 1, math.ceil(average / policy.target_in_flight))
    if wanted < current or (state.boosted and load <= policy.target_in_flight * current / 2):
        if state.below_since is None:
            state.below_since = now
        if now - state.below_since < policy.scale_down_delay_seconds:
            return ScaleDecision(current, state.boosted, "")
        state.below_since = None
        if state.boosted:
            state.boosted = False
            return ScaleDecision(current, False, "load fell: QoS weight back")
        if wanted < current:
            return ScaleDecision(
                wanted, False, f"load averaged {average:g} over {policy.traffic_history_seconds:g}s"
            )
        return ScaleDecision(current, False, "")
    state.below_since = None
    return ScaleDecision(current, state.boosted, "")


def directions(current: int, was_boosted: bool, d: ScaleDecision) -> list[ScaleDirection]:
    """What a decision changed, as counted in ``gpufrac_autoscaler_decisions_total``."""
    out: list[ScaleDirection] = []
    if d.replicas > current:
        out.append("up")
    elif d.replicas < current:
        out.append("down")
    if d.boosted != was_boosted:
        out.append("boost" if d.boosted else "unboost")
    return out
