"""The node agent of a cluster: a machine's own agent, run by the control plane's decisions.

A ``NodeAgent`` owns one ``runtime.Agent`` (this machine's GPUs, processes, MIG, MPS, QoS) and calls
the control plane through a ``ControlLink``. Each ``step`` is one reconcile pass of the agent and
one heartbeat: the node reports, per workload, the epoch of the run it has and the jobs that ended;
the answer is everything it must run (``cluster.core.Answer``). It stops what the answer leaves out
or gives under another epoch, then places what is new exactly as decided (``Agent.place``).

Fencing: a node that has gone ``fence_s`` without an answer stops every workload it runs, before
its lease (``lease_s`` > ``fence_s``) ends at the control plane, which only then places them
elsewhere. Two hands do it: the node agent itself (``fence``, first thing in a ``step``, so an agent
that wakes from a freeze stops its work before anything else), and each workload's shim, which reads
the node's lease file (renewed at every answer) and stops its workload once the lease in it has run
out, whatever the agent is doing. A node told it was lost (an answer with no lease) stops everything
and joins again.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, assert_never

from gpufrac import __version__
from gpufrac.cluster.control import ControlPlane
from gpufrac.cluster.core import FENCE_S, Answer, ClusterCore, Ended, NodeEvent, Report
from gpufrac.cluster.wire import (
    CREDENTIAL_HEADER,
    AnswerBody,
    JoinBody,
    answer_from_wire,
    gpu_to_wire,
    report_to_wire,
)
from gpufrac.model.caller import ADMIN
from gpufrac.model.event import Event
from gpufrac.model.numbers import digits_or_none
from gpufrac.model.workload import spec_from_json
from gpufrac.planning.sched_decision import Decision
from gpufrac.planning.sched_state import SchedGpu, sched_gpus_from_states
from gpufrac.runtime.agent import Agent, WorkloadState
from gpufrac.runtime.fleet_view import read_fleet
from gpufrac.runtime.lease import read_lease, write_lease
from gpufrac.runtime.qos_view import workload_qos

Views = dict[str, dict[str, Any]]
EPOCH_LABEL = "gpufrac.io/epoch"  # the epoch a node runs a workload under, kept in its local spec
FENCE_SHARE = 2 / 3  # a node fences itself this far into the control plane's lease, at the latest
RELAYED_FILE = "events-relayed"  # in the node agent's data directory: the last event passed on
RELAY_AT_ONCE = 200  # events passed on with one heartbeat, at most
NOT_RELAYED = frozenset({"applied", "deleted"})  # the control plane's own, not the node's
CREDENTIAL_FILE = "node-credential"  # in the node agent's data directory: its own, from its join
LEASE_FILE = "lease.json"  # in the node agent's data directory: until when its workloads may run


def local_decision(decision: Decision) -> Decision:
    """A control plane's decision as its node's agent knows its GPUs: by UUID alone, not
    ``NODE/UUID``."""

    def local(uuid: str) -> str:
        return uuid.split("/", 1)[-1]

    return replace(
        decision,
        gpus=tuple(local(uuid) for uuid in decision.gpus),
        actions=tuple(a.renamed(gpu=local) for a in decision.actions),
    )


class Unreachable(Exception):
    """The control plane did not answer."""


class Refused(Exception):
    """The control plane refused this node's cluster token: retrying cannot help."""


class ControlLink(Protocol):
    """How a node agent reaches the control plane."""

    def join(self, node: str, labels: Mapping[str, str], gpus: list[SchedGpu]) -> None: ...

    def heartbeat(
        self,
        node: str,
        report: Report,
        views: Views,
        gpus: list[dict[str, Any]] | None,
        events: Sequence[NodeEvent] = (),
    ) -> Answer:
        """The answer, or ``Unreachable``. ``views``: per workload what the node's agent shows of
        it; ``gpus``: the node's GPUs as its agent shows them (both for the control plane's
        views); ``events``: its own events since the last answer."""
        ...


class InProcessLink:
    """The control plane's core in this process, behind one lock (tests and benchmarks); ``cut``
    makes it unreachable, as a network partition would."""

    def __init__(self, core: ClusterCore, clock: Callable[[], float] = time.monotonic) -> None:
        import threading

        self.core = core
        self.clock = clock
        self.lock = threading.Lock()
        self.cut: set[str] = set()

    def join(self, node: str, labels: Mapping[str, str], gpus: list[SchedGpu]) -> None:
        if node in self.cut:
            raise Unreachable(node)
        with self.lock:
            self.core.join(node, labels, gpus, self.clock())

    def heartbeat(
        self,
        node: str,
        report: Report,
        views: Views,
        gpus: list[dict[str, Any]] | None,
        events: Sequence[NodeEvent] = (),
    ) -> Answer:
        if node in self.cut:
            raise Unreachable(node)
        with self.lock:
            return self.core.heartbeat(node, report, self.clock())


class ServiceLink:
    """The control plane service in this process (tests): what the HTTP API would carry. Its
    nodes are the control plane's own, as ``--local``'s are: each joins with a credential the
    control plane made for it (``bootstrap``), approved at once."""

    def __init__(self, control: ControlPlane) -> None:
        self.control = control
        self.cut: set[str] = set()

    def join(self, node: str, labels: Mapping[str, str], gpus: list[SchedGpu]) -> None:
        if node in self.cut:
            raise Unreachable(node)
        presented = self.control.bootstrap(node)
        self.control.admitted_join(node, presented, labels, gpus, None)

    def heartbeat(
        self,
        node: str,
        report: Report,
        views: Views,
        gpus: list[dict[str, Any]] | None,
        events: Sequence[NodeEvent] = (),
    ) -> Answer:
        if node in self.cut:
            raise Unreachable(node)
        return self.control.heartbeat(node, report, views, gpus, events)


class HttpLink:
    """The control plane's API over HTTP: joins with the cluster token (and this node's own
    credential once it has one, kept in ``credential_file``, mode 0600), heartbeats with the
    node's credential only."""

    def __init__(
        self, url: str, token: str, credential_file: Path, *, timeout_s: float = 2.0
    ) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.token = token
        self.credential_file = credential_file
        self.client = httpx.Client(timeout=timeout_s)
        self.address: str | None = None  # this node's own API, for logs

    @property
    def credential(self) -> str | None:
        try:
            return self.credential_file.read_text().strip() or None
        except FileNotFoundError:
            return None

    def _post(self, path: str, body: Any, headers: dict[str, str]) -> Any:
        import httpx

        try:
            r = self.client.post(self.url + path, content=body.model_dump_json(), headers=headers)
        except httpx.HTTPError as e:
            raise Unreachable(f"{self.url}: {e}") from None
        if r.status_code == 401 and path.endswith("/join"):
            raise Refused(
                f"{self.url} refused the cluster token: it is not this control plane's (copy its "
                "cluster-token file, or give --cluster-token FILE)"
            )
        if r.status_code == 404 and path.endswith("/join"):  # the users' API, or no gpufrac
            raise Refused(
                f"{self.url} is not a control plane's node listener (404: {r.text[:300]}): give "
                "its node port (gpufrac control --node-port, default its --port + 1)"
            )
        if r.status_code == 401:
            raise Unreachable(f"{self.url} refused this node's credential (401)")
        if r.status_code == 403 and path.endswith("/join"):  # denied by an admin
            raise Unreachable(f"{self.url} refused this node: {r.text[:300]}")
        if r.status_code == 409:  # its name is held by a live node: it may end, so try again
            raise Unreachable(f"{self.url} refused this node for now: {r.text[:300]}")
        if r.status_code != 200:
            raise Unreachable(f"{self.url} answered {r.status_code}: {r.text[:200]}")
        return r.content

    def join(self, node: str, labels: Mapping[str, str], gpus: list[SchedGpu]) -> None:
        body = JoinBody(
            labels=dict(labels),
            gpus=[gpu_to_wire(g) for g in gpus],
            address=self.address,
            version=__version__,
        )
        headers = {"authorization": f"Bearer {self.token}"}
        held = self.credential
        if held is not None:
            headers[CREDENTIAL_HEADER] = held
        raw = self._post(f"/cluster/v1/nodes/{node}/join", body, headers)
        given = json.loads(raw).get("credential")
        if isinstance(given, str) and given:
            fd = os.open(self.credential_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(given + "\n")

    def heartbeat(
        self,
        node: str,
        report: Report,
        views: Views,
        gpus: list[dict[str, Any]] | None,
        events: Sequence[NodeEvent] = (),
    ) -> Answer:
        held = self.credential
        if held is None:
            return Answer(node, (), 0.0, "join")
        headers = {"authorization": f"Bearer {held}"}
        try:
            raw = self._post(
                f"/cluster/v1/nodes/{node}/heartbeat",
                report_to_wire(report, views, gpus, events),
                headers,
            )
        except Unreachable as e:
            if "(401)" not in str(e):
                raise
            # its credential is not known there (the control plane's data was lost): join again
            return Answer(node, (), 0.0, "join")
        return answer_from_wire(AnswerBody.model_validate_json(raw))


class NodeAgent:
    def __init__(
        self,
        agent: Agent,
        link: ControlLink,
        *,
        fence_s: float | None = None,
        kill_grace_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] = lambda _message: None,
    ) -> None:
        self.agent = agent
        self.link = link
        self.name = agent.node
        # until the first answer, ``fence_s`` (FENCE_S); then two thirds of the lease each answer
        # gives, at most ``fence_s`` where one was given (tests keep it short)
        self.fence_s = FENCE_S if fence_s is None else fence_s
        self.fence_at_most = fence_s
        self.kill_grace_s = kill_grace_s  # SIGTERM to SIGKILL, when a shim stops a fenced workload
        self.clock = clock
        self.lease_file = agent.data_dir / LEASE_FILE
        agent.run_under_lease(self.lease_file)
        self.answered: float | None = None  # when the last answer's heartbeat was sent
        self.stepped: float | None = None  # when the last step began (a gap: this node stopped)
        self.last_states: list[WorkloadState] = []  # of the last pass that went through
        self.joined = False
        self.waiting_approval = False
        self.fenced = False
        self.unreachable = False
        self.refused: dict[str, tuple[int, str]] = {}  # placements that did not fit here
        self.say = say  # what the node tells whoever runs it (`gpufrac node` prints it)
        # the last of its own events the control plane has taken (kept across restarts)
        self.relayed_file = agent.data_dir / RELAYED_FILE
        try:
            self.relayed = int(self.relayed_file.read_text())
        except (OSError, ValueError):
            self.relayed = 0

    def join(self) -> None:
        dev = self.agent.dev
        states = dev.gpus()
        models = {g.uuid: dev.model(g.uuid) for g in states if g.health == "ok" and g.model}
        gpus = sched_gpus_from_states(states, models, self.agent.store.mig_pins())
        self.link.join(self.name, self.agent.settings.node_labels, gpus)
        self.joined = True
        self.say(f"joined the control plane with {len(gpus)} GPU(s)")

    def step(self) -> list[WorkloadState]:
        """One reconcile pass and one heartbeat; returns the pass's workload states."""
        now, before = self.clock(), self.stepped
        self.stepped = now
        stopped = None if before is None else now - before
        self._fence_if_unanswered(stopped)  # before the pass, which would restart what shims
        # stopped
        if not self.fenced and self._lease_ran_out() and self.agent.store.workloads():
            # started again after its lease ended (the shims stopped their workloads): nothing
            # here runs again before an answer gives it again
            self.fence("this node's lease ran out while its agent was not running")
        try:
            states = self.agent.reconcile()
        except Exception as e:  # a full disk, say: the failure is shown (health, events) and the
            # heartbeat still goes, with the last pass's states, so the node keeps its lease and
            # its work runs on; as the single machine's loop does (runtime.service)
            with contextlib.suppress(Exception):
                self.agent.failures.failed("agent", "reconcile pass", e)
            states = self.last_states
        else:
            with contextlib.suppress(Exception):
                self.agent.failures.succeeded("agent", "reconcile pass")
            self.last_states = states
        self.heartbeat(states)
        return states

    def heartbeat(self, states: list[WorkloadState]) -> None:
        """One heartbeat with ``states`` (a pass's), and what its answer says. Called by ``step``,
        and on its own between steps while the control plane cannot be reached (``unreachable``),
        so a restarted one is answered as soon as it listens, not a whole pass later."""
        sent, sent_wall = self.clock(), time.time()
        batch = self.agent.store.events(after=self.relayed, limit=RELAY_AT_ONCE)
        events = [
            NodeEvent(e.kind[:64], e.subject[:300], e.message[:2000])
            for e in batch
            if e.kind not in NOT_RELAYED
        ]
        try:
            if not self.joined:
                self.join()
            views = {**self.views(states), **self._refused_views()}
            answer = self.link.heartbeat(
                self.name, self.report(states), views, self.gpus(states), events
            )
            if answer.status == "join":  # a restarted control plane: join (which restores what
                # runs here) and call again at once, so the work goes on within the same lease
                self.say("the control plane does not know this node (restarted?): joining again")
                self.join()
                answer = self.link.heartbeat(self.name, self.report(states), views, None)
        except Unreachable as e:
            if not self.unreachable:
                stops = (
                    "" if self.answered is None else f"; its work stops after {self.fence_s:g} s"
                )
                self.say(f"cannot reach the control plane: {e} (retrying{stops})")
            self.unreachable = True
            self._fence_if_unanswered()
            return
        match answer.status:
            case "ok":
                self.waiting_approval = False
            case "pending":  # joined, not approved yet: it runs nothing (the answer is empty)
                if not self.waiting_approval:
                    self.say(
                        f"waiting for an admin to approve this node (gpufrac nodes approve "
                        f"{self.name}); it runs nothing until then"
                    )
                self.waiting_approval = True
            case "lost":  # its work was placed elsewhere: stop everything, then join again
                self._taken(batch)  # the control plane took them: never sent (stored) again
                self.fence("the control plane held this node lost")
                self.joined = False
                return
            case "join":  # still not known right after joining: try again next time
                self.joined = False
                return
            case _:
                assert_never(answer.status)
        if self.unreachable:
            self.say("the control plane answers again")
        self.answered, self.fenced, self.unreachable = sent, False, False
        self._taken(batch)
        # well inside the control plane's lease, whatever it is: stopped before it ends
        self.fence_s = answer.lease_s * FENCE_SHARE
        if self.fence_at_most is not None:
            self.fence_s = min(self.fence_at_most, self.fence_s)
        write_lease(self.lease_file, sent_wall + self.fence_s, self.kill_grace_s)
        self.follow(answer)

    def _lease_ran_out(self) -> bool:
        lease = read_lease(self.lease_file)
        return lease is not None and time.time() > lease[0]

    def _taken(self, batch: Sequence[Event]) -> None:
        """The control plane took these of this node's events: not sent again."""
        if batch:
            self.relayed = batch[-1].id
            self.relayed_file.write_text(f"{self.relayed}\n")

    def _fence_if_unanswered(self, stopped: float | None = None) -> None:
        """Fence once nothing has been answered for ``fence_s``, saying what happened: this node
        did not run for ``stopped`` seconds (frozen, stopped) while its lease ran out, or the
        control plane did not answer it."""
        if self.answered is None:
            return
        silent = self.clock() - self.answered
        if silent < self.fence_s:
            return
        if stopped is not None and stopped >= self.fence_s:
            self.fence(
                f"this node was stopped (frozen?) for {stopped:.1f} s and its lease ran out "
                "meanwhile"
            )
        else:
            self.fence(f"the control plane has not answered for {silent:.1f} s")

    def report(self, states: list[WorkloadState]) -> Report:
        running: dict[str, int] = {}
        ended: dict[str, tuple[int, Ended]] = {}
        for s in states:
            epoch = self._epoch(s.key)
            if epoch is None:
                continue
            match s.phase:
                case "succeeded" | "failed":
                    ended[s.key] = (epoch, s.phase)
                # unknown: it keeps its place (not ended: placing it again could run it twice)
                case "pending" | "starting" | "running" | "paused" | "backoff" | "unknown":
                    running[s.key] = epoch
                case _:
                    assert_never(s.phase)
        return Report(running=running, ended=ended)

    def views(self, states: list[WorkloadState]) -> Views:
        """What this node's agent shows of each workload it runs for the control plane."""
        agent = self.agent
        out: Views = {}
        for s in states:
            stored = agent.store.workload(*s.key.split("/", 1))
            if stored is None or self._epoch(s.key) is None:
                continue
            spec = spec_from_json(stored.spec)
            qos = workload_qos(agent, spec, s.decision, agent.arbiter.latest, None, s)
            out[s.key] = {
                "phase": s.phase,
                "reason": s.reason_for(s.key.split("/", 1)[0]),
                "attempts": s.attempts,
                "restarts": s.restarts,
                "evictions": s.evictions,
                "exit_code": s.exit_code,
                "env": dict(s.env),
                "qos": qos,
            }
        return out

    def _refused_views(self) -> Views:
        return {
            key: {"phase": "pending", "reason": f"node {self.name} could not take it: {why}"}
            for key, (_epoch, why) in self.refused.items()
        }

    def gpus(self, states: list[WorkloadState]) -> list[dict[str, Any]]:
        """This node's GPUs as its agent shows them, every workload named (the control plane
        hides other tenants' from a tenant)."""
        with self.agent.lock:
            return read_fleet(self.agent, {s.key: s for s in states}, ADMIN)

    def follow(self, answer: Answer) -> None:
        """Make this node run exactly what ``answer`` says: stops first (a preempted workload
        frees its GPU for the one that took it), then placements."""
        agent = self.agent
        wanted = {a.workload: a for a in answer.run}
        with agent.lock:
            kept = set(answer.keep)
            for w in agent.store.workloads():
                a = wanted.get(w.key)
                if a is None and w.key in kept:
                    continue  # a job that ended here: its record and logs stay
                if a is None or self._epoch(w.key) != a.epoch:
                    agent.delete(w.tenant, w.name)
            for key, a in wanted.items():
                if self._epoch(key) == a.epoch:
                    continue
                labels = {**a.spec.labels, EPOCH_LABEL: str(a.epoch)}
                done = agent.place(replace(a.spec, labels=labels), local_decision(a.decision))
                if done.outcome == "placed":
                    self.refused.pop(key, None)
                elif self.refused.get(key, (0, ""))[0] != a.epoch:
                    # what the control plane decided does not fit here: shown, not dropped
                    self.refused[key] = (a.epoch, done.reason)
                    agent.store.record_event(
                        "not_placed", key, f"node {self.name} could not take it: {done.reason}"
                    )
            for key in [k for k in self.refused if k not in wanted]:
                del self.refused[key]

    def fence(self, why: str) -> None:
        """Stop every workload of this node (their placements are the control plane's to give
        again)."""
        agent = self.agent
        with agent.lock:
            for w in agent.store.workloads():
                agent.delete(w.tenant, w.name)
            if not self.fenced:
                agent.store.record_event("fenced", self.name, f"every workload stopped: {why}")
                self.say(f"fenced: every workload stopped: {why}")
        self.fenced = True

    def _epoch(self, key: str) -> int | None:
        tenant, name = key.split("/", 1)
        stored = self.agent.store.workload(tenant, name)
        if stored is None:
            return None
        value = (stored.spec.get("labels") or {}).get(EPOCH_LABEL)
        return digits_or_none(value)  # ASCII digits: '²'.isdigit() is true, int('²') raises


def die_with_parent() -> None:
    """In a child about to exec: SIGTERM it when its parent (the control plane) ends, however
    that ends (Linux's PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
