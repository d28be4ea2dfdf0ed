"""The control plane as a service: the core (``cluster.core``) with its I/O around it.

``ControlPlane`` owns the core, a store (SQLite in its data directory: every workload as applied,
its placement with the node and epoch, events), one lock and the clock. It keeps what each node
last showed of its workloads (phase, restarts, the environment handed over, QoS), which the views
(``views.workloads``) read. Everything it decides is in the store before a node hears of it.

A restart re-reads the store: workloads that waited wait again; placements are held for their node
and restored when it joins (before anything waiting is tried there), so a node that calls in within
its lease keeps running what it runs, untouched. A node that has not joined a lease after the
restart is held lost: its workloads are placed again elsewhere.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, assert_never

from gpufrac.cluster.core import (
    LEASE_S,
    Answer,
    Assignment,
    ClusterCore,
    Moved,
    NodeEvent,
    Report,
)
from gpufrac.errors import InputError
from gpufrac.model.numbers import digits_note, is_decimal
from gpufrac.model.qos import min_share_of, qos_params
from gpufrac.model.settings import OperatorSettings
from gpufrac.model.workload import WorkloadSpec, spec_from_json, spec_to_json
from gpufrac.planning.sched_decision import (
    Completion,
    Decision,
    Displacement,
    DisplacementListeners,
    Where,
    displacement_of,
)
from gpufrac.planning.sched_state import SchedGpu
from gpufrac.planning.scheduler import workload_key
from gpufrac.planning.views import ApplyResult, NodeInfo
from gpufrac.runtime.executor import record_displaced
from gpufrac.runtime.native_memory import NativeMemory
from gpufrac.runtime.store import AdmissionState, Store, StoredNode

STORE_FILE = "control.db"
CREDENTIALS_FILE = "node-credentials.json"
RELAY_PER_WINDOW, RELAY_WINDOW_S = 600, 60.0  # a node's own events taken, at most, per window
# what the control plane says itself: a node's events of these kinds are not taken
CONTROL_KINDS = frozenset(
    {
        "node_joined", "node_rejoined", "node_lost", "moved", "pending", "lease_expired",
        "gateway_started", "gateway_error", "deployment_applied", "events_dropped",
        "cordoned", "uncordoned", "replica_removed", "autoscaler",
    }
)  # fmt: skip  # each node's own secret (mode 0600)
LEASE_LABEL = "gpufrac.io/lease"  # a workload holding a slice for Ray code (gpufrac.ray)
LEASE_TTL_LABEL = "gpufrac.io/lease-ttl"  # seconds it lives without its holder's keep-alive
ENDED = -1  # the epoch under which a node's view of a job that ended there is kept


MAX_PENDING = 100  # nodes waiting for an admin's approval at once; more joins are refused


_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


_VIEW_COUNTS = ("attempts", "restarts", "evictions")
MAX_VIEW_TEXT = 4096  # a reason is a sentence or a few


def node_view(raw: Mapping[str, Any]) -> dict[str, Any]:
    """What a node shows of one workload, as the control plane keeps it: only the fields it reads,
    each of its type (counts whole numbers from 0 to a million, text printable and bounded, the
    QoS view only where it is the API's shape), the rest dropped. A node's word is not trusted:
    a count of ``"lots"`` made every listing a 500, and escapes reached users' terminals."""
    from pydantic import ValidationError

    from gpufrac.api.schemas import QosJson

    out: dict[str, Any] = {}
    for key in _VIEW_COUNTS:
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1_000_000:
            out[key] = value
    code = raw.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool) and -(2**31) <= code < 2**31:
        out["exit_code"] = code
    for key in ("phase", "reason"):
        text = raw.get(key)
        if isinstance(text, str):
            out[key] = printable(text[:MAX_VIEW_TEXT])
    env = raw.get("env")
    if isinstance(env, dict):
        out["env"] = {
            printable(str(k)[:256]): printable(str(v)[:MAX_VIEW_TEXT])
            for k, v in list(env.items())[:256]
            if isinstance(k, str) and isinstance(v, str)
        }
    qos = raw.get("qos")
    if isinstance(qos, dict):  # else shown as the control plane knows it (static_qos)
        with contextlib.suppress(ValidationError):
            out["qos"] = QosJson.model_validate(qos).model_dump(by_alias=True)
    return out


def printable_tree(value: Any, depth: int = 0) -> Any:
    """A node's JSON value (its view of a GPU) with every text in it, keys too, ``printable``;
    nested at most 16 deep (deeper is dropped: no GPU view is)."""
    if depth > 16:
        return None
    if isinstance(value, str):
        return printable(value[:MAX_VIEW_TEXT])
    if isinstance(value, dict):
        return {printable(str(k)[:256]): printable_tree(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_tree(v, depth + 1) for v in value]
    return value


def printable(text: str) -> str:
    """A node's text as it is stored: control characters (terminal escapes, a carriage return
    that rewrites a line, a newline that fakes one) as ``\\xNN``, so what a node says reaches
    ``events`` and ``describe`` as text, never as a terminal's commands."""
    return _CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


LEASE_TTL_DEFAULT_S = 30.0
LEASE_TTL_MAX_S = 86_400.0


def lease_ttl(labels: Mapping[str, str]) -> float:
    """A lease's time to live in seconds from its label (30 without one): ASCII digits with an
    optional fraction, above 0 and at most a day; anything else (``nan``, ``inf``, ``-1``,
    ``1e3``, a word, another script's digits such as ``١٠``) is an ``InputError``."""
    text = labels.get(LEASE_TTL_LABEL)
    if text is None or text == "":
        return LEASE_TTL_DEFAULT_S
    ttl = float(text) if is_decimal(text) else 0.0  # float() would read '١٠', 'inf' and '1_0'
    if not (0 < ttl <= LEASE_TTL_MAX_S):
        raise InputError(
            f"a lease's time to live must be a number of seconds above 0 and at most "
            f"{LEASE_TTL_MAX_S:g}, not {text!r}{digits_note(text)}",
            field=f"metadata.labels.{LEASE_TTL_LABEL}",
            fix="give seconds, such as '30' (or leave the label out: 30 s)",
        )
    return ttl


class NodeRefused(Exception):
    """A join the control plane does not take (the name is a live node's)."""


class NodeDenied(Exception):
    """A join under a name an admin denied."""


class ControlPlane:
    def __init__(
        self,
        data_dir: Path,
        settings: OperatorSettings | None = None,
        *,
        lease_s: float = LEASE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.data_dir = data_dir
        # the control plane's own: its store holds every workload's environment (secrets), the
        # nodes' credentials, its tokens
        data_dir.mkdir(parents=True, exist_ok=True)
        data_dir.chmod(0o700)
        self.settings = settings or OperatorSettings()
        self.clock = clock
        self.lock = threading.RLock()
        # glibc's arenas: two, trimmed every pass (at most every 30 s), as the agent's: memory a
        # refused manifest or a burst of calls took comes back (runtime.native_memory)
        self.native_memory = NativeMemory()
        self.store = Store(data_dir / STORE_FILE)
        self.core = ClusterCore(self.settings, lease_s=lease_s)
        self.views: dict[str, tuple[int, dict[str, Any]]] = {}  # workload -> (epoch, node's view)
        # workload -> its restarts in runs before the one its node shows (a node counts its own)
        self.carried: dict[str, int] = {}
        # workload -> the times it was moved or fenced (its runs before the one its node shows,
        # and their evictions): never restarts, which count failures only
        self.moves: dict[str, int] = {}
        self._listeners = DisplacementListeners()  # the open ``displacements`` blocks
        # node -> [window start, events taken in it, said that the rest were dropped]
        self.relay_windows: dict[str, list[float | int | bool]] = {}
        self.addresses: dict[str, str] = {}  # node -> its agent's API, where it serves logs
        self.versions: dict[str, str | None] = {}  # node -> its gpufrac's version, as it said
        self.gpu_views: dict[str, list[dict[str, Any]]] = {}  # node -> its GPUs as it shows them
        self.lost_from: dict[str, str] = {}  # a workload waiting since its node was lost -> node
        self.kept_alive: dict[str, float] = {}  # a lease -> when its holder last said it lives
        # node -> when its latest heartbeat was received (written by the node listener before it
        # waits for the lock; a heartbeat heard renews the lease even while its answer waits)
        self.heard_at: dict[str, float] = {}
        self.lost_count = 0  # nodes held lost, and workloads moved, since this start (/metrics)
        self.moved_count = 0
        self.started = clock()
        # placements stored before a restart, per node, until the node joins (or is held lost)
        self.awaiting: dict[str, list[Assignment]] = {}
        # every node as admitted: pending (joined with the cluster token, not approved by an
        # admin: it gets nothing), approved (it takes work, up to its GPU cap), denied
        self.admissions: dict[str, StoredNode] = {n.name: n for n in self.store.node_admissions()}
        self._migrate_credentials()
        # each node's own credential: the cluster token lets a node join; after that it speaks
        # only for itself, with the credential its first join gave it
        self.credentials: dict[str, str] = {
            n.name: n.credential for n in self.admissions.values() if n.credential is not None
        }
        # a pending node's last join (labels, GPUs, address), taken at its approval; and when it
        # last called in (it is pruned after node_prune_after without a call)
        self.joining: dict[str, tuple[dict[str, str], list[SchedGpu], str | None]] = {}
        self.pending_seen: dict[str, float] = {}
        self.core.cordoned = self.store.cordons()  # applied to each GPU as its node joins
        self._restore()

    def close(self) -> None:
        self.store.close()

    # -- nodes -----------------------------------------------------------------------------------

    def admitted_join(
        self,
        name: str,
        presented: str | None,
        labels: Mapping[str, str],
        gpus: list[SchedGpu],
        address: str | None,
        version: str | None = None,
    ) -> str | None:
        """A node's join (with the cluster token): the credential it is given (None: it keeps
        the one it presented). A node presenting the credential of an approved node joins the
        core, with no more GPUs than it was approved for; any other join leaves it (or makes it)
        ``pending``, with a new credential, until an admin approves it: so the cluster token
        alone gets no work, secret or traffic. ``NodeRefused`` while another node holds the
        name's lease (or too many wait), ``NodeDenied`` for a name an admin denied; a join that
        fails (``ValueError``) changes nothing."""
        with self.lock:
            uuids = [g.uuid for g in gpus]
            if len(set(uuids)) != len(uuids):
                raise ValueError(f"node {name}: a GPU is listed twice")  # nothing changed
            had = self.admissions.get(name)
            if had is not None and had.state == "denied":
                raise NodeDenied(
                    f"node {name} was denied by an admin (revoking it lets it ask to join again)"
                )
            kept = presented is not None and self.credential_ok(name, presented)
            if not kept and had is not None and self._holds(name):
                raise NodeRefused(
                    f"node {name} is alive under its own credential; a node that lost it joins "
                    f"again once that lease has run out ({self.core.lease_s:g} s)"
                )
            if had is None and len(self.pending_nodes()) >= MAX_PENDING:
                raise NodeRefused(
                    f"{MAX_PENDING} nodes wait for an admin's approval already: approve or deny "
                    "them first (gpufrac nodes list)"
                )
            credential = None if kept else secrets.token_urlsafe(32)
            approved = kept and had is not None and had.state == "approved"
            state: AdmissionState = "approved" if approved else "pending"
            record = StoredNode(
                name,
                state,
                credential or (had.credential if had is not None else None),
                had.gpu_cap if approved and had is not None else None,
                dict(labels),
                len(gpus),
                address,
                had.since if had is not None and had.state == state else time.time(),
            )
            if approved:
                assert had is not None
                self._join(
                    name, labels, capped(gpus, had.gpu_cap), address, version
                )  # ValueError: none
                if record != had:
                    self.store.put_node_admission(record)
                    self.admissions[name] = record
                return None
            self.joining[name] = (dict(labels), list(gpus), address)
            self.pending_seen[name] = self.clock()
            if record != had:
                said = None
                if had is None or had.state != "pending":
                    said = (
                        "node_pending",
                        f"node {name} asks to join with {len(gpus)} GPU(s), labels "
                        + (", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none")
                        + f": an admin approves it (gpufrac nodes approve {name}) or denies it",
                    )
                self.store.put_node_admission(record, said)
                self.admissions[name] = record
            if credential is not None:
                self.credentials[name] = credential
            return credential

    def bootstrap(self, name: str) -> str:
        """A credential for a node the control plane starts itself (``--local``, a Ray node),
        approved at once: the node presents it at its join. The same one while it stands."""
        with self.lock:
            had = self.admissions.get(name)
            if had is not None and had.state == "approved" and had.credential is not None:
                return had.credential
            credential = secrets.token_urlsafe(32)
            record = StoredNode(name, "approved", credential, None, {}, 0, None, time.time())
            self.store.put_node_admission(
                record, ("node_approved", f"node {name} is started by the control plane itself")
            )
            self.admissions[name] = record
            self.credentials[name] = credential
            return credential

    def pending_nodes(self) -> list[StoredNode]:
        """The nodes that joined and wait for an admin's approval, by name."""
        with self.lock:
            return [n for n in self.admissions.values() if n.state == "pending"]

    def admitted(self) -> list[StoredNode]:
        """Every node the control plane knows of, whatever its state, by name."""
        with self.lock:
            return sorted(self.admissions.values(), key=lambda n: n.name)

    def approve(self, name: str, gpus: int | None = None) -> StoredNode:
        """An admin lets node ``name`` take work, with at most ``gpus`` of the GPUs it declares
        (None: as many as it declared when it asked). A pending node joins at once (so what waits
        for it is placed); an approved one gets its new cap at its next join."""
        with self.lock:
            had = self.admissions.get(name)
            if had is None:
                raise InputError(
                    f"no node {name} has asked to join",
                    field="name",
                    fix="name one of the nodes that wait (gpufrac nodes list)",
                )
            if had.state == "denied":
                raise InputError(
                    f"node {name} was denied",
                    field="name",
                    fix=f"revoke it (gpufrac nodes revoke {name}) so that it may ask again, "
                    "then approve it",
                )
            if gpus is not None and gpus < 0:
                raise InputError(
                    f"{gpus} GPUs", field="gpus", fix="give the most GPUs it may bring (0 or more)"
                )
            cap = had.gpus if gpus is None else gpus
            record = replace(had, state="approved", gpu_cap=cap, since=time.time())
            self.store.put_node_admission(
                record,
                (
                    "node_approved",
                    f"node {name} approved by an admin, with up to {cap} GPU(s) of the "
                    f"{had.gpus} it declared",
                ),
            )
            self.admissions[name] = record
            self.pending_seen.pop(name, None)
            joining = self.joining.pop(name, None)
            if joining is not None and had.state == "pending":
                labels, declared, address = joining
                # a GPU listed twice: nothing joins; its next join is told why
                with contextlib.suppress(ValueError):
                    self._join(name, labels, capped(declared, cap), address)
            return record

    def deny(self, name: str) -> StoredNode:
        """An admin refuses node ``name``: its credential is revoked, its work (if it had any)
        placed elsewhere, and its joins are refused until it is revoked (forgotten)."""
        with self.lock:
            had = self._known(name)
            record = replace(had, state="denied", credential=None, since=time.time())
            self._expel(name, "denied by an admin")
            self.store.put_node_admission(
                record, ("node_denied", f"node {name} denied by an admin")
            )
            self.admissions[name] = record
            return record

    def revoke(
        self, name: str, *, why: str = "revoked by an admin", kind: str = "node_revoked"
    ) -> None:
        """Forget node ``name``: its credential is revoked and its work (if it had any) placed
        elsewhere; it may ask to join again (pending)."""
        with self.lock:
            self._known(name)
            self._expel(name, why)
            self.store.delete_node_admission(name, (kind, f"node {name} {why}"))
            self.admissions.pop(name, None)

    def _known(self, name: str) -> StoredNode:
        had = self.admissions.get(name)
        if had is None:
            raise InputError(
                f"no node {name} is known",
                field="name",
                fix="name one of the nodes gpufrac nodes list shows",
            )
        return had

    def _expel(self, name: str, why: str) -> None:
        """No call of ``name`` is taken any more, and its work goes elsewhere."""
        self.credentials.pop(name, None)
        self.joining.pop(name, None)
        self.pending_seen.pop(name, None)
        self.addresses.pop(name, None)
        node = self.core.nodes.get(name)
        if node is not None and node.state == "alive":  # its work is placed elsewhere now
            self.core.expel(name, f"its node was {why}")
            self.tick()

    def _prune(self, now: float) -> None:
        """Forget the nodes lost (or pending and silent) longer than ``node_prune_after``."""
        after = self.settings.node_prune_after_s
        for name, had in list(self.admissions.items()):
            if had.state == "denied":
                continue  # an admin's refusal stands
            node = self.core.nodes.get(name)
            if node is not None and node.state == "alive":
                continue
            last = max(
                node.renewed if node is not None else self.started,
                self.pending_seen.get(name, self.started),
            )
            if now - last > after:
                self.revoke(
                    name,
                    why=f"pruned: not seen for {after:g} s (node_prune_after)",
                    kind="node_pruned",
                )

    def _migrate_credentials(self) -> None:
        """Nodes joined before node admission (their credentials in ``node-credentials.json``)
        are approved as they stand, once; the file goes."""
        path = self.data_dir / CREDENTIALS_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return
        for name, credential in sorted(raw.items()):
            if str(name) in self.admissions:
                continue
            record = StoredNode(
                str(name), "approved", str(credential), None, {}, 0, None, time.time()
            )
            self.store.put_node_admission(
                record,
                ("node_approved", f"node {name} joined before node admission: approved on upgrade"),
            )
            self.admissions[record.name] = record
        path.unlink()

    def credential_ok(self, name: str, presented: str) -> bool:
        known = self.credentials.get(name)
        return known is not None and hmac.compare_digest(known.encode(), presented.encode())

    def _holds(self, name: str) -> bool:
        """Is the name's lease held (a live node, or one awaited since a restart)?"""
        node = self.core.nodes.get(name)
        if name in self.awaiting and self.clock() - self.started <= self.core.lease_s:
            return True
        seen = self.pending_seen.get(name)  # a pending node that calls in: its name is its own
        if seen is not None and self.clock() - seen <= self.core.lease_s:
            return True
        return (
            node is not None
            and node.state == "alive"
            and self.clock() - node.renewed <= self.core.lease_s
        )

    def _join(
        self,
        name: str,
        labels: Mapping[str, str],
        gpus: list[SchedGpu],
        address: str | None,
        version: str | None = None,
    ) -> None:
        """An admitted node joins the core (with the GPUs it may bring); ``version``: the node's
        gpufrac's, as it said (``describe node`` shows it)."""
        with self.lock:
            before = dict(self.core.assigned)
            known = name in self.core.nodes
            self.core.join(name, labels, gpus, self.clock(), self.awaiting.pop(name, []))
            if address:
                self.addresses[name] = address
            self.versions[name] = version
            self.store.record_event(
                "node_joined" if not known else "node_rejoined",
                name,
                f"{len(gpus)} GPU(s), labels "
                + (", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none"),
            )
            self._persist(before)

    def heard(self, name: str) -> None:
        """Node ``name``'s heartbeat has arrived (its credential checked): noted at once, without
        the lock, so a node is never held lost for heartbeats that came while the control plane
        was busy (``tick`` renews its lease from then)."""
        self.heard_at[name] = self.clock()

    def heartbeat(
        self,
        name: str,
        report: Report,
        views: Mapping[str, Mapping[str, Any]],
        gpus: list[dict[str, Any]] | None = None,
        events: Sequence[NodeEvent] = (),
    ) -> Answer:
        with self.lock:
            had = self.admissions.get(name)
            if had is None or had.state != "approved":  # nothing for it, nor taken from it
                self.pending_seen[name] = self.clock()
                return Answer(name, (), self.core.lease_s, "pending")
            self._take_events(name, events)
            if gpus is not None and name in self.core.nodes:
                joined = self.core.scheduler.state.by_uuid
                # only the GPUs it joined with: a view of others is not taken
                self.gpu_views[name] = [
                    printable_tree(g) for g in gpus if f"{name}/{g.get('uuid')}" in joined
                ]
            before = dict(self.core.assigned)
            ended = dict(self.core.ended)
            answer = self.core.heartbeat(name, report, self.clock())
            for key, shown in views.items():
                view = node_view(shown) if isinstance(shown, Mapping) else {}
                a = self.core.assigned.get(key)
                if a is not None and a.node == name:
                    before_view = self.views.get(key)
                    if (
                        before_view is not None
                        and before_view[0] == a.epoch
                        and int(view.get("attempts") or 0)
                        < int(before_view[1].get("attempts") or 0)
                    ):  # a new run under the same placement: its node fenced it (stopped it
                        # unanswered) and runs it again in place: a restart of what it stopped
                        self._carry(key, fenced=True)
                    self.views[key] = (a.epoch, dict(view))
                elif self.core.ended_on.get(key) == name:  # a job that ended there, as it ended
                    self.views[key] = (ENDED, dict(view))
            for key, how in self.core.ended.items():
                if key not in ended:
                    self.store.record_event(how, key, f"ended on node {name}")
            self._persist(before, ended=ended)
            return answer

    def _carry(self, key: str, *, fenced: bool = False) -> None:
        """``key`` runs anew: the restarts and evictions of the run it had count on. A move (the
        control plane placed it elsewhere, or took it away) counts in its evictions: a move is no
        failure and the workload's process is not replaced where it was. ``fenced``: its node
        stopped it (it went unanswered) and started it again in the same place, under the same
        placement: its process was replaced in place, as after a failure, so it counts in
        RESTARTS (what a user reads to see that the process was started again)."""
        shown = self.views.get(key)
        view = shown[1] if shown is not None and shown[0] != ENDED else {}
        self.carried[key] = self.carried.get(key, 0) + int(view.get("restarts") or 0) + fenced
        self.moves[key] = self.moves.get(key, 0) + int(view.get("evictions") or 0) + (not fenced)

    def counts(self, key: str, node_view: Mapping[str, Any]) -> tuple[int, int]:
        """(restarts, evictions) of ``key``: its node's count of the run it shows, and those of
        the runs before (moved, fenced)."""
        return (
            int(node_view.get("restarts") or 0) + self.carried.get(key, 0),
            int(node_view.get("evictions") or 0) + self.moves.get(key, 0),
        )

    def displacements(self) -> contextlib.AbstractContextManager[list[Displacement]]:
        """The displacements told while the block runs (for the answer of the call that caused
        them); with the lock held."""
        return self._listeners.collecting()

    def _tell(self, more: Sequence[Displacement] = ()) -> None:
        """Tell of each workload displaced (the core's decisions', and ``more``): an event each,
        of its action's kind, and per cause one ``displaced`` event listing them (on its
        deployment too, for a replica), as one machine's agent does."""
        decided = self.core.take_displaced()
        for x in decided:  # taken from its node: it runs anew where it goes (a move, no restart)
            if x.action != "requeued":
                self._carry(x.workload)
        told = [*decided, *more]
        record_displaced(self.store, told, self.core.specs.get)
        self._listeners.heard(told)

    def _take_events(self, name: str, events: Sequence[NodeEvent]) -> None:
        """A known node's own events, into the control plane's: a workload's only where it runs
        (or ran, or was taken from) that node, so no node speaks of another's work; the node's
        own (a GPU's, its fencing) under its name."""
        if name not in self.core.nodes or not events:
            return
        now = self.clock()
        window = self.relay_windows.get(name)
        if window is None or now - window[0] >= RELAY_WINDOW_S:
            window = self.relay_windows[name] = [now, 0, False]
        room = max(0, RELAY_PER_WINDOW - int(window[1]))
        if len(events) > room and not window[2]:
            window[2] = True  # said once a window: nobody floods the store's bounded events
            self.store.record_event(
                "events_dropped",
                name,
                f"node {name} passed on more than {RELAY_PER_WINDOW} events in "
                f"{RELAY_WINDOW_S:g} s: the rest of this window's are dropped",
            )
        window[1] = int(window[1]) + min(room, len(events))
        for e in events[:room]:
            if e.kind in CONTROL_KINDS:  # the control plane's own: no node speaks for it
                continue
            key, kind, message = e.subject, printable(e.kind), printable(e.message)
            a = self.core.assigned.get(key)
            ours = (
                (a is not None and a.node == name)
                or self.core.ended_on.get(key) == name
                or name in self.core.revoked.get(key, {})
            )
            if ours:
                said = f"{message} (node {name})"
                self.store.record_relayed(kind, key, said, name)
            elif "/" not in key:  # a GPU's, or the node's own
                said = message if key == name else f"{printable(key)}: {message}"
                self.store.record_relayed(kind, name, said, name)

    def keep_alive(self, tenant: str, name: str) -> bool:
        """A lease's holder (a Ray driver) says it still uses it (False: no such lease)."""
        with self.lock:
            stored = self.store.workload(tenant, name)
            if stored is None or LEASE_LABEL not in (stored.spec.get("labels") or {}):
                return False
            self.kept_alive[stored.key] = self.clock()
            return True

    def _expire_leases(self, now: float) -> None:
        """Delete the leases whose holder has not said it lives within their time to live (a Ray
        driver that ended without giving them back)."""
        for w in self.store.workloads():
            labels = w.spec.get("labels") or {}
            if LEASE_LABEL not in labels:
                continue
            try:
                ttl = lease_ttl(labels)
            except InputError:  # stored before the label was checked
                ttl = LEASE_TTL_DEFAULT_S
            last = self.kept_alive.setdefault(w.key, now)  # after a restart: from now
            if now - last > ttl:
                self.delete(w.tenant, w.name)
                self.kept_alive.pop(w.key, None)
                self.store.record_event(
                    "lease_expired", w.key, f"its holder did not keep it alive for {ttl:g} s"
                )

    def tick(self) -> list[Moved]:
        """Hold lost the nodes whose lease ended, and place their work again; give back the Ray
        leases nobody keeps alive."""
        with self.lock:
            now = self.clock()
            self.native_memory.upkeep()
            self._prune(now)
            self._expire_leases(now)
            before = dict(self.core.assigned)
            ended = dict(self.core.ended)
            for name, at in list(self.heard_at.items()):
                self.core.heard(name, at)
            moved = self.core.tick(now)
            if self.awaiting and now - self.started > self.core.lease_s:
                for node, held in self.awaiting.items():  # never came back after a restart
                    for a in held:
                        d = self.core.decide(a.spec)
                        to = self.core.assigned[a.workload].node if d.outcome == "placed" else None
                        moved.append(Moved(a.workload, node, to, f"its node {node} did not return"))
                self.awaiting.clear()
            self.lost_count += len({m.lost for m in moved})
            self.moved_count += sum(1 for m in moved if m.to is not None)
            for m in moved:
                self._carry(m.workload)
                if m.to is None:
                    self.lost_from[m.workload] = m.lost
                self.store.record_event("node_lost", m.lost, f"{m.workload}: {m.reason}")
                if m.to is not None:
                    self.store.record_event("moved", m.workload, f"moved to node {m.to}")
                else:
                    self.store.record_event("pending", m.workload, m.reason)
            self._tell()  # placed again elsewhere, a lost node's work may have evicted some
            # a request whose moves began (or were given up) waits on: its decision says why
            planned = tuple(d.workload for d in self.core.planned)
            self._persist(before, ended=ended, also=planned)
            return moved

    def nodes(self) -> list[NodeInfo]:
        with self.lock:
            now = self.clock()
            joined = [
                NodeInfo(
                    name=n.name,
                    state=n.state,
                    labels=dict(n.labels),
                    gpus=len(n.gpus),
                    address=self.addresses.get(n.name),
                    last_heartbeat_s=now - n.renewed,
                    version=self.versions.get(n.name),
                    gpu_cap=self.admissions[n.name].gpu_cap,
                )
                for n in sorted(self.core.nodes.values(), key=lambda n: n.name)
                # a pruned (or revoked) node is not shown, nor one an admin took back
                if n.name in self.admissions and self.admissions[n.name].state == "approved"
            ]
            # those that wait for an admin's word, and those denied, as they asked
            waiting = [
                NodeInfo(
                    name=a.name,
                    state=a.state,
                    labels=dict(a.labels),
                    gpus=a.gpus,
                    address=a.address,
                    last_heartbeat_s=None
                    if a.name not in self.pending_seen
                    else now - self.pending_seen[a.name],
                    gpu_cap=a.gpu_cap,
                )
                for a in self.admissions.values()
                if a.state != "approved"
            ]
            shown = {n.name for n in joined}
            return sorted(
                [*joined, *(w for w in waiting if w.name not in shown)], key=lambda n: n.name
            )

    def status(self, key: str) -> tuple[str, str, dict[str, Any]]:
        """A workload's phase and reason as the cluster sees it, and its node's last view of it
        (empty where its node has not shown this placement yet)."""
        with self.lock:
            a = self.core.assigned.get(key)
            shown = self.views.get(key)
            ended = self.core.ended.get(key)
            epoch = a.epoch if a is not None else ENDED if ended is not None else None
            node_view = shown[1] if shown is not None and shown[0] == epoch else {}
            if ended is not None:
                return ended, node_view.get("reason") or "ended", node_view
            if node_view:
                return node_view.get("phase", "starting"), node_view.get("reason", ""), node_view
            if a is not None:
                return "starting", f"placed on node {a.node}; it has not shown it yet", node_view
            waiting = [
                n for n, held in self.awaiting.items() if any(h.workload == key for h in held)
            ]
            reason = (
                f"its node {waiting[0]} has not joined since the control plane restarted"
                if waiting
                else self.core.decision(key).reason
            )
            if key in self.lost_from:
                reason = f"its node {self.lost_from[key]} was lost; {reason}"
            return "pending", reason, node_view

    # -- GPUs ------------------------------------------------------------------------------------

    def cordon(self, uuid: str, reason: str = "cordoned by hand") -> None:
        """No new work on GPU ``uuid`` (``NODE/UUID``); ``KeyError`` if no node has it."""
        with self.lock:
            self.core.cordon(uuid, reason)
            self.store.cordon(uuid, reason)

    def uncordon(self, uuid: str) -> list[Decision]:
        with self.lock:
            before = dict(self.core.assigned)
            placed = self.core.uncordon(uuid)
            self.store.uncordon(uuid)
            self._persist(before)
            return placed

    def drain(self, uuid: str, reason: str = "drained by hand") -> list[Decision]:
        """Cordon GPU ``uuid`` and place its workloads again elsewhere (or they wait)."""
        with self.lock:
            before = dict(self.core.assigned)
            moved = self.core.drain(uuid, reason)
            self.store.cordon(uuid, reason)
            told = []
            for d in moved:
                self._carry(d.workload)
                to = self.core.assigned.get(d.workload)
                why = f"moved off GPU {uuid} ({reason})" + (
                    f" to node {to.node}" if to is not None else f"; {d.reason}"
                )
                told.append(displacement_of(d.workload, d, d.workload in before, why, None))
            self._tell(told)
            self._persist(before)
            return moved

    # -- desired state ---------------------------------------------------------------------------

    def check_workload(self, spec: WorkloadSpec) -> None:
        """A lease's time to live, and the operator's bounds as one machine's agent checks them at
        apply (its mounts as written: the paths are the nodes', each of which checks where they
        lead again at every start, and its image, which only a node can tell it has)."""
        lease_ttl(spec.labels)
        self.settings.check_priority(spec.tenant, spec.priority)
        self.settings.check_user(spec.tenant, spec.user)
        self.settings.check_mounts(spec.mounts)

    def apply_workload(self, spec: WorkloadSpec) -> tuple[ApplyResult, Decision]:
        key = workload_key(spec)
        self.check_workload(spec)
        with self.lock:
            raw = spec_to_json(spec)
            stored = self.store.workload(spec.tenant, spec.name)
            if stored is not None and stored.spec == raw:
                return "unchanged", self.core.decision(key)
            refusal = self.core.scheduler.refusal(spec)
            # no node yet (or not all back after a restart): what fits nowhere now may fit a
            # node yet to join, so it waits for one, and is placed once one that fits joins
            if refusal is not None and self.core.nodes and not self.awaiting:
                return "refused", Decision(key, "refused", refusal)
            waits = None
            if refusal is not None:
                waits = (
                    "no node that could hold it has joined yet"
                    if not self.awaiting
                    else "the nodes the control plane had before its restart have not all "
                    "joined again"
                ) + f" ({refusal}): it is placed once one joins"
            before = dict(self.core.assigned)
            self.store.put_workload(spec.tenant, spec.name, raw)
            decision = self.core.decide(spec, waits=waits)
            self.views.pop(key, None)
            self.carried.pop(key, None)
            self.moves.pop(key, None)
            self._tell()
            self._persist(before, also=(key,))
            return ("replaced" if stored is not None else "created"), decision

    def apply_new_workloads(
        self, specs: Sequence[WorkloadSpec]
    ) -> list[tuple[ApplyResult, Decision]]:
        """New workloads of one manifest, placed together (``ClusterCore.decide_all``); each
        answered as ``apply_workload`` answers. Where one is stored already, or nodes are still
        to join (a workload then waits for them), they are applied one by one."""
        for spec in specs:
            self.check_workload(spec)
        with self.lock:
            stored = any(self.store.workload(s.tenant, s.name) is not None for s in specs)
            if stored or self.awaiting or not self.core.nodes:
                return [self.apply_workload(s) for s in specs]
            out: dict[str, tuple[ApplyResult, Decision]] = {}
            fresh = []
            for spec in specs:
                refusal = self.core.scheduler.refusal(spec)
                if refusal is not None:
                    out[workload_key(spec)] = (
                        "refused",
                        Decision(workload_key(spec), "refused", refusal),
                    )
                else:
                    fresh.append(spec)
            before = dict(self.core.assigned)
            for spec in fresh:
                self.store.put_workload(spec.tenant, spec.name, spec_to_json(spec))
            for d in self.core.decide_all(fresh):
                out[d.workload] = ("created", d)
            keys = tuple(workload_key(s) for s in fresh)
            for key in keys:
                self.views.pop(key, None)
                self.carried.pop(key, None)
                self.moves.pop(key, None)
            self._tell()
            self._persist(before, also=keys)
            return [out[workload_key(s)] for s in specs]

    def delete(self, tenant: str, name: str) -> bool:
        with self.lock:
            if not self.store.delete_workload(tenant, name):
                return False
            before = dict(self.core.assigned)
            self.core.delete(tenant, name)
            self.views.pop(f"{tenant}/{name}", None)
            self.carried.pop(f"{tenant}/{name}", None)
            self.moves.pop(f"{tenant}/{name}", None)
            self._tell()
            self._persist(before)
            return True

    # -- the store -------------------------------------------------------------------------------

    def _persist(
        self,
        before: Mapping[str, Assignment],
        *,
        ended: Mapping[str, str] | None = None,
        also: tuple[str, ...] = (),
    ) -> None:
        """Write what changed since ``before`` (and, with ``ended``, the jobs that ended since
        then): placements (with node and epoch), or why a workload waits, or that it ended. Only
        what changed: a heartbeat costs the same however many jobs ended before."""
        after = self.core.assigned
        changed = {k for k in before.keys() | after.keys() if before.get(k) is not after.get(k)}
        for key in [k for k in self.lost_from if k in after or k not in self.core.specs]:
            del self.lost_from[key]  # placed again, or gone
        if ended is not None:
            changed |= {k for k, how in self.core.ended.items() if ended.get(k) != how}
        for key in changed | set(also):
            tenant, name = key.split("/", 1)
            stored = self.store.workload(tenant, name)
            if stored is None:
                continue
            a = after.get(key)
            if a is not None:
                self.store.set_placement(
                    tenant, name, stored.generation, a.decision, node=a.node, epoch=a.epoch
                )
            elif key in self.core.ended:
                ran = before.get(key)  # where it ran: kept, as one machine's agent keeps it
                where = (
                    None
                    if ran is None
                    else Where(ran.decision.mode, ran.decision.gpus, ran.decision.mig)
                )
                done = Completion(phase=self.core.ended[key], where=where)
                node = self.core.ended_on.get(key)
                self.store.set_placement(tenant, name, stored.generation, done, node=node)
            else:
                self.store.set_placement(tenant, name, stored.generation, self.core.decision(key))

    def _restore(self) -> None:
        for w in self.store.workloads():
            spec = spec_from_json(w.spec)
            placed = self.store.placement(w.tenant, w.name)
            if placed is not None and placed.generation == w.generation:
                match placed.record:
                    case Completion() as done:
                        self.core.specs[w.key] = spec
                        self.core.ended[w.key] = done.phase
                        if placed.node is not None:
                            self.core.ended_on[w.key] = placed.node
                        continue
                    case Decision(outcome="placed") as decision if (
                        placed.node is not None and placed.epoch is not None
                    ):
                        held = Assignment(spec, decision, placed.node, placed.epoch)
                        self.awaiting.setdefault(held.node, []).append(held)
                        self.core.hold_epoch(held.epoch)  # never given again
                        continue
                    case Decision():
                        pass  # it waited, or its node was not known: it waits again
                    case _:
                        assert_never(placed.record)
            self.core.restore(spec, None, "", 0)  # it waits, as before


def capped(gpus: list[SchedGpu], cap: int | None) -> list[SchedGpu]:
    """The GPUs a node declares, no more than ``cap`` of them (the first by UUID: the same at
    every join)."""
    ordered = sorted(gpus, key=lambda g: g.uuid)
    return ordered if cap is None else ordered[:cap]


def static_qos(spec: WorkloadSpec, settings: OperatorSettings) -> dict[str, Any]:
    """A workload's QoS as the control plane knows it before its node has shown it."""
    return {
        "class": qos_params(spec).rank,
        "priority": spec.priority,
        "qos": spec.qos,
        "weight": spec.weight,
        "min_share": min_share_of(spec, settings.job_min_share_milli) / 1000,
        "mode": None,
        "paused": None,
        "paused_by": None,
        "paused_s": None,
        "pauses": None,
        "paused_total_s": None,
        "longest_pause_1h_s": None,
        "run_s": None,
        "busy_s": None,
        "active": None,
        "turns": None,
        "arbiter_share": None,
        "measured_share": None,
        "measured_by": None,
    }
