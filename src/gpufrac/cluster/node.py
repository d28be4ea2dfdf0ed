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

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Protocol

from gpufrac.cluster.core import FENCE_S, Answer, ClusterCore, Ended, Report
from gpufrac.planning.sched_decision import Decision
from gpufrac.planning.sched_state import SchedGpu, sched_gpus_from_states
from gpufrac.runtime.agent import Agent, WorkloadState
from gpufrac.runtime.shim import write_lease

EPOCH_LABEL = "gpufrac.io/epoch"  # the epoch a node runs a workload under, kept in its local spec
LEASE_FILE = "lease.json"  # in the node agent's data directory: until when its workloads may run


def local_decision(decision: Decision) -> Decision:
    """A control plane's decision as its node's agent knows its GPUs: by UUID alone, not
    ``NODE/UUID``."""

    def local(uuid: str | None) -> str | None:
        return None if uuid is None else uuid.split("/", 1)[-1]

    return replace(
        decision,
        gpus=tuple(uuid.split("/", 1)[-1] for uuid in decision.gpus),
        actions=tuple(replace(a, gpu_uuid=local(a.gpu_uuid)) for a in decision.actions),
    )


class Unreachable(Exception):
    """The control plane did not answer."""


class ControlLink(Protocol):
    """How a node agent reaches the control plane."""

    def join(self, node: str, labels: Mapping[str, str], gpus: list[SchedGpu]) -> None: ...

    def heartbeat(self, node: str, report: Report) -> Answer:
        """The answer, or ``Unreachable``."""
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

    def heartbeat(self, node: str, report: Report) -> Answer:
        if node in self.cut:
            raise Unreachable(node)
        with self.lock:
            return self.core.heartbeat(node, report, self.clock())


class NodeAgent:
    def __init__(
        self,
        agent: Agent,
        link: ControlLink,
        *,
        fence_s: float = FENCE_S,
        kill_grace_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.agent = agent
        self.link = link
        self.name = agent.node
        self.fence_s = fence_s
        self.kill_grace_s = kill_grace_s  # SIGTERM to SIGKILL, when a shim stops a fenced workload
        self.clock = clock
        self.lease_file = agent.data_dir / LEASE_FILE
        agent.runs.lease_file = self.lease_file
        self.answered: float | None = None  # when the last answer's heartbeat was sent
        self.joined = False
        self.fenced = False

    def join(self) -> None:
        dev = self.agent.dev
        states = dev.gpus()
        models = {g.uuid: dev.model(g.uuid) for g in states if g.health == "ok" and g.model}
        gpus = sched_gpus_from_states(states, models, self.agent.store.mig_pins())
        self.link.join(self.name, self.agent.settings.node_labels, gpus)
        self.joined = True

    def step(self) -> list[WorkloadState]:
        """One reconcile pass and one heartbeat; returns the pass's workload states."""
        self._fence_if_unanswered()  # before the pass, which would restart what shims stopped
        states = self.agent.reconcile()
        sent, sent_wall = self.clock(), time.time()
        try:
            if not self.joined:
                self.join()
            answer = self.link.heartbeat(self.name, self.report(states))
        except Unreachable:
            self._fence_if_unanswered()
            return states
        if answer.lease_s <= 0:  # the control plane holds this node lost: start again
            self.fence("the control plane held this node lost")
            self.joined = False
            return states
        self.answered, self.fenced = sent, False
        write_lease(self.lease_file, sent_wall + self.fence_s, self.kill_grace_s)
        self.follow(answer)
        return states

    def _fence_if_unanswered(self) -> None:
        if self.answered is None:
            return
        silent = self.clock() - self.answered
        if silent >= self.fence_s:
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
                case "pending" | "starting" | "running" | "paused" | "backoff":
                    running[s.key] = epoch
        return Report(running=running, ended=ended)

    def follow(self, answer: Answer) -> None:
        """Make this node run exactly what ``answer`` says: stops first (a preempted workload
        frees its GPU for the one that took it), then placements."""
        agent = self.agent
        wanted = {a.workload: a for a in answer.run}
        with agent.lock:
            for w in agent.store.workloads():
                a = wanted.get(w.key)
                if a is None or self._epoch(w.key) != a.epoch:
                    agent.delete(w.tenant, w.name)
            for key, a in wanted.items():
                if self._epoch(key) == a.epoch:
                    continue
                labels = {**a.spec.labels, EPOCH_LABEL: str(a.epoch)}
                agent.place(replace(a.spec, labels=labels), local_decision(a.decision))

    def fence(self, why: str) -> None:
        """Stop every workload of this node (their placements are the control plane's to give
        again)."""
        agent = self.agent
        with agent.lock:
            for w in agent.store.workloads():
                agent.delete(w.tenant, w.name)
            if not self.fenced:
                agent.store.record_event("fenced", self.name, f"every workload stopped: {why}")
        self.fenced = True

    def _epoch(self, key: str) -> int | None:
        tenant, name = key.split("/", 1)
        stored = self.agent.store.workload(tenant, name)
        if stored is None:
            return None
        value = (stored.spec.get("labels") or {}).get(EPOCH_LABEL)
        return int(value) if isinstance(value, str) and value.isdigit() else None
