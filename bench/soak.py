"""Soak: mixed API and gateway traffic from several tenants, with faults injected: against one
agent (the agent phase, here), then against a cluster (the cluster phase: bench/soak_cluster.py,
a control plane with three local nodes, a hostile tenant's bounded floods; see its docstring).

The agent phase: a real agent (its own process, API tokens for two tenants and the admin,
simulated GPUs) runs for ``--minutes`` (10 by default). Meanwhile:

* each tenant applies, reads and deletes short jobs and services through the API (keeping at
  most ``KEEP`` applied, so the agent holds as much state at the end as after the first minute),
  lists and reads events, and calls its own deployment through the gateway (a replica server with
  the trivial ``echo_sum`` model), and now and then another tenant's (which must be refused);
* every ``--fault-every`` seconds one fault, in turn: ``kill -9`` of a random workload's shim, of
  the request gateway, of the QoS arbiter; and the data directory made unwritable for 10 s (it lives
  on a small tmpfs that is filled up, since file modes do not stop root; skipped with a note where
  tmpfs cannot be mounted).

Reported: requests made, unexpected answers (a 5xx other than the 503 the API gives while its store
cannot be written, or a 4xx where none was expected), workloads lost (applied and acknowledged but
not stored at the end) or doubled (two live processes of one workload), the agent's memory (RSS) at
the start and the end, and the API's p50/p99 outside and during faults. Targets: 0 lost or doubled,
memory growth under 10%. A benchmark, not part of ``make test``.

Run: .venv/bin/python bench/soak.py [--phase agent|cluster|both] [--minutes 10] [--fault-every 20]
(``--minutes`` is each phase's; both phases by default).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
TOKENS = {
    "alpha": "alpha-token-0123456789abcdef",
    "beta": "beta-token-0123456789abcdef",
    "admin": "admin-token-0123456789abcdef",
}
FLEET = "h200:2,h200:2:mig"
KEEP = 20  # each tenant keeps at most this many workloads applied (then it deletes one first)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Tally:
    requests: int = 0
    unexpected: list[str] = field(default_factory=list)
    api_ms: list[tuple[float, float, bool]] = field(default_factory=list)  # (at, ms, in a fault)
    applied: set[str] = field(default_factory=set)  # acknowledged and not deleted since
    lock: threading.Lock = field(default_factory=threading.Lock)
    faulted: threading.Event = field(default_factory=threading.Event)

    def saw(self, what: str, r: httpx.Response | None, ok: tuple[int, ...], t0: float) -> None:
        ms = (time.perf_counter() - t0) * 1000
        with self.lock:
            self.requests += 1
            self.api_ms.append((time.monotonic(), ms, self.faulted.is_set()))
            if r is None:
                self.unexpected.append(f"{what}: no answer")
            elif r.status_code not in ok and not (r.status_code == 503 and self.faulted.is_set()):
                self.unexpected.append(f"{what}: {r.status_code} {r.text[:120]}")


def job(tenant: str, name: str, kind: str) -> str:
    code = "import time; time.sleep(%s)" % ("1.5" if kind == "job" else "600")
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}, tenant: {tenant}}}\n"
        f"spec:\n  type: {kind}\n  command: [{sys.executable}, -c, {code!r}]\n"
        "  resources: {gpu: {fraction: 0.1}}\n  sharing: timeslice\n"
    )


def deployment(tenant: str) -> str:
    return (
        f"apiVersion: gpufrac/v1\nkind: Deployment\nmetadata: {{name: echo, tenant: {tenant}}}\n"
        "spec:\n  replicas: 1\n  template:\n    model: examples.serving.models:echo_sum\n"
        f"    workdir: {REPO}\n    resources: {{gpu: {{fraction: 0.1}}}}\n    sharing: timeslice\n"
    )


def tenant_loop(
    url: str, gateway: str, tenant: str, other: str, tally: Tally, stop: threading.Event
) -> None:
    h = {"authorization": f"Bearer {TOKENS[tenant]}"}
    rng = random.Random(tenant)
    api = httpx.Client(base_url=url + "/api/v1", headers=h, timeout=30)
    gw = httpx.Client(headers=h, timeout=30)
    n = 0
    while not stop.is_set():
        n += 1
        op = rng.random()
        t0 = time.perf_counter()
        try:
            with tally.lock:
                mine = sorted(k for k in tally.applied if k.startswith(tenant + "/"))
            # at most KEEP applied: the agent holds as much state at the end as at the start
            if op < 0.25 and len(mine) < KEEP:
                name = f"{tenant[0]}{n}"
                r = api.post(
                    "/workloads", content=job(tenant, name, rng.choice(["job", "service"]))
                )
                tally.saw("apply", r, (200,), t0)
                if r.status_code == 200:
                    with tally.lock:
                        tally.applied.add(f"{tenant}/{name}")
            elif op < 0.35 and mine:
                key = rng.choice(mine)
                r = api.delete(f"/workloads/{key}")
                tally.saw("delete", r, (200,), t0)
                if r.status_code == 200:
                    with tally.lock:
                        tally.applied.discard(key)
            elif op < 0.55:
                r = api.get("/workloads")
                tally.saw("list", r, (200,), t0)
            elif op < 0.65:
                r = api.get("/events", params={"limit": 200})
                tally.saw("events", r, (200,), t0)
            elif op < 0.95:
                r = gw.post(f"{gateway}/serve/{tenant}.echo/predict", json={"inputs": [1, 2]})
                # a replica may be restarting after a fault: 502/503/504 are the gateway's answers
                tally.saw("gateway", r, (200, 502, 503, 504), t0)
            else:
                r = gw.post(f"{gateway}/serve/{other}.echo/predict", json={"inputs": [1]})
                # 503: a restarted gateway not yet told every deployment (it answers all names so)
                tally.saw("gateway, another tenant's", r, (404, 503), t0)
        except httpx.HTTPError as e:
            with tally.lock:
                tally.requests += 1
                if not tally.faulted.is_set():
                    tally.unexpected.append(f"{type(e).__name__} ({e.request.url.path}): {e}")
        time.sleep(0.02)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def stop_workloads(data: Path) -> None:
    """Kill what the agent's shims started (their process groups): the workloads, replicas among
    them, outlive a killed agent and its shims by design (a restarted agent re-attaches)."""
    from gpufrac.runtime.shim import read_status

    for run in data.glob("runs/**/g*-*"):
        status = read_status(run)
        if status.child_pid and not status.done:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(status.child_pid, signal.SIGKILL)


def pids_of(module: str, where: str) -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            args = (proc / "cmdline").read_bytes().split(b"\0")
            if module.encode() in args and any(where.encode() in a for a in args):
                found.append(int(proc.name))
    return found


def fill(data: Path, on: bool) -> None:
    ballast = data / "ballast"
    if not on:
        ballast.unlink(missing_ok=True)
        return
    with open(ballast, "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * (1 << 20))
            f.flush()


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--phase", choices=("agent", "cluster", "both"), default="both")
    p.add_argument("--minutes", type=float, default=10.0, help="of each phase")
    p.add_argument("--fault-every", type=float, default=20.0, help="agent phase")
    c = p.add_argument_group("cluster phase (bench/soak_cluster.py)")
    c.add_argument("--lease", type=float, default=6.0, help="gpufrac control --lease")
    c.add_argument("--warmup", type=float, default=20.0, help="calm seconds before each round")
    c.add_argument("--flood-manifests", type=int, default=10, help="parallel big manifests")
    c.add_argument("--manifest-kb", type=int, default=900, help="size of each big manifest")
    c.add_argument("--flood-logs", type=int, default=45, help="parallel slow log reads")
    c.add_argument("--trickle", type=int, default=20, help="seconds each slow log answer takes")
    c.add_argument("--flood-bodies", type=int, default=20, help="aborted gateway bodies")
    c.add_argument("--body-mib", type=int, default=20, help="size each of them announces")
    args = p.parse_args()
    if args.phase in ("agent", "both"):
        agent_phase(args)
    if args.phase in ("cluster", "both"):
        import soak_cluster  # beside this file

        if args.phase == "both":
            print()
        soak_cluster.run_cluster_phase(args)
    return 0


def agent_phase(args: argparse.Namespace) -> bool:
    """One agent, two tenants, faults: prints its table; whether its targets were met."""
    tmp = Path(tempfile.mkdtemp(prefix="gpufrac-soak-"))
    data = tmp / "data"
    data.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(data)], capture_output=True
        ).returncode
        == 0
    )
    (data / "tokens.yaml").write_text(
        "tokens:\n"
        + "".join(
            f"  {t}: {{admin: true}}\n" if who == "admin" else f"  {t}: {{tenant: {who}}}\n"
            for who, t in TOKENS.items()
        )
    )
    (data / "tokens.yaml").chmod(0o600)  # refused otherwise: the tokens are the owner's alone
    # a root agent with tokens runs workloads as tenants' own users (docs/agent.md); they must be
    # able to run this Python, which is not so where it lives under a closed home directory
    python_open = all(p.stat().st_mode & 0o001 for p in Path(sys.executable).resolve().parents)
    users = "tenant" if os.geteuid() == 0 and python_open else "agent"
    (data / "gpufrac.yaml").write_text(f"workload_users: {users}\n")
    port, gw_port = free_port(), free_port()
    env = {**os.environ, "GPUFRAC_SIMULATE": FLEET, "GPUFRAC_DATA_DIR": str(data)}
    with open(tmp / "agent.log", "wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpufrac.cli", "agent", "--port", str(port),
             "--gateway-port", str(gw_port)],
            env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=REPO,
        )  # fmt: skip
    url, gateway = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{gw_port}"
    admin = {"authorization": f"Bearer {TOKENS['admin']}"}
    tally = Tally()
    faults: list[str] = []
    try:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/api/v1/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        for t in ("alpha", "beta"):
            r = httpx.post(
                url + "/api/v1/deployments",
                content=deployment(t),
                headers={"authorization": f"Bearer {TOKENS[t]}"},
                timeout=30,
            )
            assert r.status_code == 200, r.text
        time.sleep(5)  # replicas come up
        start_rss = rss_mib(agent.pid)
        stop = threading.Event()
        workers = [
            threading.Thread(
                target=tenant_loop, args=(url, gateway, a, b, tally, stop), daemon=True
            )
            for a, b in (("alpha", "beta"), ("beta", "alpha"))
        ]
        for w in workers:
            w.start()
        end = time.monotonic() + args.minutes * 60
        timeline: list[tuple[float, float]] = [(0.0, start_rss)]  # (minutes, RSS MiB)

        def sample_rss() -> None:
            t0 = time.monotonic()
            while not stop.wait(30):
                with contextlib.suppress(OSError):
                    timeline.append(((time.monotonic() - t0) / 60, rss_mib(agent.pid)))

        threading.Thread(target=sample_rss, daemon=True).start()
        kinds = ["shim", "gateway", "arbiter", "disk"]
        i = 0
        while time.monotonic() < end:
            time.sleep(min(args.fault_every, max(0.0, end - time.monotonic())))
            if time.monotonic() >= end:
                break
            kind = kinds[i % len(kinds)]
            i += 1
            tally.faulted.set()
            if kind == "shim":
                shims = pids_of("gpufrac.runtime.shim", str(data))
                if shims:
                    os.kill(random.choice(shims), signal.SIGKILL)
                    faults.append("kill -9 a shim")
            elif kind == "gateway":
                for pid in pids_of("gpufrac.serving.gateway", "--admin-fd"):
                    os.kill(pid, signal.SIGKILL)
                faults.append("kill -9 the gateway")
            elif kind == "arbiter":
                for pid in pids_of("gpufrac.runtime.arbiter_server", "--admin-fd"):
                    os.kill(pid, signal.SIGKILL)
                faults.append("kill -9 the arbiter")
            elif mounted:
                fill(data, True)
                faults.append("data directory full for 10 s")
                time.sleep(10)
                fill(data, False)
            time.sleep(5)  # answers right after a fault count as during it
            tally.faulted.clear()
        stop.set()
        for w in workers:
            w.join(timeout=60)
        time.sleep(3)
        end_rss = rss_mib(agent.pid)
        stored = {
            f"{w['tenant']}/{w['name']}"
            for w in httpx.get(url + "/api/v1/workloads", headers=admin, timeout=30).json()[
                "workloads"
            ]
        }
        lost = sorted(tally.applied - stored)
        doubled = []
        for key in stored:
            tenant, name = key.split("/", 1)
            root = data / "runs" / tenant / name
            live = 0
            for run in root.glob("g*-*") if root.exists() else []:
                child = run / "child.json"
                if child.exists() and not (run / "exit.json").exists():
                    live += 1
            if live > 1:
                doubled.append(key)
        health = httpx.get(url + "/api/v1/health", timeout=10).json()
    finally:
        agent.kill()
        agent.wait(timeout=10)
        for module in ("gpufrac.runtime.shim", "gpufrac.serving", "gpufrac.runtime.arbiter_server"):
            for pid in pids_of(module, str(data)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        stop_workloads(data)
        if mounted:
            subprocess.run(["umount", "-l", str(data)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)

    calm = [ms for _, ms, f in tally.api_ms if not f]
    during = [ms for _, ms, f in tally.api_ms if f]

    def pct(v: list[float], q: float) -> str:
        return f"{sorted(v)[min(len(v) - 1, int(q * len(v)))]:.1f}" if v else "-"

    growth = (end_rss - start_rss) / start_rss * 100 if start_rss else 0.0
    print(
        f"soak: {args.minutes:g} min, 2 tenants, simulated {FLEET}, {os.cpu_count()} CPU cores,"
        f" workloads run as: {users}"
    )
    print(
        f"faults: {len(faults)} ({', '.join(sorted(set(faults)))})"
        + ("" if mounted else "; no tmpfs: no disk fault")
    )
    print("| what | value | target |\n| --- | --- | --- |")
    print(f"| requests | {tally.requests} | |")
    print(f"| unexpected answers | {len(tally.unexpected)} | 0 |")
    print(f"| workloads lost / doubled | {len(lost)} / {len(doubled)} | 0 / 0 |")
    print(
        f"| agent RSS start -> end MiB | {start_rss:.0f} -> {end_rss:.0f} "
        f"({growth:+.1f}%) | < 10% |"
    )
    print(
        "| agent RSS over time (min: MiB) | "
        + ", ".join(f"{m:.1f}: {r:.0f}" for m, r in timeline)
        + " | |"
    )
    print(f"| API+gateway p50 / p99 ms, calm | {pct(calm, 0.5)} / {pct(calm, 0.99)} | |")
    print(
        f"| API+gateway p50 / p99 ms, during faults | {pct(during, 0.5)} / {pct(during, 0.99)} | |"
    )
    print(f"| health at the end | {health.get('status')} {health.get('problems') or ''} | ok |")
    for line in tally.unexpected[:20]:
        print("  unexpected:", line)
    if lost or doubled:
        print("  lost:", lost[:10], "doubled:", doubled[:10])
    ok = not lost and not doubled and growth < 10
    print("targets:", "met" if ok else "MISSED")
    return ok


if __name__ == "__main__":
    sys.exit(main())
