"""Real GPU fractions for Ray code: a gpufrac lease for a Ray actor or task.

Ray's ``num_gpus=0.5`` is a counter: two actors asking half a GPU each land on one GPU whatever
their memory, and nothing keeps either inside its half. Here the fraction is gpufrac's: ``lease``
asks the control plane (``gpufrac control``, docs/cluster.md) for a slice of a GPU as a manifest
would (``{"memory": "20GiB"}``, ``{"mig": "1g.18gb"}``, ``{"fraction": 0.25, "compute": "30%"}``);
the control plane places it like any workload (MIG instance, MPS share or time-slice, with
priority, quotas and QoS), or it waits where nothing fits. A placed lease gives the Ray options
that start the actor on the lease's node with the lease's environment (``CUDA_VISIBLE_DEVICES`` set
to the MIG device or GPU, MPS limits, QoS variables)::

    import gpufrac.ray

    with gpufrac.ray.lease({"memory": "20GiB"}, server="http://head:8470") as held:
        model = Model.options(**held.options).remote()
        ...

    # or: the lease goes back by itself once the actor has ended
    model, held = gpufrac.ray.actor(Model, {"memory": "20GiB"}, server="http://head:8470")

A lease is a workload of the control plane (``ray-...``, holding its slice with a small process
while the actor runs there), so ``gpufrac get workloads`` shows it, and deleting it gives it back.
This module imports nothing else of gpufrac: it runs in Ray drivers with ``ray`` and ``httpx``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
import uuid
from typing import Any

import httpx

NODE_LABEL = "gpufrac.io/node"


class LeaseWaits(Exception):
    """The lease was not placed in time: nothing fits now (the reason says why)."""


class Lease:
    """A placed lease: where it is, what to start the actor with; ``release`` gives it back."""

    def __init__(
        self, server: str, headers: dict[str, str], view: dict[str, Any], ttl_s: float
    ) -> None:
        self.server, self.headers = server, headers
        self.workload = f"{view['tenant']}/{view['name']}"
        self.node: str = view["node"]
        self.ttl_s = ttl_s
        self.env: dict[str, str] = {
            k: v for k, v in view["env"].items() if k != "GPUFRAC_ATTEMPT"
        }  # what a workload on that slice is handed
        self.released = False
        self._stop = threading.Event()
        # kept alive from this process: a driver that ends without releasing it (a crash,
        # kill -9) stops saying so, and the control plane gives it back after ttl_s
        threading.Thread(
            target=self._keep_alive, args=(ttl_s / 3,), daemon=True, name="gpufrac-lease"
        ).start()
        atexit.register(self.release)

    def _keep_alive(self, every: float) -> None:
        while not self._stop.wait(every):
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(
                    f"{self.server}/api/v1/workloads/{self.workload}/keepalive",
                    headers=self.headers,
                    timeout=5,
                )

    @property
    def options(self) -> dict[str, Any]:
        """``Actor.options(**lease.options)`` / ``task.options(...)``: on the lease's node, with its
        environment."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return {
            "scheduling_strategy": NodeAffinitySchedulingStrategy(
                ray_node_id(self.node), soft=False
            ),
            "runtime_env": {"env_vars": dict(self.env)},
        }

    def release(self) -> None:
        self._stop.set()
        if not self.released:
            httpx.delete(
                f"{self.server}/api/v1/workloads/{self.workload}", headers=self.headers, timeout=10
            )
            self.released = True

    def __repr__(self) -> str:
        """What the lease is, as a person reads it in a REPL or a log: the workload, its node, the
        device its actor gets, whether it was given back (never the token)."""
        device = self.env.get("CUDA_VISIBLE_DEVICES", "?")
        state = "released" if self.released else f"held, ttl {self.ttl_s:g} s"
        return (
            f"<Lease {self.workload} on node {self.node}: CUDA_VISIBLE_DEVICES={device} "
            f"({state}) from {self.server}>"
        )

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def ray_node_id(node: str) -> str:
    """The id of the alive Ray node labelled ``gpufrac.io/node=node``."""
    import ray

    for n in ray.nodes():  # type: ignore[no-untyped-call]
        if n.get("Alive") and (n.get("Labels") or {}).get(NODE_LABEL) == node:
            return str(n["NodeID"])
    raise LeaseWaits(f"no alive Ray node is labelled {NODE_LABEL}={node}")


def lease(
    gpu: dict[str, Any],
    *,
    server: str | None = None,
    token: str | None = None,
    tenant: str | None = None,
    sharing: str = "auto",
    priority: str | int = "normal",
    node_selector: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    ttl_s: float = 30.0,
) -> Lease:
    """Ask the control plane for ``gpu`` (a manifest's ``resources.gpu``) and wait until it is
    placed and held on its node; ``LeaseWaits`` (and nothing kept) if not within ``timeout_s``.
    The lease is kept alive from this process; once that stops (it ended, or was killed), the
    control plane gives the lease back within ``ttl_s``."""
    server = (server or os.environ.get("GPUFRAC_SERVER") or "http://127.0.0.1:8470").rstrip("/")
    token = token or os.environ.get("GPUFRAC_TOKEN")
    headers = {"authorization": f"Bearer {token}"} if token else {}
    name = f"ray-{uuid.uuid4().hex[:12]}"
    metadata: dict[str, Any] = {
        "name": name,
        **({"tenant": tenant} if tenant else {}),
        "labels": {"gpufrac.io/lease": "ray", "gpufrac.io/lease-ttl": f"{ttl_s:g}"},
    }
    spec: dict[str, Any] = {
        "type": "service",
        "command": ["sleep", "infinity"],  # holds the slice while the actor runs there
        "resources": {"gpu": gpu},
        "sharing": sharing,
        "priority": priority,
    }
    if node_selector:
        spec["node_selector"] = node_selector
    manifest = {"apiVersion": "gpufrac/v1", "kind": "Workload", "metadata": metadata, "spec": spec}
    r = httpx.post(
        f"{server}/api/v1/workloads",
        content=json.dumps(manifest),
        headers={**headers, "content-type": "application/json"},
        timeout=30,
    )
    if r.status_code != 200:
        raise LeaseWaits(f"the control plane refused the lease ({r.status_code}): {r.text[:500]}")
    result = r.json()["results"][0]
    key = result["workload"]
    if result["result"] == "refused":
        raise LeaseWaits(f"refused: {result['decision']['reason']}")
    deadline = time.monotonic() + timeout_s
    view: dict[str, Any] = {}
    kept = time.monotonic()
    while time.monotonic() < deadline:
        view = httpx.get(f"{server}/api/v1/workloads/{key}", headers=headers, timeout=10).json()
        if view.get("phase") == "running" and view.get("env"):
            return Lease(server, headers, view, ttl_s)
        if time.monotonic() - kept > ttl_s / 3:  # still wanted while it waits for a place
            httpx.post(f"{server}/api/v1/workloads/{key}/keepalive", headers=headers, timeout=10)
            kept = time.monotonic()
        time.sleep(0.2)
    httpx.delete(f"{server}/api/v1/workloads/{key}", headers=headers, timeout=10)
    raise LeaseWaits(f"not placed within {timeout_s:g} s: {view.get('reason', '')}")


def actor(cls: Any, gpu: dict[str, Any], *args: Any, **lease_args: Any) -> tuple[Any, Lease]:
    """Start Ray actor class ``cls`` (a ``ray.remote`` class) on a gpufrac lease; the lease is
    given back once the actor has ended (watched from this process, once a second)."""
    import ray

    held = lease(gpu, **lease_args)
    handle = cls.options(**held.options).remote(*args)

    def watch() -> None:
        while True:
            try:
                ray.get(handle.__ray_ready__.remote(), timeout=30)
            except ray.exceptions.RayActorError:
                held.release()
                return
            except ray.exceptions.GetTimeoutError:
                pass
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True, name=f"gpufrac-lease-{held.workload}").start()
    return handle, held
