"""The arbiter process: one per node agent, carrying out ``TurnPolicy`` over a local socket,
cgroup freezing and signals.

``python -m gpufrac.runtime.arbiter_server --dir DIR [--admin-fd N] [--quantum-ms Q]`` listens on
``DIR/arbiter.sock`` (a Unix stream socket; see ``socket_path`` for long paths) and keeps one byte
per member in ``DIR/arbiter.flags``, which SDK clients map read-only: 1 means "yield at your next
yield point". So a trainer checks for contention with a memory read, and talks to the arbiter only
to take and give back turns.

Messages are lines. On the public socket, a client: ``H {json}`` (hello) answered ``K {slot}``:
the client is the member whose cgroup or process group its process is in (its pid from the kernel,
``SO_PEERCRED``; the agent registered each member with the process group it started and its
cgroup), with the
class, weight and min share the agent gave that member; what the hello claims is ignored, and a
process in no member's group is refused (``E``); ``A`` (acquire) answered ``G`` when the turn is
granted; ``R [gpu_seconds]`` (release, no answer). Only the agent, on its own connection (one end of
a socket pair handed over as ``--admin-fd``), may also send ``S {json}`` (set a member: key, domain,
qos, pgid, cgroup), ``D key`` (remove), ``T`` (stats), ``Q`` (quit), each answered ``K ...``: a
workload cannot pause another. A malformed line is answered ``E {error}`` and changes nothing.

It runs in its own process, not a thread of the agent, so no other Python thread's GIL time delays a
grant. When the agent goes away, even by ``kill -9``, its end of the pair closes; the arbiter then
resumes every member it paused and exits. A new arbiter resumes each member when it is
registered, so a crash of the arbiter itself leaves nothing paused either.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import mmap
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufrac.model.qos import QosParams
from gpufrac.runtime.arbiter import (
    PREEMPT_MODES,
    Action,
    AskYield,
    ClearYield,
    Grant,
    Member,
    Pause,
    Resume,
    TurnPolicy,
)
from gpufrac.runtime.cgroups import WorkloadCgroup

SOCKET = "arbiter.sock"
FLAGS = "arbiter.flags"
SLOTS = 4096
REAP_SECONDS = 0.25
MAX_LINE = 64 * 1024  # the longest message line; a client sending more is cut off
MAX_CONNS = 1024  # SDK clients at once, all workloads together (fewer if descriptors are fewer)
MAX_CONNS_PER_MEMBER = 64  # of one workload (its cgroup or group): it cannot take them all
_UNIX_PATH_MAX = 100


def socket_path(directory: Path) -> tuple[str, int | None]:
    """An address for ``directory/arbiter.sock`` that fits a Unix socket's 108 bytes: the path
    itself, or ``/proc/self/fd/N/arbiter.sock`` through an open descriptor of the directory
    (returned too)."""
    full = str(directory / SOCKET)
    if len(full) <= _UNIX_PATH_MAX:
        return full, None
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{SOCKET}", fd


class _Conn:
    def __init__(
        self,
        sock: socket.socket,
        cid: int,
        *,
        admin: bool = False,
        pid: int | None = None,
        group: int | None = None,
    ) -> None:
        self.sock, self.cid, self.admin = sock, cid, admin
        self.pid = pid  # the peer's process, as the kernel reports it (SO_PEERCRED)
        self.group = group  # its process group when it connected (a workload's)
        self.owner: str | None = None  # the member whose process it is, as found when it connected
        self.buf = b""
        self.member: str | None = None
        self.refused: str | None = None  # why its hello was refused: no turn on it until one holds


def _peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process at the other end of a Unix socket, from the kernel."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, _uid, _gid = struct.unpack("3i", creds)
    return pid if pid > 0 else None


@dataclass(frozen=True, slots=True)
class PauseTarget:
    """How one member's processes are paused: its cgroup frozen where it has one (every process
    of the workload, also one that left its process group), else its process group stopped
    (SIGSTOP; SIGCONT to resume)."""

    pgid: int
    cgroup: WorkloadCgroup | None = None

    def pause(self) -> bool:
        """True if there was something to pause."""
        if self.cgroup is not None and self.cgroup.exists():
            return self.cgroup.freeze()
        return _signal(self.pgid, signal.SIGSTOP)

    def resume(self) -> bool:
        if self.cgroup is not None and self.cgroup.exists():
            return self.cgroup.thaw()
        return _signal(self.pgid, signal.SIGCONT)

    def alive(self) -> bool:
        if self.cgroup is not None and self.cgroup.exists():
            return bool(self.cgroup.pids())
        return _group_alive(self.pgid)

    def holds(self, pid: int) -> bool:
        """Whether process ``pid`` is one of the member's."""
        if self.cgroup is not None and self.cgroup.owns(pid):
            return True
        try:
            return os.getpgid(pid) == self.pgid
        except ProcessLookupError:
            return False


class ArbiterServer:
    def __init__(
        self,
        directory: Path,
        *,
        quantum: float,
        grace: float,
        window: float,
        preempt: str = "overlap",
        admin_fd: int | None = None,
        trace: Path | None = None,
    ) -> None:
        self.dir = directory
        self.policy = TurnPolicy(quantum=quantum, grace=grace, window=window, preempt=preempt)
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, _Conn] = {}
        self.next_cid = 1
        self.slots: dict[str, int] = {}
        self.targets: dict[str, PauseTarget] = {}  # how each member with processes is paused
        self.trace = open(trace, "a") if trace else None  # noqa: SIM115 - for the process's life
        self.running = True
        self.epoch = f"{os.getpid()}-{time.monotonic_ns()}"
        self._listen_again: float | None = None  # out of descriptors: accept again from then
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.max_conns = max(16, min(MAX_CONNS, soft - 64))  # descriptors left for its own use
        self._next_reap = 0.0
        directory.mkdir(parents=True, exist_ok=True)
        flags = directory / FLAGS
        fresh = directory / f".{FLAGS}.{os.getpid()}"
        with open(fresh, "wb") as f:
            f.write(b"\0" * SLOTS)
        os.chmod(fresh, 0o644)  # clients map it read-only
        os.replace(fresh, flags)  # clients of an older arbiter keep their own mapping: no SIGBUS
        self._flags_file = open(flags, "r+b")  # noqa: SIM115
        self.flags = mmap.mmap(self._flags_file.fileno(), SLOTS)
        address, dir_fd = socket_path(directory)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(address)
        if dir_fd is not None:
            os.close(dir_fd)
        # anyone may connect: who a client is comes from the kernel (SO_PEERCRED), never its word
        os.chmod(directory / SOCKET, 0o666)
        os.chmod(directory, 0o755)
        self._inode = os.stat(directory / SOCKET).st_ino
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.admin: _Conn | None = None
        if admin_fd is not None:
            sock = socket.socket(fileno=admin_fd)
            sock.setblocking(False)
            self.admin = _Conn(sock, 0, admin=True)
            self.sel.register(sock, selectors.EVENT_READ, self.admin)
        self._wake_r, self._wake_w = socket.socketpair()
        for end in (self._wake_r, self._wake_w):
            end.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        signal.set_wakeup_fd(self._wake_w.fileno())  # a signal ends select() at once
        signal.signal(signal.SIGTERM, lambda *_: self._stop())
        signal.signal(signal.SIGINT, lambda *_: self._stop())

    def serve(self) -> None:
        try:
            while self.running:
                now = time.monotonic()
                if now >= self._next_reap:
                    self._reap(now)
                if self._listen_again is not None and now >= self._listen_again:
                    self._listen_again = None
                    self.sel.register(self.listener, selectors.EVENT_READ, "listen")
                deadline = self.policy.next_deadline(now)
                if self._listen_again is not None:
                    deadline = min(deadline or self._listen_again, self._listen_again)
                if any(m.transparent for m in self.policy.members.values()):
                    deadline = min(deadline or self._next_reap, self._next_reap)
                timeout = None if deadline is None else max(0.0, deadline - now)
                for key, _ in self.sel.select(timeout):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        self._read(key.data)
                self._apply(self.policy.tick(time.monotonic()))
        finally:
            self.shutdown()

    def _reap(self, now: float) -> None:
        """Forget transparent members whose process group is gone (exited, or exiting when its
        socket closed), so no one waits for a process that will never give the GPU back."""
        self._next_reap = now + REAP_SECONDS
        for m in list(self.policy.members.values()):
            target = self.targets.get(m.key)
            if m.transparent and target is not None and not target.alive():
                self._apply(self.policy.resume_gone(m.key, now))

    def _stop(self) -> None:
        self.running = False

    def shutdown(self) -> None:
        """Resume everything paused and stop listening (also on the way out of a crash)."""
        for m in self.policy.members.values():
            target = self.targets.get(m.key)
            if m.paused and target is not None:
                target.resume()
        with contextlib.suppress(OSError):
            if os.stat(self.dir / SOCKET).st_ino == self._inode:  # not a newer arbiter's socket
                (self.dir / SOCKET).unlink()
        self.listener.close()

    # -- connections ----------------------------------------------------------------------------

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError as e:  # nothing to accept after all, or out of descriptors
            if e.errno in (errno.EMFILE, errno.ENFILE):  # not at once again: no busy loop
                self.sel.unregister(self.listener)
                self._listen_again = time.monotonic() + 0.5
            return
        pid = _peer_pid(sock)
        try:
            group = os.getpgid(pid) if pid is not None else None
        except ProcessLookupError:
            group = None
        # whose it is, from the kernel's word (its cgroup, else its process group): a process
        # no workload the agent started holds is not kept (it could hold descriptors forever)
        owner = self._owner_of(pid)
        same = sum(1 for c in self.conns.values() if c.owner == owner)
        why = (
            "unknown peer: no workload the agent started runs in this process's cgroup or group"
            if owner is None
            else "too many connections"
            if len(self.conns) >= self.max_conns or same >= MAX_CONNS_PER_MEMBER
            else None
        )
        if why is not None:
            # one workload cannot use up the arbiter's descriptors, even from processes that left
            # its process group (setsid: its cgroup still holds them): refused, its SDK runs as
            # without an arbiter and asks again a second later
            with contextlib.suppress(OSError):
                sock.sendall(b"E " + json.dumps({"error": why}).encode() + b"\n")
            sock.close()
            return
        sock.setblocking(False)
        conn = _Conn(sock, self.next_cid, pid=pid, group=group)
        conn.owner = owner
        self.next_cid += 1
        self.conns[conn.cid] = conn
        self.sel.register(sock, selectors.EVENT_READ, conn)

    def _close(self, conn: _Conn) -> None:
        self.sel.unregister(conn.sock)
        conn.sock.close()
        if conn.admin:
            self.running = False  # the agent is gone: resume everything and stop
            return
        self.conns.pop(conn.cid, None)
        self._apply(self.policy.disconnect(conn.cid, time.monotonic()))
        m = self.policy.members.get(conn.member or "")
        target = self.targets.get(m.key) if m is not None else None
        if m is not None and target is not None and not m.clients and not target.alive():
            self._apply(self.policy.remove_member(m.key, time.monotonic()))  # its process is gone

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.buf += data
        if len(conn.buf) > MAX_LINE and b"\n" not in conn.buf:  # no message is this long
            self._send(conn, "E " + json.dumps({"error": f"a line over {MAX_LINE} bytes"}))
            self._close(conn)
            return
        while b"\n" in conn.buf:
            line, conn.buf = conn.buf.split(b"\n", 1)
            try:
                self._handle(conn, line.decode())
            except Exception as e:
                self._send(conn, "E " + json.dumps({"error": f"{type(e).__name__}: {e}"}))

    def _send(self, conn: _Conn, text: str) -> None:
        with contextlib.suppress(OSError):  # its reader will see the close
            conn.sock.sendall(text.encode() + b"\n")

    def _handle(self, conn: _Conn, line: str) -> None:
        op, _, rest = line.partition(" ")
        now = time.monotonic()
        if op in ("A", "R") and conn.refused is not None:
            raise ValueError(f"this connection's hello was refused ({conn.refused}): no turn on it")
        if op == "A":
            self._apply(self.policy.acquire(conn.cid, now))
        elif op == "R":
            gpu = float(rest) if rest.strip() else None
            self._apply(self.policy.release(conn.cid, now, gpu))
        elif op == "H":
            try:
                _mapping(rest)  # what the client says of itself is not believed: the kernel is
                m = self._member_of_peer(conn)
            except ValueError as e:
                conn.refused = str(e)
                raise
            conn.refused = None
            self._apply(self.policy.connect(conn.cid, m.key, m.domain, m.qos, now))
            conn.member = key = m.key
            self._send(conn, "K " + json.dumps({"slot": self._slot(key), "flags": FLAGS}))
        elif not conn.admin:
            raise ValueError(f"{op!r} is not for workloads: send H, A or R")
        elif op == "S":
            raw = _mapping(rest)
            pgid = raw.get("pgid")
            if pgid is not None and (not isinstance(pgid, int) or pgid <= 1):
                raise ValueError(f"pgid {pgid!r} is not a process group")
            if pgid == os.getpgrp():  # pausing it would stop the arbiter (and its agent) too
                raise ValueError(f"pgid {pgid} is the arbiter's own process group")
            key = str(raw["key"])
            cgroup = (
                WorkloadCgroup.from_json(raw["cgroup"])
                if isinstance(raw.get("cgroup"), dict)
                else None
            )
            if cgroup is not None and cgroup.owns(os.getpid()):
                raise ValueError("that cgroup holds the arbiter itself")
            old = self.targets.pop(key, None)
            if pgid is not None:
                self.targets[key] = PauseTarget(pgid, cgroup)
            if old is not None and old != self.targets.get(key):
                old.resume()  # no longer this member's: nothing of it stays paused
            active = raw.get("active", True) is not False
            before = self.policy.members.get(key)
            if self.trace is not None and (before is None or before.active != active):
                self._trace_line({"action": "active" if active else "idle", "member": key})
            self._apply(
                self.policy.set_member(
                    key,
                    str(raw["domain"]),
                    QosParams.from_json(_mapping(raw.get("qos") or {})),
                    pgid,
                    now,
                    active=active,
                )
            )
            self._send(conn, "K {}")
        elif op == "D":
            self._apply(self.policy.remove_member(rest.strip(), now))
            self._send(conn, "K {}")
        elif op == "T":
            since = _mapping(rest).get("pauses_after", 0) if rest.strip() else 0
            self._send(conn, "K " + json.dumps(self.stats(now, int(since or 0))))
        elif op == "Q":
            self._send(conn, "K {}")
            self.running = False
        else:
            raise ValueError(f"unknown message {op!r}")

    def _owner_of(self, pid: int | None) -> str | None:
        """The member whose cgroup or process group holds process ``pid`` (None: no member's)."""
        if pid is None:
            return None
        return next(
            (key for key, target in self.targets.items() if target.holds(pid)),
            None,
        )

    def _member_of_peer(self, conn: _Conn) -> Member:
        """The member whose cgroup or process group the peer is in: only the agent registers
        members, with what it started; an unknown peer is refused."""
        pid = conn.pid
        found = next(
            (
                m
                for m in self.policy.members.values()
                if pid is not None and m.key in self.targets and self.targets[m.key].holds(pid)
            ),
            None,
        )
        if found is None:
            raise ValueError(
                "unknown peer: no workload the agent started runs in this process's group"
            )
        return found

    # -- actions --------------------------------------------------------------------------------

    def _slot(self, key: str) -> int:
        if key not in self.slots:
            used = set(self.slots.values())
            self.slots[key] = next(i for i in range(SLOTS) if i not in used)
        return self.slots[key]

    def _apply(self, actions: list[Action]) -> None:
        gone: list[str] = []
        for a in actions:
            if isinstance(a, Grant):
                conn = self.conns.get(a.client)
                if conn is not None:
                    if conn.member in self.slots:
                        self.flags[self.slots[conn.member]] = 0
                    self._send(conn, "G")
            elif isinstance(a, AskYield):
                self.flags[self._slot(a.member)] = 1
            elif isinstance(a, ClearYield):
                self.flags[self._slot(a.member)] = 0
            elif isinstance(a, Pause | Resume):
                target = self.targets.get(a.member)
                done = target is not None and (
                    target.pause() if isinstance(a, Pause) else target.resume()
                )
                if not done and a.member in self.policy.members:
                    gone.append(a.member)  # its processes are gone: so is the member
            if self.trace is not None:
                self._trace(a)
        for key in [k for k in self.slots if k not in self.policy.members]:
            self.flags[self.slots.pop(key)] = 0
        for key in [k for k, m in self.policy.members.items() if m.pgid is None]:
            self.targets.pop(key, None)  # no longer paused by signals or freezing
        for key in [k for k in self.targets if k not in self.policy.members]:
            del self.targets[key]
        for key in gone:
            target = self.targets.get(key)
            if key in self.policy.members and (target is None or not target.alive()):
                self._apply(self.policy.resume_gone(key, time.monotonic()))

    def _trace(self, a: Action) -> None:
        assert self.trace is not None
        who = a.member if not isinstance(a, Grant) else self.policy.client_member.get(a.client)
        if who is None:
            return
        m = self.policy.members.get(who)
        wanting = [
            {"key": x.key, "rank": x.qos.rank, "active": x.active}
            for x in self.policy.members.values()
            if m is not None and x.domain == m.domain and x.wants and x.key != who
        ]
        self._trace_line(
            {
                "action": type(a).__name__.lower(),
                "member": who,
                "rank": m.qos.rank if m else None,
                "by": m.paused_by if m is not None and isinstance(a, Pause) else None,
                "wanting": wanting,
            }
        )

    def _trace_line(self, entry: dict[str, Any]) -> None:
        assert self.trace is not None
        self.trace.write(json.dumps({"t": time.monotonic(), **entry}) + "\n")
        self.trace.flush()

    def stats(self, now: float, pauses_after: int = 0) -> dict[str, Any]:
        """Every member's state and what it was given; the pauses that ended after id
        ``pauses_after``; ``epoch`` names this arbiter process (pause ids start again with a new
        one); monotonic times (``CLOCK_MONOTONIC``, the same for every process of the machine)."""
        policy = self.policy
        return {
            "epoch": self.epoch,
            "now": now,
            "quantum_s": policy.quantum,
            "window_s": policy.window,
            "pauses": [p.to_json() for p in policy.pauses_since(pauses_after)],
            "members": {
                m.key: {
                    "domain": m.domain,
                    "qos": m.qos.to_json(),
                    "mode": "transparent" if m.transparent else "cooperative",
                    "clients": len(m.clients),
                    "paused": m.paused,
                    "paused_s": round(m.paused_total(now), 3),
                    "paused_by": m.paused_by if m.paused else None,
                    "pause_id": m.pause_id,
                    "paused_since": m.paused_since,
                    "pauses": m.pauses,
                    "active": m.active,
                    "holding": policy.domains[m.domain].holder == m.key,
                    "beside": m.key in policy.domains[m.domain].beside,
                    "turns": m.turns,
                    "held_s": round(m.held_s, 6),
                    "busy_s": round(policy.busy_total(m.domain, now), 6),
                    "gpu_s": round(m.gpu_s, 6),
                    "share": round(policy.share(m.key, now), 4),
                    "gpu_share": policy.gpu_share(m.key, now),
                }
                for m in policy.members.values()
            },
        }


def _mapping(value: object) -> dict[str, Any]:
    raw = json.loads(value) if isinstance(value, str) else value
    if not isinstance(raw, dict):
        raise ValueError("expected a JSON object")
    return raw


def _signal(pgid: int, sig: int) -> bool:
    if pgid <= 1:
        return False
    try:
        os.killpg(pgid, sig)
    except OSError:
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """Does the process group still hold a live process? Its leader as a zombie (exited, not yet
    reaped) counts as gone; a group whose leader was reaped but whose children run on is alive."""
    try:
        state = Path(f"/proc/{pgid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return _signal(pgid, 0)
    return state not in ("Z", "X")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpufrac.runtime.arbiter_server")
    p.add_argument("--dir", required=True, type=Path)
    p.add_argument("--admin-fd", type=int, help="the agent's end of a socket pair")
    p.add_argument("--quantum-ms", type=float, default=10.0)
    p.add_argument("--grace-ms", type=float, default=2.0)
    p.add_argument("--window-s", type=float, default=2.0)
    p.add_argument("--preempt", choices=PREEMPT_MODES, default="overlap")
    p.add_argument("--trace", type=Path)
    args = p.parse_args(argv)
    server = ArbiterServer(
        args.dir,
        quantum=args.quantum_ms / 1000,
        grace=args.grace_ms / 1000,
        window=args.window_s,
        preempt=args.preempt,
        admin_fd=args.admin_fd,
        trace=args.trace,
    )
    print("ready", flush=True)
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
