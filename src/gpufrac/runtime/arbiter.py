"""The QoS arbiter's policy: who may submit GPU work on each GPU (or MIG instance), moment to
moment.

Pure: no sockets, no signals. Events go in (a member registered, a client asked for a turn or gave
it back, the clock moved) and actions come out (grant a client its turn, ask a holder to yield,
pause or resume a process group); ``runtime/arbiter_server.py`` carries the actions out. The clock
is passed in, so tests drive it by counted quanta.

One *domain* (a GPU, or a MIG instance) has at most one holder at a time. A *member* is a workload
in a domain; it is *cooperative* while it has SDK clients connected (they ask for turns and give
them back), else *transparent* (a process group; not holding means SIGSTOP). A transparent member
wants the GPU only while the agent says it is *active* (its processes busy on the GPU by NVML's
per-process reading, or requests in flight to it through the gateway), or always if it is guaranteed
a min share: an idle service holds nothing, so it never stops a workload of a lower class.

Who is served next, among the members that want a turn:
1. a member below its ``min_share`` of the domain's busy time over the last ``window`` seconds (so
   low priority never starves), then
2. the highest ``rank`` (strict priority between classes), then
3. the lowest virtual time (weighted fair share within a class: holding for ``dt`` adds
   ``dt/weight``).

A holder of a lower class is asked to yield at once; one of the same class after it has held for a
``quantum`` (and a member served for its min share keeps its turn for a quantum). A cooperative
holder yields at its next yield point (the SDK checks a flag in shared memory) or when its turn
ends; a transparent one is paused at once. How a higher class takes over a cooperative holder is
``preempt``: ``overlap`` (the default) grants the higher class at once, so its work starts while the
holder's last queued work drains beside it; ``drain`` grants it once the holder has given the turn
back.

Anticipation: a cooperative member that gives its turn back unasked, while it still has more right
to the GPU than anyone waiting, and that usually asks again within ``grace`` seconds (a training
loop between steps), keeps the turn reserved for ``grace``. So a busy high-priority loop is not
overtaken between two steps, and weights hold between loops; a member that comes back later (an
inference server between requests) reserves nothing, so nobody waits for it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gpufrac.model.qos import MILLI, QosParams


@dataclass(frozen=True, slots=True)
class Grant:
    client: int


@dataclass(frozen=True, slots=True)
class AskYield:
    member: str


@dataclass(frozen=True, slots=True)
class ClearYield:
    member: str


@dataclass(frozen=True, slots=True)
class Pause:
    member: str
    pgid: int


@dataclass(frozen=True, slots=True)
class Resume:
    member: str
    pgid: int


Action = Grant | AskYield | ClearYield | Pause | Resume


@dataclass(slots=True)
class Member:
    key: str
    domain: str
    qos: QosParams
    pgid: int | None = None
    clients: set[int] = field(default_factory=set)
    waiting: deque[int] = field(default_factory=deque)
    vt: float = 0.0
    held_s: float = 0.0  # total time holding the turn
    gpu_s: float = 0.0  # total GPU time the SDK measured (CUDA events) and reported
    turns: int = 0
    last_release: float | None = None
    gap: float | None = None  # how soon it usually asks again after giving a turn back (EWMA)
    paused: bool = False
    paused_since: float | None = None
    paused_s: float = 0.0  # total time paused by signals
    active: bool = True  # a transparent member: busy on the GPU now (the agent says)
    asked_to_yield: bool = False
    # clients whose turn a higher class took over (overlap), still draining: client -> since when
    taken_over: dict[int, float] = field(default_factory=dict)
    usage: deque[tuple[float, float]] = field(default_factory=deque)  # (end, seconds held)
    usage_sum: float = 0.0  # the sum of ``usage``, kept as entries come and go
    reported: deque[tuple[float, float]] = field(default_factory=deque)  # (at, GPU seconds)

    @property
    def transparent(self) -> bool:
        return not self.clients and self.pgid is not None

    @property
    def wants(self) -> bool:
        """A cooperative member wants a turn while a client waits; a transparent one while it is
        busy, or always when it is guaranteed a min share (a job, by default: it has work to do,
        and while it is paused its processes cannot show that they are busy)."""
        if self.transparent:
            return self.active or self.qos.min_share_milli > 0
        return bool(self.waiting)

    def pause(self, now: float) -> None:
        self.paused, self.paused_since = True, now

    def resume(self, now: float) -> None:
        if self.paused_since is not None:
            self.paused_s += max(0.0, now - self.paused_since)
        self.paused, self.paused_since = False, None

    def paused_total(self, now: float) -> float:
        return self.paused_s + (now - self.paused_since if self.paused_since is not None else 0.0)


@dataclass(slots=True)
class Domain:
    name: str
    holder: str | None = None
    client: int | None = None  # the holding client (None for a transparent holder)
    since: float = 0.0
    accounted: float = 0.0  # the holder's time is accounted up to here
    reserved: str | None = None
    reserved_until: float = 0.0
    kept_until: float = 0.0  # a turn given for a min share lasts a quantum at least


PREEMPT_MODES = ("overlap", "drain")


class TurnPolicy:
    def __init__(
        self,
        *,
        quantum: float = 0.01,
        grace: float = 0.002,
        window: float = 2.0,
        preempt: str = "overlap",
    ) -> None:
        self.quantum, self.grace, self.window = quantum, grace, window
        self.preempt = (
            preempt  # overlap | drain: how a higher class takes over a cooperative holder
        )
        self.members: dict[str, Member] = {}
        self.domains: dict[str, Domain] = {}
        self.client_member: dict[int, str] = {}

    # -- membership -----------------------------------------------------------------------------

    def set_member(
        self,
        key: str,
        domain: str,
        qos: QosParams,
        pgid: int | None,
        now: float,
        active: bool = True,
    ) -> list[Action]:
        """Register a workload, or change its class, weight, min share, process group or activity
        live. A transparent holder that goes idle gives the GPU up at once."""
        out: list[Action] = []
        m = self.members.get(key)
        clients: set[int] = set()
        if m is not None and m.domain != domain:  # moved: its clients come along, without a turn
            clients = set(m.clients)
            out += self._drop(key, now)
            m = None
        if m is None:
            m = Member(key, domain, qos, pgid)
            d = self.domains.setdefault(domain, Domain(domain))
            m.vt = self._floor_vt(d, exclude=key)
            self.members[key] = m
            for c in clients:
                m.clients.add(c)
                self.client_member[c] = key
            if pgid is not None:
                out.append(
                    Resume(key, pgid)
                )  # whatever paused it before (a crashed arbiter) is gone
        else:
            if m.paused and m.pgid is not None and m.pgid != pgid:
                out.append(Resume(key, m.pgid))
                m.resume(now)
            m.qos, m.pgid = qos, pgid
        m.active = active
        d = self.domains[domain]
        if d.holder == key and m.transparent and not active:
            self._account(d, now)
            d.holder, d.client = None, None
        return out + self._schedule(d, now)

    def remove_member(self, key: str, now: float) -> list[Action]:
        """The agent no longer runs this workload here. A member whose SDK clients are still
        connected stays (as if made by their hello), no longer paused by signals; the rest is
        forgotten."""
        m = self.members.get(key)
        if m is None:
            return []
        if m.clients:
            out: list[Action] = []
            if m.paused and m.pgid is not None:
                out.append(Resume(key, m.pgid))
            m.resume(now)
            m.pgid = None
            return out + self._schedule(self.domains[m.domain], now)
        return self._drop(key, now)

    def _drop(self, key: str, now: float) -> list[Action]:
        m = self.members.pop(key, None)
        if m is None:
            return []
        d = self.domains[m.domain]
        out: list[Action] = []
        if d.holder == key:
            self._account(d, now)
            d.holder, d.client = None, None
        if d.reserved == key:
            d.reserved = None
        if m.paused and m.pgid is not None:
            out.append(Resume(key, m.pgid))
        for c in m.clients:
            self.client_member.pop(c, None)
        return out + self._schedule(d, now)

    def connect(
        self, client: int, key: str, domain: str, qos: QosParams, now: float
    ) -> list[Action]:
        """An SDK client says hello. A member the agent did not register is made from its own
        word."""
        out: list[Action] = []
        if client in self.client_member:
            return []  # a second hello on one connection changes nothing
        if key not in self.members:
            out += self.set_member(key, domain, qos, None, now)
        m = self.members[key]
        was_transparent = m.transparent
        m.clients.add(client)
        self.client_member[client] = key
        if was_transparent:  # cooperative from now on: never paused by signals
            d = self.domains[m.domain]
            if d.holder == key:
                self._account(d, now)
                d.holder, d.client = None, None
            if m.paused and m.pgid is not None:
                out.append(Resume(key, m.pgid))
                m.resume(now)
            out += self._schedule(d, now)
        return out

    def disconnect(self, client: int, now: float) -> list[Action]:
        """A client went away (it closed, or its process died): its turn, if it held one, is
        over."""
        key = self.client_member.pop(client, None)
        m = self.members.get(key) if key else None
        if m is None:
            return []
        m.clients.discard(client)
        if client in m.waiting:
            m.waiting.remove(client)
        d = self.domains[m.domain]
        out = self._end_takeover(m, client, now)
        if d.client == client:
            self._account(d, now)
            d.holder, d.client = None, None
            m.asked_to_yield = False
        if not m.clients and m.pgid is None:
            return out + self._drop(m.key, now)
        return out + self._schedule(d, now)

    def _end_takeover(self, m: Member, client: int, now: float) -> list[Action]:
        """A client whose turn was taken over gives it back: its draining time is charged to it, and
        the yield flag cleared once none of the member's clients still has to yield."""
        since = m.taken_over.pop(client, None)
        if since is None:
            return []
        dt = max(0.0, now - since)
        m.held_s += dt
        m.vt += dt / m.qos.weight
        m.usage.append((now, dt))
        m.usage_sum += dt
        m.last_release = now
        holder_asked = self.domains[m.domain].holder == m.key and m.asked_to_yield
        return [] if m.taken_over or holder_asked else [ClearYield(m.key)]

    # -- turns ----------------------------------------------------------------------------------

    def acquire(self, client: int, now: float) -> list[Action]:
        m = self._member_of(client)
        if m is None:
            return [Grant(client)]  # no hello (or forgotten): nothing to arbitrate, it runs free
        d = self.domains[m.domain]
        if d.client == client:
            return [Grant(client)]  # already holds it
        if not m.waiting and d.holder != m.key:  # back from idle: at most a quantum of credit
            m.vt = max(m.vt, self._floor_vt(d, m.key) - self.quantum)
            if m.last_release is not None:
                gap = now - m.last_release
                m.gap = gap if m.gap is None else 0.7 * m.gap + 0.3 * gap
        if client not in m.waiting:
            m.waiting.append(client)
        if d.reserved == m.key:
            d.reserved = None
        return self._schedule(d, now)

    def release(self, client: int, now: float, gpu_seconds: float | None = None) -> list[Action]:
        m = self._member_of(client)
        if m is None:
            return []
        if gpu_seconds is not None and gpu_seconds >= 0:
            m.gpu_s += gpu_seconds
            m.reported.append((now, gpu_seconds))
        d = self.domains[m.domain]
        if client in m.waiting:
            m.waiting.remove(client)
        if d.client != client:  # the end of a turn taken over (overlap), or nothing held
            return self._end_takeover(m, client, now) + self._schedule(d, now)
        self._account(d, now)
        d.holder, d.client = None, None
        m.last_release = now
        out: list[Action] = []
        was_asked = m.asked_to_yield
        if was_asked:
            m.asked_to_yield = False
            out.append(ClearYield(m.key))
        best = self._best(d, now)
        if (
            best is not None
            and best.key != m.key
            and not was_asked
            and m.gap is not None
            and m.gap < self.grace
            and self._key(m, now) > self._key(best, now)
        ):
            d.reserved, d.reserved_until = m.key, now + self.grace
        return out + self._schedule(d, now)

    def tick(self, now: float) -> list[Action]:
        """Let time pass: account transparent holders, end quanta, expire reservations."""
        out: list[Action] = []
        for d in self.domains.values():
            if d.reserved is not None and now >= d.reserved_until:
                d.reserved = None
            if d.holder is not None:
                self._account(d, now)
            out += self._schedule(d, now)
        return out

    def next_deadline(self, now: float) -> float | None:
        """When ``tick`` next has something to do (a quantum or a reservation ending)."""
        times: list[float] = []
        for d in self.domains.values():
            if d.reserved is not None:
                times.append(max(now, d.reserved_until))
            if d.holder is not None and any(
                m.wants and m.key != d.holder for m in self._in(d.name)
            ):  # the quantum's end, then once a quantum (shares and starvation move with time)
                end = d.since + self.quantum
                times.append(end if end > now else now + self.quantum)
        return min(times) if times else None

    # -- what was given -------------------------------------------------------------------------

    def share(self, key: str, now: float) -> float:
        """The member's part of its domain's held time over the last window (0..1)."""
        m = self.members[key]
        total = sum(self._recent(x, now) for x in self._in(m.domain))
        return self._recent(m, now) / total if total > 0 else 0.0

    def gpu_share(self, key: str, now: float) -> float | None:
        """GPU time the SDK measured for the member over the last window, as a part of the
        window."""
        m = self.members[key]
        self._trim(m, now)
        if m.gpu_s == 0:
            return None  # the SDK never timed its GPU work (no CUDA in use, or no SDK)
        return min(1.0, sum(s for _, s in m.reported) / self.window)

    # -- internals ------------------------------------------------------------------------------

    def _member_of(self, client: int) -> Member | None:
        key = self.client_member.get(client)
        return self.members.get(key) if key else None

    def _in(self, domain: str) -> list[Member]:
        return [m for m in self.members.values() if m.domain == domain]

    def _floor_vt(self, d: Domain, exclude: str) -> float:
        """Virtual time a newcomer (or a member back from idle) starts at: no banked credit."""
        vts = [m.vt for m in self._in(d.name) if m.key != exclude and m.wants]
        return min(vts) if vts else 0.0

    def _trim(self, m: Member, now: float) -> None:
        horizon = now - self.window
        while m.usage and m.usage[0][0] < horizon:
            m.usage_sum -= m.usage.popleft()[1]
        if not m.usage:
            m.usage_sum = 0.0  # no drift from float subtraction
        while m.reported and m.reported[0][0] < horizon:
            m.reported.popleft()

    def _recent(self, m: Member, now: float) -> float:
        self._trim(m, now)
        return m.usage_sum

    def _starved(self, m: Member, now: float) -> bool:
        if m.qos.min_share_milli <= 0:
            return False
        total = sum(self._recent(x, now) for x in self._in(m.domain))
        return total > 0 and self._recent(m, now) * MILLI < m.qos.min_share_milli * total

    def _key(self, m: Member, now: float) -> tuple[bool, int, float]:
        return (self._starved(m, now), m.qos.rank, -m.vt)

    def _same_class(self, a: Member, b: Member, now: float) -> bool:
        return self._key(a, now)[:2] == self._key(b, now)[:2]

    def _best(self, d: Domain, now: float) -> Member | None:
        """The next holder: by class, then a cooperative workload before a transparent one (which
        runs beside its class anyway), then the lowest virtual time."""
        wanting = [m for m in self._in(d.name) if m.wants]
        if not wanting:
            return None
        return max(wanting, key=lambda m: (*self._key(m, now)[:2], not m.transparent, -m.vt))

    def _account(self, d: Domain, now: float) -> None:
        m = self.members.get(d.holder) if d.holder else None
        dt = max(0.0, now - d.accounted)
        d.accounted = now
        if m is None or dt == 0:
            return
        m.held_s += dt
        m.vt += dt / m.qos.weight
        m.usage.append((now, dt))
        m.usage_sum += dt

    def _grant(self, d: Domain, m: Member, now: float) -> list[Action]:
        out: list[Action] = []
        d.holder, d.since, d.accounted, d.reserved = m.key, now, now, None
        d.kept_until = now + self.quantum if self._starved(m, now) else 0.0
        m.turns += 1
        m.asked_to_yield = False
        if m.transparent:
            d.client = None
            if m.paused and m.pgid is not None:
                m.resume(now)
                out.append(Resume(m.key, m.pgid))
        else:
            d.client = m.waiting.popleft()
            out.append(Grant(d.client))
        return out

    def _schedule(self, d: Domain, now: float) -> list[Action]:
        out = self._decide(d, now)
        holder = self.members.get(d.holder) if d.holder else None
        for m in self._in(d.name):
            if not m.transparent or m is holder:
                continue
            assert m.pgid is not None
            # stopped while a higher class holds (or one served for its min share); a transparent
            # workload of the same class shares the GPU natively, as without gpufrac
            blocked = holder is not None and self._key(holder, now)[:2] > self._key(m, now)[:2]
            if blocked and not m.paused:
                m.pause(now)
                out.append(Pause(m.key, m.pgid))
            elif not blocked and m.paused:
                m.resume(now)
                out.append(Resume(m.key, m.pgid))
        return out

    def _decide(self, d: Domain, now: float) -> list[Action]:
        best = self._best(d, now)
        if best is None:
            return []
        if d.holder is None:
            r = self.members.get(d.reserved) if d.reserved else None
            if (
                r is not None
                and now < d.reserved_until
                and r.key != best.key
                and not self._key(best, now)[:2] > self._key(r, now)[:2]
            ):
                return []  # kept for the member that just gave it back
            return self._grant(d, best, now)
        holder = self.members[d.holder]
        if best.key == holder.key or now < d.kept_until:
            return []
        b, h = self._key(best, now), self._key(holder, now)
        held_quantum = now - d.since >= self.quantum
        outranked = b[1] > h[1] and b[0] >= h[0]  # a higher class: at once
        starving = b[0] and not h[0] and held_quantum  # a min share: after the holder's quantum
        expired = b[:2] == h[:2] and held_quantum and best.vt < holder.vt
        if best.transparent and b[:2] == h[:2]:
            return []  # a transparent workload runs beside its class anyway: no turn to take
        if holder.transparent and b[:2] == h[:2]:
            expired = True  # a cooperative one need not wait for one of its class that runs anyway
        if not (outranked or starving or expired):
            return []
        if holder.transparent:
            self._account(d, now)
            return self._grant(d, best, now)
        if outranked and self.preempt == "overlap":
            # the higher class starts at once; the holder stops submitting at its next yield
            # point, and the work it queued drains beside the new holder's
            self._account(d, now)
            assert d.client is not None
            holder.taken_over[d.client] = now
            d.holder, d.client = None, None
            return [AskYield(holder.key), *self._grant(d, best, now)]
        if holder.asked_to_yield:
            return []
        holder.asked_to_yield = True
        return [AskYield(holder.key)]
