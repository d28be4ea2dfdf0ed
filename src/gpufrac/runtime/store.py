"""The node agent's state in SQLite: desired workloads, placements, events. All-or-nothing writes.

Desired state is written first; the agent reconciles towards it. Every write happens inside one
transaction (``BEGIN IMMEDIATE`` .. ``COMMIT``), so a crash at any point leaves either the old state
or the new one, never half. The schema carries a version; ``MIGRATIONS`` lists, per version, the
statements that bring the previous version to it, applied in one transaction on open. A database
written by a newer gpufrac is refused rather than guessed at.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gpufrac.errors import GpufracError
from gpufrac.model.event import Event
from gpufrac.planning.sched_decision import (
    Completion,
    Decision,
    StoredPlacement,
    stored_from_json,
    stored_to_json,
)

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE workloads (
            tenant TEXT NOT NULL,
            name TEXT NOT NULL,
            spec TEXT NOT NULL,           -- the WorkloadSpec as JSON
            generation INTEGER NOT NULL,  -- bumped on every change of spec
            created REAL NOT NULL,
            updated REAL NOT NULL,
            PRIMARY KEY (tenant, name)
        )""",
        """CREATE TABLE placements (
            tenant TEXT NOT NULL,
            name TEXT NOT NULL,
            generation INTEGER NOT NULL,  -- the spec generation this placement is for
            decision TEXT NOT NULL,       -- the scheduler's decision as JSON
            updated REAL NOT NULL,
            PRIMARY KEY (tenant, name),
            FOREIGN KEY (tenant, name) REFERENCES workloads (tenant, name) ON DELETE CASCADE
        )""",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            subject TEXT NOT NULL,        -- tenant/name of a workload, or a GPU UUID
            message TEXT NOT NULL
        )""",
        "CREATE INDEX events_subject ON events (subject, id)",
    ),
    2: (
        """CREATE TABLE cordons (
            gpu TEXT PRIMARY KEY,         -- GPU UUID
            reason TEXT NOT NULL,
            at REAL NOT NULL
        )""",
    ),
    3: (
        """CREATE TABLE deployments (
            tenant TEXT NOT NULL,
            name TEXT NOT NULL,
            spec TEXT NOT NULL,           -- the DeploymentSpec as JSON
            replicas INTEGER,             -- the replica count set by scale or the autoscaler
            created REAL NOT NULL,
            updated REAL NOT NULL,
            PRIMARY KEY (tenant, name)
        )""",
    ),
    4: (
        """CREATE TABLE mig_pins (
            gpu TEXT PRIMARY KEY,         -- GPU UUID whose MIG layout an operator set
            at REAL NOT NULL
        )""",
    ),
    5: (
        """CREATE TABLE heartbeat (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            at REAL NOT NULL              -- the agent's last write that went through
        )""",
    ),
    6: (
        """CREATE TABLE tenant_uids (
            tenant TEXT PRIMARY KEY,
            uid INTEGER NOT NULL UNIQUE   -- the unprivileged uid the tenant's workloads run as
        )""",
    ),
    7: (
        # the workload that caused the event (one that took the subject's place), named in the
        # message; and the other workloads the message names (JSON list): each is shown per
        # viewer when the event is read (another tenant's is not named)
        "ALTER TABLE events ADD COLUMN cause TEXT",
        "ALTER TABLE events ADD COLUMN mentions TEXT",
    ),
    8: (
        # a cluster's nodes as the control plane admits them: each node's own credential, whether
        # an admin approved it (pending, approved, denied), and what it may bring
        """CREATE TABLE node_admissions (
            name TEXT PRIMARY KEY,
            state TEXT NOT NULL,          -- pending | approved | denied
            credential TEXT,              -- the node's own secret (NULL: denied)
            gpu_cap INTEGER,              -- the most GPUs it may bring (NULL: not approved yet)
            labels TEXT NOT NULL,         -- as it declared them at its last join (JSON)
            gpus INTEGER NOT NULL,        -- how many GPUs it declared at its last join
            address TEXT,                 -- its agent's API, as it declared it
            since REAL NOT NULL           -- when it came to this state (wall clock)
        )""",
    ),
    9: (
        # the node that passed the event on (a cluster's control plane; NULL: its own): a view
        # shows at most a share of any one node's, so no node buries the others' events
        "ALTER TABLE events ADD COLUMN relayed_by TEXT",
    ),
}
SCHEMA_VERSION = max(MIGRATIONS)
EVENTS_KEPT = 50_000  # the newest events kept; older ones are pruned as new ones come
PRUNE_EVERY = 1_000  # events written between two prunes


EventListener = Callable[[Event, Mapping[str, object]], None]


class StoreError(GpufracError):
    """The database cannot be used (written by a newer gpufrac, or damaged)."""


@dataclass(frozen=True, slots=True)
class StoredWorkload:
    tenant: str
    name: str
    spec: dict[str, Any]
    generation: int
    created: float
    updated: float

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.name}"


AdmissionState = Literal["pending", "approved", "denied"]


@dataclass(frozen=True, slots=True)
class StoredNode:
    """A cluster node as its control plane admits it (``node_admissions``)."""

    name: str
    state: AdmissionState
    credential: str | None
    gpu_cap: int | None
    labels: dict[str, str]
    gpus: int
    address: str | None
    since: float


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # specs hold their environment (secrets, say): the owner's alone, as SQLite makes its
        # -wal and -shm files with the database's own mode
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        os.chmod(path, 0o600)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        # told of each event once its transaction is committed (the agent's decision log)
        self.listeners: list[EventListener] = []
        self._untold: list[tuple[Event, Mapping[str, object]]] = []
        self._since_prune = 0  # events written since the last prune
        self._migrate()

    def close(self) -> None:
        self.db.close()

    # -- schema ---------------------------------------------------------------------------------

    def schema_version(self) -> int:
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        with self.transaction():
            current = self.schema_version()
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {current}; this gpufrac knows up to "
                    f"{SCHEMA_VERSION}: upgrade gpufrac, or point --data-dir elsewhere"
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version]:
                    self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {version}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One all-or-nothing unit of work: committed if the block ends, rolled back if it
        raises."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self._untold.clear()
            self.db.execute("ROLLBACK")
            raise
        try:
            self.db.execute("COMMIT")
        except BaseException:  # a full disk refuses the commit: nothing of it is told, or kept
            self._untold.clear()
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")
            raise
        if self._since_prune >= PRUNE_EVERY:  # every event counts, however it was written
            self.prune_events()
        if self._untold:
            told, self._untold = self._untold, []
            for event, details in told:
                for listener in self.listeners:
                    listener(event, details)

    # -- desired state --------------------------------------------------------------------------

    def put_workload(self, tenant: str, name: str, spec: dict[str, Any]) -> tuple[int, bool]:
        """Store the desired spec; returns (generation, changed). An unchanged spec changes
        nothing."""
        text = json.dumps(spec, sort_keys=True)
        now = time.time()
        with self.transaction() as db:
            row = db.execute(
                "SELECT spec, generation FROM workloads WHERE tenant = ? AND name = ?",
                (tenant, name),
            ).fetchone()
            if row is not None and row[0] == text:
                return int(row[1]), False
            generation = 1 if row is None else int(row[1]) + 1
            if row is None:
                db.execute(
                    "INSERT INTO workloads VALUES (?, ?, ?, ?, ?, ?)",
                    (tenant, name, text, 1, now, now),
                )
            else:
                db.execute(
                    "UPDATE workloads SET spec = ?, generation = ?, updated = ? WHERE "
                    "tenant = ? AND name = ?",
                    (text, generation, now, tenant, name),
                )
            self._event(
                db,
                "applied" if row is None else "changed",
                f"{tenant}/{name}",
                f"generation {generation}",
            )
            return generation, True

    def update_spec_live(self, tenant: str, name: str, spec: dict[str, Any], message: str) -> bool:
        """Store a changed spec that applies without a restart: the generation (and so the running
        attempt) stays. False if there is no such workload."""
        text = json.dumps(spec, sort_keys=True)
        with self.transaction() as db:
            found = db.execute(
                "UPDATE workloads SET spec = ?, updated = ? WHERE tenant = ? AND name = ?",
                (text, time.time(), tenant, name),
            ).rowcount
            if found:
                self._event(db, "qos_changed", f"{tenant}/{name}", message)
            return bool(found)

    def delete_workload(self, tenant: str, name: str) -> bool:
        with self.transaction() as db:
            gone = db.execute(
                "DELETE FROM workloads WHERE tenant = ? AND name = ?", (tenant, name)
            ).rowcount
            if gone:
                self._event(db, "deleted", f"{tenant}/{name}", "deleted")
            return bool(gone)

    def workload(self, tenant: str, name: str) -> StoredWorkload | None:
        row = self.db.execute(
            "SELECT tenant, name, spec, generation, created, updated FROM workloads WHERE "
            "tenant = ? AND name = ?",
            (tenant, name),
        ).fetchone()
        return None if row is None else _workload(row)

    def workloads(self, tenant: str | None = None) -> list[StoredWorkload]:
        sql = "SELECT tenant, name, spec, generation, created, updated FROM workloads"
        args: tuple[str, ...] = ()
        if tenant is not None:
            sql += " WHERE tenant = ?"
            args = (tenant,)
        return [
            _workload(r) for r in self.db.execute(sql + " ORDER BY created, tenant, name", args)
        ]

    def tenants(self) -> list[str]:
        """Every tenant with a workload or a deployment stored, sorted."""
        rows = self.db.execute(
            "SELECT tenant FROM workloads UNION SELECT tenant FROM deployments ORDER BY tenant"
        )
        return [str(r[0]) for r in rows]

    def workload_count(self, tenant: str) -> int:
        """How many workloads ``tenant`` has stored (no spec read)."""
        row = self.db.execute("SELECT COUNT(*) FROM workloads WHERE tenant = ?", (tenant,))
        return int(row.fetchone()[0])

    def has_workload(self, tenant: str, name: str) -> bool:
        found = self.db.execute(
            "SELECT 1 FROM workloads WHERE tenant = ? AND name = ?", (tenant, name)
        ).fetchone()
        return found is not None

    # -- placements -----------------------------------------------------------------------------

    def set_placement(
        self,
        tenant: str,
        name: str,
        generation: int,
        record: Decision | Completion,
        *,
        node: str | None = None,
        epoch: int | None = None,
    ) -> None:
        """Keep the decision for (or how the finished run of) a workload's spec ``generation``;
        ``node`` and ``epoch``: a cluster's control plane's, the node and lease it runs under."""
        decision = stored_to_json(StoredPlacement(generation, record, node, epoch))
        with self.transaction() as db:
            db.execute(
                "INSERT INTO placements VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, name) "
                "DO UPDATE SET "
                "generation = excluded.generation, decision = excluded.decision, updated "
                "= excluded.updated",
                (tenant, name, generation, json.dumps(decision, sort_keys=True), time.time()),
            )

    def placement(self, tenant: str, name: str) -> StoredPlacement | None:
        """The placement kept for a workload, read back as its typed record."""
        row = self.db.execute(
            "SELECT generation, decision FROM placements WHERE tenant = ? AND name = ?",
            (tenant, name),
        ).fetchone()
        return None if row is None else stored_from_json(int(row[0]), json.loads(row[1]))

    def clear_placement(self, tenant: str, name: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM placements WHERE tenant = ? AND name = ?", (tenant, name))

    # -- cordoned GPUs ---------------------------------------------------------------------------

    def cordon(self, gpu: str, reason: str) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO cordons VALUES (?, ?, ?) ON CONFLICT (gpu) DO UPDATE SET "
                "reason = excluded.reason",
                (gpu, reason, time.time()),
            )
            self._event(db, "cordoned", gpu, reason)

    def uncordon(self, gpu: str) -> bool:
        with self.transaction() as db:
            gone = db.execute("DELETE FROM cordons WHERE gpu = ?", (gpu,)).rowcount
            if gone:
                self._event(db, "uncordoned", gpu, "schedulable again")
            return bool(gone)

    # -- deployments ----------------------------------------------------------------------------

    def put_deployment(
        self, tenant: str, name: str, spec: dict[str, Any], *, reset_replicas: bool = False
    ) -> bool:
        """Store a deployment's spec; False if it was already stored exactly so. ``reset_replicas``
        forgets a count set by scale (a new fixed ``replicas`` in the spec wins)."""
        text = json.dumps(spec, sort_keys=True)
        now = time.time()
        with self.transaction() as db:
            row = db.execute(
                "SELECT spec FROM deployments WHERE tenant = ? AND name = ?", (tenant, name)
            ).fetchone()
            if row is not None and row[0] == text:
                return False
            if row is None:
                db.execute(
                    "INSERT INTO deployments VALUES (?, ?, ?, NULL, ?, ?)",
                    (tenant, name, text, now, now),
                )
            else:
                db.execute(
                    "UPDATE deployments SET spec = ?, updated = ?,"
                    " replicas = CASE WHEN ? THEN NULL ELSE replicas END"
                    " WHERE tenant = ? AND name = ?",
                    (text, now, reset_replicas, tenant, name),
                )
            self._event(db, "deployment_applied", f"{tenant}/{name}", "spec stored")
            return True

    def deployments(self) -> list[tuple[str, str, dict[str, Any], int | None]]:
        """(tenant, name, spec, replica count set by scale or the autoscaler) for each
        deployment."""
        rows = self.db.execute(
            "SELECT tenant, name, spec, replicas FROM deployments ORDER BY tenant, name"
        )
        return [(r[0], r[1], json.loads(r[2]), r[3]) for r in rows]

    def deployment(self, tenant: str, name: str) -> dict[str, Any] | None:
        """One deployment's spec as stored, or None."""
        row = self.db.execute(
            "SELECT spec FROM deployments WHERE tenant = ? AND name = ?", (tenant, name)
        ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def deployment_count(self, tenant: str) -> int:
        row = self.db.execute("SELECT COUNT(*) FROM deployments WHERE tenant = ?", (tenant,))
        return int(row.fetchone()[0])

    def set_deployment_replicas(self, tenant: str, name: str, replicas: int, why: str) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE deployments SET replicas = ?, updated = ? WHERE tenant = ? AND name = ?",
                (replicas, time.time(), tenant, name),
            )
            self._event(
                db,
                "scaled",
                f"{tenant}/{name}",
                f"{replicas} replica(s): {why}",
                {"deployment": f"{tenant}/{name}", "replicas": replicas},
            )

    def delete_deployment(self, tenant: str, name: str) -> bool:
        with self.transaction() as db:
            found = db.execute(
                "DELETE FROM deployments WHERE tenant = ? AND name = ?", (tenant, name)
            ).rowcount
            if found:
                self._event(db, "deployment_deleted", f"{tenant}/{name}", "deleted")
            return bool(found)

    def cordons(self) -> dict[str, str]:
        return {r[0]: r[1] for r in self.db.execute("SELECT gpu, reason FROM cordons")}

    # -- a cluster's nodes, as the control plane admits them --------------------------------------

    def node_admissions(self) -> list[StoredNode]:
        rows = self.db.execute(
            "SELECT name, state, credential, gpu_cap, labels, gpus, address, since "
            "FROM node_admissions ORDER BY name"
        )
        return [
            StoredNode(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7]) for r in rows
        ]

    def put_node_admission(self, node: StoredNode, event: tuple[str, str] | None = None) -> None:
        """Store ``node`` (one row; others untouched), with ``event`` (kind, message) about it in
        the same transaction: told only once committed."""
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO node_admissions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    node.name,
                    node.state,
                    node.credential,
                    node.gpu_cap,
                    json.dumps(node.labels, sort_keys=True),
                    node.gpus,
                    node.address,
                    node.since,
                ),
            )
            if event is not None:
                self._event(db, event[0], node.name, event[1])

    def delete_node_admission(self, name: str, event: tuple[str, str]) -> bool:
        with self.transaction() as db:
            gone = db.execute("DELETE FROM node_admissions WHERE name = ?", (name,)).rowcount
            if gone:
                self._event(db, event[0], name, event[1])
            return bool(gone)

    # -- MIG layouts pinned by an operator -------------------------------------------------------

    def pin_mig(self, gpu: str) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO mig_pins VALUES (?, ?) ON CONFLICT (gpu) DO UPDATE SET at = "
                "excluded.at",
                (gpu, time.time()),
            )

    def unpin_mig(self, gpu: str) -> bool:
        with self.transaction() as db:
            gone = db.execute("DELETE FROM mig_pins WHERE gpu = ?", (gpu,)).rowcount
            if gone:
                self._event(db, "mig_released", gpu, "the agent may re-cut its MIG layout again")
            return bool(gone)

    def mig_pins(self) -> frozenset[str]:
        return frozenset(r[0] for r in self.db.execute("SELECT gpu FROM mig_pins"))

    def tenant_uid(self, tenant: str, first: int, last: int) -> int:
        """The tenant's own uid: given once, from ``first`` to ``last``, and kept."""
        with self.transaction() as db:
            row = db.execute("SELECT uid FROM tenant_uids WHERE tenant = ?", (tenant,)).fetchone()
            if row is not None:
                return int(row[0])
            used = {int(r[0]) for r in db.execute("SELECT uid FROM tenant_uids")}
            uid = next((u for u in range(first, last + 1) if u not in used), None)
            if uid is None:
                raise StoreError(f"no uid left in {first}..{last} for tenant {tenant!r}")
            db.execute("INSERT INTO tenant_uids (tenant, uid) VALUES (?, ?)", (tenant, uid))
            return uid

    def heartbeat(self) -> None:
        """A small write: raises when the store cannot be written (disk full, I/O errors)."""
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO heartbeat (id, at) VALUES (1, ?)", (time.time(),))

    # -- events ---------------------------------------------------------------------------------

    def record_relayed(self, kind: str, subject: str, message: str, node: str) -> None:
        """Store an event a cluster's node passed on, with the node (``events``'
        ``per_relayer``: no one node's events bury the others'); it counts toward the prune as
        every event does."""
        with self.transaction() as db:
            self._event(db, kind, subject, message)
            db.execute("UPDATE events SET relayed_by = ? WHERE id = last_insert_rowid()", (node,))

    def record_event(
        self,
        kind: str,
        subject: str,
        message: str,
        details: Mapping[str, object] | None = None,
        *,
        cause: str | None = None,
        mentions: tuple[str, ...] = (),
    ) -> None:
        """Store an event; ``details`` (where a workload runs, say) go to the listeners only.
        ``cause`` and ``mentions``: the workloads the message names besides its subject (the
        workload that caused it; others), kept so that each reader is shown only the names it may
        see."""
        with self.transaction() as db:
            self._event(db, kind, subject, message, details, cause=cause, mentions=mentions)

    def prune_events(self, keep: int | None = None) -> int:
        """Forget all but the newest ``keep`` events (``EVENTS_KEPT``); returns how many went."""
        keep = EVENTS_KEPT if keep is None else keep
        self._since_prune = 0
        with self.transaction() as db:
            return int(
                db.execute(
                    "DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?", (keep,)
                ).rowcount
            )

    def _event(
        self,
        db: sqlite3.Connection,
        kind: str,
        subject: str,
        message: str,
        details: Mapping[str, object] | None = None,
        *,
        cause: str | None = None,
        mentions: tuple[str, ...] = (),
    ) -> None:
        at = time.time()
        self._since_prune += 1
        row = db.execute(
            "INSERT INTO events (at, kind, subject, message, cause, mentions) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (at, kind, subject, message, cause, json.dumps(list(mentions)) if mentions else None),
        )
        if self.listeners:
            event = Event(int(row.lastrowid or 0), at, kind, subject, message, cause, mentions)
            self._untold.append((event, details or {}))

    def events(
        self,
        subject: str | None = None,
        *,
        limit: int = 100,
        tenant: str | None = None,
        after: int | None = None,
        per_relayer: int | None = None,
    ) -> list[Event]:
        """The newest ``limit`` events (of one subject, or of one tenant's workloads), oldest first;
        with ``after``, the oldest ``limit`` of those whose id is above it (to follow new ones).
        With ``per_relayer``, at most that many of those any one node passed on (the newest):
        one node's flood does not bury the rest."""
        sql = "SELECT id, at, kind, subject, message, cause, mentions FROM events WHERE 1"
        if per_relayer is not None:
            sql = (
                "SELECT id, at, kind, subject, message, cause, mentions FROM (SELECT *, "
                "ROW_NUMBER() OVER (PARTITION BY relayed_by ORDER BY id "
                f"{'ASC' if after is not None else 'DESC'}) AS nth FROM events WHERE 1"
            )
        args: tuple[Any, ...] = ()
        if subject is not None:
            sql += " AND subject = ?"
            args = (subject,)
        elif tenant is not None:  # tenant names are DNS labels: no LIKE wildcard in them
            sql += " AND subject LIKE ?"
            args = (f"{tenant}/%",)
        if after is not None:
            sql += " AND id > ?"
            args = (*args, after)
        if per_relayer is not None:
            sql += ") WHERE relayed_by IS NULL OR nth <= ?"
            args = (*args, per_relayer)
        if after is not None:
            rows = self.db.execute(sql + " ORDER BY id LIMIT ?", (*args, limit)).fetchall()
        else:
            rows = self.db.execute(sql + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
            rows.reverse()
        return [
            Event(
                int(r[0]),
                float(r[1]),
                r[2],
                r[3],
                r[4],
                r[5],
                tuple(str(k) for k in json.loads(r[6])) if r[6] else (),
            )
            for r in rows
        ]


def _workload(row: tuple[Any, ...]) -> StoredWorkload:
    return StoredWorkload(
        row[0], row[1], json.loads(row[2]), int(row[3]), float(row[4]), float(row[5])
    )
