"""Gateway benchmark: the request gateway's data path and autoscaling, against baselines in the same
run.

1. Data path, a trivial CPU model (``examples.serving.models:echo_sum``) behind six configurations,
   each measured with wrk; wrk, nginx and HAProxy are Debian's, installed here with apt-get when
   missing and running as root (nginx and HAProxy are left out, and said so, where they cannot be):

   * **direct**: wrk straight to one replica server (the floor);
   * **aiohttp proxy** (the baseline): a minimal reverse proxy written here (one shared
     ``aiohttp.ClientSession`` with keep-alive, a catch-all route forwarding method, path, headers
     and body), in front of the same replica;
   * **nginx**: one worker, a keep-alive upstream (``upstream`` block with ``keepalive``,
     ``proxy_http_version 1.1``, ``proxy_set_header Connection ""``), access log off;
   * **HAProxy**: one thread (``nbthread 1``), ``mode http``, ``http-reuse always``;
   * **gpufrac gateway**: ``python -m gpufrac.serving.gateway`` with one route to the same replica.

   Servers are pinned to the first CPU and wrk to the second (``taskset``), as in the peer numbers
   (``../shared/reference/gateway-peers.md``): p50/p99 at 1 connection; requests per second and p99
   at 32 connections. The machine is noisy, so the configurations are measured interleaved, in
   three rounds (each round in a rotated order), and the table shows each figure's median over the
   rounds; the latency a proxy adds (over direct) and its throughput over nginx's are taken within
   each round, then their median. Then the same 32 connections once more with the servers and wrk
   unpinned.
2. Autoscaling: a real agent over simulated GPUs (``GPUFRAC_SIMULATE=h200:2``) serves a Deployment
   of ``slow_sum`` (20 ms a request, at most 4 in flight per replica, autoscaled 1..4 replicas with
   ``target_in_flight`` 2); the project's own load generator (``gpufrac.cli.serve_cmds.run_load``)
   steps from 1 to 20 closed-loop clients and back to 1, while the deployment is polled for its
   replicas: replicas over time, time from the start of the overload until a second replica is
   ready, non-2xx responses below capacity, and errors while the deployment scales back down.

Targets (the issue): the gateway adds no more latency at p50 than the aiohttp baseline and sustains
at least its throughput; its throughput at 32 connections is at least 0.6x nginx's and it adds at
most 0.15 ms at p50 over direct; a new replica serves within 10 s of sustained overload; zero
non-2xx below capacity, and no request lost during scale-down.

Run: .venv/bin/python bench/gateway.py [--quick]   (about 4 minutes; --quick about 2.5)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
if SRC.is_dir() and str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

BODY = b'{"inputs": [1, 2, 3]}'
HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    "transfer-encoding",
    "content-length",
    "host",
}


# -- the baseline: a minimal aiohttp reverse proxy (run as its own process) ------------------------


def aiohttp_proxy(port: int, upstream_port: int) -> None:
    """Forward every request to ``127.0.0.1:upstream_port``; print ``ready PORT`` once listening."""
    import aiohttp
    from aiohttp import web

    upstream = f"http://127.0.0.1:{upstream_port}"

    async def forward(request: web.Request) -> web.Response:
        session: aiohttp.ClientSession = request.app["session"]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with session.request(
            request.method, upstream + request.path_qs, data=await request.read(), headers=headers
        ) as resp:
            body = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP}
            return web.Response(body=body, status=resp.status, headers=out)

    async def open_session(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=60),
            auto_decompress=False,
        )

    async def close_session(app: web.Application) -> None:
        await app["session"].close()

    async def main() -> None:
        app = web.Application()
        app.on_startup.append(open_session)
        app.on_cleanup.append(close_session)
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
        print(f"ready {port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


# -- processes -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(SRC), str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def start(cmd: list[str], ready: str, log: Path, timeout: float = 30.0) -> subprocess.Popen[bytes]:
    """Start ``cmd`` (in the repository root) and wait for a stdout line starting with ``ready``."""
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if line.startswith(ready):
            return proc
        if not line and proc.poll() is not None:
            break
    stop(proc)
    raise RuntimeError(f"{' '.join(cmd)} did not print {ready!r}; see {log}")


Process = subprocess.Popen[bytes]


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def set_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (what ``taskset -a -p`` does)."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task.name), cpus)


# -- wrk -------------------------------------------------------------------------------------------


def find_tool(name: str) -> str | None:
    """``name`` on PATH, or in the system's sbin directories (nginx and HAProxy live there)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def ensure_tool(name: str, package: str) -> str | None:
    """Debian's ``package`` for the program ``name``: installed with apt-get when missing and this
    is root, else None (with a line saying how to install it)."""
    found = find_tool(name)
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"{name} is missing: apt-get install -y {package}", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}

        def apt(*args: str) -> int:
            done = subprocess.run(["apt-get", *args], env=env, capture_output=True, check=False)
            return done.returncode

        if apt("install", "-y", package) != 0:
            apt("update")  # an image without package lists
            apt("install", "-y", package)
        return find_tool(name)
    print(
        f"{name} is not installed and this is not root: install it with `sudo apt-get install -y"
        f" {package}` (Debian/Ubuntu), then run this benchmark again",
        flush=True,
    )
    return None


def ensure_wrk() -> str | None:
    return ensure_tool("wrk", "wrk")


_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def parse_wrk(out: str) -> dict[str, float]:
    got: dict[str, float] = {"non_2xx": 0, "socket_errors": 0}
    for line in out.splitlines():
        m = re.match(r"\s*(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s|m)\s*$", line)
        if m:
            got[f"p{m.group(1)}"] = float(m.group(2)) * _UNIT[m.group(3)]
        m = re.match(r"\s*Requests/sec:\s+([\d.]+)", line)
        if m:
            got["rps"] = float(m.group(1))
        m = re.match(r"\s*Non-2xx or 3xx responses:\s+(\d+)", line)
        if m:
            got["non_2xx"] = int(m.group(1))
        m = re.match(r"\s*Socket errors:(.*)", line)
        if m:
            got["socket_errors"] = sum(int(x) for x in re.findall(r"\d+", m.group(1)))
    if "p50" not in got or "rps" not in got:
        raise RuntimeError(f"could not read wrk's output:\n{out}")
    return got


def run_wrk(
    wrk: str, url: str, conns: int, seconds: int, lua: Path, cpu: int | None
) -> dict[str, float]:
    cmd = [wrk, "-t1", f"-c{conns}", f"-d{seconds}s", "--latency", "-s", str(lua), url]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30, check=True)
    return parse_wrk(out.stdout)


DIRECT = "direct (replica server)"
BASELINE = "aiohttp proxy (baseline)"
NGINX = "nginx"
HAPROXY = "HAProxy"
GATEWAY = "gpufrac gateway"


def nginx_conf(tmp: Path, port: int, upstream_port: int) -> Path:
    """One worker, a keep-alive upstream pool, no access log; everything it writes under ``tmp``."""
    conf = tmp / "nginx.conf"
    conf.write_text(
        f"""worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    fastcgi_temp_path {tmp}/nginx-fastcgi;
    uwsgi_temp_path {tmp}/nginx-uwsgi;
    scgi_temp_path {tmp}/nginx-scgi;
    upstream replica {{
        server 127.0.0.1:{upstream_port};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=1024;
        location / {{
            proxy_pass http://replica;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""
    )
    return conf


def haproxy_conf(tmp: Path, port: int, upstream_port: int) -> Path:
    """One thread, HTTP mode, idle server connections reused by any request."""
    conf = tmp / "haproxy.cfg"
    conf.write_text(
        f"""global
    nbthread 1
    maxconn 4096

defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    http-reuse always

frontend bench
    bind 127.0.0.1:{port}
    default_backend replica

backend replica
    server r1 127.0.0.1:{upstream_port}
"""
    )
    return conf


def start_listening(cmd: list[str], port: int, log: Path, timeout: float = 30.0) -> Process:
    """Start ``cmd`` (a server that prints nothing when ready) and wait until ``port`` accepts."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    stop(proc)
    raise RuntimeError(f"{' '.join(cmd)} did not listen on {port}; see {log}")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (nginx's worker is its master's child)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def measure(wrk: str, url: str, seconds: int, lua: Path, cpu: int | None) -> dict[str, float]:
    run_wrk(wrk, url, 32, 1, lua, cpu)  # warm: connections, pools, caches
    c1 = run_wrk(wrk, url, 1, seconds, lua, cpu)
    c32 = run_wrk(wrk, url, 32, seconds, lua, cpu)
    return {
        "p50_c1": c1["p50"],
        "p99_c1": c1["p99"],
        "rps_c32": c32["rps"],
        "p99_c32": c32["p99"],
        "non_2xx": c1["non_2xx"] + c32["non_2xx"],
        "socket_errors": c1["socket_errors"] + c32["socket_errors"],
    }


def data_path(wrk: str, seconds: int, rounds: int, tmp: Path) -> dict[str, Any]:
    """Every configuration, ``rounds`` times interleaved (pinned), then once unpinned: per
    configuration its measurements in round order, or the reason it was left out."""
    lua = tmp / "post.lua"
    lua.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = '{BODY.decode()}'\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, wrk_cpu = (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)
    pin = ["taskset", "-c", str(server_cpu)] if server_cpu is not None else []
    py = sys.executable
    procs: list[Process] = []
    configs: dict[str, str] = {}  # name -> URL
    missing: dict[str, str] = {}  # name -> why it is not measured
    try:
        rport, pport, gport, nport, hport = (free_port() for _ in range(5))
        model = "examples.serving.models:echo_sum"
        replica = [*pin, py, "-m", "gpufrac.serving.replica", model, "--port", str(rport)]
        procs.append(start(replica, "serving on", tmp / "replica.log"))
        configs[DIRECT] = f"http://127.0.0.1:{rport}/predict"
        proxy = [*pin, py, str(Path(__file__).resolve()), "--aiohttp-proxy", str(pport)]
        procs.append(start([*proxy, str(rport)], "ready", tmp / "aiohttp.log"))
        configs[BASELINE] = f"http://127.0.0.1:{pport}/predict"
        nginx = ensure_tool("nginx", "nginx")
        if nginx is not None:
            conf = nginx_conf(tmp, nport, rport)
            cmd = [*pin, nginx, "-p", str(tmp), "-c", str(conf)]
            procs.append(start_listening(cmd, nport, tmp / "nginx.log"))
            configs[NGINX] = f"http://127.0.0.1:{nport}/predict"
        else:
            missing[NGINX] = "not installed"
        haproxy = ensure_tool("haproxy", "haproxy")
        if haproxy is not None:
            cmd = [*pin, haproxy, "-db", "-f", str(haproxy_conf(tmp, hport, rport))]
            procs.append(start_listening(cmd, hport, tmp / "haproxy.log"))
            configs[HAPROXY] = f"http://127.0.0.1:{hport}/predict"
        else:
            missing[HAPROXY] = "not installed"
        route = {
            "name": "m",
            "replicas": [{"id": "r1", "port": rport}],
            "max_concurrency": 64,
            "queue_limit": 1024,
        }
        gateway = [*pin, py, "-m", "gpufrac.serving.gateway", "--port", str(gport)]
        procs.append(start([*gateway, "--route", json.dumps(route)], "ready", tmp / "gateway.log"))
        configs[GATEWAY] = f"http://127.0.0.1:{gport}/serve/m/predict"
        names = list(configs)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            print(f"  round {r + 1} of {rounds} (pinned): {', '.join(order)}", flush=True)
            for name in order:
                runs[name].append(measure(wrk, configs[name], seconds, lua, wrk_cpu))
        everywhere = set(cpus)
        for p in procs:
            for pid in process_tree(p.pid):
                set_affinity(pid, everywhere)
        print("  unpinned, 32 connections", flush=True)
        free: dict[str, dict[str, float]] = {}
        for name in names:
            run_wrk(wrk, configs[name], 32, 1, lua, None)
            free[name] = run_wrk(wrk, configs[name], 32, seconds, lua, None)
    finally:
        for p in reversed(procs):
            stop(p)
    return {"runs": runs, "free": free, "missing": missing, "rounds": rounds}


# -- part 2: the autoscaling step ------------------------------------------------------------------

AGENT = [sys.executable, "-m", "gpufrac.cli", "agent"]
MANIFEST = """\
apiVersion: gpufrac/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  template:
    model: examples.serving.models:slow_sum
    workdir: {workdir}
    resources: {{gpu: {{fraction: 0.25}}}}
    sharing: timeslice
    priority: high
  autoscale:
    min_replicas: 1
    max_replicas: 4
    target_in_flight: 2
    scale_up_delay_seconds: 2
    scale_down_delay_seconds: 5
    traffic_history_seconds: 5
  max_concurrency: 4
  queue_limit: 256
  timeout_seconds: 30
"""


def kill_leftovers(data_dir: Path) -> None:
    """Stop every process started under ``data_dir`` (shims, found by the run directory on their
    command line, first), then the process group of each workload a shim started."""
    from gpufrac.runtime.shim import read_status

    where = str(data_dir).encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(proc.name) != os.getpid() and any(where in a for a in args):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(proc.name), signal.SIGKILL)
    for run in data_dir.glob("**/runs/*/*/*"):
        with contextlib.suppress(Exception):
            status = read_status(run)
            if status.child_pid and not status.done:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(status.child_pid, signal.SIGKILL)


async def drive(
    api: str, name: str, url: str, steps: list[int], step_s: float
) -> tuple[list[dict[str, Any]], list[tuple[float, int, int, int]], list[Any], list[Any], float]:
    """Run the load while polling the deployment twice a second."""
    import httpx

    from gpufrac.cli.serve_cmds import run_load

    ticks: list[tuple[float, int, int, int]] = []  # (at, clients, responses, non-2xx) per second
    records: list[tuple[float, int]] = []  # (at, status) of every response
    # (at, replicas ready, wanted, requests served by each ready replica)
    polls: list[tuple[float, int, int, dict[str, int]]] = []
    step_starts: list[tuple[float, int]] = []
    last = [time.monotonic(), -1]

    def on_second(n: int, got: list[tuple[float, float, int]]) -> None:
        now = time.monotonic()
        if n != last[1]:
            step_starts.append((last[0], n))
        new = [(at, status) for at, _, status in got if at > last[0]]
        records.extend(new)
        ticks.append((now, n, len(new), sum(1 for _, s in new if not 200 <= s < 300)))
        last[0], last[1] = now, n

    done = asyncio.Event()

    async def poll() -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            while not done.is_set():
                t = time.monotonic()
                with contextlib.suppress(httpx.HTTPError):
                    d = (await client.get(f"{api}/api/v1/deployments/default/{name}")).json()
                    served = {
                        r["name"]: int(r["served"])
                        for r in d["replicas"]
                        if r["ready"] and not r["draining"]
                    }
                    polls.append((t, d["replicas_ready"], d["replicas_wanted"] or 0, served))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), max(0.05, 0.5 - (time.monotonic() - t)))

    poller = asyncio.ensure_future(poll())
    t0 = time.monotonic()
    wall = time.time() - t0  # to place the agent's events (wall clock) on this timeline
    last[0] = t0
    try:
        rows = await run_load(url, BODY, steps, step_s, on_second)
    finally:
        done.set()
        await poller
    return rows, ticks, [records, step_starts, wall], polls, t0


def autoscaling(quick: bool, tmp: Path) -> dict[str, Any]:
    import httpx

    step_s = 4.0 if quick else 5.0
    tail = math.ceil(24 / step_s)  # long enough for the scale-down to happen under load
    steps = [1, 20, 20, 20] + [1] * tail
    data = tmp / "agent-data"
    api_port, gw_port = free_port(), free_port()
    env = {**child_env(), "GPUFRAC_SIMULATE": "h200:2", "GPUFRAC_DATA_DIR": str(data)}
    with open(tmp / "agent.log", "ab") as log:
        agent = subprocess.Popen(
            [*AGENT, "--port", str(api_port), "--gateway-port", str(gw_port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
    api = f"http://127.0.0.1:{api_port}"
    name = "gwbench"
    try:
        with httpx.Client(timeout=30) as client:
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(api + "/api/v1/health").status_code == 200:
                        break
                if time.monotonic() > deadline or agent.poll() is not None:
                    raise RuntimeError(f"the agent did not answer; see {tmp / 'agent.log'}")
                time.sleep(0.2)
            t_apply = time.monotonic()
            manifest = MANIFEST.format(name=name, workdir=REPO)
            r = client.post(api + "/api/v1/deployments", content=manifest)
            if r.status_code != 200:
                raise RuntimeError(f"apply failed: {r.status_code} {r.text}")
            url = f"http://127.0.0.1:{gw_port}/serve/{name}/predict"
            deadline = time.monotonic() + 90
            while True:
                d = client.get(f"{api}/api/v1/deployments/default/{name}").json()
                if d["replicas_ready"] >= 1:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no replica ready in 90 s: {d}")
                time.sleep(0.2)
            first_ready_s = time.monotonic() - t_apply
        rows, ticks, (records, step_starts, wall), polls, t0 = asyncio.run(
            drive(api, name, url, steps, step_s)
        )
        with httpx.Client(timeout=30) as client:
            final = client.get(f"{api}/api/v1/deployments/default/{name}").json()
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        kill_leftovers(data)
    return {
        "steps": steps,
        "step_s": step_s,
        "rows": rows,
        "ticks": ticks,
        "records": records,
        "step_starts": step_starts,
        "polls": polls,
        "t0": t0,
        "wall": wall,
        "first_ready_s": first_ready_s,
        "final": final,
    }


# -- report ----------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def report_data_path(res: dict[str, Any], seconds: int) -> list[bool]:
    runs: dict[str, list[dict[str, float]]] = res["runs"]
    free: dict[str, dict[str, float]] = res["free"]
    rounds = res["rounds"]
    print(
        f"\n## Data path: trivial CPU model, servers on CPU 0, wrk -t1 on CPU 1, {seconds} s a run,"
        f" medians of {rounds} interleaved rounds\n"
    )
    print(
        "| config | p50 c=1 ms | added p50 ms | p99 c=1 ms | req/s c=32 (rounds' range) | "
        "p99 c=32 ms | ratio vs nginx | unpinned req/s c=32 | non-2xx |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    direct = runs[DIRECT]
    nginx = runs.get(NGINX)

    def per_round(name: str, key: str, against: list[dict[str, float]], ratio: bool) -> float:
        pairs = zip(runs[name], against, strict=True)
        if ratio:
            return median([a[key] / b[key] for a, b in pairs])
        return median([a[key] - b[key] for a, b in pairs])

    added: dict[str, float] = {}
    vs_nginx: dict[str, float] = {}
    for name, rs in runs.items():
        m = {k: median([r[k] for r in rs]) for k in rs[0]}
        added[name] = per_round(name, "p50_c1", direct, ratio=False)
        rps = [r["rps_c32"] for r in rs]
        span = f"{m['rps_c32']:,.0f} ({min(rps):,.0f}-{max(rps):,.0f})"
        ratio = "-"
        if nginx is not None:
            vs_nginx[name] = per_round(name, "rps_c32", nginx, ratio=True)
            ratio = f"{vs_nginx[name]:.2f}x"
        bad = sum(r["non_2xx"] for r in rs) + free[name]["non_2xx"]
        errors = sum(r["socket_errors"] for r in rs) + free[name]["socket_errors"]
        note = f"{bad:.0f}" + (f" (+{errors:.0f} socket errors)" if errors else "")
        extra = "-" if name == DIRECT else f"{added[name]:+.3f}"
        print(
            f"| {name} | {m['p50_c1']:.3f} | {extra} | {m['p99_c1']:.2f} | {span} | "
            f"{m['p99_c32']:.1f} | {ratio} | {free[name]['rps']:,.0f} | {note} |"
        )
    for name, why in res["missing"].items():
        print(f"| {name} | {why} | | | | | | | |")
    gw, base = runs[GATEWAY], runs[BASELINE]
    print(
        f"\nadded latency at p50 vs direct: gateway {added[GATEWAY]:.3f} ms, aiohttp "
        f"{added[BASELINE]:.3f} ms"
        + (f", nginx {added[NGINX]:.3f} ms" if NGINX in added else "")
        + (f", HAProxy {added[HAPROXY]:.3f} ms" if HAPROXY in added else "")
    )
    gw_rps, base_rps = median([r["rps_c32"] for r in gw]), median([r["rps_c32"] for r in base])
    lat_ok = added[GATEWAY] <= added[BASELINE]
    rps_ok = gw_rps >= base_rps
    free_ok = free[GATEWAY]["rps"] >= free[BASELINE]["rps"]
    clean = all(
        r["non_2xx"] == 0 and r["socket_errors"] == 0 for rs in runs.values() for r in rs
    ) and all(f["non_2xx"] == 0 and f["socket_errors"] == 0 for f in free.values())
    print(
        f"target: gateway adds no more p50 latency than the aiohttp baseline: {verdict(lat_ok)} "
        f"({added[GATEWAY]:.3f} vs {added[BASELINE]:.3f} ms)"
    )
    print(
        f"target: gateway throughput at least the baseline's, pinned: {verdict(rps_ok)} "
        f"({gw_rps:,.0f} vs {base_rps:,.0f} req/s); unpinned: {verdict(free_ok)} "
        f"({free[GATEWAY]['rps']:,.0f} vs {free[BASELINE]['rps']:,.0f} req/s)"
    )
    added_ok = added[GATEWAY] <= 0.15
    print(
        f"target: gateway adds at most 0.15 ms at p50 over direct: {verdict(added_ok)} "
        f"({added[GATEWAY]:.3f} ms)"
    )
    verdicts = [lat_ok, rps_ok, free_ok, added_ok, clean]
    if GATEWAY in vs_nginx:
        nginx_ok = vs_nginx[GATEWAY] >= 0.6
        print(
            f"target: gateway throughput at 32 connections at least 0.6x nginx's: "
            f"{verdict(nginx_ok)} ({vs_nginx[GATEWAY]:.2f}x)"
        )
        verdicts.append(nginx_ok)
    else:
        print("target: gateway throughput at least 0.6x nginx's: not measured (no nginx)")
    print(f"target: zero non-2xx and socket errors below capacity (wrk): {verdict(clean)}")
    return verdicts


def report_autoscaling(a: dict[str, Any]) -> list[bool]:
    t0, polls, ticks = a["t0"], a["polls"], a["ticks"]
    print(
        f"\n## Autoscaling step: slow_sum (20 ms a request), 1..4 replicas, target_in_flight 2, "
        f"max_concurrency 4; clients {','.join(map(str, a['steps']))}, {a['step_s']:g} s a step\n"
    )
    print(f"first replica ready {a['first_ready_s']:.1f} s after the apply\n")
    print("| second | clients | replicas ready | wanted | req/s | non-2xx |")
    print("|---|---|---|---|---|---|")
    for at, n, count, bad in ticks:
        before = [p for p in polls if p[0] <= at]
        ready, wanted = (before[-1][1], before[-1][2]) if before else ("-", "-")
        print(f"| {at - t0:.0f} | {n} | {ready} | {wanted} | {count} | {bad} |")
    print("\nper step (run_load's summary):\n")
    print("| clients | requests | req/s | p50 ms | p99 ms | non-2xx |")
    print("|---|---|---|---|---|---|")
    for r in a["rows"]:
        p50 = "-" if r["p50_ms"] is None else f"{r['p50_ms']:.1f}"
        p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.1f}"
        print(
            f"| {r['clients']} | {r['requests']} | {r['rate']:.0f} | {p50} | {p99} | "
            f"{r['non_2xx']} |"
        )
    overload = next((t for t, n in a["step_starts"] if n > 1), None)
    ready_at = next((p[0] for p in polls if overload and p[0] >= overload and p[1] > 1), None)
    served_at = next(
        (
            p[0]
            for p in polls
            if overload and p[0] >= overload and sum(1 for s in p[3].values() if s > 0) > 1
        ),
        None,
    )
    peak = max((p[2] for p in polls), default=0)
    peak_at = next((p[0] for p in polls if p[2] == peak), None)
    down_at = next((p[0] for p in polls if peak_at and p[0] > peak_at and p[2] < peak), None)
    removed_at = next(
        (p[0] for p in polls if down_at and p[0] >= down_at and p[1] < max(q[1] for q in polls)),
        None,
    )
    below = sum(r["non_2xx"] for r in a["rows"] if r["clients"] == 1)
    above = sum(r["non_2xx"] for r in a["rows"] if r["clients"] > 1)
    lost_down = (
        sum(1 for at, s in a["records"] if at >= down_at and not 200 <= s < 300)
        if down_at
        else None
    )
    in_time = ready_at is not None and overload is not None and ready_at - overload <= 10.0
    print()
    if ready_at is not None and overload is not None:
        served = f"{served_at - overload:.1f} s" if served_at else "not seen"
        print(
            f"time until a new replica serves (overload start to replicas_ready > 1): "
            f"{ready_at - overload:.1f} s (a second replica has served requests: {served})"
        )
    else:
        print("time until a new replica serves: no second replica became ready during the load")
    print(f"peak replicas wanted: {peak}; ready at the end: {a['final']['replicas_ready']}")
    if down_at is not None:
        removed = f"{removed_at - t0:.0f}" if removed_at else "not within the load"
        print(
            f"scale-down: wanted fell at second {down_at - t0:.0f}, a replica left the route at "
            f"second {removed}; non-2xx from then to the end of the load: {lost_down}"
        )
    else:
        print("scale-down: did not start within the load")
    if overload is not None:
        print("autoscaler events (seconds from the start of the overload):")
        for e in sorted(a["final"].get("events", []), key=lambda e: e["at"]):
            at = e["at"] - a["wall"] - overload
            if e["kind"] in ("autoscaler", "scaled", "replica_removed") and at > -1:
                print(f"  {at:+6.1f} s  {e['kind']}: {e['message']}")
    tr = a["final"].get("traffic") or {}
    print(
        f"gateway counters: {tr.get('rejected', 0)} rejected (429), {tr.get('errors', 0)} errors, "
        f"{tr.get('retries', 0)} retried; non-2xx in the 20-client steps: {above}"
    )
    print(f"target: a new replica serving within 10 s of sustained overload: {verdict(in_time)}")
    print(f"target: zero non-2xx below capacity (the 1-client steps): {verdict(below == 0)}")
    lost_ok = down_at is not None and removed_at is not None and lost_down == 0
    print(
        f"target: no request lost during scale-down: {verdict(lost_ok)}"
        + ("" if removed_at else " (no replica was removed under load)")
    )
    return [in_time, below == 0, lost_ok]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="shorter runs (wrk 2 s, steps 4 s)")
    p.add_argument(
        "--aiohttp-proxy",
        nargs=2,
        type=int,
        metavar=("PORT", "UPSTREAM_PORT"),
        help="run the baseline proxy (used by the benchmark itself)",
    )
    args = p.parse_args()
    if args.aiohttp_proxy:
        aiohttp_proxy(*args.aiohttp_proxy)
        return 0
    seconds = 2 if args.quick else 5
    tmp = Path(tempfile.mkdtemp(prefix="gpufrac-gwbench-"))
    print(f"gateway benchmark on {os.cpu_count()} CPU cores, Python {sys.version.split()[0]}")
    wrk = ensure_wrk()
    res = None
    if wrk is not None:
        print("part 1: data path", flush=True)
        res = data_path(wrk, seconds, 3, tmp)
    print("part 2: autoscaling step", flush=True)
    auto = autoscaling(args.quick, tmp)
    if res is not None:
        report_data_path(res, seconds)
    else:
        print("\n## Data path: skipped, wrk is not installed (see above)")
    report_autoscaling(auto)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if wrk is not None else 2


if __name__ == "__main__":
    sys.exit(main())
