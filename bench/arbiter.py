"""Arbiter benchmark: what a GPU turn costs, on the CPU, against a bare Unix-socket round trip.

1. Baseline, in the same run: a minimal echo server on a Unix socket (one line out, one line back),
   the floor for any arbiter reached over a local socket.
2. gpufrac: acquire + release of a turn with the real arbiter process, uncontended; the same through
   ``gpu_turn()``; the yield-flag read (shared memory) that yield points do.
3. Under contention: a low-priority client in a loop of 1 ms "modules" with a yield point between
   them, and a high-priority client asking for turns: how long the high one waits for its grant,
   with ``qos_preempt: overlap`` (granted at once) and ``drain`` (granted once the low one yields).

Each client runs in its own session, registered with the arbiter by its process group before it
says hello, as the agent registers the workloads it starts (the arbiter believes no client's word).

Run: .venv/bin/python bench/arbiter.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
if SRC.is_dir() and str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from gpufrac.model.qos import QosParams  # noqa: E402
from gpufrac.runtime.arbiter_link import ArbiterLink, MemberSpec  # noqa: E402
from gpufrac.sdk.turns import TurnClient, gpu_turn  # noqa: E402

ECHO = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind(sys.argv[1]); s.listen(1)
print("ready", flush=True)
c, _ = s.accept()
while True:
    d = c.recv(64)
    if not d: break
    c.sendall(b"G\\n")
"""


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def echo_round_trips(tmp: Path, n: int) -> list[float]:
    path = str(tmp / "echo.sock")
    server = subprocess.Popen([sys.executable, "-c", ECHO, path], stdout=subprocess.PIPE)
    assert server.stdout is not None and server.stdout.readline() == b"ready\n"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        sock.sendall(b"A\n")
        sock.recv(64)
        out.append(time.perf_counter() - t)
    sock.close()
    server.wait(timeout=10)
    return out


def turns(client: TurnClient, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        client.acquire()
        client.release()
        out.append(time.perf_counter() - t)
    return out


def context_turns(client: TurnClient, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        with gpu_turn(client):
            pass
        out.append(time.perf_counter() - t)
    return out


def flag_reads(client: TurnClient, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        client.should_yield()
    return (time.perf_counter() - t) / n


LOW_LOOP = (
    "import sys, time; sys.path.insert(0, sys.argv[2])\n"
    "from gpufrac.sdk.turns import TurnClient, gpu_turn\n"
    "sys.stdin.readline()  # registered with the arbiter: go\n"
    "low = TurnClient(sys.argv[1], workload='b/low', domain='gpu', qos={'rank': 0})\n"
    "while True:\n"
    "    with gpu_turn(low) as turn:\n"
    "        for _ in range(8):\n"
    "            turn.checkpoint()\n"
    "            end = time.perf_counter() + 0.001\n"
    "            while time.perf_counter() < end: pass\n"
)


def client_role(role: str, address: str, n: int) -> None:
    """A client of the benchmark, in its own session as a workload would be: it waits until it is
    registered (the arbiter knows a client by its process group), measures, and prints JSON."""
    sys.stdin.readline()
    client = TurnClient(address, workload=f"b/{role}", domain="gpu", qos={})
    if role == "solo":
        turns(client, 200)  # warm
        out: dict[str, object] = {
            "plain": turns(client, n),
            "ctx": context_turns(client, n),
            "flag": flag_reads(client, n * 10),
        }
    else:
        time.sleep(0.5)
        waits = []
        rng = random.Random(7)
        for _ in range(n):
            time.sleep(rng.uniform(0.002, 0.008))  # not in step with the 1 ms modules
            t = time.perf_counter()
            client.acquire()
            waits.append(time.perf_counter() - t)
            client.release()
        out = {"waits": waits}
    client.close()
    print(json.dumps(out), flush=True)


def registered(
    link: ArbiterLink, members: dict[str, MemberSpec], key: str, rank: int, cmd: list[str]
) -> subprocess.Popen[str]:
    """Start ``cmd`` in its own session, register its process group as ``key``, then let it go."""
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    members[key] = MemberSpec("gpu", QosParams(rank=rank), proc.pid)
    link.sync(members)
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return proc


def measured(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=600)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def contended_waits(link: ArbiterLink, n: int) -> list[float]:
    """A low-priority loop of 1 ms modules with yield points; a high-priority client's waits."""
    members: dict[str, MemberSpec] = {}
    low = registered(
        link, members, "b/low", 0, [sys.executable, "-c", LOW_LOOP, link.address, str(SRC)]
    )
    try:
        high = registered(
            link, members, "b/high", 10,
            [sys.executable, __file__, "--client", "high", link.address, str(n)],
        )  # fmt: skip
        waits: list[float] = measured(high)["waits"]
        return waits
    finally:
        low.kill()
        low.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--client", nargs=3, metavar=("ROLE", "ADDRESS", "N"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        client_role(args.client[0], args.client[1], int(args.client[2]))
        return 0
    n = 2000 if args.quick else 20000
    with tempfile.TemporaryDirectory(prefix="gpufrac-arb-") as tmp_name:
        tmp = Path(tmp_name)
        echo = echo_round_trips(tmp, n)
        link = ArbiterLink(tmp / "arbiter")
        link.sync({}, start=True)
        try:
            cmd = [sys.executable, __file__, "--client", "solo", link.address, str(n)]
            solo = measured(registered(link, {}, "b/solo", 0, cmd))
            plain, ctx, flag = solo["plain"], solo["ctx"], solo["flag"]
            waits = contended_waits(link, 100 if args.quick else 400)
        finally:
            link.close()
        drain_link = ArbiterLink(tmp / "arbiter-drain", preempt="drain")
        drain_link.sync({}, start=True)
        try:
            drain_waits = contended_waits(drain_link, 100 if args.quick else 400)
        finally:
            drain_link.close()
    us = 1e6
    print(f"arbiter turn cost on {os.cpu_count()} CPU cores, Python {sys.version.split()[0]}")
    print("what | p50 us | p99 us | mean us")
    print("--- | --- | --- | ---")
    for name, values in (
        ("baseline: bare Unix-socket round trip (echo)", echo),
        ("gpufrac: acquire + release, uncontended", plain),
        ("gpufrac: gpu_turn() block, uncontended", ctx),
        ("gpufrac: high-priority wait beside a 1 ms-module trainer (overlap)", waits),
        ("gpufrac: the same, qos_preempt: drain", drain_waits),
    ):
        print(
            f"{name} | {pct(values, 0.5) * us:.1f} | {pct(values, 0.99) * us:.1f} | "
            f"{statistics.fmean(values) * us:.1f}"
        )
    print(f"yield-flag read (shared memory) | {flag * 1e9:.0f} ns per read | |")
    ratio = statistics.median(plain) / statistics.median(echo)
    print(
        f"\nturn / bare round trip: {ratio:.2f}x (a turn is one round trip plus a one-way release)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
