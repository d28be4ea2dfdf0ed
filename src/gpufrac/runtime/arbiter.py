"""The QoS arbiter's policy: who may submit GPU work on each GPU (or MIG instance), moment to
moment.

Pure: no sockets, no signals. Events go in (a member registered, a client asked for a turn or gave
it back, the clock moved) and actions come out (grant a client its turn, ask a member to yield,
pause or resume a member); ``runtime/arbiter_server.py`` carries the actions out. The clock is
passed in, so tests drive it by counted quanta.

One *domain* (a GPU, or a MIG instance) has at most one *holder* at a time, the member whose class
is served now. A *member* is a workload in a domain; it is *cooperative* while it has SDK clients
connected (they ask for turns and give them back), else *transparent* (a process group; not running
means SIGSTOP). A transparent member wants the GPU only while the agent says it is *active* (its
processes busy on the GPU by NVML's per-process reading, or requests in flight to it through the
gateway), or while it is paused if it is guaranteed a min share: an idle service or job holds
nothing, so it never stops a workload of a lower class.

The rules (``docs/qos.md`` states them for users):

1. **Strict priority between classes.** The holder is the wanting member of the highest ``rank``; a
   holder of a lower class is taken over at once. A transparent member is paused only while a member
   of a strictly higher class holds the domain: never to serve a lower class, never for one of its
   own class (transparent members of one class share the GPU natively, as without gpufrac).
2. **Weighted fair share within a class**, for cooperative members (SDK turns): holding for ``dt``
   adds ``dt/weight`` of virtual time; after a ``quantum`` the lowest virtual time goes next (a
   member below its ``min_share`` first).
3. **A min share is given beside the higher class, never instead of it.** A member of a lower class
   below its ``min_share`` runs *beside* the busy holder: a transparent one is resumed, a
   cooperative one is granted a turn that overlaps the holder's. The holder is never asked to yield
   and never paused for it; the higher class runs with a neighbour for up to ``min_share`` of the
   time. Such a turn lasts a quantum at least, and ends (pause, or a yield request) once the member
   is back at its share.

Shares are of the domain's busy time. Each member is charged the time it was allowed to run (held
the turn, ran beside the holder for its min share, ran natively beside its class, or drained a turn
a higher class took over), and the domain's busy time is the time at least one member ran; members
running at once are each charged the overlap, so shares may sum to more than 1. ``window`` seconds
of that are kept for the min-share rule; the totals are kept for reports.

Every pause is counted by the policy itself: each gets an id when it starts, and when it ends it is
kept (``pause_log``) with its length and the member whose class caused it, for the agent's events
and metrics.

How a higher class takes over a cooperative holder is ``preempt``: ``overlap`` (the default) grants
the higher class at once, so its work starts while the holder's last queued work drains beside it;
``drain`` grants it once the holder has given the turn back.

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
    """Stop the member's processes (the arbiter process works out how: its cgroup or its
    process group)."""

    member: str


@dataclass(frozen=True, slots=True)
class Resume:
    member: str


Action = Grant | AskYield | ClearYield | Pause | Resume

PAUSE_LOG = 4096  # the ended pauses kept for the agent to read (it reads them every pass)


@dataclass(frozen=True, slots=True)
class PauseRecord:
    """One pause of a transparent member, once it has ended."""

    seq: int  # its place in the pause log: given when it ends (``pauses_since`` reads by it)
    id: int  # given when it started
    member: str
    start: float
    end: float
    by: str | None  # the member whose (higher) class held the domain when it was paused

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    def to_json(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "id": self.id,
            "member": self.member,
            "start": self.start,
            "end": self.end,
            "seconds": round(self.seconds, 6),
            "by": self.by,
        }


@dataclass(slots=True)
class Member:
    key: str
    domain: str
    qos: QosParams
    pgid: int | None = None
    clients: set[int] = field(default_factory=set)
    waiting: deque[int] = field(default_factory=deque)
    vt: float = 0.0
    held_s: float = 0.0  # total time it was allowed to run (its turns, beside, natively)
    gpu_s: float = 0.0  # total GPU time the SDK measured (CUDA events) and reported
    turns: int = 0
    last_release: float | None = None
    gap: float | None = None  # how soon it usually asks again after giving a turn back (EWMA)
    paused: bool = False
    paused_since: float | None = None
    paused_by: str | None = None
    pause_id: int | None = None  # the pause under way
    pauses: int = 0  # pauses started, however short
    paused_s: float = 0.0  # total time of the pauses that ended
    active: bool = True  # a transparent member: busy on the GPU now (the agent says)
    asked_to_yield: bool = False
    # clients whose turn a higher class took over (overlap), still draining: client -> since when
    taken_over: dict[int, float] = field(default_factory=dict)
    usage: deque[tuple[float, float]] = field(default_factory=deque)  # (end, seconds run)
    usage_sum: float = 0.0  # the sum of ``usage``, kept as entries come and go
    reported: deque[tuple[float, float]] = field(default_factory=deque)  # (at, GPU seconds)

    @property
    def transparent(self) -> bool:
        return not self.clients and self.pgid is not None

    @property
    def wants(self) -> bool:
        """A cooperative member wants a turn while a client waits; a transparent one while it is
        busy, or while it is paused if it is guaranteed a min share (a job, by default: paused,
        its processes cannot show that they are busy). So an idle job holds nothing, and stops
        no one of a lower class, whatever its min share."""
        if self.transparent:
            return self.active or (self.qos.min_share_milli > 0 and self.paused)
        return bool(self.waiting)

    def paused_total(self, now: float) -> float:
        return self.paused_s + (now - self.paused_since if self.paused_since is not None else 0.0)


@dataclass(slots=True)
class Beside:
    """A turn given beside a busy higher class, for a min share."""

    client: int | None  # the cooperative client granted; None: a transparent member resumed
    until: float  # kept at least until then
    asked: bool = False  # asked to yield (a cooperative member back at its share)


@dataclass(slots=True)
class Domain:
    name: str
    holder: str | None = None
    client: int | None = None  # the holding client (None for a transparent holder)
    since: float = 0.0
    accounted: float = 0.0  # run and busy time are accounted up to here
    reserved: str | None = None
    reserved_until: float = 0.0
    kept_until: float = 0.0  # a turn given for a min share within a class lasts a quantum
    beside: dict[str, Beside] = field(default_factory=dict)
    busy: deque[tuple[float, float]] = field(default_factory=deque)  # (end, seconds busy)
    busy_sum: float = 0.0
    busy_s: float = 0.0  # total time at least one member ran


PREEMPT_MODES = ("overlap", "drain")


class TurnPolicy:
    def __init__(
        self,
        *,
        quantum: float = 0.01,
        grace: float = 0.002,
        window: float = 2.0,
        preempt: str = "overlap",
        yield_grace: float = 0.5,
    ) -> None:
        self.quantum, self.grace, self.window = quantum, grace, window
        # how long an SDK workload asked to yield may run on before signals stop it
        self.yield_grace = yield_grace
        self.preempt = (
            preempt  # overlap | drain: how a higher class takes over a cooperative holder
        )
        self.members: dict[str, Member] = {}
        self.domains: dict[str, Domain] = {}
        self.client_member: dict[int, str] = {}
        self.pause_log: deque[PauseRecord] = deque(maxlen=PAUSE_LOG)
        self._next_pause = 1
        self._next_seq = 1

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
            d = self.domains.setdefault(domain, Domain(domain, accounted=now))
            self._account(d, now)
            m = Member(key, domain, qos, pgid)
            m.vt = self._floor_vt(d, exclude=key)
            self.members[key] = m
            for c in clients:
                m.clients.add(c)
                self.client_member[c] = key
            if pgid is not None:
                out.append(Resume(key))  # whatever paused it before (a crashed arbiter) is gone
        else:
            d = self.domains[domain]
            self._account(d, now)
            if m.paused and m.pgid is not None and m.pgid != pgid:
                out.append(Resume(key))
                self._resumed(m, now)
            m.qos, m.pgid = qos, pgid
        m.active = active
        if d.holder == key and m.transparent and not m.wants:
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
            d = self.domains[m.domain]
            self._account(d, now)
            out: list[Action] = []
            if m.paused and m.pgid is not None:
                out.append(Resume(key))
            self._resumed(m, now)
            m.pgid = None
            return out + self._schedule(d, now)
        return self._drop(key, now)

    def resume_gone(self, key: str, now: float) -> list[Action]:
        """The member's process group is gone (its process exited): its pause, if any, ends here,
        and the member is forgotten."""
        m = self.members.get(key)
        if m is None:
            return []
        self._account(self.domains[m.domain], now)
        self._resumed(m, now)
        return self.remove_member(key, now)

    def _drop(self, key: str, now: float) -> list[Action]:
        m = self.members.get(key)
        if m is None:
            return []
        d = self.domains[m.domain]
        self._account(d, now)
        del self.members[key]
        out: list[Action] = []
        if d.holder == key:
            d.holder, d.client = None, None
        if d.reserved == key:
            d.reserved = None
        d.beside.pop(key, None)
        if m.paused and m.pgid is not None:
            out.append(Resume(key))
        self._resumed(m, now)
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
        d = self.domains[m.domain]
        self._account(d, now)
        was_transparent = m.transparent
        m.clients.add(client)
        self.client_member[client] = key
        if was_transparent:  # cooperative from now on: never paused by signals
            if d.holder == key:
                d.holder, d.client = None, None
            d.beside.pop(key, None)
            if m.paused and m.pgid is not None:
                out.append(Resume(key))
                self._resumed(m, now)
            out += self._schedule(d, now)
        return out

    def disconnect(self, client: int, now: float) -> list[Action]:
        """A client went away (it closed, or its process died): its turn, if it held one, is
        over."""
        key = self.client_member.pop(client, None)
        m = self.members.get(key) if key else None
        if m is None:
            return []
        d = self.domains[m.domain]
        self._account(d, now)
        m.clients.discard(client)
        if client in m.waiting:
            m.waiting.remove(client)
        out = self._end_takeover(m, client, now) + self._end_beside(d, m, client)
        if d.client == client:
            d.holder, d.client = None, None
            m.asked_to_yield = False
        if not m.clients and m.pgid is None:
            return out + self._drop(m.key, now)
        return out + self._schedule(d, now)

    def _end_takeover(self, m: Member, client: int, now: float) -> list[Action]:
        """A client whose turn was taken over gives it back; the yield flag is cleared once none
        of the member's clients still has to yield."""
        if m.taken_over.pop(client, None) is None:
            return []
        m.last_release = now
        return self._clear_yield(m)

    def _end_beside(self, d: Domain, m: Member, client: int) -> list[Action]:
        """A client given a turn beside the holder (for its min share) gives it back."""
        b = d.beside.get(m.key)
        if b is None or b.client != client:
            return []
        del d.beside[m.key]
        return self._clear_yield(m) if b.asked else []

    def _clear_yield(self, m: Member) -> list[Action]:
        d = self.domains[m.domain]
        b = d.beside.get(m.key)
        if m.taken_over or (d.holder == m.key and m.asked_to_yield) or (b and b.asked):
            return []
        return [ClearYield(m.key)]

    # -- turns ----------------------------------------------------------------------------------

    def acquire(self, client: int, now: float) -> list[Action]:
        m = self._member_of(client)
        if m is None:
            return [Grant(client)]  # no hello (or forgotten): nothing to arbitrate, it runs free
        d = self.domains[m.domain]
        self._account(d, now)
        b = d.beside.get(m.key)
        if d.client == client or (b is not None and b.client == client):
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
        d = self.domains[m.domain]
        self._account(d, now)
        if gpu_seconds is not None and gpu_seconds >= 0:
            m.gpu_s += gpu_seconds
            m.reported.append((now, gpu_seconds))
        if client in m.waiting:
            m.waiting.remove(client)
        if d.client != client:  # the end of a turn taken over, or one beside, or nothing held
            b = d.beside.get(m.key)
            if client in m.taken_over or (b is not None and b.client == client):
                m.last_release = now
            ended = self._end_takeover(m, client, now) + self._end_beside(d, m, client)
            return ended + self._schedule(d, now)
        d.holder, d.client = None, None
        m.last_release = now
        out: list[Action] = []
        was_asked = m.asked_to_yield
        if was_asked:
            m.asked_to_yield = False
            out += self._clear_yield(m)
        best = self._best(d, now)
        if (
            best is not None
            and best.key != m.key
            and not was_asked
            and m.gap is not None
            and m.gap < self.grace
            and self._order(m, now) > self._order(best, now)
        ):
            d.reserved, d.reserved_until = m.key, now + self.grace
        return out + self._schedule(d, now)

    def tick(self, now: float) -> list[Action]:
        """Let time pass: account run and busy time, end quanta, expire reservations, give and end
        min-share turns."""
        out: list[Action] = []
        for d in self.domains.values():
            if d.reserved is not None and now >= d.reserved_until:
                d.reserved = None
            out += self._schedule(d, now)
        return out

    def next_deadline(self, now: float) -> float | None:
        """When ``tick`` next has something to do (a quantum or a reservation ending)."""
        times: list[float] = []
        for d in self.domains.values():
            if d.reserved is not None:
                times.append(max(now, d.reserved_until))
            for m in self._in(d.name):  # a turn taken over: stopped by signals past its grace
                times += [
                    since + self.yield_grace
                    for since in m.taken_over.values()
                    if since + self.yield_grace > now
                ]
            if d.beside or (
                d.holder is not None
                and any(m.wants and m.key != d.holder for m in self._in(d.name))
            ):  # the quantum's end, then once a quantum (shares and starvation move with time)
                end = d.since + self.quantum
                times.append(end if end > now else now + self.quantum)
        return min(times) if times else None

    # -- what was given -------------------------------------------------------------------------

    def share(self, key: str, now: float) -> float:
        """The member's part of its domain's busy time over the last window (0..1)."""
        m = self.members[key]
        d = self.domains[m.domain]
        self._account(d, now)
        busy = self._busy_recent(d, now)
        return min(1.0, self._recent(m, now) / busy) if busy > 0 else 0.0

    def gpu_share(self, key: str, now: float) -> float | None:
        """GPU time the SDK measured for the member over the last window, as a part of the
        window."""
        m = self.members[key]
        self._trim(m, now)
        if m.gpu_s == 0:
            return None  # the SDK never timed its GPU work (no CUDA in use, or no SDK)
        return min(1.0, sum(s for _, s in m.reported) / self.window)

    def busy_total(self, domain: str, now: float) -> float:
        """The domain's busy time so far (at least one member ran)."""
        d = self.domains[domain]
        self._account(d, now)
        return d.busy_s

    def pauses_since(self, after: int) -> list[PauseRecord]:
        """The pauses that ended after the one logged as ``after`` (their ``seq``), in the order
        they ended. (Not by id: a long pause that began first may end after many short ones.)"""
        return [p for p in self.pause_log if p.seq > after]

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

    def _busy_recent(self, d: Domain, now: float) -> float:
        horizon = now - self.window
        while d.busy and d.busy[0][0] < horizon:
            d.busy_sum -= d.busy.popleft()[1]
        if not d.busy:
            d.busy_sum = 0.0
        return d.busy_sum

    def _starved(self, m: Member, now: float) -> bool:
        """Below its min share of the domain's busy time over the last window."""
        if m.qos.min_share_milli <= 0:
            return False
        busy = self._busy_recent(self.domains[m.domain], now)
        return busy > 0 and self._recent(m, now) * MILLI < m.qos.min_share_milli * busy

    def _order(self, m: Member, now: float) -> tuple[int, bool, float]:
        """Who goes first: the higher class, then (within a class) a member below its min share,
        then the lowest virtual time."""
        return (m.qos.rank, self._starved(m, now), -m.vt)

    def _best(self, d: Domain, now: float) -> Member | None:
        """The next holder: by class, a member below its min share first within a class, then a
        cooperative workload before a transparent one (which runs beside its class anyway), then
        the lowest virtual time."""
        wanting = [m for m in self._in(d.name) if m.wants]
        if not wanting:
            return None
        return max(
            wanting,
            key=lambda m: (m.qos.rank, self._starved(m, now), not m.transparent, -m.vt),
        )

    def _running(self, d: Domain) -> list[Member]:
        """The members allowed to run now: the holder, those beside it, those draining a turn a
        higher class took over, and transparent ones not paused that want the GPU."""
        out: list[Member] = []
        for m in self._in(d.name):
            if m.transparent:  # busy, or let run beside the holder for its min share
                runs = not m.paused and (m.wants or m.key in d.beside)
            else:
                runs = d.holder == m.key or m.key in d.beside or bool(m.taken_over)
            if runs:
                out.append(m)
        return out

    def _account(self, d: Domain, now: float) -> None:
        """Charge the time since the last accounting to every member that was allowed to run, and
        to the domain's busy time if any was. Called before anything changes who runs."""
        dt = now - d.accounted
        if dt <= 0:
            return
        d.accounted = now
        running = self._running(d)
        if not running:
            return
        for m in running:
            m.held_s += dt
            m.vt += dt / m.qos.weight
            m.usage.append((now, dt))
            m.usage_sum += dt
        d.busy.append((now, dt))
        d.busy_sum += dt
        d.busy_s += dt

    def _paused(self, m: Member, now: float, by: str | None) -> None:
        m.paused, m.paused_since, m.paused_by = True, now, by
        m.pause_id, self._next_pause = self._next_pause, self._next_pause + 1
        m.pauses += 1

    def _resumed(self, m: Member, now: float) -> None:
        """The member's pause, if one is under way, ends now: kept in the pause log."""
        if m.paused_since is not None and m.pause_id is not None:
            record = PauseRecord(
                self._next_seq,
                m.pause_id,
                m.key,
                m.paused_since,
                now,
                m.paused_by,
            )
            m.paused_s += record.seconds
            self.pause_log.append(record)
            self._next_seq += 1
        m.paused, m.paused_since, m.paused_by, m.pause_id = False, None, None, None

    def _owner(self, d: Domain, now: float) -> Member | None:
        """The member whose class is served now: the holder, or the one the turn is kept for."""
        if d.holder is not None:
            return self.members.get(d.holder)
        if d.reserved is not None and now < d.reserved_until:
            return self.members.get(d.reserved)
        return None

    def _grant(self, d: Domain, m: Member, now: float) -> list[Action]:
        out: list[Action] = []
        same_class = (
            self.members[d.holder].qos.rank == m.qos.rank
            if d.holder is not None and d.holder in self.members
            else False
        )
        d.holder, d.since, d.reserved = m.key, now, None
        d.kept_until = now + self.quantum if same_class and self._starved(m, now) else 0.0
        m.asked_to_yield = False
        beside = d.beside.pop(m.key, None)
        if beside is not None and beside.client is not None:  # its turn beside becomes the turn
            d.client = beside.client
            return out + (self._clear_yield(m) if beside.asked else [])
        m.turns += 1
        if m.transparent:
            d.client = None
            if m.paused and m.pgid is not None:
                self._resumed(m, now)
                out.append(Resume(m.key))
        else:
            d.client = m.waiting.popleft()
            out.append(Grant(d.client))
        return out

    def _schedule(self, d: Domain, now: float) -> list[Action]:
        self._account(d, now)
        out = self._decide(d, now)
        out += self._give_beside(d, now)
        owner = self._owner(d, now)
        for m in self._in(d.name):
            if m.pgid is None:
                continue
            if m.key == d.holder or not self._by_signals(d, m, now):
                if m.paused:  # the holder runs; so does an SDK workload that keeps to its turns
                    self._resumed(m, now)
                    out.append(Resume(m.key))
                continue
            # stopped only while a higher class holds the domain, and not while it runs beside
            # it for its min share; one of its own class never stops it
            blocked = owner is not None and owner.qos.rank > m.qos.rank
            run = not blocked or m.key in d.beside
            if not run and not m.paused:
                self._paused(m, now, owner.key if owner is not None else None)
                out.append(Pause(m.key))
            elif run and m.paused:
                self._resumed(m, now)
                out.append(Resume(m.key))
        return out

    def _by_signals(self, d: Domain, m: Member, now: float) -> bool:
        """Is ``m`` kept to its class by signals (paused while a higher class holds)? A member
        without the SDK is; so is one with SDK clients that runs on the GPU without a turn: busy
        by the agent's reading while it holds none (it said hello, then never asked), or still
        busy ``yield_grace`` after a higher class took its turn over. An SDK workload that keeps
        to its turns is never paused by signals."""
        if m.transparent:
            return True
        if m.pgid is None or not m.active or d.holder == m.key or m.key in d.beside:
            return False
        return not any(now - since < self.yield_grace for since in m.taken_over.values())

    def _give_beside(self, d: Domain, now: float) -> list[Action]:
        """Members of a lower class than the holder's, below their min share, run beside it for
        at least a quantum; those back at their share stop (a transparent one is paused by
        ``_schedule``, a cooperative one asked to yield)."""
        out: list[Action] = []
        owner = self._owner(d, now)
        for m in self._in(d.name):
            if m.key == d.holder:
                continue
            b = d.beside.get(m.key)
            blocked = owner is not None and owner.qos.rank > m.qos.rank
            starved = blocked and self._starved(m, now)
            if m.transparent:
                if b is not None and (not blocked or (not starved and now >= b.until)):
                    del d.beside[m.key]
                elif b is None and starved and m.wants:
                    d.beside[m.key] = Beside(None, now + self.quantum)
            elif b is None:
                if starved and m.waiting:
                    client = m.waiting.popleft()
                    d.beside[m.key] = Beside(client, now + self.quantum)
                    m.turns += 1
                    out.append(Grant(client))
            elif blocked and not starved and now >= b.until and not b.asked:
                b.asked = True
                out.append(AskYield(m.key))
        return out

    def _decide(self, d: Domain, now: float) -> list[Action]:
        out: list[Action] = []
        if d.holder is None and d.beside:  # the holder is gone: a turn beside it holds on
            coop = [self.members[k] for k, b in d.beside.items() if b.client is not None]
            if coop:
                out += self._grant(d, max(coop, key=lambda m: (m.qos.rank, -m.vt)), now)
        best = self._best(d, now)
        if best is None:
            return out
        if d.holder is None:
            r = self.members.get(d.reserved) if d.reserved else None
            if (
                r is not None
                and now < d.reserved_until
                and r.key != best.key
                and not best.qos.rank > r.qos.rank
            ):
                return out  # kept for the member that just gave it back
            return out + self._grant(d, best, now)
        holder = self.members[d.holder]
        if best.key == holder.key or now < d.kept_until:
            return out
        held_quantum = now - d.since >= self.quantum
        outranked = best.qos.rank > holder.qos.rank  # a higher class: at once
        same = best.qos.rank == holder.qos.rank
        if same and best.transparent:
            return out  # a transparent workload runs beside its class anyway: no turn to take
        # within a class: after the holder's quantum, the one below its min share, else by
        # virtual time; a cooperative one need not wait for one of its class that runs anyway
        expired = same and (
            holder.transparent
            or (held_quantum and self._order(best, now) > self._order(holder, now))
        )
        if not (outranked or expired):
            return out
        if holder.transparent:
            return out + self._grant(d, best, now)
        if outranked and self.preempt == "overlap":
            # the higher class starts at once; the holder stops submitting at its next yield
            # point, and the work it queued drains beside the new holder's
            assert d.client is not None
            holder.taken_over[d.client] = now
            d.holder, d.client = None, None
            return [*out, AskYield(holder.key), *self._grant(d, best, now)]
        if holder.asked_to_yield:
            return out
        holder.asked_to_yield = True
        return [*out, AskYield(holder.key)]
