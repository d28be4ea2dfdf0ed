"""The agent's Python as tenants' users see it: a read-only view of what it needs, nothing else.

Workloads run as their tenant's user start the agent's Python: ``model:`` replicas run the agent's
own interpreter, and manifests whose command is ``python`` get the agent's venv when its ``bin`` is
first on ``PATH`` (``make demo``, an activated venv). Where that Python lives under a directory only
its owner may enter (a checkout under ``/root``, mode 0700, and so its ``.venv``; or a venv of an
interpreter that pyenv or uv installed under ``/root``), those users cannot run it.

Opening such a directory to them (``chmod o+x``, or an ACL per tenant uid) would also let them
read whatever else in it is readable by others, which the closed directory was guarding. Instead
each such workload gets its own mount namespace in which every closed directory on the way to the
agent's Python (the topmost one of each path) is covered by an empty, read-only tmpfs that holds,
at their own paths, read-only bind mounts of exactly what the agent's Python needs: its prefix (the
venv), its base interpreter's prefix, and the directories a fresh interpreter of it puts on
``sys.path`` (the project's source for an editable install). Paths stay as they are
(``pyvenv.cfg``, ``.pth`` files and the venv's links keep working); nothing else of a covered
directory is visible, and the namespace ends with the workload. The agent's data directory is never
shown (and stays mode 0700 regardless).

It needs mount namespaces (root with ``CAP_SYS_ADMIN``: a machine, or a privileged container). At
start the agent runs its Python through the view as an unprivileged uid (``probe``); when that fails
it uses no view and says why (docs/agent.md).
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18

# What a fresh interpreter of the agent's needs: where it is, its prefixes, its sys.path ('' is the
# working directory of whoever runs it: not the agent's to show). -E: PYTHONPATH and the like are
# the agent's own environment, which no workload gets.
_PATHS = (
    "import json, os, sys; print(json.dumps([os.path.dirname(sys.executable),"
    " os.path.dirname(os.path.realpath(sys.executable)), sys.prefix, sys.exec_prefix,"
    " sys.base_prefix, sys.base_exec_prefix, *[p for p in sys.path if p]]))"
)
PROBE_IMPORT = "import gpufrac"  # what a model: replica needs first: the project on sys.path


@dataclass(frozen=True, slots=True)
class Cover:
    """A closed directory ``top``, covered by an empty read-only tmpfs that shows ``shown`` (paths
    under it) at their own paths, read-only."""

    top: str
    shown: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PythonView:
    covers: tuple[Cover, ...] = ()

    def to_json(self) -> list[dict[str, object]]:
        return [{"cover": c.top, "show": list(c.shown)} for c in self.covers]

    @staticmethod
    def from_json(value: object) -> PythonView:
        if not isinstance(value, list):
            return PythonView()
        return PythonView(
            tuple(Cover(str(c["cover"]), tuple(str(p) for p in c["show"])) for c in value)
        )

    def tops(self) -> list[str]:
        return [c.top for c in self.covers]


def searchable_by_others(path: str) -> bool:
    """Whether users other than its owner and group may pass through directory ``path``."""
    try:
        return bool(os.stat(path).st_mode & stat.S_IXOTH)
    except OSError:
        return False


def closed_top(path: str, searchable: Callable[[str], bool]) -> str | None:
    """The topmost directory above ``path`` that others may not pass through (None: every one on
    its way is open, or only ``/`` is closed, which no view can cover)."""
    for parent in reversed(PurePosixPath(path).parents):
        if str(parent) != "/" and not searchable(str(parent)):
            return str(parent)
    return None


def plan_view(paths: Iterable[str], searchable: Callable[[str], bool]) -> PythonView:
    """The covers that make ``paths`` (absolute) reachable: one per topmost closed directory, each
    showing the outermost of the paths under it (a path inside another shown one comes with it)."""
    under: dict[str, set[str]] = {}
    for p in paths:
        top = closed_top(p, searchable)
        if top is not None:
            under.setdefault(top, set()).add(p)
    covers = []
    for top in sorted(under):
        kept: list[PurePosixPath] = []
        for path in sorted(PurePosixPath(p) for p in under[top]):
            if not any(path.is_relative_to(k) for k in kept):
                kept.append(path)
        covers.append(Cover(top, tuple(str(k) for k in kept)))
    return PythonView(tuple(covers))


def python_paths(executable: str, timeout: float = 30.0) -> list[str]:
    """What ``executable`` (a fresh interpreter of it) reads from: each path as written and after
    its links, those that exist."""
    out = subprocess.run(
        [executable, "-E", "-c", _PATHS],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
        check=True,
    ).stdout
    found: list[str] = []
    for p in json.loads(out):
        for q in (os.path.abspath(p), os.path.realpath(p)):
            if q not in found and os.path.exists(q):
                found.append(q)
    return found


def view_for(executable: str) -> PythonView:
    """The view that shows ``executable``'s Python to users who cannot reach it (empty where they
    can)."""
    return plan_view(python_paths(executable), searchable_by_others)


def enter(view: PythonView) -> None:
    """Give this process (root, about to run a workload as another user) its own mount namespace
    with ``view``'s covers in it. Raises OSError saying which step failed."""
    if not view.covers:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    _call(libc.unshare(CLONE_NEWNS), "unshare a mount namespace")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing of it reaches the machine's
    # every source is opened before any cover hides it (a shown path may be reached through a
    # link into another closed directory)
    sources: dict[str, int] = {}
    umask = os.umask(0o022)
    try:
        for p in (p for c in view.covers for p in c.shown):
            try:
                sources[p] = os.open(p, os.O_PATH | os.O_CLOEXEC)
            except OSError as e:
                raise OSError(e.errno, f"cannot open {p}: {e.strerror}") from None
        for c in view.covers:
            _mount(libc, "gpufrac", c.top, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
            for p in c.shown:
                fd = sources[p]
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.makedirs(p, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(p), exist_ok=True)
                    os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
                _mount(libc, f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
                noexec = os.fstatvfs(fd).f_flag & os.ST_NOEXEC and MS_NOEXEC
                ro = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | noexec
                _mount(libc, None, p, None, ro)
            _mount(libc, None, c.top, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    finally:
        os.umask(umask)
        for fd in sources.values():
            os.close(fd)


def _mount(
    libc: ctypes.CDLL,
    source: str | None,
    target: str,
    fstype: str | None,
    flags: int,
    data: str | None = None,
) -> None:
    what = (
        f"bind {target}" if flags & MS_BIND and source else f"mount {fstype or 'again'} on {target}"
    )
    _call(libc.mount(_c(source), _c(target), _c(fstype), flags, _c(data)), what)


def _c(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def _call(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"cannot {what}: {os.strerror(errno)}")


def probe(executable: str, view: PythonView, uid: int, timeout: float = 30.0) -> str | None:
    """Run ``executable`` as ``uid`` (and gid, no other groups) through ``view``, as a workload
    would be: None if it ran and imported gpufrac, else why not."""
    code = (
        "import sys; from gpufrac.runtime.python_view import _probe_child;"
        " _probe_child(sys.argv[1], sys.argv[2], int(sys.argv[3]))"
    )
    try:
        done = subprocess.run(
            [executable, "-E", "-c", code, executable, json.dumps(view.to_json()), str(uid)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def _probe_child(executable: str, view: str, uid: int) -> None:
    """The probe's process (root): enters the view, becomes ``uid``, runs ``executable``."""
    try:
        enter(PythonView.from_json(json.loads(view)))
    except OSError as e:
        print(e.strerror or e, file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    try:
        os.execv(executable, [executable, "-E", "-c", PROBE_IMPORT])
    except OSError as e:
        print(f"{executable}: {e.strerror or e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
