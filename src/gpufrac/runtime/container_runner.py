"""The container runner: a workload as an OCI container of a local image, run by a rootful podman
(or Docker), supervised by the same shim as a process (``runtime/shim.py``).

The shim runs the engine's client in the foreground (``podman run`` attached, whose exit status is
the container's), so everything the shim does for a process holds for a container: its output in
``output.log`` (rotated), its outcome in ``exit.json``, the lease's fencing, the stop (SIGTERM,
then a kill after the grace) and re-attaching after the agent dies (the shim, the engine's monitor
and the container outlive it).

The container's cgroup is made *below* the workload's (``--cgroup-parent /gpufrac-<id>``), so
freezing the workload's cgroup (QoS pauses) freezes the container, killing it kills the container,
and its processes are the workload's members. An engine takes one cgroup parent for every
hierarchy, so a container workload's cgroup sits at ``/gpufrac-<id>`` from each hierarchy's root
(not below the agent's own, as a process's does). The engine's client stays out of that cgroup's
memory directory (``Launch.engine_client``; on a v2-only machine, out of all of it). Host limits
go to the container itself (``--memory``, ``--pids-limit``, ``--cpus``), and the memory limit to
the workload's cgroup as well, which holds the container and, on v1, its monitor (conmon, about a
MiB, counts against it): the kernel's kill for that limit reaches the shim there
(``cgroups.OomWatch``; on v1 the container's own count goes with the cgroup the engine removes as
soon as it has ended, and podman with runc does not report ``OOMKilled``), and is reported like
the process runner's.

The container process runs as the tenant's uid (``--user``), with no capabilities
(``--cap-drop all``), ``no-new-privileges`` and its own network namespace; its ports are published
on ``127.0.0.1``. Its GPU comes as CDI devices (``--device gpufrac.io/gpu=MIG-...``, the grant's
devices: ``runtime/cdi.py``), MPS's pipe directory as a bind mount. When the run has ended, the
container and what the engine left of its cgroups are removed (``_settle``), and gpufrac's CDI spec
with the last container.
"""

from __future__ import annotations

import json
import os
import pwd
import resource
import shutil
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import assert_never

from gpufrac.errors import InputError
from gpufrac.model.settings import ContainerEngine, ContainerSettings
from gpufrac.model.workload import VolumeMount
from gpufrac.runtime.cdi import CdiSpecs
from gpufrac.runtime.cgroups import HostLimits, Layout, remove_tree
from gpufrac.runtime.process_runner import ProcessRunner
from gpufrac.runtime.runner import (
    Launch,
    Pausable,
    RunHandle,
    RunnerKind,
    RunStatus,
)
from gpufrac.runtime.shim import LOG as LOG_NAME
from gpufrac.runtime.shim import cgroup_name

LABEL = "gpufrac.run"
CDI_LABEL = "gpufrac.cdi"  # the kind of the CDI spec its devices come from
RECORD = "container.json"  # what the engine said of the ended container (written once)
NAMED = "container-name.json"  # its container's and cgroup parent's names, as started
ENV_FILE = "container.env"  # the container's environment, for the engine (--env-file)
ENV_JSON = "container-env.json"  # the same, as the agent reads it back
CLIENT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUNC = "/usr/sbin/runc"  # podman's default crun cannot run in cgroup v1/v2 hybrid mode
PODMAN_INIT = "/usr/libexec/podman/catatonit"  # what podman's --init runs (containers.conf)


@dataclass(frozen=True, slots=True)
class Engine:
    """A container engine's client: its program and the options every call gets."""

    name: ContainerEngine
    argv: tuple[str, ...]
    # a small init as the container's process 1 (``--init``), which passes SIGTERM on to the
    # command: the kernel gives process 1 only the signals it handles, so a program that sets
    # no handler would wait out the stop grace and be killed
    init: bool = False

    def run(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.argv, *args], capture_output=True, text=True, timeout=timeout, check=False
        )


def find_engine(choice: ContainerEngine) -> Engine | None:
    """The engine the operator chose, or (``auto``) podman, else a docker whose daemon answers."""
    match choice:
        case "podman":
            return _podman()
        case "docker":
            return Engine("docker", ("docker",), init=True) if shutil.which("docker") else None
        case "auto":
            found = _podman()
            if found is not None:
                return found
            docker = Engine("docker", ("docker",), init=True) if shutil.which("docker") else None
            if docker is not None and docker.run("info", timeout=10).returncode == 0:
                return docker
            return None
        case _:
            assert_never(choice)


def _podman() -> Engine | None:
    if shutil.which("podman") is None:
        return None
    runtime = ("--runtime", RUNC) if Path(RUNC).exists() else ()
    return Engine(
        "podman",
        ("podman", *runtime, "--cgroup-manager", "cgroupfs"),
        init=Path(PODMAN_INIT).exists(),
    )


def container_name(run_dir: Path) -> str:
    """The run's container (unique to its run directory, found again after a restart)."""
    return cgroup_name(run_dir)


def _root_layout(layout: Layout) -> Layout:
    """The layout with every hierarchy's cgroups at its root (one cgroup parent for all)."""
    return Layout({f: replace(p, own="/") for f, p in layout.places.items()})


# podman lowers its own process limit to this, and runc cannot set a container's above it
ENGINE_NPROC_MAX = 32768


def _ulimit(name: str, which: int, most: int | None = None) -> list[str]:
    """Our own limit, passed on (an engine's default above it is refused: setrlimit)."""
    soft, hard = (
        (most or 2**62) if v == resource.RLIM_INFINITY else min(v, most or v)
        for v in resource.getrlimit(which)
    )
    return ["--ulimit", f"{name}={soft}:{hard}"]


def _user(user: str | int | None, group: int | None) -> list[str]:
    if user is None:
        return []
    uid = user if isinstance(user, int) else pwd.getpwnam(user).pw_uid
    gid = group if group is not None else pwd.getpwuid(uid).pw_gid
    return ["--user", f"{uid}:{gid}"]


class ContainerRunner:
    kind: RunnerKind = "container"

    def __init__(self, cgroups: Layout, settings: ContainerSettings | None = None) -> None:
        self.settings = settings or ContainerSettings()
        self.layout = _root_layout(cgroups) if cgroups.usable else cgroups
        self.processes = ProcessRunner(self.layout)
        self.cdi = CdiSpecs(Path(self.settings.cdi_dir), self.settings.cdi_kind)
        self._engine: Engine | None = None
        # runs started by this runner and not settled yet: their containers may not exist yet
        # (``podman run`` is on its way), so the CDI spec they need is kept
        self._unsettled: set[Path] = set()

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = find_engine(self.settings.engine)
            if self._engine is None:
                raise RuntimeError(
                    f"no container engine ({self.settings.engine}) runs here: install podman "
                    "(apt-get install podman runc) or set containers.engine in gpufrac.yaml"
                )
        return self._engine

    def check_image(self, image: str) -> None:
        """Refuse an image this machine does not have (nothing is pulled), or any image where no
        container engine runs."""
        try:
            engine = self.engine
        except RuntimeError as e:
            raise InputError(
                f"the image {image!r} cannot run here: {e}",
                field="spec.image",
                fix="install podman (apt-get install podman runc), or leave spec.image out and "
                "run the command as a process",
            ) from None
        match engine.name:
            case "podman":
                found = engine.run("image", "exists", "--", image).returncode == 0
            case "docker":
                found = engine.run("image", "inspect", "--", image).returncode == 0
            case "auto":
                raise AssertionError("an engine found is podman or docker")
            case _:
                assert_never(engine.name)
        if not found:
            raise InputError(
                f"the image {image!r} is not on this machine (no registry is pulled from)",
                field="spec.image",
                fix=f"load it first ({self.engine.name} load -i IMAGE.tar, or "
                f"{self.engine.name} build/import), or name one `{self.engine.name} images` lists",
            )

    def command(self, handle: RunHandle, what: Launch) -> list[str]:
        """The engine's command line that runs the workload's container in the foreground."""
        spec = what.container
        assert spec is not None, "the container runner needs Launch.container"
        name = container_name(handle.run_dir)
        argv = [
            *self.engine.argv,
            "run",
            "--name",
            name,
            "--label",
            f"{LABEL}={handle.run_dir}",
            "--label",
            f"{CDI_LABEL}={self.cdi.kind}",
            "--sig-proxy=true",
            "--security-opt",
            "no-new-privileges",
            "--cap-drop",
            "all",
            "--log-driver",
            "k8s-file",
            "--log-opt",
            f"path={handle.run_dir / 'container.log'}",
            *_ulimit("nofile", resource.RLIMIT_NOFILE),
            *_ulimit("nproc", resource.RLIMIT_NPROC, ENGINE_NPROC_MAX),
            *_user(what.user, what.group),
        ]
        if self.engine.init:
            argv.append("--init")
        if self.layout.usable:
            argv += ["--cgroup-parent", f"/{cgroup_name(handle.run_dir)}"]
        limits = what.limits
        if limits.memory_bytes is not None:
            argv += [
                "--memory",
                str(limits.memory_bytes),
                "--memory-swap",
                str(limits.memory_bytes),
            ]
        if limits.pids is not None:
            argv += ["--pids-limit", str(limits.pids)]
        if limits.milli_cpus is not None:
            argv += ["--cpus", f"{limits.milli_cpus / 1000:.3f}"]
        for port in spec.ports:
            argv += ["-p", f"{spec.publish_host}:{port}:{port}"]
        for device in what.grant.devices:
            argv += ["--device", self.cdi.qualified(device)]
        if what.grant.host_ipc:
            argv += ["--ipc", "host"]
        for m in (*what.grant.mounts, *spec.mounts):
            argv += ["-v", f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}"]
        if what.workdir:
            argv += ["-w", what.workdir]
        # its environment from a file only root reads: never on a command line, and never the
        # client's own (the engine runs as root: a tenant's PATH or LD_PRELOAD would be its)
        argv += ["--env-file", str(handle.run_dir / ENV_FILE)]
        # the image only as it is here (nothing pulled), and after "--": never read as an option
        return [*argv, "--pull", "never", "--", spec.image, *what.command]

    # -- the seam -------------------------------------------------------------------------------

    def start(self, handle: RunHandle, what: Launch) -> None:
        spec = what.container
        assert spec is not None, "the container runner needs Launch.container"
        write_env_file(handle.run_dir / ENV_FILE, spec.env)
        _write(handle.run_dir / ENV_JSON, dict(spec.env))
        # named once: a removed workload's run directory moves (``.gone``) but keeps its names
        _write(
            handle.run_dir / NAMED,
            {"name": container_name(handle.run_dir), "cgroup": cgroup_name(handle.run_dir)},
        )
        client = Launch(
            self.command(handle, what),
            {"PATH": CLIENT_PATH},  # the engine's client gets nothing of the workload's
            None,
            None,  # the engine runs rootful; the container as the tenant (--user)
            None,
            None,
            # memory bounded at the workload's cgroup, which holds the container and its monitor
            # (the shim learns of a kill there); the container's own --memory too, for it to see
            HostLimits(memory_bytes=what.limits.memory_bytes),
            what.lease,
            what.grant,
            engine_client=True,
        )
        self._unsettled.add(handle.run_dir)
        self.processes.start(handle, client)

    def stop(self, handle: RunHandle, *, grace: float, wait: float = 0.5) -> bool:
        ended = self.processes.stop(handle, grace=grace, wait=wait)
        if ended:
            self._settle(handle)
        return ended

    def signal(self, handle: RunHandle, sig: int) -> int:
        return self.processes.signal(handle, sig)

    def pause(self, handle: RunHandle) -> bool:
        return self.processes.pause(handle)

    def resume(self, handle: RunHandle) -> bool:
        return self.processes.resume(handle)

    def owns(self, handle: RunHandle, *, pid: int | None = None, port: int | None = None) -> bool:
        # a published port is held by the engine's monitor (conmon), a member of the workload
        return self.processes.owns(handle, pid=pid, port=port)

    def members(self, handle: RunHandle, pids: Iterable[int]) -> frozenset[int]:
        return self.processes.members(handle, pids)

    def status(self, handle: RunHandle) -> RunStatus:
        status = _explained(handle, self.processes.status(handle))
        # ended, or its shim is gone (killed; or the run directory moved aside for a removed
        # workload, which its shim no longer answers for): what is left of it goes now
        if status.done or not (status.shim_alive or self.processes.launching(handle, status)):
            self._settle(handle)
        return status

    def launching(self, handle: RunHandle, status: RunStatus) -> bool:
        return self.processes.launching(handle, status)

    def pending_outcome(self, handle: RunHandle, status: RunStatus) -> str | None:
        return self.processes.pending_outcome(handle, status)

    def abandon(self, handle: RunHandle, status: RunStatus) -> RunStatus:
        after = self.processes.abandon(handle, status)
        self._settle(handle)
        return after

    def clear_unknown(self, handle: RunHandle, by: str) -> bool:
        return self.processes.clear_unknown(handle, by)

    def limit_hit(self, handle: RunHandle) -> str | None:
        # the shim saw the kernel kill for the workload cgroup's limit (the container below it);
        # the engine may say so too (OOMKilled, which podman with runc on v1 does not)
        shim_saw = self.processes.limit_hit(handle)
        if shim_saw is not None:
            return shim_saw
        record = _read(handle.run_dir / RECORD)
        if record.get("oom_killed") is True:
            mib = _limit_mib(_read(handle.run_dir / "spec.json").get("command"))
            return (
                f"stopped: it used more host memory than its {mib} MiB host_memory limit "
                "(the kernel killed its container's process)"
            )
        return None

    def pausable(self, handle: RunHandle) -> Pausable | None:
        return self.processes.pausable(handle)

    def env(self, handle: RunHandle) -> Mapping[str, str]:
        raw = _read(handle.run_dir / ENV_JSON)
        return {str(k): str(v) for k, v in raw.items()}

    def log(self, handle: RunHandle) -> Path:
        return self.processes.log(handle)

    # -- after the run --------------------------------------------------------------------------

    def _settle(self, handle: RunHandle) -> None:
        """Once: what the engine says of the ended container (a memory kill), then the container
        and its cgroups removed; gpufrac's CDI spec too when no container of it is left."""
        record = handle.run_dir / RECORD
        if record.exists() or not handle.run_dir.exists():
            self._unsettled.discard(handle.run_dir)
            return
        named = _read(handle.run_dir / NAMED)
        name = str(named.get("name") or container_name(handle.run_dir))
        cgroup = str(named.get("cgroup") or cgroup_name(handle.run_dir))
        engine = self.engine
        seen = engine.run("inspect", "--format", "{{json .State}}", name)
        state: dict[str, object] = {}
        if seen.returncode == 0:
            try:
                raw = json.loads(seen.stdout.strip().splitlines()[0])
                state = raw if isinstance(raw, dict) else {}
            except (ValueError, IndexError):
                state = {}
        engine.run("rm", "--force", name)
        remove_tree(f"/{cgroup}")
        limit = _limit_mib(_read(handle.run_dir / "spec.json").get("command"))
        _write(record, {"oom_killed": state.get("OOMKilled") is True, "limit_mib": limit})
        self._unsettled.discard(handle.run_dir)
        if self._starting():
            return  # a container on its way needs the spec
        left = engine.run(
            "ps", "--all", "--quiet", "--filter", f"label={CDI_LABEL}={self.cdi.kind}"
        )
        if left.returncode == 0 and not left.stdout.strip():
            self.cdi.remove()

    def _starting(self) -> bool:
        """Whether a run this runner started is not settled yet (its directory still there)."""
        self._unsettled = {r for r in self._unsettled if r.exists() and not (r / RECORD).exists()}
        return bool(self._unsettled)


def _limit_mib(command: object) -> int | None:
    """The ``--memory`` the run's engine command gave, in MiB."""
    if not isinstance(command, list):
        return None
    args: Sequence[object] = command
    for i, arg in enumerate(args[:-1]):
        if arg == "--memory" and isinstance(args[i + 1], str) and str(args[i + 1]).isdigit():
            return int(str(args[i + 1])) // 2**20
    return None


def _read(path: Path) -> dict[str, object]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _write(path: Path, value: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


def write_env_file(path: Path, env: Mapping[str, str]) -> None:
    """The container's environment as the engines' ``--env-file`` reads it: ``NAME=value`` a line,
    owner-only. A value cannot hold a line break there (``model.workload.container_env_problems``
    refuses one at apply)."""
    for key, value in env.items():
        assert not set(value) & {"\n", "\r", "\0"}, f"{key}: a line break in a container's env"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.writelines(f"{key}={env[key]}\n" for key in sorted(env))


def check_mount_sources(mounts: Sequence[VolumeMount], sources: Sequence[str]) -> None:
    """Each mount's source, resolved (``sources``: where each leads, as checked against the
    operator's allowed paths), must exist and be a path only root can change: a directory on the
    way that another user may write lets that user swap what the path leads to between this check
    and the engine's mount (a symbolic link to /etc, say). ``InputError`` at
    ``spec.mounts[i].source``."""
    for i, (m, source) in enumerate(zip(mounts, sources, strict=True)):
        field = f"spec.mounts[{i}].source"
        if not os.path.exists(source):
            raise InputError(
                f"{m.source} does not exist on this machine",
                field=field,
                fix="mount a path that exists (made before the workload is applied)",
            )
        who = changeable_by(source)
        if who is not None:
            raise InputError(
                f"{m.source} leads to {source}, and {who}: it could be swapped for another path "
                "between gpufrac's check and the mount",
                field=field,
                fix="mount a path whose directories only root can change (a tenant's own "
                "directory is fine when its parent is root's)",
            )


def changeable_by(path: str) -> str | None:
    """Who other than root may change what the absolute, resolved ``path`` leads to, said as a
    clause (None: root alone). A directory on the way lets whoever may write it rename or replace
    its entries: its owner, its group (other than root's), everyone; in a sticky directory
    (``/tmp``) only an entry's owner may, so a root-owned entry there is safe."""
    here = Path("/")
    for name in Path(path).parts[1:]:
        st = os.stat(here)
        entry = here / name
        writers = []
        if st.st_uid != 0:
            writers.append(f"uid {st.st_uid} owns {here}")
        if st.st_mode & stat.S_IWGRP and st.st_gid != 0:
            writers.append(f"group {st.st_gid} may write {here}")
        if st.st_mode & stat.S_IWOTH:
            writers.append(f"everyone may write {here}")
        if writers and st.st_mode & stat.S_ISVTX and st.st_uid == 0:
            try:
                owner = os.lstat(entry).st_uid
            except OSError:
                owner = -1
            if owner == 0:
                writers = []  # sticky: only the entry's owner, root, may rename or remove it
        if writers:
            return writers[0]
        here = entry
    return None


# what the engines' init (catatonit, docker-init/tini) says when the command is not in the image
_NO_COMMAND = ("failed to exec pid1", "exec ", "executable file not found")


def _explained(handle: RunHandle, status: RunStatus) -> RunStatus:
    """A container whose command is not in its image ends at once with its init's message in the
    log and exit 1 (127 without an init): said as a failed start naming the command, as a
    process's missing program is."""
    if not status.done or status.error or status.exit_code not in (1, 127):
        return status
    try:
        with open(handle.run_dir / LOG_NAME, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            tail = f.read().decode(errors="replace")
    except OSError:
        return status
    if not any(n in tail for n in _NO_COMMAND) or "No such file or directory" not in tail:
        return status
    wanted = _container_command(_read(handle.run_dir / "spec.json").get("command")) or "?"
    return replace(
        status,
        exit_code=127,
        error=f"cannot start {wanted!r}: not found in the container's image",
    )


def _container_command(argv: object) -> str | None:
    """The container's own program in the engine's command line: the word after the image."""
    if not isinstance(argv, list) or "--" not in argv:
        return None
    at = argv.index("--") + 2  # "--", the image, then its command
    return str(argv[at]) if at < len(argv) else None
