"""The arbiter's policy on a driven clock: every assertion counts quanta or turns, never wall
time."""

from __future__ import annotations

from collections import Counter

import pytest

from gpufrac.model.qos import QosParams, arbiter_rank, mps_client_priority
from gpufrac.runtime.arbiter import (
    Action,
    AskYield,
    ClearYield,
    Grant,
    Pause,
    Resume,
    TurnPolicy,
)

MS = 0.001


def grants(actions: list[Action]) -> list[int]:
    return [a.client for a in actions if isinstance(a, Grant)]


def busy_loops(
    p: TurnPolicy, members: dict[str, QosParams], turns: int, *, turn_s: float = MS
) -> Counter[str]:
    """Each member is a client that holds each turn for ``turn_s`` and asks again at once (a
    training loop). Returns the turns each got out of ``turns``."""
    now = 0.0
    key_of = dict(enumerate(members))
    first: list[int] = []
    for cid, key in key_of.items():
        p.connect(cid, key, "gpu", members[key], now)
    for cid in key_of:
        first += grants(p.acquire(cid, now))
    assert first
    holder = p.domains["gpu"].client  # under overlap a later grant may have taken over the first
    assert holder is not None
    got: Counter[str] = Counter()
    for _ in range(turns):
        got[key_of[holder]] += 1
        now += turn_s
        out = grants(p.release(holder, now))
        out += grants(p.acquire(holder, now + 10e-6))
        now += 10e-6
        while not out:
            deadline = p.next_deadline(now)
            assert deadline is not None, "a waiting client must be granted eventually"
            now = max(now, deadline)
            out = grants(p.tick(now))
        holder = p.domains["gpu"].client  # the last grant (under overlap it took over another)
        assert holder is not None and holder in out
    return got


def concurrent_loops(
    p: TurnPolicy,
    members: dict[str, QosParams],
    duration: float,
    *,
    turn_s: float = MS,
    yield_s: float = 0.1 * MS,
) -> Counter[str]:
    """Each member is one SDK client in a training loop: it holds each grant for ``turn_s`` (or,
    asked to yield, until its next yield point ``yield_s`` later), gives it back and asks again at
    once. Grants may overlap (a turn beside the holder, a turn taken over and draining). Returns how
    often each member was asked to yield."""
    now = 0.0
    cid = {key: i + 1 for i, key in enumerate(members)}
    ends: dict[int, float] = {}  # holding client -> when it gives the turn back
    asked: Counter[str] = Counter()

    def handle(actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Grant):
                ends[a.client] = now + turn_s
            elif isinstance(a, AskYield):
                asked[a.member] += 1
                c = cid[a.member]
                if c in ends:
                    ends[c] = min(ends[c], now + yield_s)

    for key, q in members.items():
        handle(p.connect(cid[key], key, "gpu", q, now))
    for key in members:
        handle(p.acquire(cid[key], now))
    while now < duration:
        deadline = p.next_deadline(now)
        step = min([*ends.values(), *([deadline] if deadline is not None else [])])
        now = max(now, step)
        for c, end in sorted(ends.items()):
            if end <= now:
                del ends[c]
                handle(p.release(c, now))
                handle(p.acquire(c, now))
        handle(p.tick(now))
    return asked


def test_class_mapping_and_mps_priority() -> None:
    assert arbiter_rank(100, "throughput") > arbiter_rank(50, "latency")  # priority first
    assert arbiter_rank(50, "latency") > arbiter_rank(50, "throughput")
    assert (mps_client_priority("latency"), mps_client_priority("throughput")) == (0, 1)


def test_strict_priority_asks_the_holder_to_yield_and_grants_the_higher_class_next() -> None:
    p = TurnPolicy(quantum=10 * MS, preempt="drain")
    p.connect(1, "w/train", "gpu", QosParams(rank=0), 0.0)
    p.connect(2, "w/infer", "gpu", QosParams(rank=10), 0.0)
    p.connect(3, "w/train", "gpu", QosParams(rank=0), 0.0)
    assert grants(p.acquire(1, 0.0)) == [1]
    assert p.acquire(2, 0.001) == [AskYield("w/train")]
    assert p.acquire(3, 0.002) == []  # the trainer's second client must wait too
    out = p.release(1, 0.003)
    assert ClearYield("w/train") in out and grants(out) == [2]
    # while the higher class holds, the lower class is never granted, whatever the clock says
    assert grants(p.tick(1.0)) == []
    assert grants(p.release(2, 1.001)) == [3]


@pytest.mark.parametrize(("wa", "wb"), [(1, 1), (3, 1), (1, 4)])
def test_weights_split_turns_within_a_class(wa: int, wb: int) -> None:
    p = TurnPolicy(quantum=10 * MS, grace=2 * MS)
    got = busy_loops(p, {"a": QosParams(0, wa), "b": QosParams(0, wb)}, 4000)
    assert got["a"] / 4000 == pytest.approx(wa / (wa + wb), abs=0.02)


@pytest.mark.parametrize("preempt", ["drain", "overlap"])
def test_a_busy_higher_class_takes_every_turn_without_min_share(preempt: str) -> None:
    p = TurnPolicy(quantum=10 * MS, grace=2 * MS, preempt=preempt)
    got = busy_loops(p, {"hi": QosParams(10), "lo": QosParams(0)}, 1000)
    assert got["lo"] <= 1  # at most the turn it had before the other asked


def test_min_share_is_given_beside_a_busy_higher_class_never_instead_of_it() -> None:
    p = TurnPolicy(quantum=10 * MS, grace=2 * MS, window=0.5)
    asked = concurrent_loops(p, {"hi": QosParams(10), "lo": QosParams(0, 1, 100)}, 4.0)
    busy = p.domains["gpu"].busy_s
    assert asked["hi"] == 0  # the higher class is never asked to yield for a lower one
    assert p.members["hi"].held_s == pytest.approx(busy, rel=0.01)  # it ran the whole time
    lo = p.members["lo"].held_s / busy
    assert 0.09 <= lo <= 0.2, lo  # its min share, beside the higher class (shares sum over 1)
    assert p.share("lo", 4.0) >= 0.08
    assert asked["lo"] > 0  # back at its share, it was asked to give the GPU back


def test_transparent_members_share_their_class_natively_and_stop_for_a_higher_one() -> None:
    p = TurnPolicy(quantum=10 * MS)
    out = p.set_member("a", "gpu", QosParams(0, 3), 111, 0.0)
    out += p.set_member("b", "gpu", QosParams(0, 1), 222, 0.0)
    assert Resume("a") in out and Resume("b") in out  # a new arbiter resumes first
    assert not any(isinstance(a, Pause) for a in out + p.tick(0.5))  # same class: never paused
    out = p.set_member("hi", "gpu", QosParams(10), 333, 0.6)
    assert Pause("a") in out and Pause("b") in out
    now = 0.6
    for _ in range(100):  # the higher class always wants: the lower one stays stopped
        now += 10 * MS
        assert not any(isinstance(a, Resume) for a in p.tick(now))
    assert p.members["a"].paused and p.members["b"].paused
    out = p.remove_member("hi", now)
    assert Resume("a") in out and Resume("b") in out


def test_a_transparent_low_class_is_paused_for_each_turn_of_a_cooperative_high_class() -> None:
    p = TurnPolicy()
    p.set_member("train", "gpu", QosParams(0), 4242, 0.0)
    assert p.domains["gpu"].holder == "train"
    p.connect(7, "infer", "gpu", QosParams(10), 0.0)
    out = p.acquire(7, 0.01)
    assert out == [Grant(7), Pause("train")]
    assert p.release(7, 0.015) == [Resume("train")]


def test_a_crashed_holder_releases_its_turn() -> None:
    p = TurnPolicy()
    p.connect(1, "a", "gpu", QosParams(0), 0.0)
    p.connect(2, "b", "gpu", QosParams(0), 0.0)
    assert grants(p.acquire(1, 0.0)) == [1]
    assert grants(p.acquire(2, 0.001)) == []
    assert grants(p.disconnect(1, 0.002)) == [2]
    assert "a" not in p.members  # made by its own hello, gone with its last client


def test_removing_a_paused_member_resumes_it_and_hands_on_the_turn() -> None:
    p = TurnPolicy()
    p.set_member("a", "gpu", QosParams(0), 1, 0.0)
    p.set_member("b", "gpu", QosParams(5), 2, 0.0)
    assert p.members["a"].paused
    out = p.remove_member("a", 0.1)
    assert out == [Resume("a")]
    assert p.remove_member("b", 0.2) == []


def test_connecting_makes_a_member_cooperative_and_resumes_it() -> None:
    p = TurnPolicy()
    p.set_member("a", "gpu", QosParams(0), 1, 0.0)
    p.set_member("b", "gpu", QosParams(5), 2, 0.0)
    assert p.members["a"].paused
    assert Resume("a") in p.connect(9, "a", "gpu", QosParams(0), 0.1)
    assert not p.members["a"].transparent


def test_live_changes_take_effect_at_once() -> None:
    p = TurnPolicy(quantum=10 * MS, preempt="drain")
    p.connect(1, "a", "gpu", QosParams(0), 0.0)
    p.connect(2, "b", "gpu", QosParams(0), 0.0)
    assert grants(p.acquire(1, 0.0)) == [1]
    assert grants(p.acquire(2, 0.001)) == []
    # b is raised above a: a is asked to yield at once, not after its quantum
    assert p.set_member("b", "gpu", QosParams(10), None, 0.002) == [AskYield("a")]
    got = busy_loops(TurnPolicy(grace=2 * MS), {"a": QosParams(0, 1), "b": QosParams(0, 1)}, 10)
    assert sum(got.values()) == 10


def test_domains_are_independent() -> None:
    p = TurnPolicy()
    p.connect(1, "a", "gpu-0", QosParams(0), 0.0)
    p.connect(2, "b", "gpu-1", QosParams(10), 0.0)
    assert grants(p.acquire(1, 0.0)) == [1]
    assert grants(p.acquire(2, 0.0)) == [2]  # another GPU (or MIG instance): no contention


def test_an_idle_member_banks_at_most_one_quantum() -> None:
    p = TurnPolicy(quantum=10 * MS, grace=2 * MS)
    busy_loops(p, {"a": QosParams(0), "b": QosParams(0)}, 10)  # warms a and b
    p.connect(5, "late", "gpu", QosParams(0), 0.02)
    assert p.members["late"].vt >= min(p.members[k].vt for k in ("a", "b")) - 10 * MS


def test_the_next_deadline_is_always_ahead_so_the_arbiter_never_spins() -> None:
    p = TurnPolicy(quantum=10 * MS)
    p.set_member("svc", "gpu", QosParams(10), 100, 0.0)  # transparent: holds for good
    p.connect(1, "low", "gpu", QosParams(0), 0.0)
    p.acquire(1, 0.0)
    now = 0.0
    for _ in range(50):
        deadline = p.next_deadline(now)
        assert deadline is not None and deadline > now
        now = deadline
        assert grants(p.tick(now)) == []  # the lower class keeps waiting, a tick per quantum


def test_an_expired_reservation_is_cleared() -> None:
    p = TurnPolicy(quantum=10 * MS, grace=2 * MS)
    busy_loops(p, {"a": QosParams(0), "b": QosParams(0)}, 20)
    d = p.domains["gpu"]
    if d.reserved is None:
        d.reserved, d.reserved_until = "a", 1.0
    p.tick(5.0)
    assert d.reserved is None and (p.next_deadline(5.0) or 6.0) > 5.0


def test_a_client_without_a_member_runs_free() -> None:
    assert TurnPolicy().acquire(42, 0.0) == [Grant(42)]


def test_an_unregistered_member_with_clients_stays_and_is_never_paused_again() -> None:
    p = TurnPolicy()
    p.set_member("a", "gpu", QosParams(0), 1, 0.0)
    p.connect(3, "a", "gpu", QosParams(0), 0.0)
    assert p.remove_member("a", 0.1) == []
    assert "a" in p.members and p.members["a"].pgid is None
    assert grants(p.acquire(3, 0.2)) == [3]


def test_a_holder_that_went_away_after_being_asked_is_asked_again_next_time() -> None:
    p = TurnPolicy(preempt="drain")
    p.connect(1, "lo", "gpu", QosParams(0), 0.0)
    p.connect(2, "lo", "gpu", QosParams(0), 0.0)
    p.connect(3, "hi", "gpu", QosParams(10), 0.0)
    p.acquire(1, 0.0)
    p.acquire(2, 0.0)
    assert p.acquire(3, 0.001) == [AskYield("lo")]
    assert grants(p.disconnect(1, 0.002)) == [3]  # gone without giving the turn back
    assert grants(p.release(3, 0.003)) == [2]
    assert p.acquire(3, 0.004) == [AskYield("lo")]  # asked again, not left waiting


def test_a_min_share_turn_beside_the_higher_class_lasts_a_quantum_at_least() -> None:
    p = TurnPolicy(quantum=10 * MS, window=1.0)
    p.set_member("hi", "gpu", QosParams(10), 1, 0.0)
    p.set_member("lo", "gpu", QosParams(0, 1, 100), 2, 0.0)
    switches = 0
    now = 0.0
    while now < 2.0:
        now += MS  # a tick every millisecond, ten per quantum
        out = p.tick(now)
        switches += sum(isinstance(a, Resume) for a in out)
        assert Pause("hi") not in out
    assert switches <= 2.0 / (10 * MS) / 2  # far fewer than one a tick: a turn is a quantum
    assert p.share("lo", now) >= 0.09


def tick_for(p: TurnPolicy, start: float, end: float, step: float = MS) -> list[Action]:
    out: list[Action] = []
    now = start
    while now < end - 1e-9:
        now = round(now + step, 9)
        out += p.tick(now)
    return out


def test_a_transparent_higher_class_is_never_paused_for_a_lower_ones_min_share() -> None:
    p = TurnPolicy(quantum=10 * MS, window=2.0)
    out = p.set_member("svc", "gpu", QosParams(10), 100, 0.0)  # a busy service, no SDK
    out += p.set_member("job", "gpu", QosParams(0, 1, 100), 200, 0.0)  # a job, min share 10%
    out += tick_for(p, 0.0, 20.0)
    assert not [a for a in out if isinstance(a, Pause) and a.member == "svc"]
    job, busy = p.members["job"], p.domains["gpu"].busy_s
    assert busy == pytest.approx(20.0)  # the service ran all along
    assert p.members["svc"].held_s == pytest.approx(20.0)
    assert 0.09 <= job.held_s / busy <= 0.12  # beside it, for its min share
    # each pause was counted, by the member whose class held the GPU, each with its own length
    log = [r for r in p.pause_log if r.member == "job"]
    assert len(log) == job.pauses - (1 if job.paused else 0) and len(log) > 10
    assert {r.by for r in log} == {"svc"}
    assert job.paused_s == pytest.approx(sum(r.seconds for r in log))
    assert all(r.end > r.start for r in log) and max(r.seconds for r in log) < 1.0


def test_a_lower_class_is_paused_only_while_the_higher_class_is_busy() -> None:
    p = TurnPolicy(quantum=10 * MS)
    p.set_member("svc", "gpu", QosParams(10), 100, 0.0, active=False)
    p.set_member("job", "gpu", QosParams(0), 200, 0.0)
    busy = [(1.0, 3.0), (5.0, 5.5), (8.0, 12.0)]  # when the service is busy
    now = 0.0
    for start, end in busy:
        tick_for(p, now, start)
        p.set_member("svc", "gpu", QosParams(10), 100, start, active=True)
        tick_for(p, start, end)
        p.set_member("svc", "gpu", QosParams(10), 100, end, active=False)
        now = end
    tick_for(p, now, 14.0)
    pauses = [(r.start, r.end, r.by) for r in p.pause_log if r.member == "job"]
    assert pauses == [(s, e, "svc") for s, e in busy]
    assert p.members["job"].pauses == 3 and not p.members["job"].paused


def test_two_equal_jobs_never_stop_each_other_whatever_their_min_shares() -> None:
    p = TurnPolicy(quantum=10 * MS)
    out = p.set_member("a", "gpu", QosParams(0, 1, 100), 100, 0.0)
    out += p.set_member("b", "gpu", QosParams(0, 1, 100), 200, 0.0)
    out += tick_for(p, 0.0, 10.0)
    assert not [a for a in out if isinstance(a, Pause)]
    # both ran all the time: each is charged the overlap, so their shares sum to 2
    assert p.share("a", 10.0) == pytest.approx(1.0) and p.share("b", 10.0) == pytest.approx(1.0)


def test_an_idle_job_of_a_higher_class_stops_no_one_whatever_its_min_share() -> None:
    p = TurnPolicy(quantum=10 * MS)
    out = p.set_member("hi-job", "gpu", QosParams(10, 1, 100), 100, 0.0, active=False)
    out += p.set_member("job", "gpu", QosParams(0, 1, 100), 200, 0.0)
    out += tick_for(p, 0.0, 5.0)
    assert not [a for a in out if isinstance(a, Pause)]  # it sleeps: the GPU is the other's
    out = p.set_member("hi-job", "gpu", QosParams(10, 1, 100), 100, 5.0, active=True)
    assert Pause("job") in out  # busy now: the lower class waits (beside it, its share)
    out = p.set_member("hi-job", "gpu", QosParams(10, 1, 100), 100, 6.0, active=False)
    assert Resume("job") in out and not p.members["job"].paused


def test_an_sdk_workload_that_runs_without_a_turn_is_stopped_by_signals_like_any() -> None:
    p = TurnPolicy(quantum=10 * MS, yield_grace=0.5)
    p.set_member("svc", "gpu", QosParams(10), 100, 0.0)  # busy, no SDK
    p.set_member("evil", "gpu", QosParams(0), 200, 0.0, active=False)
    out = p.connect(9, "evil", "gpu", QosParams(0), 0.1)  # says hello, never asks for a turn
    assert Resume("evil") in out  # cooperative now, and idle
    out = p.set_member("evil", "gpu", QosParams(0), 200, 0.5, active=True)  # but is busy
    assert Pause("evil") in out
    out = p.set_member("evil", "gpu", QosParams(0), 200, 1.0, active=False)
    assert Resume("evil") in out  # idle on the GPU: its clients wait for their turns
    # one that keeps to its turns is never stopped: it waits, idle, for its turn
    p.connect(11, "good", "gpu", QosParams(0), 1.0)
    assert p.acquire(11, 1.0) == []
    assert not [a for a in tick_for(p, 1.0, 2.0) if isinstance(a, Pause)]


def test_a_turn_taken_over_and_not_given_back_is_stopped_after_its_grace() -> None:
    p = TurnPolicy(quantum=10 * MS, yield_grace=0.5)
    p.set_member("train", "gpu", QosParams(0), 200, 0.0)
    p.connect(1, "train", "gpu", QosParams(0), 0.0)
    assert grants(p.acquire(1, 0.0)) == [1]
    p.set_member("train", "gpu", QosParams(0), 200, 0.0, active=True)
    p.connect(2, "infer", "gpu", QosParams(10), 0.0)
    assert p.acquire(2, 0.1) == [AskYield("train"), Grant(2)]  # overlap: taken over
    assert Pause("train") not in tick_for(p, 0.1, 0.55)  # it drains, within its grace
    deadline = p.next_deadline(0.55)
    assert deadline is not None and deadline <= 0.6 + 1e-9
    assert Pause("train") in tick_for(p, 0.55, 0.7)  # it ignored the flag: stopped


def test_a_cooperative_low_class_is_granted_beside_a_transparent_higher_class() -> None:
    p = TurnPolicy(quantum=10 * MS)
    p.set_member("svc", "gpu", QosParams(10), 100, 0.0)
    tick_for(p, 0.0, 1.0)
    p.connect(7, "job", "gpu", QosParams(0, 1, 100), 1.0)
    out = p.acquire(7, 1.0)
    assert out == [Grant(7)]  # below its share: a turn beside the service, which runs on
    assert p.domains["gpu"].holder == "svc" and not p.members["svc"].paused
    out = tick_for(p, 1.0, 1.2)
    assert AskYield("job") in out and not [a for a in out if isinstance(a, Pause)]
    assert p.release(7, 1.2) == [ClearYield("job")]


def test_a_lower_class_holder_is_taken_over_at_once_and_keeps_its_min_share() -> None:
    p = TurnPolicy(quantum=10 * MS, window=1.0)
    p.set_member("job", "gpu", QosParams(0, 1, 100), 200, 0.0)
    tick_for(p, 0.0, 1.0)
    out = p.set_member("svc", "gpu", QosParams(10), 100, 1.0)
    assert p.domains["gpu"].holder == "svc"
    out += tick_for(p, 1.0, 4.0)
    assert Pause("job") in out and Pause("svc") not in out
    assert p.share("job", 4.0) >= 0.09


def test_overlap_grants_a_higher_class_at_once_and_the_holder_stops_at_its_yield_point() -> None:
    p = TurnPolicy(quantum=10 * MS)  # overlap is the default
    p.connect(1, "train", "gpu", QosParams(0), 0.0)
    p.connect(2, "infer", "gpu", QosParams(10), 0.0)
    assert grants(p.acquire(1, 0.0)) == [1]
    assert p.acquire(2, 0.001) == [AskYield("train"), Grant(2)]
    # the trainer reaches its yield point: gives back the turn it no longer holds, asks again
    assert p.release(1, 0.0015) == [ClearYield("train")]
    assert p.acquire(1, 0.0015) == []
    assert grants(p.release(2, 0.004)) == [1]
    # charged until it was taken over, and for its draining until it gave the turn back
    assert p.members["train"].held_s == pytest.approx(0.0015)


def test_a_member_with_two_processes_keeps_its_yield_request_until_both_have_yielded() -> None:
    p = TurnPolicy()
    for client, key, rank in ((1, "A", 0), (2, "A", 0), (3, "H", 10)):
        p.connect(client, key, "gpu", QosParams(rank), 0.0)
    p.acquire(1, 0.0)
    p.acquire(2, 0.001)
    assert p.acquire(3, 0.002) == [AskYield("A"), Grant(3)]  # c1 taken over, still draining
    assert grants(p.release(3, 0.004)) == [2]  # c2 runs while c1 drains
    assert p.acquire(3, 0.006) == [AskYield("A"), Grant(3)]  # c2 taken over too
    assert p.release(1, 0.007) == []  # c1 yielded: c2 still has to, the flag stays
    assert p.release(2, 0.008) == [ClearYield("A")]
    # charged the time it was allowed to run (a turn, or draining one), once however many
    # of its clients ran at that moment: from 0 to c2's last yield
    assert p.members["A"].held_s == pytest.approx(0.008)
