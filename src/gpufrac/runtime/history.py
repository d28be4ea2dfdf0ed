"""The last 15 minutes of the fleet, kept in memory for the dashboard's plots (``GET
/api/v1/history``).

A sampler thread of the agent reads, every ``interval`` seconds (5 by default): per GPU the memory
used, the utilization and the memory reserved; per MIG instance holding a workload the memory its
processes use; per placed workload its used and reserved memory, SM use and compute cap, and what
the QoS arbiter gave it against what it is entitled to; per deployment the gateway's rate, latency,
queue and the
replicas. Each value is one column of a ring of ``window / interval`` samples, so memory is bounded:
a track (a GPU, an instance, a workload, a deployment) absent for a whole window is dropped.

Sampling holds the agent's lock only to copy what the scheduler, the store and the last reconcile
pass already know; the device reads (NVML), run directories and ``/proc`` are read outside it, and
the sample is put together by :func:`gpufrac.runtime.fleet_view.fleet_view`, the pure function
behind ``GET /api/v1/gpus``. The view is filtered by the caller as the other views are: a tenant
gets the whole GPUs' series and only its own instances, workloads and deployments.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any, Literal, assert_never

from gpufrac.model.caller import ADMIN, Caller
from gpufrac.model.catalog import GpuModel
from gpufrac.planning.sched_state import Allocation
from gpufrac.runtime.fleet_view import Holder, fleet_view, holder_pids
from gpufrac.runtime.mps import MpsDomain

if TYPE_CHECKING:
    from gpufrac.runtime.agent import Agent, WorkloadState

INTERVAL_SECONDS = 5.0
WINDOW_SECONDS = 900.0

Kind = Literal["gpu", "instance", "workload", "deployment"]
KINDS: tuple[Kind, ...] = ("gpu", "instance", "workload", "deployment")
Value = float | int | None

# what each kind of track records, in this order
METRICS: dict[Kind, tuple[str, ...]] = {
    "gpu": ("memory_used_mib", "utilization_gpu", "reserved_memory_mib"),
    "instance": ("memory_used_mib",),
    "workload": (
        "memory_used_mib",
        "memory_mib",
        "sm_percent",
        "compute_pct",
        "qos_share",
        "qos_gpu_share",
        "qos_entitled",
    ),
    "deployment": (
        "rate",
        "p50_ms",
        "p99_ms",
        "queued",
        "in_flight",
        "replicas_ready",
        "replicas_wanted",
    ),
}


@dataclass(frozen=True, slots=True)
class Reading:
    """One track in one sample: whose it is (None: every caller's, a whole GPU), what it is, and
    its values by metric."""

    kind: Kind
    key: str
    owner: str | None
    meta: dict[str, Any]
    values: dict[str, Value]


@dataclass(slots=True)
class Track:
    kind: Kind
    owner: str | None
    meta: dict[str, Any]
    columns: dict[str, deque[Value]] = field(default_factory=dict)
    last_seen: float = 0.0  # the time of the last sample it was in


# Tracks that are gone (in no sample since) but still have values in the window are kept so the
# plots show recent history, at most this many: with workloads coming and going fast, each new name
# would otherwise hold its track (7 columns of the whole window, about 19 KiB) for a whole window,
# and the agent's memory would grow with the rate of new names (bench/soak.py found it).
MAX_GONE_TRACKS = 64


class Ring:
    """The samples of the last window, column by column (pure: times are given)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.times: deque[float] = deque(maxlen=size)
        self.tracks: dict[tuple[Kind, str], Track] = {}

    def add(self, at: float, readings: Iterable[Reading]) -> None:
        self.times.append(at)
        seen = {(r.kind, r.key): r for r in readings}
        for ident, r in seen.items():
            if ident not in self.tracks:
                pad = len(self.times) - 1
                self.tracks[ident] = Track(
                    r.kind,
                    r.owner,
                    r.meta,
                    {m: deque([None] * pad, maxlen=self.size) for m in METRICS[r.kind]},
                )
            track = self.tracks[ident]
            track.owner, track.meta, track.last_seen = r.owner, r.meta, at
        gone: list[tuple[float, tuple[Kind, str]]] = []
        for ident, track in list(self.tracks.items()):
            got = seen.get(ident)
            for metric, column in track.columns.items():
                column.append(None if got is None else got.values.get(metric))
            if got is None:
                if all(v is None for c in track.columns.values() for v in c):
                    del self.tracks[ident]  # gone for a whole window
                else:
                    gone.append((track.last_seen, ident))
        gone.sort()
        for _, ident in gone[: max(0, len(gone) - MAX_GONE_TRACKS)]:
            del self.tracks[ident]  # the longest gone first

    def view(self, who: Caller, since: float | None = None) -> dict[str, Any]:
        """The samples after ``since`` (all without it), the tracks ``who`` may see."""
        times = list(self.times)
        first = (
            0 if since is None else next((i for i, t in enumerate(times) if t > since), len(times))
        )
        out: dict[str, Any] = {"times": times[first:]}
        for kind in KINDS:
            out[_plural(kind)] = []
        for (kind, key), track in self.tracks.items():
            if track.owner is not None and not who.may_see(track.owner):
                continue
            series = {m: list(islice(c, first, None)) for m, c in track.columns.items()}
            if first and all(v is None for s in series.values() for v in s):
                continue  # nothing new: the page pads what it has
            out[_plural(kind)].append({"key": key, **track.meta, "series": series})
        return out


def _plural(kind: Kind) -> str:
    match kind:
        case "gpu":
            return "gpus"
        case "instance":
            return "instances"
        case "workload":
            return "workloads"
        case "deployment":
            return "deployments"
        case _:
            assert_never(kind)


def geometry(model: GpuModel) -> dict[str, Any]:
    """A GPU model's MIG geometry, as the dashboard draws it to scale."""
    return {
        "memory_slots": model.memory_slots,
        "compute_slices": model.compute_slices,
        "profiles": {
            p.name: {"memory_slots": p.memory_slots, "compute_slices": p.compute_slices}
            for p in model.profiles
        },
    }


def entitled(members: Mapping[str, Any]) -> dict[str, float | None]:
    """Per QoS member, the share of its GPU it is entitled to now: in the highest class with active
    members of its domain, its weight's part of that class (at least its min share); below it, its
    guaranteed min share; None while it asks for no turn (not active)."""
    domains: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for key, m in members.items():
        domains.setdefault(str(m.get("domain")), []).append((key, m))
    out: dict[str, float | None] = {}
    for found in domains.values():
        active = [(k, m) for k, m in found if m.get("active")]
        top = max((int((m.get("qos") or {}).get("rank", 0)) for _, m in active), default=None)
        weights = sum(
            int((m.get("qos") or {}).get("weight", 1))
            for _, m in active
            if int((m.get("qos") or {}).get("rank", 0)) == top
        )
        for key, m in found:
            qos = m.get("qos") or {}
            floor = int(qos.get("min_share_milli", 0)) / 1000
            if not m.get("active"):
                out[key] = None
            elif int(qos.get("rank", 0)) == top and weights:
                out[key] = round(max(floor, int(qos.get("weight", 1)) / weights), 4)
            else:
                out[key] = floor
    return out


@dataclass(frozen=True, slots=True)
class _Copied:
    """What sampling copies under the agent's lock."""

    allocations: dict[str, list[Allocation]]
    models: dict[str, GpuModel]
    placed: Mapping[str, tuple[str, int]]  # workload -> (phase, generation)
    cordons: dict[str, str]
    pins: list[str]
    qos: dict[str, Any]
    more: list[Reading]  # what follows the agent's passes (its deployments)
    mps_domains: dict[str, MpsDomain]  # per GPU UUID, its MPS workloads' domain


Sampler = Callable[[], tuple[list[Reading], dict[str, dict[str, Any]]]]


class History:
    """The ring, and the thread that fills it from ``read`` (one machine's agent: ``AgentSampler``;
    a cluster's control plane: ``cluster.history``), owned by whoever serves the API."""

    def __init__(
        self,
        read: Sampler,
        *,
        interval: float = INTERVAL_SECONDS,
        window: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.read = read
        self.interval = interval
        self.window = window
        self.clock = clock
        self.ring = Ring(max(1, int(window // interval)))
        self.geometry: dict[str, dict[str, Any]] = {}
        self.error: str | None = None  # the last sample's failure, if it failed
        self._mu = threading.Lock()  # the ring's own; never held while waiting for the agent's
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="gpufrac-history", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            try:
                self.sample()
                self.error = None
            except Exception as e:  # a failed sample is a gap in the plots, not a dead sampler
                self.error = f"{type(e).__name__}: {e}"
                with contextlib.suppress(Exception), self._mu:
                    self.ring.add(self.clock(), [])
            if self._stop.wait(self.interval):
                return

    def view(self, who: Caller, since: float | None = None) -> dict[str, Any]:
        with self._mu:
            out = self.ring.view(who, since)
            geometry = dict(self.geometry)
        return {
            "interval_s": self.interval,
            "window_s": self.window,
            "error": self.error,
            **out,
            "mig_geometry": geometry,
        }

    def sample(self) -> None:
        readings, geometry = self.read()
        at = self.clock()
        with self._mu:
            self.ring.add(at, readings)
            self.geometry = geometry


class AgentSampler:
    """One sample of one machine's agent: GPUs from the driver, placements from its scheduler,
    QoS from its arbiter, and ``more`` (read under the agent's lock with the states of the last
    pass: its deployments, from their gateway)."""

    def __init__(
        self,
        agent: Agent,
        states: Callable[[], Mapping[str, WorkloadState]],
        more: Callable[[Mapping[str, WorkloadState]], list[Reading]] = lambda _states: [],
    ) -> None:
        self.agent = agent
        self.states = states
        self.more = more

    def _copy(self) -> _Copied:
        agent = self.agent
        with agent.lock:
            states = self.states()
            sched = agent.scheduler.state.gpus
            allocations = {g.uuid: list(g.allocs.values()) for g in sched}
            placed = {
                a.workload: (st.phase, st.generation) if st else ("starting", 0)
                for allocs in allocations.values()
                for a in allocs
                for st in [states.get(a.workload)]
            }
            return _Copied(
                allocations=allocations,
                models={g.uuid: g.model for g in sched},
                placed=placed,
                cordons=agent.store.cordons(),
                pins=list(agent.store.mig_pins()),
                qos=dict(agent.arbiter.latest),
                more=self.more(states),
                mps_domains=agent.executor.mps_domains(),
            )

    def read(self) -> tuple[list[Reading], dict[str, dict[str, Any]]]:
        copied = self._copy()
        agent = self.agent
        gpus = agent.dev.gpus()  # the driver, outside the agent's lock
        holders: dict[str, Holder] = {}
        for key, (phase, generation) in copied.placed.items():
            tenant, name = key.split("/", 1)
            pids = None
            if phase in ("running", "paused", "starting"):
                run = agent.runs.latest(tenant, name, generation)
                pids = holder_pids(agent.runs, run, gpus, copied.allocations, key)
            share = (copied.qos.get(key) or {}).get("gpu_share")
            holders[key] = Holder(phase, pids, None if share is None else float(share))
        sm_by_pid = {
            g.uuid: agent.health.process_utilization(g.uuid)
            for g in gpus
            if g.health == "ok" and not g.mig_enabled and g.processes
        }
        clients = {g.uuid for g in gpus if any(p.mps == "client" for p in g.processes)}
        mps_servers = {  # the daemons asked outside the agent's lock
            uuid: agent.mps.server_pids(domain)
            for uuid, domain in copied.mps_domains.items()
            if uuid in clients
        }
        fleet = fleet_view(
            gpus,
            copied.allocations,
            holders,
            sm_by_pid,
            cordons=copied.cordons,
            pins=copied.pins,
            node="",
            viewer=ADMIN,
            mps_servers=mps_servers,
        )
        readings = gpu_readings(fleet, copied.qos)
        readings += copied.more
        return readings, {uuid: geometry(m) for uuid, m in copied.models.items()}


def gpu_readings(fleet: list[dict[str, Any]], qos: Mapping[str, Any]) -> list[Reading]:
    out: list[Reading] = []
    fair = entitled(qos)
    workloads: dict[str, Reading] = {}
    for g in fleet:
        uuid = g["uuid"] if g["health"] == "ok" else f"lost-{g['index']}"
        out.append(
            Reading(
                "gpu",
                uuid,
                None,
                {
                    "uuid": g["uuid"],
                    "index": g["index"],
                    "name": g["name"],
                    "memory_total_mib": g["memory_total_mib"],
                    "mig_enabled": g["mig_mode"]["current"] == "enabled",
                },
                {
                    "memory_used_mib": g["memory_used_mib"],
                    "utilization_gpu": g["utilization_gpu"],
                    "reserved_memory_mib": g["reserved_memory_mib"],
                },
            )
        )
        for a in g["allocations"]:
            key = f"{a['tenant']}/{a['name']}"
            if a["mig"] is not None and a["mig"]["gi_id"] is not None:
                gi = a["mig"]["gi_id"]
                inst = next((i for i in g["instances"] if i["gi_id"] == gi), None)
                used = sum(p["used_memory_mib"] or 0 for p in g["processes"] if p["gi_id"] == gi)
                out.append(
                    Reading(
                        "instance",
                        f"{g['uuid']}/{gi}/{key}",  # a new track when another workload moves in
                        a["tenant"],
                        {
                            "gpu": g["uuid"],
                            "gpu_index": g["index"],
                            "gi_id": gi,
                            "profile": a["mig"]["profile"],
                            "start": a["mig"]["start"],
                            "memory_mib": None if inst is None else inst["memory_mib"],
                            "workload": key,
                        },
                        {"memory_used_mib": used},
                    )
                )
            member = qos.get(key) or {}
            values: dict[str, Value] = {
                "memory_used_mib": a["used_memory_mib"],
                "memory_mib": a["memory_mib"],
                "sm_percent": a["sm_percent"],
                "compute_pct": a["compute_pct"],
                "qos_share": member.get("share"),
                "qos_gpu_share": member.get("gpu_share"),
                "qos_entitled": fair.get(key),
            }
            before = workloads.get(key)
            if before is not None:  # a workload on several GPUs: its sums
                values = {
                    m: _plus(before.values.get(m), v) if m.startswith(("memory", "sm")) else v
                    for m, v in values.items()
                }
                gpus_of = [*before.meta["gpus"], g["index"]]
            else:
                gpus_of = [g["index"]]
            workloads[key] = Reading(
                "workload",
                key,
                a["tenant"],
                {
                    "tenant": a["tenant"],
                    "name": a["name"],
                    "gpus": gpus_of,
                    "mode": a["mode"],
                    "mig": a["mig"],
                },
                values,
            )
    return out + list(workloads.values())


def _plus(a: Value, b: Value) -> Value:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _rounded(v: Any) -> Value:
    return round(float(v), 2) if isinstance(v, int | float) and not isinstance(v, bool) else None


def deployment_readings(
    deployments: list[tuple[str, str, int, dict[str, Any], int]],
) -> list[Reading]:
    return [
        Reading(
            "deployment",
            f"{tenant}/{name}",
            tenant,
            {"tenant": tenant, "name": name},
            {
                "rate": _rounded(traffic.get("rate")),
                "p50_ms": _rounded(traffic.get("p50_ms")),
                "p99_ms": _rounded(traffic.get("p99_ms")),
                "queued": traffic.get("queued"),
                "in_flight": traffic.get("in_flight"),
                "replicas_ready": ready,
                "replicas_wanted": wanted,
            },
        )
        for tenant, name, wanted, traffic, ready in deployments
    ]
