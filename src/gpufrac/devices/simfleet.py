"""Simulated GPUs: the fleet spec, its state on disk, and the controls a test or the SDK uses to act
on it.

The state lives in one JSON file in the data directory, so separate commands see the same GPUs.
Every change takes an exclusive lock, re-reads the file and replaces it atomically; readers re-read
only when the file changed. The NVML-shaped view of this state is ``fakenvml.FakeNvml``; nothing
above the device adapter sees this module except to choose it and, in tests and the demo, to inject
faults.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import tempfile
import threading
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufrac.errors import InputError
from gpufrac.model.catalog import GpuModel, lookup_model
from gpufrac.model.numbers import digits_note, is_digits

_NAMESPACE = uuidlib.UUID("6f1c2b7e-3a55-4c1e-9d7a-7c0f1a2b9e40")


@dataclass(frozen=True, slots=True)
class SimulatedGpuSpec:
    model: GpuModel
    mig: bool


def parse_simulate_spec(text: str, *, field: str = "--simulate") -> tuple[SimulatedGpuSpec, ...]:
    """Parse ``h200:1:mig,h200:1`` (``MODEL[:COUNT][:mig]``, comma separated)."""
    gpus: list[SimulatedGpuSpec] = []
    if not text.strip():
        raise InputError("no GPUs given", field=field, fix="write MODEL[:COUNT][:mig], e.g. h200:2")
    for part in (p.strip() for p in text.split(",")):
        bits = [b.strip() for b in part.split(":")]
        if not part or not bits[0]:
            raise InputError(f"empty entry in {text!r}", field=field, fix="MODEL[:COUNT][:mig]")
        try:
            model = lookup_model(bits[0])
        except InputError as e:
            raise e.at(field) from None
        count, mig = 1, False
        for extra in bits[1:]:
            if extra.lower() == "mig":
                mig = True
            elif is_digits(extra) and int(extra) >= 1:  # ASCII: '²'.isdigit() is true
                count = int(extra)
            else:
                raise InputError(
                    f"{extra!r} in {part!r} is neither a count nor 'mig'{digits_note(extra)}",
                    field=field,
                    fix="write MODEL[:COUNT][:mig], e.g. h200:2:mig",
                )
        unknown = [p.name for p in model.profiles if p.memory_mib is None or p.sm_count is None]
        if unknown:
            raise InputError(
                f"{model.key} cannot be simulated: its catalog entry is unverified and "
                "the memory or "
                f"SM count of {', '.join(unknown)} is unknown",
                field=field,
                fix="simulate a GPU whose geometry was read from a driver or documented "
                "(h200, h100, a100-40gb, a30, ...)",
            )
        gpus.extend(SimulatedGpuSpec(model, mig) for _ in range(count))
    if len(gpus) > 4096:
        raise InputError("more than 4096 simulated GPUs", field=field, fix="simulate fewer GPUs")
    return tuple(gpus)


def normalized_spec(specs: tuple[SimulatedGpuSpec, ...]) -> str:
    return ",".join(f"{s.model.key}:1{':mig' if s.mig else ''}" for s in specs)


def simulated_gpu_uuid(model_key: str, index: int) -> str:
    return "GPU-" + str(uuidlib.uuid5(_NAMESPACE, f"{model_key}/{index}"))


def initial_state(specs: tuple[SimulatedGpuSpec, ...]) -> dict[str, Any]:
    return {
        "version": 1,
        "spec": normalized_spec(specs),
        "created": 0,  # counts MIG devices ever created, so re-created instances get new UUIDs
        "event_seq": 0,
        "gpus": [
            {
                "model": s.model.key,
                "uuid": simulated_gpu_uuid(s.model.key, i),
                "mig_current": int(s.mig),
                "mig_pending": int(s.mig),
                "lost": False,
                "utilization": 0,
                "gpu_instances": [],
                "processes": [],
                "events": [],
                "ecc": {"volatile": 0, "aggregate": 0},
            }
            for i, s in enumerate(specs)
        ],
    }


class SimulatedFleet:
    """The on-disk state of one simulated fleet, with locked read-modify-write."""

    def __init__(self, path: Path, specs: tuple[SimulatedGpuSpec, ...]) -> None:
        self.path = path
        self.specs = specs
        self._cache: dict[str, Any] | None = None
        self._stamp: tuple[int, int] | None = None
        self._thread_lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.mutate():
            pass  # creates the file on first use

    @property
    def reports_dir(self) -> Path:
        """Where workloads on this fleet report their GPU use (``gpufrac.sdk.report_gpu_use``):
        outside the data directory, writable by any process and listable by none but its owner
        (mode 1733, as a drop box), one file per process."""
        return reports_path(self.path)

    def open_reports(self) -> Path:
        d = self.reports_dir
        d.mkdir(mode=0o1733, exist_ok=True)
        os.chmod(d, 0o1733)
        return d

    def reported(self) -> list[dict[str, Any]]:
        """Each live process's report, as the driver would list it (an MPS client where a control
        daemon answers at its pipe directory): the device is the one the process was handed (its
        own environment says which; ``PID.N.json``: the N-th GPU of its ``CUDA_VISIBLE_DEVICES``,
        for a share of several GPUs), the memory and SM use what it wrote. A report whose file is
        not owned by the process's user is ignored; those of processes that are gone are
        removed."""
        out: list[dict[str, Any]] = []
        try:
            entries = list(os.scandir(self.reports_dir))
        except OSError:
            return out
        for entry in entries:
            stem = entry.name.removesuffix(".json")
            pid_text, _, device_text = stem.partition(".")  # PID.json, or PID.DEVICE.json
            if not entry.name.endswith(".json") or not is_digits(pid_text):  # a workload names it
                continue
            if device_text and not is_digits(device_text):
                continue
            pid, device = int(pid_text), int(device_text or 0)
            if not pid_alive(pid):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                continue
            try:
                uid = _uid(pid)
                text = _own_report(entry.path, uid)
                if text is None:
                    continue
                env = _environ(pid)
                raw = json.loads(text)
            except (OSError, ValueError):
                continue
            gpu, gi = env.get("GPUFRAC_GPU_UUID"), env.get("GPUFRAC_GI_ID", "")
            if device:  # the device-th GPU of a share of several (never a MIG device)
                visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",")
                gpu, gi = (visible[device] if device < len(visible) else None), ""
            if not gpu or not isinstance(raw, dict):
                continue
            mib, sm, tensor = raw.get("mib"), raw.get("sm", 0), raw.get("tensor", 0)
            if not isinstance(mib, int) or mib < 0:
                continue
            if not isinstance(sm, int) or not isinstance(tensor, int):
                continue
            sm = max(0, min(100, sm))
            out.append(
                {
                    "gpu": gpu,
                    "pid": pid,
                    "used_mib": mib,
                    "gi_id": int(gi) if is_digits(gi) else None,
                    "ci_id": 0 if is_digits(gi) else None,
                    "mps": _mps_client(env),
                    "mps_pipe": env.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps",
                    "sm_util": sm,
                    # its tensor pipes busy: a part of its SMs' busy time
                    "tensor_util": max(0, min(sm, tensor)),
                }
            )
        return out

    @classmethod
    def open(cls, spec_text: str, data_dir: Path) -> SimulatedFleet:
        specs = parse_simulate_spec(spec_text)
        digest = hashlib.sha1(normalized_spec(specs).encode()).hexdigest()[:12]
        return cls(data_dir / "simulated" / f"fleet-{digest}.json", specs)

    # -- reading and writing -------------------------------------------------------------------

    def read(self) -> dict[str, Any]:
        """The current state (do not mutate it; use ``mutate``). Safe from several threads, as NVML
        is: the agent's MIG workers read and change GPUs beside its reconcile pass."""
        with self._thread_lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._cache = initial_state(self.specs)
                return self._cache
            stamp = (st.st_mtime_ns, st.st_size)
            cached = self._cache
            if cached is None or stamp != self._stamp:
                with open(self.path, encoding="utf-8") as f:
                    cached = json.load(f)
                self._cache, self._stamp = cached, stamp
            return cached

    @contextlib.contextmanager
    def mutate(self) -> Iterator[dict[str, Any]]:
        """Lock, re-read, yield the state for changes, and write it back atomically."""
        lock_path = self.path.with_suffix(".lock")
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if self.path.exists():
                    with open(self.path, encoding="utf-8") as f:
                        state = json.load(f)
                else:
                    state = initial_state(self.specs)
                yield state
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".fleet-", suffix=".tmp")
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(state, f)
                os.replace(tmp, self.path)
                with self._thread_lock:
                    self._cache = None
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- controls for tests, the demo and the SDK channel ---------------------------------------

    def _gpu(self, state: dict[str, Any], gpu_uuid: str) -> dict[str, Any]:
        for g in state["gpus"]:
            if g["uuid"] == gpu_uuid:
                return g  # type: ignore[no-any-return]
        raise InputError(f"no simulated GPU {gpu_uuid}", field="gpu", fix="see gpufrac gpus")

    def attach_process(
        self,
        gpu_uuid: str,
        pid: int,
        used_memory_mib: int,
        *,
        gi_id: int | None = None,
        mps: bool = False,
        sm_util: int = 0,
        tensor_util: int = 0,
    ) -> None:
        """Record that ``pid`` holds memory on a GPU (or on its GPU instance ``gi_id``), keeps
        ``sm_util`` % of its SMs busy and ``tensor_util`` % of the time its tensor pipes (at most
        its SM use)."""
        with self.mutate() as state:
            gpu = self._gpu(state, gpu_uuid)
            if gi_id is not None and not any(gi["id"] == gi_id for gi in gpu["gpu_instances"]):
                raise InputError(f"GPU {gpu_uuid} has no GPU instance {gi_id}", field="gi_id")
            gpu["processes"] = [p for p in gpu["processes"] if p["pid"] != pid]
            ci_id = 0 if gi_id is not None else None
            gpu["processes"].append(
                {
                    "pid": pid,
                    "used_mib": used_memory_mib,
                    "gi_id": gi_id,
                    "ci_id": ci_id,
                    "mps": mps,
                    "sm_util": sm_util,
                    "tensor_util": max(0, min(sm_util, tensor_util)),
                }
            )

    def detach_process(self, pid: int) -> None:
        with self.mutate() as state:
            for gpu in state["gpus"]:
                gpu["processes"] = [p for p in gpu["processes"] if p["pid"] != pid]

    def inject_xid(self, gpu_uuid: str, xid: int) -> None:
        """Raise an Xid critical-error event on a GPU, as the driver would."""
        with self.mutate() as state:
            state["event_seq"] += 1
            self._gpu(state, gpu_uuid)["events"].append(
                {"seq": state["event_seq"], "type": "xid", "data": xid}
            )

    def add_ecc_errors(self, gpu_uuid: str, count: int, *, double_bit: bool = True) -> None:
        with self.mutate() as state:
            gpu = self._gpu(state, gpu_uuid)
            gpu["ecc"]["volatile"] += count
            gpu["ecc"]["aggregate"] += count
            if double_bit:
                state["event_seq"] += 1
                gpu["events"].append({"seq": state["event_seq"], "type": "ecc_dbe", "data": count})

    def set_lost(self, gpu_uuid: str, lost: bool = True) -> None:
        """Make a GPU fall off the bus (every driver call on it fails with GPU_IS_LOST)."""
        with self.mutate() as state:
            self._gpu(state, gpu_uuid)["lost"] = lost

    def set_latency(self, *, create_s: float = 0.0, destroy_s: float = 0.0) -> None:
        """How long creating and destroying a GPU instance takes (0: at once), as a real driver's
        MIG changes take time."""
        with self.mutate() as state:
            state["latency"] = {
                "create_gpu_instance": max(0.0, create_s),
                "destroy_gpu_instance": max(0.0, destroy_s),
            }

    def set_utilization(self, gpu_uuid: str, percent: int) -> None:
        with self.mutate() as state:
            self._gpu(state, gpu_uuid)["utilization"] = max(0, min(100, percent))


def pid_alive(pid: int) -> bool:
    """Whether a process still runs (a zombie has exited: like the driver, it holds no GPU
    memory)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return True


def reports_path(fleet_path: Path) -> Path:
    """The report drop box of the simulated fleet whose state is ``fleet_path``."""
    digest = hashlib.sha1(str(fleet_path.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"gpufrac-sim-{digest}"


MAX_REPORT_BYTES = 4096  # a report is a small JSON object


def _own_report(path: str, uid: int) -> str | None:
    """A report's text where it is a small regular file owned by ``uid`` (the process it names):
    opened without following a link or waiting on a FIFO, its owner and type checked on what was
    opened, at most ``MAX_REPORT_BYTES`` read. None otherwise (the drop box is writable by every
    user: what another user put there is not a report)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size > MAX_REPORT_BYTES:
            return None
        return os.read(fd, MAX_REPORT_BYTES + 1).decode("utf-8")
    finally:
        os.close(fd)


def _mps_client(env: dict[str, str]) -> bool:
    """Whether a process with this environment is an MPS client: CUDA connects to the control
    daemon at ``CUDA_MPS_PIPE_DIRECTORY`` (``/tmp/nvidia-mps`` unless set) when one answers there
    (the daemon, or its stand-in, makes the directory's ``control``), else runs without MPS."""
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    return os.path.exists(os.path.join(pipe, "control"))


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise OSError(f"no Uid for {pid}")
