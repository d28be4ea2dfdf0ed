"""Real containers (podman + runc) behind the runner seam: CDI devices and MPS mounts, pause,
host memory limit, re-attach and clean removal."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufrac.model.settings import ContainerSettings
from gpufrac.runtime.cdi import CdiSpecs
from gpufrac.runtime.cgroups import HostLimits, detect
from gpufrac.runtime.container_runner import container_name
from gpufrac.runtime.runner import BindMount, ContainerLaunch, Grant
from gpufrac.runtime.runs import Runs
from tests.integration.containers import PODMAN, ensure_image

REPO = Path(__file__).resolve().parents[2]
VENV_PY = "/usr/bin/python3"  # the host's, under the /usr the image mounts


@pytest.fixture
def image() -> str:
    return ensure_image()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    kind = f"gpufrac.io/test{abs(hash(str(tmp_path))) % 10**8}"
    settings = ContainerSettings(engine="podman", cdi_kind=kind, cdi_dir="/etc/cdi")
    r = Runs(tmp_path / "runs", stop_grace=1.0, cgroups=detect(), containers=settings)
    yield r
    for tenant in ("t",):
        for name in ("a", "b", "c", "d"):
            r.remove(tenant, name)
    r.wait_stopped(10)
    CdiSpecs(Path("/etc/cdi"), kind).remove()


def cdi(runs: Runs) -> CdiSpecs:
    return CdiSpecs(Path(runs.containers.cdi_dir), runs.containers.cdi_kind)


def write_spec(runs: Runs, tmp_path: Path) -> Path:
    """A CDI spec as the executor writes it, of one simulated MIG device."""
    drop = tmp_path / "drop"
    drop.mkdir()
    spec = {
        "cdiVersion": "0.5.0",
        "kind": runs.containers.cdi_kind,
        "devices": [
            {"name": "MIG-abc", "containerEdits": {"env": ["GPUFRAC_DEVICE_UUID=MIG-abc"]}},
        ],
        "containerEdits": {
            "env": [f"GPUFRAC_GPU_REPORTS={drop}"],
            "mounts": [
                {"hostPath": str(drop), "containerPath": str(drop), "options": ["rbind", "rw"]}
            ],
        },
    }
    cdi(runs).refresh(spec)
    return drop


def launch(
    runs: Runs,
    name: str,
    image: str,
    script: str,
    *,
    limits: HostLimits | None = None,
    **kw: object,
) -> Path:
    env = {"HELLO": "world", "NVIDIA_VISIBLE_DEVICES": "MIG-abc"}
    mounts = (BindMount(Path("/usr"), "/usr", True), BindMount(REPO, str(REPO), True))
    grant = Grant(env, ("MIG-abc",), tuple(kw.pop("grant_mounts", ())))  # type: ignore[arg-type]
    return runs.launch(
        "t",
        name,
        1,
        1,
        [VENV_PY, "-c", script],
        env=env,
        workdir=None,
        user=65534,
        group=65534,
        limits=limits,
        grant=grant,
        container=ContainerLaunch(image, env, mounts, tuple(kw.pop("ports", ()))),  # type: ignore[arg-type]
    )


def wait_for(what: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(what) and what():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def podman_has(name: str) -> bool:
    out = subprocess.run([*PODMAN, "ps", "-a", "--format", "{{.Names}}"], capture_output=True)
    return name in out.stdout.decode().split()


SHOW = (
    "import os, json; "
    "print(json.dumps({'uid': os.getuid(), 'uuid': os.environ.get('GPUFRAC_DEVICE_UUID'), "
    "'reports': os.environ.get('GPUFRAC_GPU_REPORTS'), 'hello': os.environ.get('HELLO'), "
    "'path': os.environ.get('PATH'), 'mps': os.path.isdir('/tmp/gf-mps-pipe'), "
    "'caps': open('/proc/self/status').read().split('CapEff:')[1].split()[0], "
    "'nnp': open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0]}), flush=True)"
)


def test_a_container_job_sees_its_cdi_device_and_mps_mounts_then_leaves_nothing(
    runs: Runs, image: str, tmp_path: Path
) -> None:
    drop = write_spec(runs, tmp_path)
    pipe = Path("/tmp/gf-mps-pipe")
    pipe.mkdir(exist_ok=True)
    started = time.monotonic()
    run = launch(runs, "a", image, SHOW, grant_mounts=(BindMount(pipe, str(pipe)),))
    wait_for(lambda: runs.status(run).done)
    took = time.monotonic() - started
    status = runs.status(run)
    assert status.exit_code == 0, runs.log(run).read_text()
    seen = json.loads(runs.log(run).read_text().strip().splitlines()[-1])
    assert seen["uid"] == 65534
    assert seen["uuid"] == "MIG-abc"  # from the CDI device
    assert seen["reports"] == str(drop)  # from the CDI spec's common edits
    assert seen["hello"] == "world"
    assert seen["mps"] is True
    assert seen["caps"] == "0000000000000000" and seen["nnp"] == "1"
    assert "/work" not in (seen["path"] or "")  # not the agent's PATH
    print(f"container job: start to end {took:.2f}s")
    # the engine's client (root) got nothing of the workload's environment: the container did,
    # from a file only root reads; the image only as it is here, never read as an option
    client = json.loads((run / "spec.json").read_text())
    assert client["env"] == {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    assert (run / "container.env").stat().st_mode & 0o777 == 0o600
    assert "HELLO=world\n" in (run / "container.env").read_text()
    argv = client["command"]
    assert argv[argv.index("--") + 1] == image and argv[argv.index("--pull") + 1] == "never"
    assert runs.handed_env(run)["NVIDIA_VISIBLE_DEVICES"] == "MIG-abc"  # as the agent reads it
    name = container_name(run)
    assert not podman_has(name)  # settled: removed
    assert not cdi(runs).path.exists()  # the last container gone: its CDI spec too
    assert not list(Path("/sys/fs/cgroup/memory").glob(name))
    assert not list(Path("/sys/fs/cgroup/devices").glob(name))


def test_pause_freezes_the_container_and_a_stop_removes_it(
    runs: Runs, image: str, tmp_path: Path
) -> None:
    write_spec(runs, tmp_path)
    tick = tmp_path / "ticks"
    script = "import time\nwhile True:\n    print(time.time(), flush=True); time.sleep(0.05)"
    run = launch(runs, "b", image, script)
    wait_for(lambda: runs.log(run).exists() and runs.log(run).read_text().count("\n") > 3)
    pausable = runs.pausable(run)
    assert pausable is not None and pausable.cgroup is not None
    members = runs.members(run, pausable.cgroup.pids())
    assert len(members) >= 2  # the client, the monitor and the container's process
    assert pausable.cgroup.freeze()
    time.sleep(0.3)
    before = runs.log(run).read_text().count("\n")
    time.sleep(0.6)
    assert runs.log(run).read_text().count("\n") == before  # frozen: nothing printed
    assert runs.resume(run)
    wait_for(lambda: runs.log(run).read_text().count("\n") > before + 3)
    started = time.monotonic()
    runner, handle = runs.runner_of(run)
    runner.stop(handle, grace=30.0, wait=0.0)
    wait_for(lambda: runs.status(run).done, 25)  # well within the grace: not killed after it
    print(f"container stop (grace 30 s): {time.monotonic() - started:.2f}s")
    # its process 1 (the init) passed SIGTERM on to a program that sets no handler of its own
    assert runs.status(run).exit_code == 128 + 15, runs.status(run)
    runs.remove("t", "b")
    assert runs.wait_stopped(15)
    assert not podman_has(container_name(run))
    assert not tick.exists()


def test_a_container_over_its_host_memory_is_stopped_and_reported(
    runs: Runs, image: str, tmp_path: Path
) -> None:
    write_spec(runs, tmp_path)
    hog = "x = []\nwhile True:\n    x.append(bytearray(4 * 2**20))"
    run = launch(runs, "c", image, hog, limits=HostLimits(memory_bytes=96 * 2**20))
    wait_for(lambda: runs.status(run).done, 30)
    assert runs.status(run).signal == 9 or runs.status(run).exit_code == 137
    why = runs.limit_hit(run)
    assert why is not None and "96 MiB host_memory" in why


def test_a_published_port_is_the_workloads(runs: Runs, image: str, tmp_path: Path) -> None:
    write_spec(runs, tmp_path)
    from tests.integration.conftest import free_port

    port = free_port()
    server = (
        "import http.server\n"
        f"http.server.ThreadingHTTPServer(('0.0.0.0', {port}), "
        "http.server.SimpleHTTPRequestHandler).serve_forever()"
    )
    run = launch(runs, "d", image, server, ports=(port,))
    import urllib.request

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_for(answers, 20)
    assert runs.owns(run, port=port)
    assert not runs.owns(run, pid=1)
    _ = sys


def test_a_container_whose_nodes_lease_runs_out_is_stopped_and_removed(
    runs: Runs, image: str, tmp_path: Path
) -> None:
    from gpufrac.runtime.lease import write_lease

    write_spec(runs, tmp_path)
    lease = tmp_path / "lease"
    write_lease(lease, time.time() + 30, 0.5)
    runs.lease_file = lease  # a cluster node's: each run's shim reads it
    script = "import time\nwhile True:\n    print(time.time(), flush=True); time.sleep(0.05)"
    run = launch(runs, "b", image, script)
    wait_for(lambda: runs.log(run).exists() and runs.log(run).read_text().count("\n") > 3, 30)
    assert podman_has(container_name(run))
    write_lease(lease, time.time() - 0.1, 0.5)  # its agent did not renew it: run out now
    wait_for(lambda: runs.status(run).done, 20)
    assert (run / "fenced.json").exists()
    assert "lease ran out" in runs.log(run).read_text()
    wait_for(lambda: not podman_has(container_name(run)), 20)  # settled: removed


def test_a_command_not_in_the_image_is_a_failed_start_naming_it(
    runs: Runs, image: str, tmp_path: Path
) -> None:
    write_spec(runs, tmp_path)
    env = {"NVIDIA_VISIBLE_DEVICES": "MIG-abc"}
    run = runs.launch(
        "t",
        "a",
        1,
        1,
        ["/no/such/program", "--flag"],
        env=env,
        workdir=None,
        user=65534,
        group=65534,
        grant=Grant(env, ("MIG-abc",)),
        container=ContainerLaunch(image, env, (BindMount(Path("/usr"), "/usr", True),)),
    )
    wait_for(lambda: runs.status(run).done, 30)
    status = runs.status(run)
    assert status.exit_code == 127, (status, runs.log(run).read_text()[-500:])
    assert status.error == "cannot start '/no/such/program': not found in the container's image"
