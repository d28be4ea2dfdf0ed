"""Real GPU fractions for Ray code: a gpufrac lease for a Ray actor or task.

Ray's ``num_gpus=0.5`` is a counter: two actors asking half a GPU each land on one GPU whatever
their memory, and nothing keeps either inside its half. Here the fraction is gpufrac's: ``lease``
asks the control plane (``gpufrac control``, docs/cluster.md) for a slice of a GPU as a manifest
would (``{"memory": "20GiB"}``, ``{"mig": "1g.18gb"}``, ``{"fraction": 0.25, "compute": "30%"}``);
the control plane places it like any workload (MIG instance, MPS share or time-slice, with
priority, quotas and QoS), or it waits where nothing fits. A placed lease gives the Ray options
that start the actor on the lease's node with the lease's environment (``CUDA_VISIBLE_DEVICES`` set
to the MIG device or GPU, MPS limits, QoS variables) and a token GPU request, so that Ray's own
view agrees: ``ray.get_gpu_ids()`` there is the lease's device (``["MIG-..."]``), as Ray returns
the ids of a worker started with ``CUDA_VISIBLE_DEVICES`` set::

    import gpufrac.ray

    with gpufrac.ray.lease({"memory": "20GiB"}, server="http://head:8470") as held:
        model = Model.options(**held.options).remote()
        refs = held.map(embed, batches)  # one lease serves many tasks (one Ray worker, reused)

    # or: the lease goes back by itself once the actor has ended
    model, held = gpufrac.ray.actor(Model, {"memory": "20GiB"}, "arg", server="http://head:8470",
                                    dtype="bf16")  # the lease's keywords; the rest: Model's

    # several leases at once, tasks spread over them
    with gpufrac.ray.pool({"memory": "10GiB"}, size=4, server="http://head:8470") as leases:
        refs = leases.map(embed, batches)

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
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

NODE_LABEL = "gpufrac.io/node"
# What a leased task or actor asks of Ray's GPU counter for a lease of one device: the smallest
# amount Ray takes (it counts in units of 1/10000), so that Ray assigns the worker a GPU (and
# ``ray.get_gpu_ids()`` is not ``[]``) without its counter standing in for gpufrac's fractions
RAY_GPU_TOKEN = 0.0001
LEASE_KEYWORDS = frozenset(
    ("server", "token", "tenant", "sharing", "priority", "node_selector", "timeout_s", "ttl_s")
)


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
        self._options: dict[str, Any] | None = None
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
    def devices(self) -> list[str]:
        """The lease's devices (its ``CUDA_VISIBLE_DEVICES``: a MIG device or GPU UUIDs), which
        ``ray.get_gpu_ids()`` returns in its tasks and actors."""
        value = self.env.get("CUDA_VISIBLE_DEVICES", "")
        return [d for d in value.split(",") if d]

    @property
    def options(self) -> dict[str, Any]:
        """``Actor.options(**lease.options)`` / ``task.options(...)``: on the lease's node, with its
        environment, and with a GPU of Ray's (``num_gpus``: a token for one device, whole GPUs
        for several), so that Ray's view (``ray.get_gpu_ids()``, the accelerator ids Ray's
        libraries read) is the lease's device. Worked out once per lease."""
        if self._options is None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            node = ray_node(self.node)
            self._options = {
                "scheduling_strategy": NodeAffinitySchedulingStrategy(
                    str(node["NodeID"]), soft=False
                ),
                "num_gpus": ray_gpu_request(
                    self.devices, float((node.get("Resources") or {}).get("GPU", 0)), self.node
                ),
                "runtime_env": {"env_vars": dict(self.env)},
            }
        return dict(self._options)

    def remote(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run Ray task ``fn`` (a ``ray.remote`` function) on this lease: its ``ObjectRef``. Tasks
        of one lease share its slice and its Ray workers (started once, then reused)."""
        return fn.options(**self.options).remote(*args, **kwargs)

    def map(self, fn: Any, items: Iterable[Any]) -> list[Any]:
        """``fn(item)`` as a Ray task on this lease for each item: their ``ObjectRef``s."""
        return [self.remote(fn, item) for item in items]

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


def ray_node(node: str) -> dict[str, Any]:
    """The alive Ray node labelled ``gpufrac.io/node=node`` (as ``ray.nodes()`` lists it)."""
    import ray

    for n in ray.nodes():  # type: ignore[no-untyped-call]
        if n.get("Alive") and (n.get("Labels") or {}).get(NODE_LABEL) == node:
            return dict(n)
    raise LeaseWaits(f"no alive Ray node is labelled {NODE_LABEL}={node}")


def ray_node_id(node: str) -> str:
    """The id of the alive Ray node labelled ``gpufrac.io/node=node``."""
    return str(ray_node(node)["NodeID"])


def ray_gpu_request(devices: list[str], node_gpus: float, node: str) -> float:
    """``num_gpus`` for a task or actor on a lease of ``devices`` on a Ray node with ``node_gpus``
    GPUs of Ray's: a token (``RAY_GPU_TOKEN``) for one device, so that Ray's counter does not
    stand in for gpufrac's fractions; as many whole GPUs as devices for several (Ray gives a
    worker several GPU ids only for whole GPUs). Either way Ray maps the ids it assigns onto the
    worker's ``CUDA_VISIBLE_DEVICES`` (the lease's), so ``ray.get_gpu_ids()`` is the lease's
    devices. ``ValueError`` naming the fix where the Ray node has too few GPUs of Ray's."""
    want = RAY_GPU_TOKEN if len(devices) <= 1 else float(len(devices))
    if node_gpus < want:
        raise ValueError(
            f"Ray node {NODE_LABEL}={node} has {node_gpus:g} GPUs of Ray's, and a lease of "
            f"{len(devices)} device(s) runs its tasks with num_gpus={want:g} (so that "
            "ray.get_gpu_ids() there is the lease's device): start that Ray node with its GPUs "
            "(ray start --num-gpus N, or let Ray detect them)"
        )
    return want


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


def actor(
    cls: Any,
    gpu: dict[str, Any],
    *args: Any,
    init_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[Any, Lease]:
    """Start Ray actor class ``cls`` (a ``ray.remote`` class) on a gpufrac lease, as
    ``cls(*args, **kwargs)``; the lease is given back once the actor has ended (watched from
    this process, once a second). The keywords ``lease`` takes (``server``, ``token``,
    ``tenant``, ``sharing``, ``priority``, ``node_selector``, ``timeout_s``, ``ttl_s``) go to the
    lease, every other to the constructor; a constructor keyword of one of those names goes in
    ``init_kwargs``."""
    import ray

    lease_args = {k: kwargs.pop(k) for k in LEASE_KEYWORDS & kwargs.keys()}
    held = lease(gpu, **lease_args)
    try:
        handle = cls.options(**held.options).remote(*args, **{**kwargs, **(init_kwargs or {})})
    except BaseException:
        held.release()
        raise

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


class LeasePool:
    """Several leases held together, serving tasks in turn (``remote``, ``map``); ``release``
    gives them all back."""

    def __init__(self, leases: list[Lease]) -> None:
        self.leases = leases
        self._next = 0
        self._lock = threading.Lock()

    def remote(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run Ray task ``fn`` on the next lease of the pool, in turn: its ``ObjectRef``."""
        with self._lock:
            held = self.leases[self._next % len(self.leases)]
            self._next += 1
        return held.remote(fn, *args, **kwargs)

    def map(self, fn: Any, items: Iterable[Any]) -> list[Any]:
        """``fn(item)`` as a Ray task for each item, spread over the pool's leases in turn."""
        return [self.remote(fn, item) for item in items]

    def release(self) -> None:
        for held in self.leases:
            held.release()

    def __repr__(self) -> str:
        return f"<LeasePool of {len(self.leases)}: {', '.join(map(repr, self.leases))}>"

    def __enter__(self) -> LeasePool:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def pool(gpu: dict[str, Any], size: int, **lease_args: Any) -> LeasePool:
    """``size`` leases of ``gpu`` (each as ``lease`` asks for one, with ``lease_args``), asked for
    at once; if any is not placed, those that were are given back and its ``LeaseWaits`` raised."""
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"pool size {size!r}: give a whole number of leases, 1 or more")
    with ThreadPoolExecutor(max_workers=min(size, 16), thread_name_prefix="gpufrac-pool") as ex:
        futures = [ex.submit(lease, gpu, **lease_args) for _ in range(size)]
    held, failed = [], None
    for f in futures:
        try:
            held.append(f.result())
        except Exception as e:
            failed = failed or e
    if failed is not None:
        for h in held:
            h.release()
        raise failed
    return LeasePool(held)
