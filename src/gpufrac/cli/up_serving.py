"""Deployments in ``gpufrac up``: the gateway and the autoscaler in the foreground, optional traffic
from the built-in load generator (``--load 1,12,12,1``), a live table, and a summary of how the
replicas followed the traffic."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from rich.table import Table

from gpufrac.cli.common import console
from gpufrac.cli.serve_cmds import load_table, run_load
from gpufrac.model.deployment import DeploymentSpec
from gpufrac.runtime.agent import Agent, WorkloadState
from gpufrac.serving.deployments import AgentServing, Deployments, gateway_path, route_name

BODY = b'{"inputs": [1, 2, 3]}'


class ServingRun:
    def __init__(
        self,
        agent: Agent,
        specs: list[DeploymentSpec],
        *,
        gateway_port: int,
        load: list[int],
        step_seconds: float,
    ) -> None:
        self.specs = specs
        self.deps = Deployments(AgentServing(agent), gateway_port=gateway_port)
        self.load, self.step_seconds = load, step_seconds
        self.started = time.monotonic()
        self.timeline: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] | None = None
        self.clients = 0
        self._recent: list[tuple[float, float, int]] = []
        self._thread: threading.Thread | None = None
        for d in specs:
            result = self.deps.apply_deployment(d)
            console.print(
                f"deployment {d.key}: {result} at {self.deps.gateway_url}{gateway_path(d)}",
                highlight=False,
            )

    def reconcile(self, states: dict[str, WorkloadState]) -> None:
        self.deps.reconcile(states)
        now = time.monotonic() - self.started
        for d in self.specs:
            views = self.deps.views(d, states)
            ready = sum(1 for r in views if r.ready and not r.draining)
            traffic = self.deps.traffic.get(route_name(d), {})
            self.timeline.append(
                {"t": now, "name": d.name, "ready": ready, "clients": self.clients,
                 "in_flight": traffic.get("in_flight", 0), "rate": traffic.get("rate", 0.0)}
            )  # fmt: skip
        if self.load and self._thread is None and self.timeline and self.timeline[-1]["ready"]:
            self._thread = threading.Thread(target=self._drive, name="gpufrac-load", daemon=True)
            self._thread.start()

    def _drive(self) -> None:
        d = self.specs[0]
        url = f"{self.deps.gateway_url}{gateway_path(d)}/predict"

        def tick(n: int, got: list[tuple[float, float, int]]) -> None:
            self.clients = n
            self._recent = got

        self.rows = asyncio.run(run_load(url, BODY, self.load, self.step_seconds, tick))
        self.clients = 0

    @property
    def done(self) -> bool:
        """The traffic has run its course (always true without --load)."""
        return not self.load or self.rows is not None

    def table(self) -> Table:
        t = Table(title="deployments", title_justify="left")
        for col in ("deployment", "replicas ready", "clients", "in flight", "req/s"):
            t.add_column(col)
        latest = {row["name"]: row for row in self.timeline[-len(self.specs) :]}
        for d in self.specs:
            row = latest.get(d.name, {})
            t.add_row(
                d.key, str(row.get("ready", 0)), str(row.get("clients", 0)),
                str(row.get("in_flight", 0)), f"{row.get('rate', 0.0):.0f}",
            )  # fmt: skip
        return t

    def summary(self) -> None:
        console.print()
        for d in self.specs:
            changes = []
            last = None
            for row in self.timeline:
                if row["name"] == d.name and row["ready"] != last:
                    changes.append(f"{row['t']:.0f}s: {row['ready']}")
                    last = row["ready"]
            console.print(
                f"{d.key}: replicas ready over time: {', '.join(changes)}", highlight=False
            )
        if self.rows:
            console.print(load_table(self.rows, "traffic from the load generator"))

    def close(self, *, keep: bool) -> None:
        if not keep:
            for d in self.specs:
                self.deps.delete(d.tenant, d.name)
        self.deps.close()
