from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# The CLI's consoles are made when gpufrac.cli.common is first imported, as a piped run gets them
# (not wrapped at 80 columns): made here, before any test, so no test's COLUMNS (CliRunner's env)
# or order of files (pytest-xdist) decides how every later test's output wraps
os.environ.pop("COLUMNS", None)
import gpufrac.cli.common  # noqa: F401
from gpufrac.config import shared_path
from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.devices.simfleet import SimulatedFleet, reports_path
from gpufrac.runtime.agent import Agent, WorkloadState
from gpufrac.runtime.shim import cgroup_of, read_status

DATA = Path(__file__).parent / "data"

settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci")


def load_data(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def kill_leftover_runs(data_dir: Path) -> None:
    """Stop every shim under ``data_dir`` and the process group of each run it started.

    Shims go first, found by the run directory on their command line: one an agent started just
    before it was killed may not have written ``child.json`` yet, and killed now it never starts a
    workload that nobody would stop.
    """
    where = (str(data_dir).encode(), str(shared_path(data_dir)).encode())
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = any(
            m in args
            for m in (
                b"gpufrac.runtime.shim",
                b"gpufrac.runtime.arbiter_server",
                b"gpufrac.serving.gateway",
            )
        )
        if ours and any(a.startswith(w) for a in args for w in where):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
    for run in data_dir.glob("**/runs/*/*/*"):
        status = read_status(run)
        cgroup = cgroup_of(run)
        if cgroup is not None:  # its processes killed and the cgroup removed, ended or not
            cgroup.remove()
        if status.child_pid and not status.done:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(status.child_pid, signal.SIGKILL)
    shutil.rmtree(shared_path(data_dir), ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the user's data directory or a GPUFRAC_SIMULATE from the environment."""
    monkeypatch.setenv("GPUFRAC_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("GPUFRAC_SIMULATE", raising=False)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def sim(data_dir: Path) -> Iterator[NvmlDevices]:
    """The demo fleet: GPU 0 an H200 in MIG mode, GPU 1 an H200 without."""
    dev = open_simulated("h200:1:mig,h200:1", data_dir)
    yield dev
    dev.close()


@pytest.fixture
def fleet(data_dir: Path, sim: NvmlDevices) -> SimulatedFleet:
    return SimulatedFleet.open("h200:1:mig,h200:1", data_dir)


def settle(agent: Agent, key: str, phases: set[str], timeout: float = 20.0) -> WorkloadState:
    """Reconcile ``agent`` until workload ``key`` is in one of ``phases``; its state then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = {s.key: s for s in agent.reconcile()}
        if states[key].phase in phases:
            return states[key]
        time.sleep(0.05)
    raise AssertionError(f"{key} never reached {phases}: {states[key]}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove what the session's data directories made outside them: each one's shared directory
    (``gpufrac.config.shared_path``) and each simulated fleet's report drop box, both under the
    system's temporary directory, where thousands of test agents would otherwise leave one each.
    Run once, by the process that started the session (with pytest-xdist, after every worker)."""
    if hasattr(session.config, "workerinput"):
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    try:
        base = factory.getbasetemp()
    except (OSError, ValueError):
        return
    for root, dirs, files in os.walk(base):
        here = Path(root)
        made = [shared_path(here)]
        made += [reports_path(here / f) for f in files if f.startswith("fleet-")]
        for path in made:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
