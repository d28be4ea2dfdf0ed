"""Container workloads through the agent (in process, on simulated GPUs) with real podman
containers: each sees its device by CDI (the MIG instance's or the GPU's UUID, the SDK's
environment) and, on MPS, its pipe directory; a delete leaves no container, cgroup or CDI spec;
a restarted agent re-attaches to a running container instead of starting it again."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpufrac.devices import NvmlDevices, open_simulated
from gpufrac.model.settings import ContainerSettings, OperatorSettings
from gpufrac.model.workload import GpuRequest, HealthCheck, VolumeMount, WorkloadSpec
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.cdi import CdiSpecs
from gpufrac.runtime.mps import MpsDomain
from tests.conftest import kill_leftover_runs, settle
from tests.integration.containers import PODMAN, ensure_image

FLEET = "h200:1:mig,h200:1"
PY = "/usr/bin/python3"  # the host's, under the /usr the test image mounts
SHOW = (
    "import json, os; e = os.environ; p = e.get('CUDA_MPS_PIPE_DIRECTORY'); "
    "print(json.dumps({'visible': e.get('CUDA_VISIBLE_DEVICES'), "
    "'device': e.get('GPUFRAC_DEVICE_UUID'), 'reports': e.get('GPUFRAC_GPU_REPORTS'), "
    "'pipe': p, 'pipe_seen': bool(p) and os.path.isdir(p), 'mine': e.get('MINE'), "
    "'host': e.get('GPUFRAC_HOST'), 'limit': e.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'), "
    "'host_shm': os.path.exists('/dev/shm/gpufrac-test-shm-probe')}), flush=True)"
)
SHM_PROBE = Path("/dev/shm/gpufrac-test-shm-probe")  # seen only where the host's /dev/shm is


@pytest.fixture
def image() -> str:
    return ensure_image()


@pytest.fixture
def dev(data_dir: Path) -> Iterator[NvmlDevices]:
    yield open_simulated(FLEET, data_dir)
    kill_leftover_runs(data_dir)
    ours = podman("ps", "-a", "--format", "{{.Names}} {{.Labels}}")
    for line in ours.splitlines():  # whatever a failing test left of its containers
        if str(data_dir) in line:
            podman("rm", "--force", line.split()[0])


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[OperatorSettings]:
    kind = f"gpufrac.io/agent{abs(hash(str(tmp_path))) % 10**8}"  # its own: tests run side by side
    yield OperatorSettings(
        containers=ContainerSettings(
            engine="podman", allowed_mounts=("/usr",), cdi_kind=kind, cdi_dir="/etc/cdi"
        )
    )
    CdiSpecs(Path("/etc/cdi"), kind).remove()


def allowing(tmp_path: Path, allowed: Path) -> OperatorSettings:
    """Containers by podman that may mount /usr and ``allowed``, with a CDI kind of the test's."""
    kind = f"gpufrac.io/agent{abs(hash(str(tmp_path))) % 10**8}"
    return OperatorSettings(
        containers=ContainerSettings(
            engine="podman", allowed_mounts=("/usr", str(allowed)), cdi_kind=kind
        )
    )


def podman(*args: str) -> str:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, check=False).stdout


def container(name: str, image: str, code: str, **kw: object) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        command=(PY, "-c", code),
        image=image,
        mounts=(VolumeMount("/usr", "/usr"),),
        env={"MINE": "yes"},
        restart="never",
        **kw,  # type: ignore[arg-type]
    )


def shown(agent: Agent, name: str) -> dict[str, object]:
    log = agent.latest_log("default", name, 1)
    assert log is not None
    lines = log.read_text().strip().splitlines()
    assert lines, "the container printed nothing"
    seen: dict[str, object] = json.loads(lines[-1])
    return seen


def container_of(agent: Agent, name: str) -> str:
    """The container's name, as the engine knows it (its label: the run directory)."""
    run = agent.runs.latest("default", name, 1)
    assert run is not None
    out = podman("ps", "-a", "--filter", f"label=gpufrac.run={run}", "--format", "{{.Names}}")
    return out.strip()


def no_cgroup(name: str) -> bool:
    return not any(Path("/sys/fs/cgroup").glob(f"*/{name}")) and not any(
        Path("/sys/fs/cgroup").glob(name)
    )


def test_a_mig_and_an_mps_container_see_their_devices_and_a_delete_leaves_nothing(
    data_dir: Path, dev: NvmlDevices, settings: OperatorSettings, image: str
) -> None:
    agent = Agent(data_dir, dev, settings, stop_grace=1.0)
    cdi = CdiSpecs(Path(settings.containers.cdi_dir), settings.containers.cdi_kind)
    SHM_PROBE.touch()
    started = time.monotonic()
    agent.apply_workload(container("mig", image, SHOW, gpu=GpuRequest(mig_profile="1g.18gb")))
    agent.apply_workload(
        container("mps", image, SHOW, gpu=GpuRequest(memory_mib=4096), sharing="mps")
    )
    mig = settle(agent, "default/mig", {"succeeded", "failed"})
    mps = settle(agent, "default/mps", {"succeeded", "failed"})
    took = time.monotonic() - started
    assert mig.phase == "succeeded", shown(agent, "mig")
    assert mps.phase == "succeeded", shown(agent, "mps")
    instance = next(i for i in dev.gpus()[0].instances if i.uuid)
    seen = shown(agent, "mig")
    assert seen["device"] == instance.uuid  # from its CDI device, by the MIG device's UUID
    assert seen["visible"] == instance.uuid
    assert seen["reports"] == dev.sdk_env["GPUFRAC_GPU_REPORTS"]  # the spec's common edits
    assert seen["mine"] == "yes" and seen["host"] == "0.0.0.0"
    assert seen["pipe"] is None
    assert seen["host_shm"] is False  # its own /dev/shm
    seen = shown(agent, "mps")
    gpu = dev.gpus()[1].uuid
    assert seen["device"] == gpu and seen["visible"] == gpu
    assert seen["pipe_seen"] is True  # the MPS pipe directory, mounted
    assert seen["pipe"] == str(agent.mps.pipe_dir(MpsDomain((gpu,))))
    assert seen["limit"] is not None
    assert seen["host_shm"] is True  # the host's IPC namespace: MPS's shared memory
    print(f"two container jobs through the agent, apply to succeeded: {took:.2f}s")
    names = [container_of(agent, n) for n in ("mig", "mps")]
    assert all(not n for n in names)  # ended: removed already
    for n in ("mig", "mps"):
        assert agent.delete("default", n)
    assert agent.runs.wait_stopped(10)
    assert not cdi.path.exists()  # no container of gpufrac's left: its CDI spec went too
    agent.close()
    SHM_PROBE.unlink()


def test_a_running_container_is_re_attached_by_a_restarted_agent_and_deleted_clean(
    data_dir: Path, dev: NvmlDevices, settings: OperatorSettings, image: str
) -> None:
    from tests.integration.conftest import free_port

    port = free_port()
    server = (
        "import http.server, os\n"
        "http.server.ThreadingHTTPServer((os.environ['GPUFRAC_HOST'], "
        f"{port}), http.server.SimpleHTTPRequestHandler).serve_forever()"
    )
    first = Agent(data_dir, dev, settings, stop_grace=1.0)
    spec = container(
        "svc",
        image,
        server,
        gpu=GpuRequest(memory_mib=4096),
        sharing="timeslice",
        type="service",
        health=HealthCheck("http", port, "/", 1),
    )
    first.apply_workload(spec)
    # running: its health check passed, through the port published at 127.0.0.1
    settle(first, "default/svc", {"running"})
    assert "ready" in [e.kind for e in first.store.events("default/svc")]
    name = container_of(first, "svc")
    assert name
    cid = podman("inspect", "--format", "{{.Id}}", name).strip()
    run = first.runs.latest("default", "svc", 1)
    assert run is not None
    pid = first.runs.status(run).child_pid
    cdi = CdiSpecs(Path(settings.containers.cdi_dir), settings.containers.cdi_kind)
    assert cdi.path.exists()
    first.close()  # the agent goes, without stopping anything; its container does not

    second = Agent(data_dir, open_simulated(FLEET, data_dir), settings, stop_grace=1.0)
    after = settle(second, "default/svc", {"running"})
    assert after.attempts == 1  # re-attached, not started again
    assert second.runs.status(run).child_pid == pid
    assert podman("inspect", "--format", "{{.Id}}", name).strip() == cid
    assert second.apply_workload(spec)[0] == "unchanged"
    assert no_cgroup(name) is not second.runs.cgroups.usable  # its cgroup is there while it runs
    assert second.delete("default", "svc")
    assert second.runs.wait_stopped(10)
    assert not podman("ps", "-a", "--filter", f"name={name}", "--format", "{{.Names}}").strip()
    assert no_cgroup(name)
    assert not cdi.path.exists()
    second.close()


REPO = Path(__file__).resolve().parents[2]
TURNS = (
    "import json, sys, time\n"
    f"sys.path.insert(0, {str(REPO / 'src')!r})\n"
    "from gpufrac.sdk.turns import TurnClient\n"
    "c = TurnClient.from_env()\n"
    "granted, deadline = False, time.monotonic() + 30\n"
    "while not granted and time.monotonic() < deadline:\n"
    "    granted = c.acquire()\n"
    "    if granted:\n"
    "        c.release()\n"
    "    else:\n"
    "        time.sleep(0.2)\n"
    "print(json.dumps({'granted': granted, 'connected': c.connected}), flush=True)\n"
    "time.sleep(2)\n"  # the other one may still be on its way to its first turn
)


def test_a_containers_sdk_takes_its_turns_from_the_arbiter(
    data_dir: Path, dev: NvmlDevices, settings: OperatorSettings, image: str
) -> None:
    # two workloads on one time-sliced GPU: the arbiter starts; its socket is in each container
    allowed = replace(settings.containers, allowed_mounts=("/usr", str(REPO)))
    agent = Agent(data_dir, dev, replace(settings, containers=allowed), stop_grace=1.0)
    mounts = (VolumeMount("/usr", "/usr"), VolumeMount(str(REPO), str(REPO)))
    for name in ("t1", "t2"):
        agent.apply_workload(
            replace(
                container(name, image, TURNS, gpu=GpuRequest(memory_mib=4096), sharing="timeslice"),
                mounts=mounts,
            )
        )
    for name in ("t1", "t2"):
        state = settle(agent, f"default/{name}", {"succeeded", "failed"})
        assert state.phase == "succeeded", shown(agent, name)
        assert shown(agent, name) == {"granted": True, "connected": True}
    for name in ("t1", "t2"):
        agent.delete("default", name)
    assert agent.runs.wait_stopped(10)
    agent.close()


REPLICA = (
    "import http.server, json, os\n"
    "e = os.environ; p = e.get('CUDA_MPS_PIPE_DIRECTORY')\n"
    "seen = {'visible': e.get('CUDA_VISIBLE_DEVICES'), 'device': e.get('GPUFRAC_DEVICE_UUID'),\n"
    "        'reports': e.get('GPUFRAC_GPU_REPORTS'), 'pipe': p,\n"
    "        'pipe_seen': bool(p) and os.path.isdir(p), 'pid': os.getpid(),\n"
    "        'limit': e.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = json.dumps(seen).encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers(); self.wfile.write(body)\n"
    "http.server.ThreadingHTTPServer((e['GPUFRAC_HOST'], int(e['PORT'])), H).serve_forever()\n"
)


def _deployment(name: str, image: str, gpu: dict[str, object], sharing: str) -> dict[str, object]:
    return {
        "apiVersion": "gpufrac/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "image": image,
                "command": [PY, "-c", REPLICA],
                "mounts": [{"source": "/usr", "target": "/usr"}],
                "resources": {"gpu": gpu},
                "sharing": sharing,
            },
            "replicas": 1,
        },
    }


def _started(name: str) -> tuple[str, str]:
    """The container's id and when it started, as the engine says."""
    out = podman("inspect", "--format", "{{.Id}} {{.State.StartedAt}}", name).strip()
    cid, _, at = out.partition(" ")
    return cid, at


def test_replica_containers_on_mig_and_mps_serve_through_the_gateway_and_outlive_a_kill_9(
    tmp_path: Path, image: str
) -> None:
    import httpx

    from tests.integration.conftest import running_agent

    kind = f"gpufrac.io/serve{abs(hash(str(tmp_path))) % 10**8}"
    yaml = f"containers:\n  engine: podman\n  allowed_mounts: [/usr]\n  cdi_kind: {kind}\n"
    agents = running_agent(tmp_path, "h200:1:mig,h200:1", files={"gpufrac.yaml": yaml})
    agent = next(agents)
    runs = agent.data_dir / "runs"

    def ready(name: str) -> dict[str, object]:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            got: dict[str, object] = httpx.get(
                f"{agent.url}/api/v1/deployments/default/{name}", timeout=10
            ).json()
            if got["replicas_ready"] == 1:
                return got
            time.sleep(0.2)
        raise AssertionError(f"no ready replica of {name}")

    def through_gateway(name: str) -> dict[str, object]:
        answer = httpx.get(f"{agent.gateway}/serve/{name}/", timeout=10)
        assert answer.status_code == 200, answer.text
        seen: dict[str, object] = answer.json()
        return seen

    def ours() -> dict[str, str]:
        out = podman("ps", "--format", "{{.Names}} {{.Labels}}")
        return {
            line.split()[0]: line for line in out.splitlines() if str(runs) in line
        }  # name -> its line (labels: its deployment's run directory)

    try:
        # what only the agent can tell (an image not here, where a mount leads) is checked for
        # every document before anything is stored, and located in its document and file
        bad = tmp_path / "bad.yaml"
        bad.write_text(
            "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: fine}\n"
            f"spec: {{command: [{PY}, -c, '1'], resources: {{gpu: {{memory: 1GiB}}}}}}\n---\n"
            "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: no-image}\n"
            f"spec: {{image: localhost/not-here:0, command: [{PY}],\n"
            "  resources: {gpu: {count: 1}}}\n---\n"
            "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: out}\n"
            f"spec: {{image: {image}, command: [{PY}], resources: {{gpu: {{count: 1}}}},\n"
            "  mounts: [{source: /etc, target: /x}]}\n"
        )
        cli = subprocess.run(
            [sys.executable, "-m", "gpufrac.cli", "apply", "-f", str(bad)],
            env={**os.environ, "GPUFRAC_SERVER": agent.url},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 2, cli.stdout + cli.stderr
        assert f"{bad}: doc[2].spec.image: the image 'localhost/not-here:0'" in cli.stderr
        assert f"{bad}: doc[3].spec.mounts[0].source: /etc is outside" in cli.stderr
        assert httpx.get(f"{agent.url}/api/v1/workloads").json()["workloads"] == []

        started = time.monotonic()
        for name, gpu, sharing in (
            ("on-mig", {"mig": "1g.18gb"}, "mig"),
            ("on-mps", {"memory": "4GiB"}, "mps"),
        ):
            r = httpx.post(
                agent.url + "/api/v1/deployments", json=_deployment(name, image, gpu, sharing)
            )
            assert r.status_code == 200, r.text
        for name in ("on-mig", "on-mps"):
            ready(name)
        mig, mps = through_gateway("on-mig"), through_gateway("on-mps")
        took = time.monotonic() - started
        gpus = httpx.get(f"{agent.url}/api/v1/gpus", timeout=10).json()["gpus"]
        instances = [i["uuid"] for g in gpus for i in g.get("instances", []) if i.get("uuid")]
        whole = [g["uuid"] for g in gpus if not g.get("instances")]
        # exactly their CDI devices' env: the MIG instance's UUID; the whole GPU and MPS's pipe
        assert mig["device"] in instances and mig["visible"] == mig["device"], mig
        assert mig["pipe"] is None and mig["limit"] is None, mig
        assert mps["device"] in whole and mps["visible"] == mps["device"], mps
        assert mps["pipe_seen"] is True and mps["limit"] is not None, mps
        assert mig["reports"] == mps["reports"] is not None  # the spec's common edits
        print(f"two replica containers (MIG, MPS), apply to both answering: {took:.2f}s")

        before = {n: _started(n) for n in ours()}
        assert len(before) == 2, ours()
        agent.kill9()  # the agent goes at once; its shims, the engine and the containers do not
        killed = time.monotonic()
        agent.start()
        for name in ("on-mig", "on-mps"):
            ready(name)
        print(
            f"kill -9, a new agent up, both replicas ready again: {time.monotonic() - killed:.2f}s"
        )
        assert {n: _started(n) for n in ours()} == before  # re-attached: not started again
        assert through_gateway("on-mig")["pid"] == mig["pid"]
        assert through_gateway("on-mps")["pid"] == mps["pid"]

        for name in ("on-mig", "on-mps"):
            r = httpx.delete(f"{agent.url}/api/v1/deployments/default/{name}", timeout=30)
            assert r.status_code == 200, r.text
        deleting = time.monotonic()
        spec = CdiSpecs(Path("/etc/cdi"), kind).path
        # no container left, nor its cgroups; gpufrac's CDI spec goes with the last of them
        while (
            ours()
            or str(runs) in podman("ps", "-a", "--format", "{{.Labels}}")
            or spec.exists()
            or not all(no_cgroup(n) for n in before)
        ):
            assert time.monotonic() < deleting + 30, (ours(), spec.exists())
            time.sleep(0.2)
        print(f"deleted; containers, cgroups, CDI spec gone: {time.monotonic() - deleting:.2f}s")
    finally:
        with contextlib.suppress(StopIteration):
            next(agents)  # the agent and what it left are stopped
        for line in podman("ps", "-a", "--format", "{{.Names}} {{.Labels}}").splitlines():
            if str(tmp_path) in line:
                podman("rm", "--force", line.split()[0])
        CdiSpecs(Path("/etc/cdi"), kind).remove()


def test_a_mount_whose_link_leads_out_after_apply_is_refused_at_its_start(
    data_dir: Path, dev: NvmlDevices, tmp_path: Path, image: str
) -> None:
    """The mounts are checked where they lead at each start too (a link swapped after apply; a
    cluster node's work, which never goes through its apply): the start fails, said as the action's
    failure naming the mount, and no container is made."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "data").mkdir()
    settings = allowing(tmp_path, allowed)
    kind = settings.containers.cdi_kind
    agent = Agent(data_dir, dev, settings, stop_grace=1.0)
    try:
        w = replace(
            container("linked", image, "print('ran')", gpu=GpuRequest(memory_mib=1024)),
            mounts=(VolumeMount("/usr", "/usr"), VolumeMount(str(allowed / "data"), "/d")),
        )
        agent.apply_workload(w)  # a directory within the allowed path, as applied
        (allowed / "data").rmdir()
        (allowed / "data").symlink_to(outside)  # now it leads out
        deadline = time.monotonic() + 20
        said: list[str] = []
        while time.monotonic() < deadline and not said:
            agent.reconcile()
            said = [e.message for e in agent.store.events(limit=50) if e.kind == "action_failed"]
            time.sleep(0.05)
        assert said and f"leads to {outside}" in said[0], said
        run = agent.runs.latest("default", "linked", 1)
        assert run is None or not container_of(agent, "linked")
    finally:
        agent.delete("default", "linked")
        agent.close()
        CdiSpecs(Path(settings.containers.cdi_dir), kind).remove()


def test_a_mount_a_tenant_could_swap_is_refused_at_apply_and_nothing_is_stored(
    data_dir: Path, dev: NvmlDevices, tmp_path: Path, image: str
) -> None:
    """A tenant's directory under the allowed path, holding the directory mounted: its owner
    could swap that for a link to /etc between the check and the mount (the hostile review did,
    4 times in 5), so it is refused; the tenant's directory itself (its parent root's) is fine."""
    import os

    from gpufrac.errors import InputError

    allowed = tmp_path / "share"
    (allowed / "bob" / "d").mkdir(parents=True)
    os.chown(allowed / "bob", 200001, 200001)
    settings = allowing(tmp_path, allowed)
    kind = settings.containers.cdi_kind
    agent = Agent(data_dir, dev, settings, stop_grace=1.0)
    try:
        base = container("swap", image, "print('ran')", gpu=GpuRequest(memory_mib=1024))
        inner = replace(base, mounts=(VolumeMount(str(allowed / "bob" / "d"), "/d"),))
        with pytest.raises(InputError) as e:
            agent.apply_workload(inner)
        assert e.value.field == "spec.mounts[0].source"
        assert f"uid 200001 owns {allowed / 'bob'}" in e.value.message
        assert agent.store.workload("default", "swap") is None
        own = replace(base, mounts=(VolumeMount(str(allowed / "bob"), "/d"),))
        assert agent.apply_workload(own)[0] == "created"
    finally:
        agent.delete("default", "swap")
        agent.runs.wait_stopped(10)
        agent.close()
        CdiSpecs(Path(settings.containers.cdi_dir), kind).remove()


def test_a_container_port_below_1024_is_refused_at_apply(
    data_dir: Path, dev: NvmlDevices, settings: OperatorSettings, image: str
) -> None:
    """The engine (root) publishes a container's ports: one below 1024 is one its tenant could
    never listen on itself (the hostile review had conmon listen on 127.0.0.1:80 for a tenant)."""
    from gpufrac.errors import InputError

    agent = Agent(data_dir, dev, settings, stop_grace=1.0)
    try:
        web = container(
            "web",
            image,
            "pass",
            gpu=GpuRequest(memory_mib=1024),
            type="service",
            health=HealthCheck("tcp", 80),
        )
        with pytest.raises(InputError) as e:
            agent.apply_workload(web)
        assert e.value.field == "spec.health" and "port 80" in e.value.message
        assert agent.store.workload("default", "web") is None
        assert agent.apply_workload(replace(web, health=HealthCheck("tcp", 8080)))[0] == "created"
    finally:
        agent.delete("default", "web")
        agent.runs.wait_stopped(10)
        agent.close()
