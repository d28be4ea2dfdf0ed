"""A gpufrac cluster on a real multi-node Ray cluster on this machine, from start to end; run by
``test_cluster_ray.py`` (and ``bench/cluster.py --ray``) inside a network namespace with only
loopback (``unshare -n``), so no packet leaves the machine (Ray may pick the host's external
address otherwise: ray-project/ray#59110). Prints one JSON object: what was seen, and timings.

The cluster: a Ray head and three Ray worker nodes (``ray start --block``, each in its own PID
namespace, so that killing a node kills everything of it: its raylet, the Ray worker that runs its
node agent, the agent, its workloads), labelled ``gpufrac.io/node`` n0 (an H200 in MIG mode), n1
(an H200 for MPS work), n2 (an H200); ``gpufrac control --ray`` starts a node agent on each (a Ray
actor) with simulated GPUs. A deployment's two replicas run on n1 and n2, behind the control
plane's gateway, under traffic while one of their nodes is killed.

Run: unshare -n python tests/integration/ray_scenario.py --lo-up OUT_DIR   (as root)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

PY = sys.executable
RAY = str(Path(PY).parent / "ray")
NODES = {  # name: (simulated GPUs, as a Ray label value: dots for colons; kind)
    "n0": ("h200.1.mig", "mig"),
    "n1": ("h200.1", "mps"),
    "n2": ("h200.1", "timeslice"),
}
LEASE_S = 8.0  # a restart of the control plane (with Ray to connect to) is quicker than its 2/3
RAY_PORT, CONTROL_PORT, GATEWAY_PORT, NODE_PORT = 6391, 18479, 18489, 18499
URL = f"http://127.0.0.1:{CONTROL_PORT}"
SERVE = f"http://127.0.0.1:{GATEWAY_PORT}/serve/summer/predict"
ROOT = Path(__file__).resolve().parents[2]  # the replicas import examples.serving.models from it
DEPLOYMENT = f"""apiVersion: gpufrac/v1
kind: Deployment
metadata: {{name: summer}}
spec:
  template:
    model: examples.serving.models:slow_sum
    resources: {{gpu: {{memory: 10GiB}}}}
    sharing: mps
    workdir: {ROOT}
  replicas: 2
  max_concurrency: 4
  timeout_seconds: 30
"""


def wait(ok: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = ok()
            if last:
                return last
        except (httpx.HTTPError, KeyError, ValueError) as e:
            last = e
        time.sleep(0.1)
    # said before Ray's exit handlers run (with the cluster gone, they may end the process first)
    print(f"timed out waiting for {what}: {last!r}", file=sys.stderr, flush=True)
    raise SystemExit(f"timed out waiting for {what}: {last!r}")


def view(name: str) -> dict[str, Any]:
    r = httpx.get(f"{URL}/api/v1/workloads/default/{name}", timeout=5)
    r.raise_for_status()
    return dict(r.json())


def apply(text: str) -> dict[str, Any]:
    r = httpx.post(f"{URL}/api/v1/workloads", content=text, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def workload(name: str, gpu: str, *, selector: str | None = None, sharing: str = "auto") -> str:
    sel = f"  node_selector: {{gpufrac.io/kind: {selector}}}\n" if selector else ""
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}}}\nspec:\n"
        f"  type: service\n  command: [sleep, '3600']\n  resources: {{gpu: {gpu}}}\n"
        f"  sharing: {sharing}\n{sel}"
    )


def _pids_matching(pattern: str) -> list[int]:
    """The processes whose command line matches ``pattern`` (``pgrep -f``, without procps)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if re.search(pattern, line):
                found.append(int(proc.name))
    return found


def lo_up() -> None:
    """Bring the loopback interface up in this (new) network namespace (``ip link set lo up``,
    without iproute2): SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, siocgifflags, ifreq))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b""))


def _kill_node_agents_and_hosts(nodes_dir: Path, own_pids: bool) -> None:
    """What is left of the nodes, found by command line; without PID namespaces, the workloads'
    process groups too, from their ``child.json`` (in a namespace that holds the node's own pids,
    not ones to kill from here: there the namespace took them with it)."""
    for pid in _pids_matching(re.escape(str(nodes_dir))):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if Path(f"/proc/{parent}/cmdline").read_bytes().startswith(b"ray::AgentHost"):
                os.kill(parent, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for child in [] if own_pids else nodes_dir.glob("*/runs/*/*/*/child.json"):
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int(json.loads(child.read_text())["pgid"]), signal.SIGKILL)


def _parent(pid: int) -> int:
    """The parent of process ``pid`` (0 where it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _live_pids(node_dir: Path, name: str) -> list[int]:
    """The shims of workload ``name`` still alive on a node, each holding a copy of it that has not
    ended (a shim outlives its workload's processes). Found by their command lines, as seen from
    outside the node's PID namespace."""
    return _pids_matching(re.escape(f"gpufrac.runtime.shim {node_dir}/runs/default/{name}/"))


class Traffic:
    """Clients sending requests to a deployment through its gateway (``url``), counting the
    answers (status codes, or the error's name where none came)."""

    def __init__(self, url: str = SERVE, clients: int = 4) -> None:
        import threading

        self.url = url
        self.codes: dict[str, int] = {}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                try:
                    code = str(client.post(self.url, content=b'{"inputs": [1, 2]}').status_code)
                except httpx.HTTPError as e:
                    code = type(e).__name__
                self.codes[code] = self.codes.get(code, 0) + 1

    def end(self) -> dict[str, int]:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=40)
        return dict(self.codes)


def _registered(log: Path, proc: subprocess.Popen[bytes], timeout: float = 90.0) -> bool:
    """Whether ``ray start --block`` reports its node up (its log says so) before it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if b"Ray runtime started" in log.read_bytes():
            return True
        time.sleep(0.2)
    return False


def _pid_namespaces() -> bool:
    """Whether this machine lets a node run in its own PID namespace (a container may not allow
    mounting a /proc of its own): else each node is its own process group, as before."""
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False
    )
    return done.returncode == 0


def main(out: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    own_pids = seen["pid_namespaces"] = _pid_namespaces()
    namespace = ["unshare", "--pid", "--fork", "--mount-proc"] if own_pids else []
    # a loaded 2-core machine: raylets get longer to register than Ray's default 30 s
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_raylet_start_wait_time_s": "120"}
    procs: list[subprocess.Popen[bytes]] = []
    nodes: dict[str, subprocess.Popen[bytes]] = {}
    t0 = time.monotonic()
    head_log = out / "ray-head.log"
    head = subprocess.Popen(
        [RAY, "start", "--block", "--head", "--node-ip-address", "127.0.0.1",
         "--port", str(RAY_PORT), "--num-cpus", "0", "--include-dashboard", "false",
         "--disable-usage-stats"],
        env=env, stdout=head_log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    procs.append(head)
    try:
        if not _registered(head_log, head):
            raise SystemExit(f"the Ray head did not start: {head_log.read_text()[-2000:]}")
        for name, (simulate, kind) in NODES.items():  # one at a time: each registered first
            labels = f"gpufrac.io/node={name},gpufrac.io/simulate={simulate},gpufrac.io/kind={kind}"
            for _ in range(3):  # Ray's rare failure to register a raylet: try again
                log = open(out / f"ray-{name}.log", "ab")  # noqa: SIM115
                nodes[name] = subprocess.Popen(
                    # its own PID namespace: killing the node (its process group: unshare and the
                    # namespace's first process) kills every process in it, whatever group each
                    # is in (Ray's workers and gpufrac's workloads are in their own)
                    [*namespace,
                     RAY, "start", "--block", "--address", f"127.0.0.1:{RAY_PORT}",
                     "--node-ip-address", "127.0.0.1", "--num-cpus", "2", "--num-gpus", "1",
                     "--labels", labels, "--disable-usage-stats"],
                    env=env, stdout=log, stderr=log, start_new_session=True,
                )  # fmt: skip
                if _registered(out / f"ray-{name}.log", nodes[name]):
                    break
        control_args = [
            PY, "-m", "gpufrac.cli", "control", "--ray", f"127.0.0.1:{RAY_PORT}",
            "--port", str(CONTROL_PORT), "--gateway-port", str(GATEWAY_PORT),
            "--node-port", str(NODE_PORT),
            "--lease", str(LEASE_S),
            "--data-dir", str(out / "control"), "--node-data-dir", str(out / "nodes"),
        ]  # fmt: skip

        def start_control() -> subprocess.Popen[bytes]:
            log = open(out / "control.log", "ab")  # noqa: SIM115
            p = subprocess.Popen(control_args, stdout=log, stderr=log, start_new_session=True)
            procs.append(p)
            return p

        control = start_control()
        wait(
            lambda: (
                sorted(
                    n["name"]
                    for n in httpx.get(f"{URL}/api/v1/nodes", timeout=2).json()["nodes"]
                    if n["state"] == "alive"
                )
                == sorted(NODES)
            ),
            120,
            "three nodes",
        )
        seen["cluster_up_s"] = round(time.monotonic() - t0, 1)

        def replicas() -> dict[str, dict[str, Any]]:
            got = httpx.get(f"{URL}/api/v1/deployments/default/summer", timeout=5).json()
            return {r["name"]: r for r in got["replicas"]}

        # placement by label; the lease's environment reaches the workload
        starts = []
        for name, gpu, kind, sharing in (
            ("embed", "{mig: 1g.18gb}", "mig", "auto"),
            ("rank", "{memory: 20GiB, compute: 30%}", "mps", "mps"),
            ("mover", "{memory: 10GiB}", None, "mps"),
        ):
            t = time.monotonic()
            apply(workload(name, gpu, selector=kind, sharing=sharing))
            wait(lambda n=name: view(n)["phase"] == "running", 60, f"{name} running")
            starts.append(time.monotonic() - t)
        seen["apply_to_running_s"] = [round(s, 2) for s in starts]
        seen["nodes_of"] = {n: view(n)["node"] for n in ("embed", "rank", "mover")}
        seen["embed_env"] = view("embed")["env"].get("CUDA_VISIBLE_DEVICES", "")

        # Ray actors: on gpufrac leases, and with plain num_gpus fractions
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        import gpufrac.ray

        ray.init(address=f"127.0.0.1:{RAY_PORT}", log_to_driver=False)

        @ray.remote(num_cpus=0)
        class Probe:
            def __init__(self, tag: str = "", *, kind: str = "") -> None:
                self.made_with = [tag, kind]

            def where(self) -> tuple[str, str]:
                return (
                    os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                    ray.get_runtime_context().get_node_id(),
                )

            def gpus(self) -> dict[str, Any]:  # Ray's own view, as Ray libraries read it
                return {
                    "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
                    "accelerator_ids": ray.get_runtime_context().get_accelerator_ids()["GPU"],
                    "env": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                    "made_with": self.made_with,
                }

        @ray.remote(num_cpus=1)  # at most two at once on a node (--num-cpus 2): two workers
        def probe_task(_: int = 0) -> dict[str, Any]:
            return {
                "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
                "env": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                "lease": os.environ.get("GPUFRAC_WORKLOAD", ""),
                "node": ray.get_runtime_context().get_node_id(),
                "pid": os.getpid(),
            }

        t = time.monotonic()
        actor_a, held_a = gpufrac.ray.actor(
            Probe, {"memory": "100GiB"}, "a", server=URL, kind="leased"
        )  # a constructor's positional and keyword arguments beside the lease's keywords
        seen["own_lease_s"] = round(time.monotonic() - t, 2)
        seen["lease_a"] = {"node": held_a.node, "env": held_a.env.get("CUDA_VISIBLE_DEVICES")}
        seen["actor_a"] = ray.get(actor_a.where.remote(), timeout=60)
        seen["actor_a_gpus"] = ray.get(actor_a.gpus.remote(), timeout=60)
        # a task on a lease: what a task on a lease of its own costs, with the lease's time
        # above (its worker is started with the lease's environment; the actor has its own)
        t = time.monotonic()
        seen["task_a"] = ray.get(held_a.remote(probe_task), timeout=60)
        seen["first_task_on_lease_s"] = round(time.monotonic() - t, 2)
        seen["task_on_own_lease_s"] = round(seen["own_lease_s"] + seen["first_task_on_lease_s"], 2)
        seen["lease_a_ray_node"] = gpufrac.ray.ray_node_id(held_a.node)
        try:
            gpufrac.ray.lease({"memory": "100GiB"}, server=URL, timeout_s=3)
            seen["lease_b"] = "placed"
        except gpufrac.ray.LeaseWaits as e:
            seen["lease_b"] = f"waits: {e}"
        # on one node (Ray spreads a second actor once a node is half used, as the lease's token
        # of a GPU may make it), not the lease's, where that token is taken
        other = next(n for n in NODES if n != held_a.node)
        plain = [
            Probe.options(  # type: ignore[attr-defined]
                num_gpus=0.5,
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    gpufrac.ray.ray_node_id(other), soft=False
                ),
            ).remote()
            for _ in range(2)
        ]
        seen["plain_ray"] = ray.get([p.where.remote() for p in plain], timeout=60)
        seen["plain_ray_gpus"] = ray.get([p.gpus.remote() for p in plain], timeout=60)
        for p in plain:  # their GPU in Ray's count back: a leased task asks Ray for a token of it
            ray.kill(p)
        ray.kill(actor_a)
        wait(
            lambda: (
                httpx.get(f"{URL}/api/v1/workloads/{held_a.workload}", timeout=5).status_code == 404
            ),
            15,
            "the lease given back",
        )
        seen["lease_a_released"] = True
        # a driver that dies without giving its lease back stops keeping it alive
        orphan = gpufrac.ray.lease({"memory": "10GiB"}, server=URL, ttl_s=3)
        orphan._stop.set()  # as if its process were gone
        t = time.monotonic()
        wait(
            lambda: (
                httpx.get(f"{URL}/api/v1/workloads/{orphan.workload}", timeout=5).status_code == 404
            ),
            20,
            "the orphaned lease given back",
        )
        seen["orphan_lease_given_back_s"] = round(time.monotonic() - t, 1)
        orphan.released = True  # nothing left to give back at exit

        # a pool of two leases serving 16 tasks in turn: two leases, not 16
        t = time.monotonic()
        with gpufrac.ray.pool({"memory": "10GiB"}, size=2, server=URL) as leases:
            seen["pool_leases_s"] = round(time.monotonic() - t, 2)
            seen["pool_devices"] = sorted(h.env["CUDA_VISIBLE_DEVICES"] for h in leases.leases)
            seen["pool_ray_nodes"] = sorted(gpufrac.ray.ray_node_id(h.node) for h in leases.leases)
            t = time.monotonic()
            seen["pool_tasks"] = ray.get(leases.map(probe_task, range(16)), timeout=60)
            seen["pool_16_s"] = round(time.monotonic() - t, 2)  # with the workers' start
            seen["leases_while_pooled"] = sorted(
                w["name"]
                for w in httpx.get(f"{URL}/api/v1/workloads", timeout=5).json()["workloads"]
                if w["name"].startswith("ray-")
            )
            pooled = [h.workload for h in leases.leases]
        seen["pool_released"] = [
            httpx.get(f"{URL}/api/v1/workloads/{w}", timeout=5).status_code for w in pooled
        ]
        ray.shutdown()

        # the control plane killed and started again: nothing restarted
        kept = ("embed", "rank", "mover")
        before = {n: view(n)["placement"]["epoch"] for n in kept}
        agents = f"gpufrac.cli node .*--data-dir {re.escape(str(out / 'nodes'))}"
        agents_before = sorted(_pids_matching(agents))
        os.killpg(control.pid, signal.SIGKILL)
        control.wait(timeout=10)
        t = time.monotonic()
        control = start_control()
        wait(lambda: httpx.get(f"{URL}/api/v1/health", timeout=1).status_code == 200, 60, "up")
        wait(lambda: all(view(n)["phase"] == "running" for n in before), 30, "views after restart")
        seen["control_restart_to_ready_s"] = round(time.monotonic() - t, 2)
        time.sleep(LEASE_S + 1)
        after = {n: (view(n)["placement"]["epoch"], view(n)["restarts"]) for n in before}
        seen["restart_kept"] = all(after[n] == (before[n], 0) for n in before)
        seen["restart_epochs"] = {"before": before, "after": after}
        seen["agents_through_kill"] = [agents_before, sorted(_pids_matching(agents))]

        # a node agent frozen (SIGSTOP) past its lease: the shims stop its work, which runs once
        # elsewhere; woken, it stops what it had, is told it was lost, and joins again
        frozen = seen["nodes_of"]["mover"]
        old_pid = _live_pids(out / "nodes" / frozen, "mover")
        # (its data directory on the line too: another test's node may be called n1 as well)
        agent_pid = _pids_matching(
            f"gpufrac.cli node .*--name {frozen} .*--data-dir {re.escape(str(out / 'nodes'))}"
        )[0]
        os.kill(agent_pid, signal.SIGSTOP)
        t = time.monotonic()
        elsewhere = wait(
            lambda: (v := view("mover"))["phase"] == "running" and v["node"] != frozen and v,
            60,
            "mover away from the frozen node",
        )
        seen["frozen_old_copy_alive_when_moved"] = _live_pids(out / "nodes" / frozen, "mover")
        seen["frozen_old_pids"] = old_pid
        seen["freeze_to_replaced_s"] = round(time.monotonic() - t, 2)
        os.kill(agent_pid, signal.SIGCONT)
        wait(
            lambda: view("embed")["phase"] == view("rank")["phase"] == "running",
            60,
            "embed and rank running again (rank back on its woken node, where its label is)",
        )
        seen["thawed_runs_mover"] = bool(_live_pids(out / "nodes" / frozen, "mover"))
        seen["mover_after_freeze"] = elsewhere["node"]

        # a deployment: its replicas spread over the two nodes that take MPS work (n0 is MIG)
        apply(DEPLOYMENT)
        wait(lambda: sum(r["ready"] for r in replicas().values()) == 2, 90, "two replicas ready")
        seen["replica_nodes"] = sorted(r["node"] for r in replicas().values())
        r = httpx.post(SERVE, content=b'{"inputs": [1, 2, 3]}', timeout=30)
        seen["served"] = [r.status_code, r.json()]

        # a node killed (its PID namespace: its raylet, its node agent, its workloads) under
        # traffic: its work runs on another node, once; the deployment answers every request
        lost = view("mover")["node"]
        if lost not in seen["replica_nodes"]:  # mover moved to n0: kill a replica's node
            lost = seen["replica_nodes"][0]
        on_lost = [n for n, r in replicas().items() if r["node"] == lost]
        traffic = Traffic()
        time.sleep(2)
        t = time.monotonic()
        os.killpg(nodes[lost].pid, signal.SIGKILL)
        time.sleep(0.5)
        seen["killed_node_processes_left"] = _pids_matching(re.escape(str(out / "nodes" / lost)))
        if view("mover")["node"] == lost:
            moved = wait(
                lambda: (v := view("mover"))["phase"] == "running" and v["node"] != lost and v,
                60,
                "mover elsewhere",
            )
        else:
            moved = view("mover")
        seen["node_loss_to_replaced_s"] = round(time.monotonic() - t, 2)
        wait(
            lambda: all((r := replicas()[n])["ready"] and r["node"] != lost for n in on_lost),
            60,
            "the lost node's replica ready elsewhere",
        )
        seen["replica_loss_to_replaced_s"] = round(time.monotonic() - t, 2)
        time.sleep(1)
        seen["traffic_through_node_loss"] = traffic.end()
        seen["replica_nodes_after"] = sorted(r["node"] for r in replicas().values())
        seen["mover_after"] = moved["node"]
        seen["embed_after"] = view("embed")["phase"]  # its node stays or goes with the loss
        seen["nodes_after"] = {
            n["name"]: n["state"]
            for n in httpx.get(f"{URL}/api/v1/nodes", timeout=5).json()["nodes"]
        }
        seen["lost"] = lost
        seen["old_copies_alive"] = _live_pids(out / "nodes" / lost, "mover")
        seen["apply_to_running_p50_s"] = round(statistics.median(starts), 2)

        # Ray ending on a node (its worker killed, as `ray stop` there does): the agent ends too
        first = sorted(_pids_matching(agents))[0]
        host = _parent(first)
        assert host > 1, (first, host)  # (never kill(0): this process group)
        os.kill(host, signal.SIGKILL)
        deadline = time.monotonic() + 10  # (ended, it is a zombie of its namespace's first
        while first in _pids_matching(agents) and time.monotonic() < deadline:  # process: no
            time.sleep(0.1)  # command line)
        seen["agent_left_after_its_actor"] = first in _pids_matching(agents)

        # the control plane stopped cleanly (SIGTERM): it stops the node agents it started
        agent_pids = _pids_matching(agents)
        hosts = {_parent(pid) for pid in agent_pids}  # the Ray actors (ray::AgentHost) running them
        seen["agents_before_stop"] = len(agent_pids)
        t = time.monotonic()
        control.send_signal(signal.SIGTERM)
        seen["control_stop_rc"] = control.wait(timeout=60)
        deadline = time.monotonic() + 20
        while (left := _pids_matching(agents)) and time.monotonic() < deadline:
            time.sleep(0.1)
        seen["agents_left_after_stop"] = left
        seen["control_stop_to_agents_gone_s"] = round(time.monotonic() - t, 2)
        while any(Path(f"/proc/{p}").exists() for p in hosts) and time.monotonic() < deadline:
            time.sleep(0.1)
        seen["agent_hosts_left"] = [p for p in hosts if p and Path(f"/proc/{p}").exists()]
        return seen
    finally:
        for p in [*procs, *nodes.values()]:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        # each Ray node in its own process group, killed above: no `ray stop`, which would stop
        # every Ray cluster on the machine. Ray's workers leave their node's group: the actors
        # that ran the node agents are found as the agents' parents
        _kill_node_agents_and_hosts(out / "nodes", own_pids)
        for pid in _pids_matching(re.escape(str(out / "nodes"))):  # shims left
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--lo-up"]:  # run by `unshare -n`: the new namespace's loopback is down
        lo_up()
        args = args[1:]
    try:
        result = main(Path(args[0]))
    except BaseException:  # said last on stderr (where the test shows its tail), and gone at once:
        import traceback  # Ray's exit handler would wait 60 s for the cluster ended above, then

        traceback.print_exc()  # abort, its own words burying these
        sys.stderr.flush()
        os._exit(1)
    print(json.dumps(result))
