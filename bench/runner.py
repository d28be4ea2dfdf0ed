"""What a workload's cgroup and container cost: the process runner with and without a cgroup,
and the container runner (podman), in one run.

For each way (``process group``: no cgroup; ``cgroup``: the machine's layout, runtime/cgroups.py;
``container (podman)``: the test image of tests/integration/containers.py, /usr bind-mounted
read-only, the machine's layout where it has one):

* start to ready: from ``Runs.launch`` (the shim started detached, its cgroup made, the workload
  moved into it before exec; for a container, ``podman run`` in the shim) until the workload's
  first line is in its ``output.log``;
* stop: from ``Runs.stop_live`` until the run has ended (``exit.json``: its processes killed and
  its cgroup removed before that) and, for a container, the container removed (``container.json``,
  written after ``podman rm``);
* the agent's cost per running workload: CPU time (user + system) of the agent's reconcile pass with
  N workloads running on simulated GPUs, divided by N (the pass reads each run, its cgroup's record
  included). CPU time is the agent's own process: podman's client and monitor are not in it.

The workload exits on SIGTERM (a container's Python is its PID 1, which the kernel does not kill
for a signal it has no handler for: it would wait out the grace), so every way stops the same.
The container row's pass runs ``--container-workloads`` (default: as many as ``--workloads``;
fewer where starting that many containers is slow). Where podman cannot run containers, their row
is skipped with the reason.

Medians of the rounds; wall clock on a shared machine, so read the columns against each other.
Run: .venv/bin/python bench/runner.py [--rounds 10] [--workloads 16] [--container-workloads N]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpufrac.devices import open_simulated
from gpufrac.model.settings import ContainerSettings, OperatorSettings
from gpufrac.model.workload import GpuRequest, VolumeMount, WorkloadSpec
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.cdi import CdiSpecs
from gpufrac.runtime.cgroups import Layout, detect
from gpufrac.runtime.container_runner import ENGINE_NPROC_MAX, RECORD, RUNC, _ulimit
from gpufrac.runtime.runner import BindMount, ContainerLaunch, Grant
from gpufrac.runtime.runs import Runs
from gpufrac.runtime.shim import read_status

REPO = Path(__file__).resolve().parents[1]
READY = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)
CONTAINER_PY = "/usr/bin/python3"  # the host's, under the /usr the test image mounts
CDI_KIND = "gpufrac.io/bench-runner"


@dataclass(frozen=True, slots=True)
class Way:
    """One row: a runner's layout and, for containers, the image and the engine's settings."""

    label: str
    layout: Layout
    image: str | None = None
    containers: ContainerSettings | None = None

    @property
    def python(self) -> str:
        return CONTAINER_PY if self.image else sys.executable


def container_way(layout: Layout) -> Way | str:
    """The container row, or why podman cannot run one here."""
    if shutil.which("podman") is None or not Path(RUNC).exists():
        return "podman and runc are not installed (apt-get install podman runc)"
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    try:
        import pytest

        from tests.integration.containers import PODMAN, ensure_image
    except ImportError as e:
        return f"the test image's helper cannot be imported ({e}): make .venv/.installed"
    try:
        image = ensure_image()
    except pytest.skip.Exception as e:
        return str(e.msg)
    except subprocess.CalledProcessError as e:
        return f"the test image could not be built: {e.stderr!r}"
    tried = subprocess.run(
        [
            *PODMAN,
            "run",
            "--rm",
            # the runner's limits: ours, as an engine's default above them is refused
            *_ulimit("nofile", resource.RLIMIT_NOFILE),
            *_ulimit("nproc", resource.RLIMIT_NPROC, ENGINE_NPROC_MAX),
            "-v",
            "/usr:/usr:ro",
            image,
            CONTAINER_PY,
            "-c",
            "pass",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if tried.returncode != 0:
        return f"podman cannot run a container here: {tried.stderr.strip()[-300:]}"
    settings = ContainerSettings(
        engine="podman", allowed_mounts=("/usr",), cdi_kind=CDI_KIND, cdi_dir="/etc/cdi"
    )
    return Way("container (podman)", layout, image, settings)


def _until(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not (callable(check) and check()):
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.001)


def _ended(runs: Runs, run: Path, container: bool) -> bool:
    if not container:
        return read_status(run).done
    # the runner's status settles an ended container (``podman rm``, then its record)
    return runs.status(run).done and (run / RECORD).exists()


def start_and_stop(root: Path, way: Way, rounds: int) -> tuple[float, float]:
    runs = Runs(root / "runs", stop_grace=5.0, cgroups=way.layout, containers=way.containers)
    container = None
    if way.image is not None:
        container = ContainerLaunch(way.image, {}, (BindMount(Path("/usr"), "/usr", True),))
    starts, stops = [], []
    try:
        for i in range(rounds):
            t0 = time.perf_counter()
            run = runs.launch(
                "bench",
                f"w{i}",
                1,
                1,
                [way.python, "-c", READY],
                env={},
                workdir=None,
                user=None,
                grant=Grant({}, (), ()),
                container=container,
            )
            log = run / "output.log"
            _until(lambda log=log: log.exists() and b"ready" in log.read_bytes(), timeout=60)
            starts.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            runs.stop_live("bench", f"w{i}")
            _until(lambda run=run: _ended(runs, run, container is not None), timeout=60)
            stops.append(time.perf_counter() - t0)
    finally:
        for i in range(rounds):
            runs.remove("bench", f"w{i}")
        runs.wait_stopped(30)
    return statistics.median(starts), statistics.median(stops)


def agent_cost(root: Path, way: Way, workloads: int, passes: int) -> float:
    """CPU milliseconds of one reconcile pass per running workload."""
    data = root / "agent"
    settings = OperatorSettings(containers=way.containers) if way.containers else None
    agent = Agent(
        data, open_simulated("h200:4", data), settings, stop_grace=2.0, cgroups=way.layout
    )
    image = {"image": way.image, "mounts": (VolumeMount("/usr", "/usr"),)} if way.image else {}
    try:
        for i in range(workloads):
            agent.apply_workload(
                WorkloadSpec(
                    name=f"w{i}",
                    gpu=GpuRequest(memory_mib=1024),
                    command=(way.python, "-c", READY),
                    type="service",
                    sharing="timeslice",
                    **image,  # type: ignore[arg-type]
                )
            )
        _until(lambda: all(s.phase == "running" for s in agent.reconcile()), timeout=180)
        t0 = time.process_time()
        for _ in range(passes):
            agent.reconcile()
        return (time.process_time() - t0) / passes / workloads * 1000
    finally:
        for i in range(workloads):
            agent.delete("default", f"w{i}")
        agent.runs.wait_stopped(30)
        agent.close()
        if way.containers is not None:
            CdiSpecs(Path(way.containers.cdi_dir), way.containers.cdi_kind).remove()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--workloads", type=int, default=16)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument(
        "--container-workloads",
        type=int,
        default=None,
        help="container workloads in the agent's pass (default: --workloads)",
    )
    args = ap.parse_args()
    in_containers = args.container_workloads or args.workloads
    detected = detect()
    ways = [Way("process group", Layout({}))]
    if detected.usable:
        ways.append(Way("cgroup", detected))
    else:
        print("no writable cgroup hierarchy here: only the process group is measured")
    print(f"cgroup layout here: {detected.describe()}")
    found = container_way(detected if detected.usable else Layout({}))
    if isinstance(found, Way):
        ways.append(found)
    else:
        print(f"container (podman) skipped: {found}")
    rows = []
    for way in ways:
        n = in_containers if way.image else args.workloads
        with tempfile.TemporaryDirectory(prefix="gpufrac-bench-runner-") as tmp:
            start, stop = start_and_stop(Path(tmp), way, args.rounds)
            cost = agent_cost(Path(tmp), way, n, args.passes)
        rows.append((way.label, start, stop, cost, n))
    print()
    counts = ", ".join(f"{label}: {n}" for label, *_, n in rows)
    print(
        f"Medians of {args.rounds} rounds; the agent's pass: {args.passes} passes with N "
        f"workloads running on simulated GPUs (N = {counts})."
    )
    print()
    print(
        "| runner | start to ready (ms) | stop (ms) | agent CPU per running workload "
        "and pass (ms) | workloads in the pass |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, start, stop, cost, n in rows:
        print(f"| {label} | {start * 1000:.1f} | {stop * 1000:.1f} | {cost:.2f} | {n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
