"""The agent behind its lock, with a background thread running its reconcile passes (and the
deployments' after each pass): what the API serves."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Literal

from gpufrac.api.history import AgentSampler, History
from gpufrac.config import DEFAULT_GATEWAY_PORT
from gpufrac.model.event import Event
from gpufrac.runtime.agent import Agent, WorkloadState
from gpufrac.runtime.shim import LOG
from gpufrac.serving.deployments import AgentServing, Deployments

RECONCILE_SECONDS = 0.5
STALLED_SECONDS = 30.0  # no pass finished for this long: the agent says it is degraded
MIN_GAP_SECONDS = 0.1  # a burst of API calls wakes one pass, not one per call


class AgentService:
    """The agent behind a lock, with a background thread reconciling it."""

    def __init__(
        self,
        agent: Agent,
        *,
        interval: float = RECONCILE_SECONDS,
        gateway_port: int = DEFAULT_GATEWAY_PORT,
        gateway_host: str = "127.0.0.1",
        tokens: dict[str, str | None] | None = None,
    ) -> None:
        """``tokens``: the API tokens' tenants (None for the admin's), for the request gateway."""
        self.agent = agent
        self.deployments = Deployments(
            AgentServing(agent), gateway_port=gateway_port, host=gateway_host, tokens=tokens
        )
        self.lock = agent.lock  # the agent's own: its reconcile pass releases it for device calls
        self.interval = interval
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.states: dict[str, WorkloadState] = {}
        self.last_pass = time.monotonic()  # when a reconcile pass last finished
        agent.mig.notify = self.wake  # a MIG instance made: the workload waiting for it starts now
        # the last 15 minutes for the dashboard's plots (GET /api/v1/history)
        self.history = History(AgentSampler(agent, self.deployments, lambda: self.states).read)

    def reconcile(self) -> None:
        states = {s.key: s for s in self.agent.reconcile()}
        with self.lock:
            self.states = states
            self.deployments.reconcile(self.states)
        self.last_pass = time.monotonic()

    def health(self) -> tuple[Literal["ok", "degraded"], list[str]]:
        """Whether the agent is doing its work, and if not, why: the agent's own steps that keep
        failing (a reconcile pass, writing the store, watching GPUs) and a loop that stopped making
        passes. Read without the agent's lock, so it answers even when the agent is stuck."""
        problems = [
            f"{f.what} failed: {f.error} ({f.count} {'tries' if f.count > 1 else 'try'})"
            for f in self.agent.failures.of("agent")
        ]
        age = time.monotonic() - self.last_pass
        if self._thread is not None and age > STALLED_SECONDS:
            problems.append(f"no reconcile pass has finished for {age:.0f}s")
        return ("degraded" if problems else "ok"), problems

    def start(self) -> None:
        self.reconcile()
        self._thread = threading.Thread(target=self._loop, name="gpufrac-reconcile", daemon=True)
        self._thread.start()
        self.history.start()

    def events(self, subject: str, limit: int) -> list[Event]:
        return self.agent.store.events(subject, limit=limit)

    def last_error(self, tenant: str, name: str, st: Any) -> str | None:
        """The last line a replica that failed wrote (its traceback's last line, say), so a
        deployment whose replicas never get ready says why."""
        if st is None or (st.phase not in ("backoff", "failed") and st.exit_code in (None, 0)):
            return None
        stored = self.agent.store.workload(tenant, name)
        run = self.agent.latest_run(tenant, name, stored.generation) if stored else None
        try:
            lines = (run / LOG).read_text(errors="replace").splitlines() if run else []
        except OSError:
            return None
        last = next((line.strip() for line in reversed(lines) if line.strip()), None)
        return None if last is None else last[-300:]

    def wake(self) -> None:
        """Run the next reconcile pass now rather than at the next tick."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            if self._stop.wait(MIN_GAP_SECONDS):
                return
            self._wake.clear()
            try:
                self.reconcile()
            except Exception as e:  # one bad pass must not stop the loop; it is recorded once
                with contextlib.suppress(Exception), self.lock:
                    self.agent.failures.failed("agent", "reconcile pass", e)
            else:
                with contextlib.suppress(Exception), self.lock:
                    self.agent.failures.succeeded("agent", "reconcile pass")

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.history.stop()
        self.deployments.close()
