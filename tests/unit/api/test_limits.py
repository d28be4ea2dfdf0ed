"""Each tenant's applies, at once and a second (``api.limits``): pure, on a given clock."""

from __future__ import annotations

import pytest

from gpufrac.api.limits import ApplyLimits


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def limits(
    clock: Clock, *, concurrent: int = 2, rate: float = 10.0, burst: int = 20
) -> ApplyLimits:
    return ApplyLimits(concurrent=concurrent, rate=rate, burst=burst, clock=clock)


def test_a_tenant_has_at_most_its_concurrent_applies_and_others_are_not_held() -> None:
    clock = Clock()
    lim = limits(clock)
    assert lim.take("alpha") is None and lim.take("alpha") is None
    third = lim.take("alpha")
    assert third is not None and third.retry_after_s == 1
    assert "max_concurrent_applies" in third.reason
    assert lim.take("beta") is None  # another tenant is not held by alpha's
    lim.done("alpha")
    assert lim.take("alpha") is None
    assert lim.in_flight("alpha") == 2


def test_the_rate_allows_a_burst_then_refills_and_says_when() -> None:
    clock = Clock()
    lim = limits(clock, concurrent=64, rate=2.0, burst=3)
    for _ in range(3):
        assert lim.take("alpha") is None
        lim.done("alpha")
    refused = lim.take("alpha")
    assert refused is not None and "apply_rate" in refused.reason
    assert refused.retry_after_s == 1  # half a second to the next, said as a whole second
    clock.now += 0.5
    assert lim.take("alpha") is None
    lim.done("alpha")
    assert lim.take("alpha") is not None
    clock.now += 10  # refilled to the burst, not beyond
    for _ in range(3):
        assert lim.take("alpha") is None
        lim.done("alpha")
    assert lim.take("alpha") is not None


def test_a_slow_rate_says_the_seconds_to_wait() -> None:
    clock = Clock()
    lim = limits(clock, rate=0.1, burst=1)
    assert lim.take("t") is None
    lim.done("t")
    refused = lim.take("t")
    assert refused is not None and refused.retry_after_s == 10


def test_a_refusal_takes_no_token() -> None:
    clock = Clock()
    lim = limits(clock, concurrent=1, rate=1.0, burst=2)
    assert lim.take("t") is None
    for _ in range(5):
        assert lim.take("t") is not None  # one in progress: refused, the bucket not drawn
    lim.done("t")
    assert lim.take("t") is None  # the second token is still there
    lim.done("t")
    assert lim.take("t") is not None  # now the bucket is empty
    assert lim.in_flight("t") == 0


@pytest.mark.parametrize("bad", [{"concurrent": 0}, {"rate": 0.0}, {"burst": 0}])
def test_limits_must_be_positive(bad: dict[str, float]) -> None:
    args: dict[str, float] = {"concurrent": 2, "rate": 10.0, "burst": 20, **bad}
    with pytest.raises(ValueError, match="positive"):
        ApplyLimits(concurrent=int(args["concurrent"]), rate=args["rate"], burst=int(args["burst"]))
