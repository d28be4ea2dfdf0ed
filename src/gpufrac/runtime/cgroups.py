"""A workload's cgroup: one concept that owns it, from where each function lives to its removal.

Each function is chosen on its own (``choose_layout``, pure; ``detect`` reads the machine):

* ``freeze`` and ``kill``: cgroup v2 where a v2 hierarchy is mounted (``cgroup.freeze`` and
  ``cgroup.kill`` are core files of every non-root v2 cgroup), else the v1 ``freezer`` hierarchy
  (kill is then: freeze, SIGKILL every member, thaw, so none forks away meanwhile);
* ``memory``, ``pids`` and ``cpu``: v2 only where the v2 root lists the controller in
  ``cgroup.controllers``, else that controller's v1 hierarchy (``/sys/fs/cgroup/<controller>``).

On v2 a controller's files exist in a child cgroup only where its parent enables the controller in
``cgroup.subtree_control``: ``enable_controllers`` does so for the workloads' parent (the process
runner calls it once, before any workload's cgroup is made) and reports what it could not enable.

A hierarchy is used only where the agent may write in it (it makes a directory there). A
workload's cgroup is made beside the agent's own cgroup in each hierarchy it uses (``<mount><the
agent's cgroup>/gpufrac-<id>``), so whatever bounds the agent also bounds its workloads. Where no
hierarchy can freeze, there is no cgroup at all and the workload runs in its process group only
(``Layout.usable`` is False): a process that leaves the group is then neither paused by QoS nor
counted, and host limits are not applied (the agent says so once when it starts).

What a workload's cgroup is (its directories) is written in its run directory by the shim
(``cgroup.json``), so a restarted agent finds it again without working it out anew.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, assert_never, get_args

Function = Literal["freeze", "kill", "memory", "pids", "cpu"]
FUNCTIONS: tuple[Function, ...] = get_args(Function)
V1_CONTROLLER: dict[Function, str] = {
    "freeze": "freezer",
    "kill": "freezer",
    "memory": "memory",
    "pids": "pids",
    "cpu": "cpu",
}
CPU_PERIOD_US = 100_000


@dataclass(frozen=True, slots=True)
class Mount:
    """A cgroup hierarchy as ``/proc/self/mountinfo`` shows it: v2, or v1 with its controllers."""

    version: Literal[1, 2]
    path: Path
    controllers: frozenset[str]  # v1: the mount's options; v2: the root's cgroup.controllers


@dataclass(frozen=True, slots=True)
class Place:
    """Where one function lives: a hierarchy's mount and the agent's own cgroup in it."""

    version: Literal[1, 2]
    mount: Path
    own: str  # the agent's cgroup in this hierarchy, "/" at the root

    def parent(self) -> Path:
        return self.mount / self.own.strip("/")

    def to_json(self) -> dict[str, object]:
        return {"version": self.version, "mount": str(self.mount), "own": self.own}

    @staticmethod
    def from_json(raw: Mapping[str, object]) -> Place:
        version = raw.get("version")
        assert version in (1, 2), f"a cgroup version is 1 or 2, not {version!r}"
        return Place(version, Path(str(raw["mount"])), str(raw.get("own") or "/"))


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each function of a workload's cgroup lives; a function missing is not offered."""

    places: Mapping[Function, Place]

    @property
    def usable(self) -> bool:
        """Workloads get cgroups: something can freeze and kill them."""
        return "freeze" in self.places and "kill" in self.places

    def describe(self) -> str:
        """One line: each function and where it lives (``freeze: v2, memory: v1, cpu: none``)."""
        return ", ".join(
            f"{f}: v{self.places[f].version}" if f in self.places else f"{f}: none"
            for f in FUNCTIONS
        )

    def to_json(self) -> dict[str, object]:
        return {f: p.to_json() for f, p in self.places.items()}

    @staticmethod
    def from_json(raw: Mapping[str, object]) -> Layout:
        places: dict[Function, Place] = {}
        for f in FUNCTIONS:
            value = raw.get(f)
            if isinstance(value, Mapping):
                places[f] = Place.from_json(value)
        return Layout(places)


def choose_layout(
    mounts: Iterable[Mount], own: Mapping[str, str], writable: Mapping[Path, bool]
) -> Layout:
    """Where each function lives (pure). ``own``: the agent's cgroup per hierarchy, keyed by the
    v1 controller name or ``""`` for v2 (``/proc/self/cgroup``); ``writable``: whether the agent
    may make a cgroup under its own in each mount (absent: not)."""
    v2 = next((m for m in mounts if m.version == 2), None)
    v1 = {c: m for m in mounts if m.version == 1 for c in m.controllers}
    places: dict[Function, Place] = {}
    for f in FUNCTIONS:
        core = f in ("freeze", "kill")
        if v2 is not None and (core or f in v2.controllers):
            place = Place(2, v2.path, own.get("", "/"))
            if writable.get(place.parent(), False):
                places[f] = place
                continue
        mount = v1.get(V1_CONTROLLER[f])
        if mount is not None:
            place = Place(1, mount.path, own.get(V1_CONTROLLER[f], "/"))
            if writable.get(place.parent(), False):
                places[f] = place
    return Layout(places)


def read_mounts(mountinfo: str) -> list[Mount]:
    """The cgroup hierarchies in ``/proc/self/mountinfo``'s text (v2 controllers left empty)."""
    found: list[Mount] = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2":
            found.append(Mount(2, Path(fields[4]), frozenset()))
        elif tail[0] == "cgroup":
            opts = set(tail[2].split(",")) | set(fields[5].split(",") if len(fields) > 5 else ())
            found.append(Mount(1, Path(fields[4]), frozenset(opts)))
    return found


def read_own(proc_cgroup: str) -> dict[str, str]:
    """The agent's cgroup per hierarchy from ``/proc/self/cgroup``: v1 by each controller of the
    line, v2 (``0::``) under ``""``."""
    own: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and not parts[1]:
            own[""] = parts[2]
        else:
            for c in parts[1].split(","):
                own[c] = parts[2]
    return own


def detect(proc: Path = Path("/proc/self")) -> Layout:
    """This machine's layout, for the calling process (``proc``: its ``/proc`` entry)."""
    try:
        mounts = read_mounts((proc / "mountinfo").read_text())
        own = read_own((proc / "cgroup").read_text())
    except OSError:
        return Layout({})
    with_controllers: list[Mount] = []
    for m in mounts:
        if m.version == 2:
            try:
                listed = (m.path / "cgroup.controllers").read_text().split()
            except OSError:
                listed = []
            m = Mount(2, m.path, frozenset(listed))
        with_controllers.append(m)
    parents = {Place(m.version, m.path, _own_in(m, own)).parent() for m in with_controllers}
    return choose_layout(with_controllers, own, {p: _can_make_cgroup(p) for p in parents})


Controller = Literal["memory", "pids", "cpu"]  # the functions a v2 controller offers
CONTROLLERS: tuple[Controller, ...] = get_args(Controller)
LIMIT_OF: dict[Controller, str] = {"memory": "host_memory", "pids": "pids", "cpu": "cpus"}


def enable_controllers(layout: Layout) -> list[str]:
    """On cgroup v2, a child cgroup has a controller's files (``memory.max``, ...) only where its
    parent lists the controller in ``cgroup.subtree_control``: for each v2 parent the layout puts
    ``memory``, ``pids`` or ``cpu`` in (it does so only where the v2 root offers the controller),
    the missing ones are enabled there (``+memory +pids +cpu``), before any workload's cgroup is
    made. Returns what could not be enabled, as sentences (nothing raises): the limits of that
    controller are then not applied, and each workload's log says so when one asks for them."""
    wanted: dict[Path, list[Controller]] = {}
    for f in CONTROLLERS:
        place = layout.places.get(f)
        if place is not None and place.version == 2:
            wanted.setdefault(place.parent(), []).append(f)
    problems: list[str] = []
    for parent, controllers in wanted.items():
        control = parent / "cgroup.subtree_control"
        try:
            enabled = set(control.read_text().split())
        except OSError:
            enabled = set()
        missing = [c for c in controllers if c not in enabled]
        if not missing:
            continue
        try:
            control.write_text(" ".join(f"+{c}" for c in missing))
            continue
        except OSError:
            pass  # each on its own: one refused (not offered to the parent) must not stop another
        for c in missing:
            try:
                control.write_text(f"+{c}")
            except OSError as e:
                hint = (
                    " (the cgroup holds processes, the agent's own: run the agent in a cgroup of "
                    "its own, below one it may write, such as a systemd unit with Delegate=yes)"
                    if e.errno == errno.EBUSY
                    else ""
                )
                problems.append(
                    f"cannot enable the cgroup v2 {c} controller for workloads in {control}: "
                    f"{e.strerror or e}{hint}; their {LIMIT_OF[c]} limits are not applied"
                )
    return problems


def _own_in(m: Mount, own: Mapping[str, str]) -> str:
    if m.version == 2:
        return own.get("", "/")
    return next((own[c] for c in sorted(m.controllers) if c in own), "/")


def _can_make_cgroup(parent: Path) -> bool:
    probe = parent / f"gpufrac-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


@dataclass(frozen=True, slots=True)
class HostLimits:
    """Host resources a workload may use: memory in bytes, CPUs in milli-CPUs, processes."""

    memory_bytes: int | None = None
    milli_cpus: int | None = None
    pids: int | None = None

    def to_json(self) -> dict[str, object]:
        return {"memory_bytes": self.memory_bytes, "milli_cpus": self.milli_cpus, "pids": self.pids}

    @staticmethod
    def from_json(raw: Mapping[str, object] | None) -> HostLimits:
        raw = raw or {}

        def num(key: str) -> int | None:
            value = raw.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return HostLimits(num("memory_bytes"), num("milli_cpus"), num("pids"))


@dataclass(frozen=True, slots=True)
class WorkloadCgroup:
    """One workload's cgroup: its directory per function (one per hierarchy it spans)."""

    dirs: Mapping[Function, Path]
    versions: Mapping[Function, Literal[1, 2]]

    @staticmethod
    def for_run(layout: Layout, name: str) -> WorkloadCgroup:
        """The cgroup named ``name`` (``gpufrac-<id>``) in ``layout``'s hierarchies."""
        assert "/" not in name and name not in ("", ".", ".."), f"bad cgroup name {name!r}"
        return WorkloadCgroup(
            {f: p.parent() / name for f, p in layout.places.items()},
            {f: p.version for f, p in layout.places.items()},
        )

    def _distinct(self) -> list[Path]:
        return sorted(set(self.dirs.values()))

    def to_json(self) -> dict[str, object]:
        return {
            "dirs": {f: str(d) for f, d in self.dirs.items()},
            "versions": dict(self.versions),
        }

    @staticmethod
    def from_json(raw: Mapping[str, object]) -> WorkloadCgroup | None:
        dirs, versions = raw.get("dirs"), raw.get("versions")
        if not isinstance(dirs, Mapping) or not isinstance(versions, Mapping):
            return None
        out_dirs: dict[Function, Path] = {}
        out_versions: dict[Function, Literal[1, 2]] = {}
        for f in FUNCTIONS:
            d, v = dirs.get(f), versions.get(f)
            if isinstance(d, str) and v in (1, 2):
                out_dirs[f] = Path(d)
                out_versions[f] = 2 if v == 2 else 1
        return WorkloadCgroup(out_dirs, out_versions)

    # -- making it ------------------------------------------------------------------------------

    def create(self, limits: HostLimits) -> list[str]:
        """Make the directories and write the limits; what could not be applied, as sentences
        (a limit asked for whose controller is not offered here, say)."""
        for d in self._distinct():
            d.mkdir(exist_ok=True)
        missing: list[str] = []
        if limits.memory_bytes is not None:
            if self._write_limit("memory", limits.memory_bytes):
                self._v1_memsw(limits.memory_bytes)
            else:
                missing.append("host_memory (no writable memory controller)")
        if limits.pids is not None and not self._write_limit("pids", limits.pids):
            missing.append("pids (no writable pids controller)")
        if limits.milli_cpus is not None and not self._write_limit("cpu", limits.milli_cpus):
            missing.append("cpus (no writable cpu controller)")
        return missing

    def _write_limit(self, f: Function, value: int) -> bool:
        d = self.dirs.get(f)
        if d is None:
            return False
        files: list[tuple[str, str]]
        match f, self.versions[f]:
            case "memory", 1:
                files = [("memory.limit_in_bytes", str(value))]
            case "memory", 2:
                files = [("memory.max", str(value)), ("memory.swap.max", "0")]
            case "pids", _:
                files = [("pids.max", str(value))]
            case "cpu", 1:
                quota = max(1000, value * CPU_PERIOD_US // 1000)
                files = [
                    ("cpu.cfs_period_us", str(CPU_PERIOD_US)),
                    ("cpu.cfs_quota_us", str(quota)),
                ]
            case "cpu", 2:
                files = [("cpu.max", f"{max(1000, value * CPU_PERIOD_US // 1000)} {CPU_PERIOD_US}")]
            case _:
                return False
        try:
            for name, text in files:
                if not (d / name).exists():  # the kernel makes a controller's files
                    if name == "memory.swap.max":
                        continue  # no swap accounting: memory.max bounds it all
                    return False
                (d / name).write_text(text)
        except OSError:  # missing (a v2 controller not enabled for the agent's cgroup), refused
            return False
        return True

    def _v1_memsw(self, value: int) -> None:
        """On v1, memory and swap together bounded too where the kernel counts swap, so the
        limit is not lifted by swapping."""
        d = self.dirs.get("memory")
        if d is not None and self.versions["memory"] == 1:
            with contextlib.suppress(OSError):
                (d / "memory.memsw.limit_in_bytes").write_text(str(value))

    def apart_from(self, f: Function) -> WorkloadCgroup:
        """The cgroup less every directory that holds ``f`` (where one directory holds every
        function, as on a v2-only machine, nothing is left)."""
        held = self.dirs.get(f)
        kept = {g: d for g, d in self.dirs.items() if d != held}
        return WorkloadCgroup(kept, {g: self.versions[g] for g in kept})

    def enter(self, pid: int) -> None:
        """Move process ``pid`` (and so what it starts) into every directory of the cgroup."""
        for d in self._distinct():
            (d / "cgroup.procs").write_text(str(pid))

    # -- using it -------------------------------------------------------------------------------

    def pids(self) -> set[int]:
        """Every process in the cgroup and the cgroups below it (a container engine makes its
        container's and its monitor's there), from its freezer's directory."""
        d = self.dirs.get("freeze")
        if d is None:
            return set()
        found: set[int] = set()
        for sub in _tree(d):
            try:
                found |= {int(x) for x in (sub / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                continue
        return found

    def owns(self, pid: int) -> bool:
        return pid in self.pids()

    def freeze(self) -> bool:
        """Stop every process of the workload, wherever it moved in its process tree; True if
        the cgroup is there to freeze."""
        return self._set_frozen(True)

    def thaw(self) -> bool:
        return self._set_frozen(False)

    def _set_frozen(self, frozen: bool) -> bool:
        d = self.dirs.get("freeze")
        if d is None:
            return False
        try:
            match self.versions["freeze"]:
                case 2:
                    (d / "cgroup.freeze").write_text("1" if frozen else "0")
                case 1:
                    (d / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
                case other:
                    assert_never(other)
        except OSError:
            return False
        return True

    def frozen(self) -> bool | None:
        """Whether the kernel says the cgroup is frozen (None where it is gone): v2's
        ``cgroup.events`` ``frozen 1``, v1's ``freezer.state`` ``FROZEN``."""
        d = self.dirs.get("freeze")
        if d is None:
            return None
        try:
            match self.versions["freeze"]:
                case 2:
                    events = dict(
                        line.split(" ", 1)
                        for line in (d / "cgroup.events").read_text().splitlines()
                    )
                    return events.get("frozen") == "1"
                case 1:
                    return (d / "freezer.state").read_text().strip() == "FROZEN"
                case other:
                    assert_never(other)
        except (OSError, ValueError):
            return None

    def signal(self, sig: int) -> int:
        """Send ``sig`` to every process of the cgroup; how many got it."""
        sent = 0
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                sent += 1
        return sent

    def kill(self) -> None:
        """SIGKILL every process of the cgroup at once (none escapes by forking meanwhile)."""
        d = self.dirs.get("kill")
        if d is None:
            return
        match self.versions["kill"]:
            case 2:
                with contextlib.suppress(OSError):
                    (d / "cgroup.kill").write_text("1")
            case 1:
                self.freeze()
                self.signal(signal.SIGKILL)
                self.thaw()
            case other:
                assert_never(other)

    def memory_bytes(self) -> int | None:
        """Host memory the whole cgroup uses now (None where no memory controller counts it)."""
        d = self.dirs.get("memory")
        if d is None:
            return None
        name = "memory.usage_in_bytes" if self.versions["memory"] == 1 else "memory.current"
        try:
            return int((d / name).read_text())
        except (OSError, ValueError):
            return None

    def watch_oom(self) -> OomWatch:
        """What tells of the kernel's memory kills for this cgroup's limit (register it before
        the workload starts: on v1 it is an event the kernel signals from then on)."""
        return OomWatch(self)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for the cgroup's memory limit, as the kernel
        counts them now (on v1, only those whose own cgroup is still there: ``OomWatch``)."""
        d = self.dirs.get("memory")
        if d is None:
            return 0
        name = "memory.oom_control" if self.versions["memory"] == 1 else "memory.events"
        # v1 counts a kill only in the victim's own cgroup (a container's, below this one);
        # v2's memory.events counts those below too
        kills = 0
        for sub in _tree(d) if self.versions["memory"] == 1 else [d]:
            try:
                for line in (sub / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        kills += int(value)
            except (OSError, ValueError):
                continue
        return kills

    def exists(self) -> bool:
        return any(d.exists() for d in self._distinct())

    def remove(self, timeout: float = 2.0) -> bool:
        """Kill what is left and remove every directory; True once none is left. A directory
        is removed only once its last process has gone, so this waits for them (at most
        ``timeout`` seconds)."""
        if not self.exists():
            return True
        self.kill()
        deadline = time.monotonic() + timeout
        while True:
            for top in self._distinct():
                for d in reversed(_tree(top)):  # the cgroups below it first
                    with contextlib.suppress(OSError):  # gone, or busy: a process still leaving
                        d.rmdir()
            if not self.exists():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


class OomWatch:
    """The kernel's out-of-memory kills for one workload cgroup's memory limit, whichever cgroup
    below it the killed process sat in.

    v2 counts each kill in ``memory.events`` (``oom_kill``) of the victim's cgroup and of every
    cgroup above it. v1 counts it only in the victim's own cgroup (``memory.oom_control``), and a
    container engine removes its container's cgroup as soon as the container has ended, count
    and all, often before anyone has read it. So on v1 an eventfd is registered on the workload
    cgroup's ``memory.oom_control`` (``cgroup.event_control``): the kernel signals it each time
    the cgroup's limit runs out, wherever below it the victim is, and the count stays in the
    eventfd until it is read. ``hits`` is the larger of the two counts."""

    def __init__(self, cgroup: WorkloadCgroup) -> None:
        self.cgroup = cgroup
        self._fd: int | None = None
        self._events = 0
        self._lock = threading.Lock()  # the shim's watcher and its last look, then close
        d = cgroup.dirs.get("memory")
        if d is None or cgroup.versions["memory"] != 1:
            return
        efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            control = os.open(d / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
            try:
                (d / "cgroup.event_control").write_text(f"{efd} {control}")
            finally:
                os.close(control)
        except OSError:
            os.close(efd)  # not offered (a kernel without v1 events): the counter only
            return
        self._fd = efd

    @property
    def registered(self) -> bool:
        """Whether the v1 event is registered (False on v2, where none is needed)."""
        return self._fd is not None

    def hits(self) -> int:
        """How many times the kernel has killed for the limit so far (at least)."""
        with self._lock:
            if self._fd is not None and self.cgroup.exists():  # its removal signals it too
                with contextlib.suppress(BlockingIOError, OSError):
                    self._events += os.eventfd_read(self._fd)
            events = self._events
        return max(events, self.cgroup.oom_kills())

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _tree(top: Path) -> list[Path]:
    """``top`` and every cgroup below it, each before those below it."""
    found = [top]
    for d in found:
        try:
            found += sorted(p for p in d.iterdir() if p.is_dir())
        except OSError:
            continue
    return found


def remove_tree(relative: str, mounts: Iterable[Mount] | None = None) -> None:
    """Remove the cgroup ``relative`` (``/gpufrac-<id>``) and those below it from every
    hierarchy (what a container engine made there beside the workload's own functions: cpuset,
    devices, ...); those still holding processes stay."""
    if mounts is None:
        try:
            mounts = read_mounts(Path("/proc/self/mountinfo").read_text())
        except OSError:
            return
    for m in mounts:
        top = m.path / relative.strip("/")
        if not relative.strip("/") or not top.is_dir():
            continue
        for d in reversed(_tree(top)):
            with contextlib.suppress(OSError):
                d.rmdir()


def process_frozen(pid: int, layout: Layout) -> bool:
    """Whether process ``pid`` sits in a frozen cgroup of the hierarchy ``layout`` freezes in
    (a frozen process is not in state ``T``: v1 shows ``D``, v2 ``S``)."""
    place = layout.places.get("freeze")
    if place is None:
        return False
    try:
        own = read_own(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return False
    path = own.get("" if place.version == 2 else "freezer")
    if path is None:
        return False
    cgroup = WorkloadCgroup({"freeze": place.mount / path.strip("/")}, {"freeze": place.version})
    return cgroup.frozen() is True
