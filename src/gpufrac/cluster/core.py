"""The control plane's core for many machines: nodes with leases, placements with epochs. Pure.

Events in (a node joins, a node's heartbeat with what it runs, the clock, an apply, a delete),
answers out (what each node must run, which nodes were lost, what moved). No I/O and no clock of
its own: the caller passes ``now`` (monotonic seconds) and carries the answers to the nodes.

* **One scheduler over every node's GPUs** (``planning.Scheduler``, GPUs tagged with their node):
  a placement is exact (node, GPU, MIG instance, the actions that make it); the node carries it out.
* **Leases.** A node holds a lease of ``lease_s`` seconds, renewed by each heartbeat the core
  answers. The node agent stops its own workloads once it has gone ``fence_s`` (< ``lease_s``)
  without an answer (``NodeAgent``), so by the time the core declares it lost (``tick``: its lease
  ended) nothing of it runs; only then are its workloads placed again elsewhere.
* **Epochs.** Every placement gets an epoch, a number that only grows (kept across restarts by the
  caller's store). A node runs a workload only under the epoch its latest answer gave; whatever it
  reports under another epoch (a node that comes back after its work was moved) it is told to stop,
  because the answer to every heartbeat is the node's whole desired state, not a change.
* **One copy at a time.** A workload taken from a node while that node is alive (deleted, replaced,
  evicted, moved) is not given to another node until the first has reported it gone (or has been
  lost): the scheduler counts it in its new place at once, but its new node starts it only then.
* **A restart of the control plane** restores placements with their epochs and gives every node a
  fresh lease from the restart: nodes that heartbeat in time keep what they run, untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import WorkloadSpec
from gpufrac.planning.sched_decision import Decision, Displacement, displacements
from gpufrac.planning.sched_state import CORDONED, Closed, SchedGpu
from gpufrac.planning.scheduler import Scheduler, workload_key

LEASE_S = 6.0  # a node's lease: renewed by each answered heartbeat
FENCE_S = 4.0  # a node unanswered this long stops its workloads, before its lease ends
HEARTBEAT_S = 1.0  # how often a node agent calls in

NodeState = Literal["alive", "lost"]
Ended = Literal["succeeded", "failed"]


@dataclass(frozen=True, slots=True)
class Assignment:
    """A workload placed on a node, under an epoch: what the node must run."""

    spec: WorkloadSpec
    decision: Decision
    node: str
    epoch: int

    @property
    def workload(self) -> str:
        return self.decision.workload


@dataclass(frozen=True, slots=True)
class Report:
    """What a node says when it calls in: per workload, the epoch of the run it has (starting,
    running, or restarting under its restart policy), and the jobs that ended for good."""

    running: Mapping[str, int] = field(default_factory=dict)
    ended: Mapping[str, tuple[int, Ended]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """One of a node's own events, as it passes it on (its kind, subject and message)."""

    kind: str
    subject: str
    message: str


# join: the core does not know the node (restarted); pending: an admin has not approved it yet
# (it runs nothing, and gets nothing: the control plane answers so, the core never sees it)
AnswerStatus = Literal["ok", "lost", "join", "pending"]


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to a heartbeat: everything the node must run (anything else it runs, it stops),
    and how long its lease now lasts; or that the node was held lost (it stops everything, then
    joins again), or is not known (a restarted control plane: it joins again, and keeps what it
    runs, which the join restores)."""

    node: str
    run: tuple[Assignment, ...]
    lease_s: float
    status: AnswerStatus = "ok"
    keep: tuple[str, ...] = ()  # jobs that ended here: the node keeps their records (logs)


@dataclass(slots=True)
class Node:
    name: str
    labels: dict[str, str]
    gpus: list[int]  # the scheduler's GPU indexes
    renewed: float  # when its lease was last renewed (the core's clock)
    state: NodeState = "alive"
    expelled: str | None = None  # why it was held lost before its lease ran out (revoked)


@dataclass(frozen=True, slots=True)
class Moved:
    """What ``tick`` did about a lost node's workload: placed again (``to`` a node) or left waiting
    or ended (``to`` None, with the reason)."""

    workload: str
    lost: str
    to: str | None
    reason: str


class ClusterCore:
    """Nodes, leases, and where every workload runs, under which epoch."""

    def __init__(
        self,
        settings: OperatorSettings | None = None,
        *,
        lease_s: float = LEASE_S,
        first_epoch: int = 1,
    ) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self.settings = settings or OperatorSettings()
        self.lease_s = lease_s
        self.scheduler = Scheduler([], self.settings)
        self.nodes: dict[str, Node] = {}
        self.specs: dict[str, WorkloadSpec] = {}  # desired state, by tenant/name
        self.assigned: dict[str, Assignment] = {}  # placed workloads
        self.ended: dict[str, Ended] = {}  # jobs that ended for good
        self.ended_on: dict[str, str] = {}  # ... and the node each ran on (which keeps its logs)
        # workload -> {node: epoch} it was taken from, alive, and has not reported gone yet
        self.revoked: dict[str, dict[str, int]] = {}
        self.cordoned: dict[str, str] = {}  # GPU (NODE/UUID) -> why it takes no new work
        # the workloads decisions took the place of, until the caller takes them (``take_told``)
        self.displaced: list[Displacement] = []
        self.planned: list[Decision] = []  # the last tick's decisions of moves that make room
        self._epoch = first_epoch - 1

    # -- nodes -----------------------------------------------------------------------------------

    def join(
        self,
        name: str,
        labels: Mapping[str, str],
        gpus: Iterable[SchedGpu],
        now: float,
        placed: Iterable[Assignment] = (),
    ) -> list[Decision]:
        """A node joins with its GPUs, or comes back after it was lost (its GPUs were kept, idle:
        they take work again). Returns the decisions of waiting workloads that now fit. Here a GPU
        is ``NODE/UUID`` (decisions name it so; ``node.local_decision`` takes the node off); its
        ``index`` is the core's own. ``placed``: what a restarted control plane had placed there
        (restored before anything waiting is tried on the node)."""
        node = self.nodes.get(name)
        gpus = list(gpus)
        if node is None:
            uuids = [f"{name}/{g.uuid}" for g in gpus]
            if len(set(uuids)) != len(uuids) or set(uuids) & self.scheduler.state.by_uuid.keys():
                raise ValueError(f"node {name}: a GPU is listed twice")  # nothing changed
            start = len(self.scheduler.state.gpus)
            fresh = []
            for i, g in enumerate(gpus):
                g.index, g.node, g.node_labels = start + i, name, dict(labels)
                g.uuid = f"{name}/{g.uuid}"  # a GPU is known by its node and its UUID
                fresh.append(g)
            self.nodes[name] = node = Node(name, dict(labels), [g.index for g in fresh], now)
            self.scheduler.add_gpus(fresh, retry=False)
        else:
            st = self.scheduler.state
            had = sorted(st.gpus[gi].uuid for gi in node.gpus)
            if sorted(f"{name}/{g.uuid}" for g in gpus) != had:
                raise ValueError(
                    f"node {name} joined before with other GPUs ({', '.join(had)}); a machine "
                    "whose GPUs changed joins under another name (--name)"
                )  # nothing changed
            node.renewed, node.state, node.expelled = now, "alive", None
            if dict(labels) != node.labels:  # the operator changed its labels: they hold now
                node.labels = dict(labels)
                for gi in node.gpus:
                    st.gpus[gi].node_labels = dict(labels)
                st.nodes[name] = dict(labels)
        st = self.scheduler.state
        for gi in node.gpus:  # a cordoned GPU stays so, through a loss or a restart
            want = CORDONED if st.gpus[gi].uuid in self.cordoned else None
            if st.gpus[gi].closed != want:
                st.set_closed(st.gpus[gi], want)
        for a in placed:
            self.restore(a.spec, a.decision, name, a.epoch)
        return self._placed(self.scheduler.retry_pending(gpus=set(node.gpus)))

    def expel(self, name: str, why: str) -> None:
        """Hold ``name`` lost at the next ``tick``, whatever its lease (its credential was
        revoked): its work is placed again elsewhere then. Its workloads were told to stop by
        then or stop by themselves (fenced), as for any lost node."""
        node = self.nodes.get(name)
        if node is not None and node.state == "alive":
            node.expelled = why

    def heartbeat(self, name: str, report: Report, now: float) -> Answer:
        """Renew ``name``'s lease and take its report; the answer is its whole desired state. A lost
        node is answered with nothing to run until it joins again."""
        node = self.nodes.get(name)
        if node is None or node.state == "lost":
            return Answer(name, (), 0.0, "join" if node is None else "lost")
        node.renewed = now
        for key in [k for k, held in self.revoked.items() if name in held]:
            if report.running.get(key) != self.revoked[key][name]:  # gone from the node
                self._acknowledged(key, name)
        for key, (epoch, how) in report.ended.items():
            a = self.assigned.get(key)
            if a is not None and a.node == name and a.epoch == epoch:
                self.ended[key] = how
                self.ended_on[key] = name
                del self.assigned[key]
                tenant, wname = key.split("/", 1)
                self._placed(self.scheduler.delete(tenant, wname))
        return self.answer(name)

    def heard(self, name: str, at: float) -> None:
        """A heartbeat of ``name`` was received at ``at`` and is still being worked out: the node
        was alive then, so its lease runs from then at least (a control plane slow to answer never
        holds lost a node it heard). Nothing else is taken from it until its ``heartbeat``. As
        safe as a renewal: the node fences by the answers it gets, which come no sooner."""
        node = self.nodes.get(name)
        if node is not None and node.state == "alive" and at > node.renewed:
            node.renewed = at

    def answer(self, name: str) -> Answer:
        """``name``'s desired state: what is assigned to it, less what another node still has."""
        run = tuple(
            a
            for a in self.assigned.values()
            if a.node == name and not (set(self.revoked.get(a.workload, ())) - {name})
        )
        keep = tuple(sorted(k for k, n in self.ended_on.items() if n == name))
        return Answer(name, run, self.lease_s, keep=keep)

    def tick(self, now: float) -> list[Moved]:
        """Declare lost every node whose lease has ended, and place its workloads again (most
        important first): elsewhere if they fit, else they wait; a job that may not restart
        (``restart: never``) fails."""
        lost = [
            n
            for n in self.nodes.values()
            if n.state == "alive" and (now - n.renewed > self.lease_s or n.expelled is not None)
        ]
        moved: list[Moved] = []
        st = self.scheduler.state
        for node in lost:
            node.state = "lost"
        for node in self.nodes.values():  # a lost node's GPUs say how long it has been silent
            if node.state == "lost":
                closed = Closed(
                    "node_lost", node.expelled or f"no heartbeat for {now - node.renewed:.0f} s"
                )
                for gi in node.gpus:
                    if st.gpus[gi].closed != closed:
                        st.set_closed(st.gpus[gi], closed)
        gone = {n.name for n in lost}
        for key in list(self.revoked):
            for node_name in gone & set(self.revoked[key]):
                self._acknowledged(key, node_name)  # fenced: it runs nothing any more
        victims = sorted(
            (a for a in self.assigned.values() if a.node in gone),
            key=lambda a: (-a.spec.priority, a.workload),
        )
        for a in victims:
            del self.assigned[a.workload]
            tenant, wname = a.workload.split("/", 1)
            self._placed(self.scheduler.delete(tenant, wname))
        for a in victims:
            why = f"its node {a.node} was lost"
            if a.spec.restart == "never":
                self.ended[a.workload] = "failed"
                moved.append(Moved(a.workload, a.node, None, f"{why}; restart: never"))
                continue
            d = self._place(self.scheduler.submit(a.spec))
            to = self.assigned[a.workload].node if d.outcome == "placed" else None
            moved.append(Moved(a.workload, a.node, to, why if to else f"{why}; {d.reason}"))
        # moves that make room (docs/scheduler.md): plans given up or begun, services restarted;
        # kept for the caller, which stores a waiting request's new decision (its moves)
        self.planned = self._placed(self.scheduler.plan_moves())
        return moved

    # -- desired state ---------------------------------------------------------------------------

    def decide(self, spec: WorkloadSpec, *, waits: str | None = None) -> Decision:
        """Store and place ``spec`` (a changed spec replaces the old one, under a new epoch).
        ``waits``: it fits no GPU known now but may fit a node yet to join (none has, or not all
        are back after a restart): it waits with that reason, and is tried as nodes join."""
        key = workload_key(spec)
        if self.specs.get(key) == spec:
            return self.decision(key)
        if key in self.specs:
            self.delete(spec.tenant, spec.name)
        self.specs[key] = spec
        if waits is not None and self.scheduler.refusal(spec) is not None:
            self.scheduler.restore(spec, Decision(key, "pending", waits))
            return self.scheduler.pending.decision(key)
        return self._place(self.scheduler.submit(spec))

    def decide_all(self, specs: Sequence[WorkloadSpec]) -> list[Decision]:
        """Store and place new workloads that arrive together (``Scheduler.submit_all``: all
        waiting before the first is tried, so small ones may share a new MIG instance). Returns
        each one's own decision first, in order, then the rest (evictions)."""
        for spec in specs:
            self.specs[workload_key(spec)] = spec
        decisions = self._placed(self.scheduler.submit_all(specs))
        own: dict[str, Decision] = {}
        for d in decisions:
            own.setdefault(d.workload, d)
        return [own[workload_key(s)] for s in specs if workload_key(s) in own]

    def cordon(self, uuid: str, reason: str) -> None:
        """No new work on GPU ``uuid`` (``NODE/UUID``); what runs there stays. ``KeyError``: no
        such GPU."""
        g = self.scheduler.state.by_uuid[uuid]
        self.cordoned[uuid] = reason
        if g.schedulable:  # on a lost node it stays closed for that (and cordoned once it is back)
            self.scheduler.state.set_closed(g, CORDONED)

    def uncordon(self, uuid: str) -> list[Decision]:
        """GPU ``uuid`` takes work again (once its node is alive); what waits is tried there."""
        g = self.scheduler.state.by_uuid[uuid]
        self.cordoned.pop(uuid, None)
        if self.nodes[g.node].state != "alive" or g.schedulable:
            return []
        self.scheduler.state.set_closed(g, None)
        return self._placed(self.scheduler.retry_pending(gpus={g.index}))

    def drain(self, uuid: str, reason: str) -> list[Decision]:
        """Cordon GPU ``uuid`` and place its workloads again, elsewhere or waiting; each starts on
        its new node once its old one has stopped it (one copy at a time)."""
        self.cordon(uuid, reason)
        g = self.scheduler.state.by_uuid[uuid]
        moved = []
        for key in sorted({a.workload for a in g.allocs.values()}):
            spec = self.specs.get(key)
            if spec is None:
                continue
            self._revoke(key)
            self._placed(self.scheduler.delete(spec.tenant, spec.name))
            moved.append(self._place(self.scheduler.submit(spec)))
        return moved

    def decision(self, key: str) -> Decision:
        """Where ``key`` is now: its placement, or why it waits (or that it ended)."""
        a = self.assigned.get(key)
        if a is not None:
            return a.decision
        if key in self.ended:
            return Decision(key, "pending", f"it ended ({self.ended[key]})")
        # with the moves under way that make room for it (docs/scheduler.md)
        return replace(self.scheduler.pending.decision(key), moves=self.scheduler.moves_of(key))

    def take_displaced(self) -> list[Displacement]:
        """The workloads decisions took the place of since the last call (each once): evicted (it
        had a node), moved (placed again at once) or requeued."""
        told, self.displaced = self.displaced, []
        return told

    def delete(self, tenant: str, name: str) -> bool:
        key = f"{tenant}/{name}"
        if self.specs.pop(key, None) is None:
            return False
        self._revoke(key)
        self.ended.pop(key, None)
        self.ended_on.pop(key, None)
        if self.scheduler.knows(key):
            self._placed(self.scheduler.delete(tenant, name))
        return True

    def restore(self, spec: WorkloadSpec, decision: Decision | None, node: str, epoch: int) -> None:
        """Take back, after a restart, a workload placed on ``node`` under ``epoch`` (``decision``
        None: it waited). Nodes must have joined first; epochs given later are above every one
        restored."""
        key = workload_key(spec)
        self.specs[key] = spec
        self._epoch = max(self._epoch, epoch)
        if decision is None or decision.outcome != "placed":
            self.scheduler.restore(spec, decision or Decision(key, "pending", "waiting"))
            return
        self.scheduler.restore(spec, decision)
        if key not in self.scheduler.pending:
            self.assigned[key] = Assignment(spec, decision, node, epoch)

    def hold_epoch(self, epoch: int) -> None:
        """Epochs up to ``epoch`` are taken (a restarted control plane's stored placements)."""
        self._epoch = max(self._epoch, epoch)

    def renew_all(self, now: float) -> None:
        """A restarted control plane gives every node a fresh lease from ``now``."""
        for n in self.nodes.values():
            n.renewed = now

    @property
    def epoch(self) -> int:
        return self._epoch

    # -- decisions to assignments ----------------------------------------------------------------

    def _revoke(self, key: str) -> None:
        """Take ``key``'s assignment away; until its node (if alive) reports it gone, no other node
        is told to run it."""
        a = self.assigned.pop(key, None)
        if a is not None and self.nodes[a.node].state == "alive":
            self.revoked.setdefault(key, {})[a.node] = a.epoch

    def _acknowledged(self, key: str, node: str) -> None:
        held = self.revoked.get(key, {})
        held.pop(node, None)
        if not held:
            self.revoked.pop(key, None)

    def _place(self, decisions: list[Decision]) -> Decision:
        self._placed(decisions)
        return decisions[0]

    def _placed(self, decisions: list[Decision]) -> list[Decision]:
        """Assignments for placed decisions (a new epoch each); an evicted or waiting workload
        loses its assignment, so its node stops it at its next heartbeat."""
        st = self.scheduler.state
        had_node = set(self.assigned)
        for d in decisions:
            self._revoke(d.workload)
            if d.outcome == "placed":
                self._epoch += 1
                node = st.by_uuid[d.gpus[0]].node
                self.assigned[d.workload] = Assignment(self.specs[d.workload], d, node, self._epoch)
            for victim in d.evicted:
                self._revoke(victim)
        self.displaced += displacements(decisions, had_node.__contains__)
        return decisions
