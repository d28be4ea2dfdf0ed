"""What relayed logs cost a control plane: ``gpufrac control --local 2`` (two real node agents) and
a fake node (joined with the real protocol, approved) whose log API this script serves.

1. ``logs --tail 0`` of a workload whose node answers ``--huge-mib`` MiB, three times: the control
   plane's VmRSS growth per call and its peak (VmHWM), once for a node that answers what it is
   asked for (the newest lines that fit ``max_bytes``) and once for one that sends it all anyway.
2. 45 parallel ``logs`` calls for workloads of two tenants on the fake node, which trickles its
   answer a byte a second (for ``--trickle-s``): the control plane's ``/health`` latency meanwhile
   (probed every 0.25 s), the answers' codes, how long the calls took, the most relays the node saw
   at once, and whether a real node was held lost or fenced.

The fake node speaks both protocols: JSON lines to a control plane that asks without ``max_bytes``
(before issue 26), raw text up to ``max_bytes`` to one that asks with it. ``--src`` runs another
checkout's control plane (the code before: ``--src /work/main/src`` at 9a74a67), with this
interpreter and its packages. Run: .venv/bin/python bench/log_relay.py [--src PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

REPO = Path(__file__).resolve().parents[1]
LINE = b"x" * 1023 + b"\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeNode(BaseHTTPRequestHandler):
    server: LogServer

    def do_GET(self) -> None:
        s = self.server
        query = parse_qs(urlsplit(self.path).query)
        asked = int(query["max_bytes"][0]) if "max_bytes" in query else None
        with s.lock:
            s.now += 1
            s.most = max(s.most, s.now)
        try:
            self.send_response(200)
            if asked is None:  # the old protocol: JSON lines
                self.send_header("content-type", "application/json")
            else:
                self.send_header("content-type", "text/plain; charset=utf-8")
                self.send_header("x-gpufrac-run", "g1-a1")
                self.send_header("x-gpufrac-truncated", "true")
            self.end_headers()
            if "/slow" in self.path:
                self._trickle(asked is None)
            else:
                honest = "/huge" in self.path and asked is not None
                size = min(asked, s.huge) if honest and asked is not None else s.huge
                self._send(size, asked is None)
        except OSError:
            pass
        finally:
            with s.lock:
                s.now -= 1

    def _trickle(self, as_json: bool) -> None:
        if as_json:
            self.wfile.write(b'{"run":"g1-a1","lines":["')
        for _ in range(int(self.server.trickle_s)):
            if self.server.stop.wait(1.0):
                return
            self.wfile.write(b".")
            self.wfile.flush()
        if as_json:
            self.wfile.write(b'"]}')

    def _send(self, size: int, as_json: bool) -> None:
        lines = size // len(LINE)
        if as_json:
            self.wfile.write(b'{"run":"g1-a1","lines":[')
            one = b'"' + LINE[:-1] + b'"'
            for i in range(lines):
                self.wfile.write(one if i == 0 else b"," + one)
            self.wfile.write(b"]}")
        else:
            for _ in range(lines):
                self.wfile.write(LINE)

    def log_message(self, *args: Any) -> None:
        pass


class LogServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, trickle_s: float, huge: int) -> None:
        super().__init__(("127.0.0.1", 0), FakeNode)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.trickle_s, self.huge = trickle_s, huge
        self.now = self.most = 0


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def wait(ok: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ok():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("timed out starting the cluster")


def manifest(tenant: str, name: str) -> str:
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}, tenant: {tenant}}}\n"
        'spec:\n  type: service\n  command: ["sleep", "600"]\n'
        "  resources: {gpu: {memory: 1GiB}}\n  sharing: timeslice\n"
        "  node_selector: {zone: slow}\n"
    )


async def slow_calls(url: str, calls: int, trickle_s: float) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=calls + 10)
    async with (
        httpx.AsyncClient(limits=limits, timeout=trickle_s + 60) as http,
        httpx.AsyncClient(timeout=trickle_s + 60) as probe,
    ):

        async def one(i: int) -> tuple[int, float]:
            started = time.monotonic()
            try:
                r = await http.get(f"{url}/api/v1/workloads/{'ab'[i % 2]}/slow/logs")
                code = r.status_code
            except httpx.HTTPError:
                code = 0
            return code, time.monotonic() - started

        tasks = [asyncio.create_task(one(i)) for i in range(calls)]
        latencies: list[float] = []
        while not all(t.done() for t in tasks):
            started = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                await probe.get(url + "/api/v1/health")
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.25)
        done = [t.result() for t in tasks]
    return {
        "health_max_s": max(latencies),
        "health_p50_s": statistics.median(latencies),
        "codes": dict(sorted(collections.Counter(c for c, _ in done).items())),
        "calls_max_s": max(d for _, d in done),
    }


def run(src: Path, calls: int, trickle_s: float, huge_mib: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpufrac-log-relay-"))
    data = root / "control"
    data.mkdir()
    port = node_port = free_port()
    env = {**os.environ, "PYTHONPATH": str(src)}
    args = [sys.executable, "-m", "gpufrac.cli", "control", "--local", "2", "--port", str(port)]
    args += ["--gateway-port", str(free_port()), "--data-dir", str(data)]
    if "--node-port" in (src / "gpufrac" / "cli" / "cluster_cmds.py").read_text():
        node_port = free_port()  # the node protocol on its own listener (since b8c731c)
        args += ["--node-port", str(node_port)]
    log = open(root / "control.log", "ab")  # noqa: SIM115 (closed at the end)
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    logs = LogServer(trickle_s, huge_mib * 1024 * 1024)
    threading.Thread(target=logs.serve_forever, daemon=True).start()
    stop = threading.Event()
    try:

        def alive() -> list[str]:
            nodes = httpx.get(url + "/api/v1/nodes", timeout=30).json()["nodes"]
            return sorted(n["name"] for n in nodes if n["state"] == "alive")

        wait(lambda: alive() == ["local-0", "local-1"])
        token = (data / "cluster-token").read_text().strip()
        joined = httpx.post(
            f"http://127.0.0.1:{node_port}/cluster/v1/nodes/slow/join",
            json={
                "gpus": [{"uuid": "GPU-slow-0", "model": "B200-180GB", "mig": False}],
                "labels": {"zone": "slow"},
                "address": f"http://127.0.0.1:{logs.server_address[1]}",
            },
            headers={"authorization": f"Bearer {token}"},
            timeout=10,
        ).json()
        httpx.post(url + "/api/v1/nodes/slow/approve", timeout=10).raise_for_status()

        def beat() -> None:
            with httpx.Client(timeout=30) as http:
                while not stop.wait(0.5):
                    with contextlib.suppress(httpx.HTTPError):
                        http.post(
                            f"http://127.0.0.1:{node_port}/cluster/v1/nodes/slow/heartbeat",
                            json={},
                            headers={"authorization": f"Bearer {joined['credential']}"},
                        )

        threading.Thread(target=beat, daemon=True).start()
        placed = [("a", "slow"), ("b", "slow"), ("c", "huge"), ("c", "liar")]
        body = "---\n".join(manifest(t, n) for t, n in placed)
        httpx.post(url + "/api/v1/workloads", content=body, timeout=30).raise_for_status()
        for t, n in placed:
            wait(
                lambda t=t, n=n: (
                    httpx.get(f"{url}/api/v1/workloads/{t}/{n}", timeout=30).json()["node"]
                    == "slow"
                )
            )
        pid = proc.pid
        out: dict[str, Any] = {}
        out["rss_before_mib"] = status_kib(pid, "VmRSS") / 1024
        out["peak_before_mib"] = status_kib(pid, "VmHWM") / 1024
        for name in ("huge", "liar"):
            grown, codes = [], []
            for _ in range(3):
                before = status_kib(pid, "VmRSS")
                r = httpx.get(f"{url}/api/v1/workloads/c/{name}/logs?tail=0", timeout=300)
                codes.append(r.status_code)
                grown.append((status_kib(pid, "VmRSS") - before) / 1024)
            out[name] = {"codes": codes, "rss_growth_mib": grown}
        out["peak_rss_mib"] = status_kib(pid, "VmHWM") / 1024
        out["rss_mib"] = status_kib(pid, "VmRSS") / 1024
        logs.most = 0
        out.update(asyncio.run(slow_calls(url, calls, trickle_s)))
        out["node_most_at_once"] = logs.most
        out["alive_after"] = alive()
        events = httpx.get(url + "/api/v1/events?limit=1000", timeout=30).json()["events"]
        out["lost_or_fenced"] = sorted(
            {f"{e['kind']} {e['subject']}" for e in events if e["kind"] in ("node_lost", "fenced")}
        )
        return out
    finally:
        stop.set()
        logs.stop.set()
        logs.shutdown()
        logs.server_close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", type=Path, default=REPO / "src")
    parser.add_argument("--calls", type=int, default=45)
    parser.add_argument("--trickle-s", type=float, default=20.0)
    parser.add_argument("--huge-mib", type=int, default=150)
    a = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
        f"control plane from {a.src}"
    )
    out = run(a.src, a.calls, a.trickle_s, a.huge_mib)
    rows = [
        (
            f"/health under {a.calls} slow calls, max (p50)",
            "{health_max_s:.2f} s ({health_p50_s:.2f} s)",
        ),
        ("answers of the slow calls", "{codes}"),
        ("longest slow call", "{calls_max_s:.1f} s"),
        ("relays the node saw at once, most", "{node_most_at_once}"),
        ("real nodes alive after", "{alive_after}"),
        ("nodes held lost or fenced", "{lost_or_fenced}"),
    ]
    for label, fmt in rows:
        print(f"{label:<45} {fmt.format(**out)}")
    for name, what in (("huge", "asked for"), ("liar", "sent anyway")):
        got = out[name]
        growth = ", ".join(f"{g:+.0f}" for g in got["rss_growth_mib"])
        print(
            f"{f'{a.huge_mib} MiB log, {what}: codes, RSS growth MiB':<45} {got['codes']}, {growth}"
        )
    before = f"{out['rss_before_mib']:.0f}, {out['peak_before_mib']:.0f}"
    print(f"{'control plane RSS, peak before the big logs (MiB)':<45} {before}")
    rss = f"{out['rss_mib']:.0f}, {out['peak_rss_mib']:.0f}"
    print(f"{'control plane RSS, peak after (MiB)':<45} {rss}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
