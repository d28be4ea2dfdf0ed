"""The cluster phase of bench/soak.py (issues 26 and 27): a control plane no tenant can starve.

Run it through soak.py: ``.venv/bin/python bench/soak.py --phase cluster [--minutes 10]``.

A real control plane (``gpufrac control --local 3``: three node agents it starts and approves
itself, and its request gateway) with API tokens for three tenants and the admin. Meanwhile:

* tenants alpha and beta apply, read and delete jobs and services on every local node (MIG, MPS,
  time-sliced; at most ``KEEP`` each applied), list workloads and events, read their own, and call
  their own deployment through the cluster's gateway (and now and then the other's: refused);
* two fake nodes in this bench speak the real node protocol (join with the cluster token, approved
  by the admin, a heartbeat a second): ``probe``, with no GPUs, times every heartbeat's answer
  (sent from a process of its own, as a real node's are);
  ``hostile``, labelled ``pool=hostile``, runs (says it runs) the hostile tenant's workload, and
  declares as its address a small server in this bench that trickles each log answer (a byte a
  second for ``--trickle`` seconds);
* the hostile tenant gamma floods, in bounded bursts, one kind at a time: ten parallel ~900 KB
  YAML flow lists, with exactly-1 MiB manifests beside them (each answer timed; one pair is also
  timed in the calm); 45 parallel ``logs`` calls for its own workload on its node; 20 MiB bodies
  to its ``public: true`` deployment on the gateway, aborted before their end;
* between the floods one fault each: ``kill -9`` of a local node agent (the control plane starts
  it again), a full disk on local-2 for 10 s (its data directory, ``DATA/nodes/local-2``, is a
  small tmpfs mounted before the control plane starts it; skipped with a note where tmpfs cannot
  be mounted), ``kill -9`` of the control plane (started again on its data directory with the same
  arguments: it takes its running nodes over).

A round is a calm warm-up, then floods and faults in turn, with calm gaps; rounds repeat until
``--minutes`` have passed (at least one round: today a round can take longer than that).

Measured, with targets (benchmark targets, not tests): fencings of the real nodes (``fenced:`` in
their ``node.log``, followed as the run goes; the ``fenced`` events are counted too) outside the
faults' windows, so caused by floods: 0; the probe's heartbeat answer p99 during floods < 0.2 s;
every 1 MiB manifest answered (whatever the answer) within 1 s; the other tenants' ``GET`` p99
during floods < 0.5 s; 0 lost workloads (applied, acknowledged, not deleted, not stored at the
end) and 0 doubled (two live processes of one workload at once, on any nodes: read from /proc,
by a marker in each workload's environment, every 2 s); control-plane and gateway RSS growth
< 10% (each process from the end of the calm warm-up to its last reading, before it was killed
or at the end). The hostile tenant's 413 and 429 answers are bounds doing their work, not errors.

Today's control plane serves the node protocol on its API port; once ``gpufrac control`` lists
``--node-port`` in its ``--help``, this bench gives it one and its fake nodes call there.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import soak

from gpufrac.cluster.wire import CREDENTIAL_HEADER

HOSTILE = "gamma"
TOKENS = {**soak.TOKENS, HOSTILE: "gamma-token-0123456789abcdef"}
GPUFRAC = [sys.executable, "-m", "gpufrac.cli"]
LOCAL = 3  # local nodes: local-0 MIG, local-1 MPS, local-2 time-sliced (cluster_cmds.LOCAL_KINDS)
DISK_NODE = 2  # whose data directory is a tmpfs, filled in the disk fault
KEEP = 8  # each tenant keeps at most this many workloads applied
WHERE = {"alpha": ("timeslice", "mps"), "beta": ("timeslice", "mig")}
FAULT_GRACE_S = 10.0  # after a fault has ended (what it broke is back): still its window
FLOOD_GRACE_S = 3.0  # after a flood's last answer
GAP_S = 8.0  # calm between steps
MIB = 1 << 20


# -- what the run saw ---------------------------------------------------------------------------


class Windows:
    """When each flood and fault ran (wall-clock seconds): samples are classified at the end as
    during a fault (within ``FAULT_GRACE_S`` of one: faults win), during a flood, or calm."""

    def __init__(self) -> None:
        self.spans: list[list[Any]] = []  # [kind, label, start, end or None]
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def open(self, kind: str, label: str) -> Iterator[None]:
        span: list[Any] = [kind, label, time.time(), None]
        with self.lock:
            self.spans.append(span)
        try:
            yield
        finally:
            span[3] = time.time()

    def of(self, t: float) -> tuple[str, str]:
        """(``fault`` | ``flood`` | ``calm``, the label) at ``t``."""
        found: dict[str, str] = {}
        with self.lock:
            spans = list(self.spans)
        for kind, label, start, end in spans:
            grace = FAULT_GRACE_S if kind == "fault" else FLOOD_GRACE_S
            if start <= t <= (time.time() if end is None else end) + grace:
                found.setdefault(kind, label)
        for kind in ("fault", "flood"):
            if kind in found:
                return kind, found[kind]
        return "calm", ""

    def kind(self, t: float) -> str:
        return self.of(t)[0]


@dataclass
class Record:
    requests: int = 0
    calls: list[tuple[float, float, bool]] = field(default_factory=list)  # (at, s, a GET)
    issues: list[tuple[float, str]] = field(default_factory=list)  # unexpected unless in a fault
    applied: set[str] = field(default_factory=set)  # acknowledged and not deleted since
    uncertain: set[str] = field(default_factory=set)  # an apply or delete that got no answer
    beats: list[tuple[float, float, int | None]] = field(default_factory=list)  # probe's
    hostile: Counter[str] = field(default_factory=Counter)  # "what status" -> count
    big: list[tuple[float, str, float, str]] = field(default_factory=list)  # 1 MiB answers
    fenced: list[tuple[float, str, str]] = field(default_factory=list)  # (seen, node, line)
    doubled: dict[str, tuple[float, list[int]]] = field(default_factory=dict)
    rss: dict[int, list[Any]] = field(default_factory=dict)  # pid -> [role, base, last, n]
    faults: list[str] = field(default_factory=list)
    floods: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, what: str, r: httpx.Response | None, ok: tuple[int, ...], t0: float) -> None:
        took = time.perf_counter() - t0
        sent = time.time() - took  # a call counts where it began
        with self.lock:
            self.requests += 1
            self.calls.append((sent, took, what.startswith("GET")))
            if r is not None and r.status_code not in ok:
                self.issues.append((sent, f"{what}: {r.status_code} {r.text[:120]}"))

    def failed(self, what: str, e: Exception, t0: float) -> None:
        took = time.perf_counter() - t0
        sent = time.time() - took
        with self.lock:
            self.requests += 1
            self.calls.append((sent, took, what.startswith("GET")))
            self.issues.append((sent, f"{what}: {type(e).__name__} {e}"))


# -- the control plane and its nodes -------------------------------------------------------------


class Cluster:
    """``gpufrac control --local 3`` as a process, started again with the same arguments."""

    def __init__(self, tmp: Path, lease: float) -> None:
        self.data = tmp / "data"
        self.log = tmp / "control.log"
        ports = {soak.free_port() for _ in range(3)}
        while len(ports) < 3:
            ports.add(soak.free_port())
        self.port, self.gateway_port, node_port = sorted(ports)
        shown = subprocess.run(
            [*GPUFRAC, "control", "--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
            check=False,
        ).stdout
        self.node_port = node_port if "--node-port" in shown else None
        self.args = [
            *GPUFRAC,
            *("control", "--local", str(LOCAL), "--port", str(self.port)),
            *("--gateway-port", str(self.gateway_port), "--lease", f"{lease:g}"),
            *(("--node-port", str(self.node_port)) if self.node_port else ()),
            *("--data-dir", str(self.data)),
        ]
        self.url = f"http://127.0.0.1:{self.port}"
        self.node_url = f"http://127.0.0.1:{self.node_port or self.port}"
        self.gateway = f"http://127.0.0.1:{self.gateway_port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.admin = httpx.Client(
            base_url=self.url + "/api/v1",
            headers={"authorization": f"Bearer {TOKENS['admin']}"},
            timeout=30,
        )

    def start(self) -> float:
        """Start it and wait for its health: the seconds that took."""
        t0 = time.perf_counter()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=soak.REPO
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/api/v1/health", timeout=2).status_code == 200:
                    return time.perf_counter() - t0
            if self.proc.poll() is not None:
                raise RuntimeError(f"the control plane exited ({self.proc.returncode}): {self.log}")
            time.sleep(0.1)
        raise RuntimeError(f"the control plane did not answer within 120 s: {self.log}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def node_dir(self, i: int) -> Path:
        return self.data / "nodes" / f"local-{i}"

    def node_pid(self, i: int) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int((self.node_dir(i) / "node.pid").read_text())
        return None

    def gateway_pid(self) -> int | None:
        """The request gateway: the control plane's child running ``gpufrac.serving.gateway``."""
        if self.proc is None:
            return None
        for proc in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if b"gpufrac.serving.gateway" not in (proc / "cmdline").read_bytes():
                    continue
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == self.proc.pid:
                    return int(proc.name)
        return None

    def nodes(self) -> dict[str, dict[str, Any]]:
        r = self.admin.get("/nodes")
        r.raise_for_status()
        return {n["name"]: n for n in r.json()["nodes"]}

    def wait_nodes(self, names: list[str], timeout: float) -> bool:
        """Until each of ``names`` is alive with a heartbeat under 3 s old."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, KeyError):
                now = self.nodes()
                if all(
                    now[n]["state"] == "alive" and (now[n]["last_heartbeat_s"] or 0) < 3
                    for n in names
                ):
                    return True
            time.sleep(0.5)
        return False


class FakeNode:
    """A node this bench plays, with the real protocol: it joins with the cluster token, has the
    admin approve it, and heartbeats every second, saying it runs what it is given (it runs
    nothing); it joins again where the answer says so (a restarted control plane, a lost node).
    ``timed``: each heartbeat's (wall time sent, seconds to its answer, status or None)."""

    def __init__(
        self,
        cluster: Cluster,
        token: str,
        name: str,
        gpus: int,
        labels: dict[str, str],
        address: str | None,
        timed: Callable[[float, float, int | None], None] | None = None,
    ) -> None:
        self.cluster, self.token, self.name = cluster, token, name
        self.body: dict[str, Any] = {
            "labels": labels,
            "gpus": [
                {"uuid": f"GPU-{name}-{i}", "model": "H200-141GB", "mig": False}
                for i in range(gpus)
            ],
        }
        if address is not None:
            self.body["address"] = address
        self.timed = timed
        self.credential: str | None = None
        self.running: dict[str, int] = {}
        self.http = httpx.Client(timeout=10)

    def join(self) -> None:
        headers = {"authorization": f"Bearer {self.token}"}
        if self.credential is not None:
            headers[CREDENTIAL_HEADER] = self.credential
        r = self.http.post(
            f"{self.cluster.node_url}/cluster/v1/nodes/{self.name}/join",
            json=self.body,
            headers=headers,
        )
        r.raise_for_status()
        given = r.json().get("credential")
        if given:
            self.credential = given
        if self.cluster.nodes().get(self.name, {}).get("state") == "pending":
            self.cluster.admin.post(f"/nodes/{self.name}/approve").raise_for_status()

    def loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            began = time.perf_counter()
            try:
                if self.credential is None:
                    self.join()
                self.beat()
            except httpx.HTTPError:
                pass
            stop.wait(max(0.0, 1.0 - (time.perf_counter() - began)))

    def beat(self) -> None:
        at, t0 = time.time(), time.perf_counter()
        try:
            r = self.http.post(
                f"{self.cluster.node_url}/cluster/v1/nodes/{self.name}/heartbeat",
                json={"running": self.running},
                headers={"authorization": f"Bearer {self.credential}"},
            )
        except httpx.HTTPError:
            if self.timed is not None:
                self.timed(at, time.perf_counter() - t0, None)
            raise
        if self.timed is not None:
            self.timed(at, time.perf_counter() - t0, r.status_code)
        if r.status_code == 401:  # its credential is not known there: a new one, approved again
            self.credential = None
            return
        if r.status_code != 200:
            return
        answer = r.json()
        match answer["status"]:
            case "ok":
                self.running = {a["decision"]["workload"]: a["epoch"] for a in answer["run"]}
            case "pending":
                self.cluster.admin.post(f"/nodes/{self.name}/approve")
            case _:  # lost, join: what it had is gone; join again with its credential
                self.running = {}
                self.join()


# The probe's heartbeats, sent from a process of their own (as a real node's are): the bench's own
# threads (floods, traffic, the watch) would otherwise delay its answers in this process. One JSON
# line per beat: [wall time sent, seconds to the answer, HTTP status or null, the answer's status];
# it exits 3 where the control plane wants it to join again (the bench joins it and starts it anew).
PROBE = """
import json, sys, time
import httpx
url, name, credential = sys.argv[1:4]
http = httpx.Client(timeout=10)
while True:
    began, at = time.perf_counter(), time.time()
    try:
        r = http.post(f"{url}/cluster/v1/nodes/{name}/heartbeat", json={"running": {}},
                      headers={"authorization": f"Bearer {credential}"})
        code, said = r.status_code, (r.json().get("status") if r.status_code == 200 else None)
    except httpx.HTTPError:
        code, said = None, None
    print(json.dumps([at, time.perf_counter() - began, code, said]), flush=True)
    if code == 401 or said in ("lost", "join", "pending"):
        sys.exit(3)
    time.sleep(max(0.0, 1.0 - (time.perf_counter() - began)))
"""


def probe_loop(node: FakeNode, stop: threading.Event) -> None:
    """Run the probe's heartbeats in their own process (``PROBE``) until ``stop``; each beat
    timed through ``node.timed``; joined again (and approved) where the answer asks."""
    import json

    assert node.timed is not None
    while not stop.is_set():
        if node.credential is None:
            try:
                node.join()
            except httpx.HTTPError:
                stop.wait(1.0)
                continue
        proc = subprocess.Popen(
            [sys.executable, "-c", PROBE, node.cluster.node_url, node.name, str(node.credential)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                at, took, code, _ = json.loads(line)
                node.timed(at, took, code)
                if stop.is_set():
                    break
        finally:
            proc.kill()
            proc.wait()
        if not stop.is_set():
            try:
                node.join()  # it asked to: a restarted control plane, or a lost node
            except httpx.HTTPError:
                stop.wait(1.0)


class Trickle:
    """The hostile node's address: every log answer comes a byte a second (valid JSON at last,
    after ``seconds`` spaces), so each relayed ``logs`` call is held that long."""

    def __init__(self, seconds: int) -> None:
        self.stop = threading.Event()
        self.served = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                tail = b'{"run": null, "lines": ["slowly"]}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(seconds + len(tail)))
                self.end_headers()
                try:
                    for _ in range(seconds):
                        if outer.stop.wait(1.0):
                            return
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    self.wfile.write(tail)
                    outer.served += 1
                except OSError:
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


# -- manifests -----------------------------------------------------------------------------------


def workload(tenant: str, name: str, kind: str, where: str, run: str) -> str:
    """A job (1.5 s) or a service of ``tenant`` on the local node labelled ``where``."""
    code = "import time; time.sleep(%s)" % ("1.5" if kind == "job" else "600")
    resources = {
        "timeslice": "{gpu: {memory: 4GiB}}\n  sharing: timeslice",
        "mps": "{gpu: {memory: 4GiB, compute: 10%}}\n  sharing: mps",
        "mig": "{gpu: {mig: 1g.18gb}}",
        "hostile": "{gpu: {memory: 4GiB}}\n  sharing: timeslice",
    }[where]
    selector = "pool: hostile" if where == "hostile" else f"gpufrac.io/kind: {where}"
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}, tenant: {tenant}}}\n"
        f"spec:\n  type: {kind}\n  command: [{sys.executable}, -c, {code!r}]\n"
        f"  resources: {resources}\n  node_selector: {{{selector}}}\n"
        f"  env: {{SOAK_RUN: {run}}}\n"
    )


def deployment(tenant: str, name: str, run: str, *, public: bool = False) -> str:
    return (
        f"apiVersion: gpufrac/v1\nkind: Deployment\nmetadata: {{name: {name}, tenant: {tenant}}}\n"
        f"spec:\n  replicas: 1\n  public: {str(public).lower()}\n  template:\n"
        f"    model: examples.serving.models:echo_sum\n    workdir: {soak.REPO}\n"
        "    resources: {gpu: {memory: 4GiB}}\n    sharing: timeslice\n"
        f"    node_selector: {{gpufrac.io/kind: timeslice}}\n    env: {{SOAK_RUN: {run}}}\n"
    )


def flow_list(size: int, name: str) -> str:
    """A manifest of exactly ``size`` bytes, most of it one long YAML flow list (of a field no
    manifest has: refused, however small, once it is read)."""
    head = (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}, tenant: {HOSTILE}}}\n"
        "spec:\n  type: job\n  resources: {gpu: {memory: 1GiB}}\n  command: [true]\n  padding: ["
    )
    room = size - len(head) - len("x]\n")
    return head + "a, " * (room // 3) + "a" * (room % 3) + "x]\n"


def long_string(size: int, name: str) -> str:
    """A manifest of exactly ``size`` bytes, most of it one scalar (of a field no manifest has)."""
    head = (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}, tenant: {HOSTILE}}}\n"
        "spec:\n  type: job\n  resources: {gpu: {memory: 1GiB}}\n  command: [true]\n  padding: "
    )
    return head + "x" * (size - len(head) - 1) + "\n"


# -- traffic -------------------------------------------------------------------------------------


def tenant_traffic(
    cluster: Cluster, tenant: str, other: str, run: str, rec: Record, stop: threading.Event
) -> None:
    h = {"authorization": f"Bearer {TOKENS[tenant]}"}
    rng = random.Random(tenant)
    api = httpx.Client(base_url=cluster.url + "/api/v1", headers=h, timeout=30)
    gw = httpx.Client(headers=h, timeout=30)
    n = 0
    while not stop.is_set():
        n += 1
        op = rng.random()
        t0 = time.perf_counter()
        with rec.lock:
            mine = sorted(k for k in rec.applied if k.startswith(tenant + "/"))
        what = "?"
        try:
            if op < 0.2 and len(mine) < KEEP:
                name = f"{tenant[0]}{n}"
                what = "apply"
                text = workload(
                    tenant, name, rng.choice(["job", "service"]), rng.choice(WHERE[tenant]), run
                )
                try:
                    r = api.post("/workloads", content=text)
                except httpx.HTTPError:
                    with rec.lock:
                        rec.uncertain.add(f"{tenant}/{name}")
                    raise
                rec.call(what, r, (200,), t0)
                if r.status_code == 200:
                    with rec.lock:
                        rec.applied.add(f"{tenant}/{name}")
            elif op < 0.3 and mine:
                key = rng.choice(mine)
                what = "delete"
                with rec.lock:  # acknowledged or not, no longer expected to be stored
                    rec.applied.discard(key)
                    rec.uncertain.add(key)
                r = api.delete(f"/workloads/{key}")
                rec.call(what, r, (200,), t0)
                if r.status_code == 200:
                    with rec.lock:
                        rec.uncertain.discard(key)
            elif op < 0.45:
                what = "GET workloads"
                rec.call(what, api.get("/workloads"), (200,), t0)
            elif op < 0.55 and mine:
                what = "GET a workload"
                rec.call(what, api.get(f"/workloads/{rng.choice(mine)}"), (200,), t0)
            elif op < 0.65:
                what = "GET events"
                rec.call(what, api.get("/events", params={"limit": 200}), (200,), t0)
            elif op < 0.95:
                what = "gateway"
                r = gw.post(
                    f"{cluster.gateway}/serve/{tenant}.echo/predict", json={"inputs": [1, 2]}
                )
                # a replica may be restarting after a fault: 502/503/504 are the gateway's answers
                rec.call(what, r, (200, 502, 503, 504), t0)
            else:
                what = "gateway, another tenant's"
                r = gw.post(f"{cluster.gateway}/serve/{other}.echo/predict", json={"inputs": [1]})
                rec.call(what, r, (404, 503), t0)
        except httpx.HTTPError as e:
            rec.failed(what, e, t0)
        time.sleep(0.05)


def processes(run: str) -> dict[str, list[int]]:
    """Per workload (``tenant/name``) the live processes of this run's workloads that are not a
    child of one of the same workload (a workload's own children are part of it): from /proc, by
    the marker ``SOAK_RUN`` in their environment (the shims are not counted)."""
    marker = f"SOAK_RUN={run}".encode()
    found: dict[int, tuple[str, int]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
            env = (proc / "environ").read_bytes().split(b"\0")
            if marker not in env:
                continue
            state, parent = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            if state in ("Z", "X") or b"gpufrac.runtime.shim" in (proc / "cmdline").read_bytes():
                continue
            seen = dict(v.split(b"=", 1) for v in env if b"=" in v)
            key = f"{seen[b'GPUFRAC_TENANT'].decode()}/{seen[b'GPUFRAC_WORKLOAD'].decode()}"
            found[int(proc.name)] = (key, int(parent))
    roots: dict[str, list[int]] = {}
    for pid, (key, ppid) in found.items():
        if found.get(ppid, ("", 0))[0] != key:
            roots.setdefault(key, []).append(pid)
    return roots


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def watch(
    cluster: Cluster, run: str, rec: Record, stop: threading.Event, follow_logs: list[Path]
) -> None:
    """Every 2 s: doubled workloads (two live processes at once, checked again so that one that
    ended meanwhile is not counted); every 0.5 s: new ``fenced:`` lines in the nodes' logs; every
    5 s: the control plane's and the gateway's RSS."""
    offsets = {p: p.stat().st_size if p.exists() else 0 for p in follow_logs}
    n = 0
    while not stop.wait(0.5):
        n += 1
        for path in follow_logs:
            with contextlib.suppress(OSError):
                size = path.stat().st_size
                if size < offsets[path]:
                    offsets[path] = 0
                if size > offsets[path]:
                    with open(path, "rb") as f:
                        f.seek(offsets[path])
                        chunk = f.read(size - offsets[path])
                    whole = chunk[: chunk.rfind(b"\n") + 1]  # a line not yet ended: next time
                    offsets[path] += len(whole)
                    for line in whole.decode(errors="replace").split("\n"):
                        if "fenced:" in line:
                            with rec.lock:
                                rec.fenced.append((time.time(), path.parent.name, line.strip()))
        if n % 4 == 0:
            for key, pids in processes(run).items():
                if len(pids) > 1 and sum(alive(p) for p in pids) > 1:
                    with rec.lock:
                        rec.doubled.setdefault(key, (time.time(), pids))
        if n % 10 == 0:
            sample_rss(cluster, rec)


def sample_rss(cluster: Cluster, rec: Record, *, base: bool = False) -> None:
    """Each process's latest RSS; ``base``: this reading is its baseline (after warm-up)."""
    proc = cluster.proc
    pids = {
        "control plane": proc.pid if proc is not None and proc.poll() is None else None,
        "gateway": cluster.gateway_pid(),
    }
    for role, pid in pids.items():
        if pid is None:
            continue
        with contextlib.suppress(OSError):
            mib = soak.rss_mib(pid)
            if mib == 0:  # killed, not yet reaped: no reading
                continue
            with rec.lock:
                entry = rec.rss.setdefault(pid, [role, None, mib, 0])
                entry[2] = mib
                if base:
                    entry[1] = mib
                elif entry[1] is not None:
                    entry[3] += 1


# -- floods --------------------------------------------------------------------------------------


def in_threads(count: int, target: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)


def hostile_client() -> httpx.Client:
    h = {"authorization": f"Bearer {TOKENS[HOSTILE]}"}
    return httpx.Client(base_url="", headers=h, timeout=300)


def one_mib(cluster: Cluster, rec: Record, label: str) -> None:
    """The two exactly-1 MiB manifests, one after the other, each answer timed."""
    for kind, make in (("one long string", long_string), ("flow list", flow_list)):
        text = make(MIB, "mib")
        t0 = time.perf_counter()
        with hostile_client() as http:
            try:
                status = str(http.post(cluster.url + "/api/v1/workloads", content=text).status_code)
            except httpx.HTTPError as e:
                status = type(e).__name__
        with rec.lock:
            rec.big.append((time.time(), f"{label}, {kind}", time.perf_counter() - t0, status))
            rec.hostile[f"1 MiB manifest {status}"] += 1


def manifest_flood(cluster: Cluster, rec: Record, count: int, kib: int) -> None:
    text = flow_list(kib * 1024, "flood")

    def send(i: int) -> None:
        if i == count:  # beside the flood: the 1 MiB manifests, timed
            time.sleep(1.0)
            one_mib(cluster, rec, "during the flood")
            return
        with hostile_client() as http:
            try:
                status = str(http.post(cluster.url + "/api/v1/workloads", content=text).status_code)
            except httpx.HTTPError as e:
                status = type(e).__name__
        with rec.lock:
            rec.hostile[f"{kib} KB manifest {status}"] += 1

    in_threads(count + 1, send)
    rec.floods.append(f"{count} parallel {kib} KB flow lists (and 1 MiB manifests)")


def logs_flood(cluster: Cluster, rec: Record, count: int) -> None:
    try:
        hog = cluster.admin.get(f"/workloads/{HOSTILE}/hog").json()
    except (httpx.HTTPError, ValueError):
        hog = {}
    if hog.get("node") != "hostile":
        rec.notes.append(f"logs flood: gamma/hog was on {hog.get('node')!r}, not the slow node")

    def read(_i: int) -> None:
        with hostile_client() as http:
            try:
                status = str(
                    http.get(f"{cluster.url}/api/v1/workloads/{HOSTILE}/hog/logs").status_code
                )
            except httpx.HTTPError as e:
                status = type(e).__name__
        with rec.lock:
            rec.hostile[f"slow logs {status}"] += 1

    in_threads(count, read)
    rec.floods.append(f"{count} parallel slow log reads")


def bodies_flood(cluster: Cluster, rec: Record, count: int, mib: int, parallel: int = 4) -> None:
    """``count`` bodies of ``mib`` MiB announced to the public deployment, each cut off (a reset)
    after nine tenths of it."""
    port = cluster.gateway_port
    head = (
        f"POST /serve/{HOSTILE}.pub/predict HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {mib * MIB}\r\n\r\n"
    ).encode()
    chunk = b"1" * MIB
    todo = list(range(count))
    lock = threading.Lock()

    def send(_i: int) -> None:
        while True:
            with lock:
                if not todo:
                    return
                todo.pop()
            outcome = "aborted"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                    s.sendall(head)
                    for _ in range(mib * 9 // 10):
                        s.sendall(chunk)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            except OSError as e:
                outcome = f"cut by the gateway ({type(e).__name__})"
            with rec.lock:
                rec.hostile[f"{mib} MiB body {outcome}"] += 1

    in_threads(parallel, send)
    rec.floods.append(f"{count} aborted {mib} MiB bodies to a public deployment")


# -- faults --------------------------------------------------------------------------------------


def kill_node(cluster: Cluster, rec: Record, i: int) -> None:
    pid = cluster.node_pid(i)
    if pid is None:
        rec.notes.append(f"kill -9 local-{i}: no pid")
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    rec.faults.append(f"kill -9 node agent local-{i}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and cluster.node_pid(i) in (pid, None):
        time.sleep(0.2)
    if not cluster.wait_nodes([f"local-{i}"], 60):
        rec.notes.append(f"local-{i} was not alive again within 60 s of its kill -9")


def disk_full(cluster: Cluster, rec: Record, mounted: bool) -> None:
    if not mounted:
        rec.notes.append("no tmpfs could be mounted: no full disk")
        return
    where = cluster.node_dir(DISK_NODE)
    soak.fill(where, True)
    rec.faults.append(f"local-{DISK_NODE}'s data directory full for 10 s")
    time.sleep(10)
    soak.fill(where, False)
    if not cluster.wait_nodes([f"local-{DISK_NODE}"], 60):
        rec.notes.append(f"local-{DISK_NODE} was not alive within 60 s of its disk's end")


def kill_control(cluster: Cluster, rec: Record) -> None:
    sample_rss(cluster, rec)  # the last reading of this control plane and its gateway
    cluster.kill()
    rec.faults.append("kill -9 the control plane")
    took = cluster.start()
    rec.notes.append(f"control plane answered again {took:.1f} s after its kill -9")
    cluster.wait_nodes([f"local-{i}" for i in range(LOCAL)], 60)


# -- the phase -----------------------------------------------------------------------------------

BEGAN = time.monotonic()


def say(what: str) -> None:
    """Progress, on stderr (the table goes to stdout at the end)."""
    print(f"[soak cluster {time.monotonic() - BEGAN:6.0f} s] {what}", file=sys.stderr, flush=True)


def pct(v: list[float], q: float, scale: float = 1.0, digits: int = 3) -> str:
    return f"{sorted(v)[min(len(v) - 1, int(q * len(v)))] * scale:.{digits}f}" if v else "-"


def p99(v: list[float]) -> float | None:
    return sorted(v)[min(len(v) - 1, int(0.99 * len(v)))] if v else None


def run_cluster_phase(args: Any) -> bool:
    tmp = Path(tempfile.mkdtemp(prefix="gpufrac-soak-cluster-"))
    cluster = Cluster(tmp, args.lease)
    disk = cluster.node_dir(DISK_NODE)
    disk.mkdir(parents=True)
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], capture_output=True
        ).returncode
        == 0
    )
    (cluster.data / "tokens.yaml").write_text(
        "tokens:\n"
        + "".join(
            f"  {t}: {{admin: true}}\n" if who == "admin" else f"  {t}: {{tenant: {who}}}\n"
            for who, t in TOKENS.items()
        )
    )
    (cluster.data / "tokens.yaml").chmod(0o600)  # refused otherwise
    run = secrets.token_hex(4)
    rec, windows, stop = Record(), Windows(), threading.Event()
    trickle = Trickle(args.trickle)
    threads: list[threading.Thread] = []
    result: dict[str, Any] = {}
    started = time.time()
    try:
        say(f"control plane and {LOCAL} local nodes starting ({tmp})")
        cluster.start()
        names = [f"local-{i}" for i in range(LOCAL)]
        if not cluster.wait_nodes(names, 120):
            raise RuntimeError(f"the local nodes did not come up: {cluster.nodes()}")
        result["bootstrap"] = {n: s["state"] for n, s in cluster.nodes().items()}
        token = (cluster.data / "cluster-token").read_text().strip()

        def timed(at: float, took: float, status: int | None) -> None:
            with rec.lock:
                rec.beats.append((at, took, status))

        probe = FakeNode(cluster, token, "probe", 0, {"role": "probe"}, None, timed)
        hostile = FakeNode(cluster, token, "hostile", 1, {"pool": "hostile"}, trickle.url)
        for node in (probe, hostile):
            node.join()
        threads.append(threading.Thread(target=probe_loop, args=(probe, stop), daemon=True))
        threads.append(threading.Thread(target=hostile.loop, args=(stop,), daemon=True))
        for who, name in (("alpha", "echo"), ("beta", "echo"), (HOSTILE, "pub")):
            text = deployment(who, name, run, public=who == HOSTILE)
            r = httpx.post(
                cluster.url + "/api/v1/workloads",
                content=text,
                headers={"authorization": f"Bearer {TOKENS[who]}"},
                timeout=60,
            )
            assert r.status_code == 200, r.text
        r = httpx.post(
            cluster.url + "/api/v1/workloads",
            content=workload(HOSTILE, "hog", "service", "hostile", run),
            headers={"authorization": f"Bearer {TOKENS[HOSTILE]}"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        waiting = {"alpha.echo", "beta.echo", f"{HOSTILE}.pub"}
        while waiting and time.monotonic() < deadline:
            for d in list(waiting):
                with contextlib.suppress(httpx.HTTPError):
                    r = httpx.post(
                        f"{cluster.gateway}/serve/{d}/predict",
                        json={"inputs": [1]},
                        headers={"authorization": f"Bearer {TOKENS[d.split('.')[0]]}"},
                        timeout=5,
                    )
                    if r.status_code == 200:
                        waiting.discard(d)
            time.sleep(0.5)
        if waiting:
            rec.notes.append(f"not serving within 120 s: {sorted(waiting)}")
        follow = [cluster.node_dir(i) / "node.log" for i in range(LOCAL)]
        more = [
            threading.Thread(
                target=tenant_traffic, args=(cluster, a, b, run, rec, stop), daemon=True
            )
            for a, b in (("alpha", "beta"), ("beta", "alpha"))
        ]
        more.append(
            threading.Thread(target=watch, args=(cluster, run, rec, stop, follow), daemon=True)
        )
        for t in more:
            t.start()
        threads += more
        say("traffic started")
        end = time.monotonic() + args.minutes * 60
        big, bodies = (args.flood_manifests, args.manifest_kb), (args.flood_bodies, args.body_mib)
        rounds = 0
        while True:
            time.sleep(args.warmup)  # calm: the traffic warms the processes up
            sample_rss(cluster, rec, base=True)
            if rounds == 0:
                time.sleep(2)
                one_mib(cluster, rec, "calm")
            steps: list[tuple[str, str, Callable[[], None]]] = [
                ("flood", "big manifests", partial(manifest_flood, cluster, rec, *big)),
                ("fault", "kill -9 a node agent", partial(kill_node, cluster, rec, rounds % LOCAL)),
                ("flood", "slow log reads", partial(logs_flood, cluster, rec, args.flood_logs)),
                ("fault", "full disk", partial(disk_full, cluster, rec, mounted)),
                ("flood", "aborted bodies", partial(bodies_flood, cluster, rec, *bodies)),
                ("fault", "kill -9 the control plane", partial(kill_control, cluster, rec)),
            ]
            for kind, label, step in steps:
                time.sleep(GAP_S)
                say(f"round {rounds + 1}: {label}")
                with windows.open(kind, label):
                    step()
            rounds += 1
            if time.monotonic() >= end:
                break
        time.sleep(GAP_S)
        say("traffic stops; final checks")
        stop.set()
        for t in threads:
            t.join(timeout=60)
        time.sleep(15)  # what was applied last is placed and started
        listed = cluster.admin.get("/workloads").json()["workloads"]
        stored = {f"{w['tenant']}/{w['name']}": w for w in listed}
        live = processes(run)
        result["lost"] = sorted(rec.applied - set(stored))
        result["idle"] = sorted(
            k
            for k in rec.applied & set(stored)
            if stored[k]["spec"].get("type") == "service" and k not in live
        )
        result["phases"] = Counter(
            w["phase"] for k, w in stored.items() if k.split("/")[0] in WHERE
        )
        events = cluster.admin.get("/events", params={"limit": 10_000}).json()["events"]
        result["events"] = [
            (e["at"], e["kind"], e["subject"])
            for e in events
            if e["kind"] in ("fenced", "node_lost")
        ]
        result["health"] = cluster.admin.get("/health").json()
        sample_rss(cluster, rec)
        result["rounds"] = rounds
    finally:
        stop.set()
        teardown(cluster, run, trickle, mounted, disk)
        shutil.rmtree(tmp, ignore_errors=True)
    return report(args, cluster, rec, windows, result, mounted, time.time() - started)


def teardown(cluster: Cluster, run: str, trickle: Trickle, mounted: bool, disk: Path) -> None:
    """Stop the control plane (SIGTERM stops its local nodes and gateway), then kill whatever
    outlived it: node agents, shims, the workloads of this run, the gateway."""
    trickle.close()
    gateway = cluster.gateway_pid()
    proc = cluster.proc
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for pid in [gateway, *(cluster.node_pid(i) for i in range(LOCAL))]:
        if pid is not None and alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for module in ("gpufrac.runtime.shim", "gpufrac.serving"):
        for pid in soak.pids_of(module, str(cluster.data)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for pids in processes(run).values():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for i in range(LOCAL):
        with contextlib.suppress(Exception):
            soak.stop_workloads(cluster.node_dir(i))
    if mounted:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def report(
    args: Any,
    cluster: Cluster,
    rec: Record,
    windows: Windows,
    result: dict[str, Any],
    mounted: bool,
    took_s: float,
) -> bool:
    by: dict[str, list[float]] = {"calm": [], "flood": [], "fault": []}
    gets: dict[str, list[float]] = {"calm": [], "flood": [], "fault": []}
    for at, s, is_get in rec.calls:
        by[windows.kind(at)].append(s)
        if is_get:
            gets[windows.kind(at)].append(s)
    beats: dict[str, list[float]] = {"calm": [], "flood": [], "fault": []}
    missed, slow = Counter[str](), Counter[str]()
    slow_in: list[str] = []  # each slow beat's window, as "0.80 s (slow log reads)"
    for at, s, status in rec.beats:
        kind, label = windows.of(at)
        beats[kind].append(s)
        missed[kind] += status != 200
        slow[kind] += s >= 0.2
        if s >= 0.2:
            slow_in.append(f"{s:.2f} s ({label or kind})")
    unexpected = [(t, what) for t, what in rec.issues if windows.kind(t) != "fault"]
    fenced: dict[str, list[str]] = {"fault": [], "flood": []}
    for at, node, _line in rec.fenced:
        kind, label = windows.of(at)
        fenced["fault" if kind == "fault" else "flood"].append(f"{node} ({label or 'calm'})")
    ev = Counter[str]()
    for at, kind, subject in result.get("events", []):
        if windows.kind(at) == "fault":
            ev[f"{kind} during faults"] += 1
        else:
            ev[f"{kind} outside faults ({subject}, {windows.of(at)[1] or 'calm'})"] += 1
    big = [s for _, _, s, _ in rec.big]
    big_flood = [s for _, label, s, _ in rec.big if label.startswith("during")]
    big_calm = [s for _, label, s, _ in rec.big if label.startswith("calm")]
    growth: dict[str, list[str]] = {"control plane": [], "gateway": []}
    worst: dict[str, float | None] = {"control plane": None, "gateway": None}
    for pid, (role, base, last, n) in rec.rss.items():
        if base is None or n == 0:  # no baseline (it did not live past a warm-up)
            continue
        g = (last - base) / base * 100
        growth[role].append(f"pid {pid}: {base:.0f} -> {last:.0f} ({g:+.1f}%)")
        before = worst[role]
        worst[role] = g if before is None else max(before, g)
    lost, doubled = result.get("lost", []), sorted(rec.doubled)
    hb99, get99 = p99(beats["flood"]), p99(gets["flood"])
    targets = {
        "fencings": not fenced["flood"],
        "heartbeat": hb99 is not None and hb99 < 0.2,
        "1 MiB": bool(big) and max(big) < 1.0,
        "GET": get99 is not None and get99 < 0.5,
        "lost": not lost and not doubled and "lost" in result,
        "rss": all(w is not None and w < 10 for w in worst.values()),
    }

    def met(key: str) -> str:
        return "met" if targets[key] else "MISSED"

    load = os.getloadavg()
    print(
        f"soak, cluster phase: {took_s / 60:.1f} min ({result.get('rounds', 0)} round(s); "
        f"--minutes {args.minutes:g}), {os.cpu_count()} CPU cores (load {load[0]:.1f} at the "
        f"end), simulated GPUs, gpufrac control --local {LOCAL} --lease {args.lease:g}, "
        + (
            f"node protocol on --node-port {cluster.node_port}"
            if cluster.node_port
            else "node protocol on the API port (no --node-port)"
        )
    )
    print(
        "local nodes at the start: "
        + ", ".join(f"{n} {s}" for n, s in sorted(result.get("bootstrap", {}).items()))
    )
    print(f"floods: {'; '.join(rec.floods) or '-'}")
    print(
        f"faults: {'; '.join(rec.faults) or '-'}" + ("" if mounted else "; no tmpfs: no full disk")
    )
    print("| what | value | target | |\n| --- | --- | --- | --- |")
    print(f"| tenants' requests (alpha, beta) | {rec.requests} | | |")
    print(
        "| hostile tenant's answers | "
        + ", ".join(f"{k}: {v}" for k, v in sorted(rec.hostile.items()))
        + " | 413/429 expected | |"
    )
    print(
        f"| tenants' unexpected answers outside faults | {len(unexpected)} "
        f"(during faults: {len(rec.issues) - len(unexpected)}) | 0 | |"
    )
    print(
        f"| fencings caused by floods (node.log, outside faults) | {len(fenced['flood'])}"
        + (f": {', '.join(sorted(set(fenced['flood'])))}" if fenced["flood"] else "")
        + f" | 0 | {met('fencings')} |"
    )
    print(
        f"| fencings during faults (node.log) | {len(fenced['fault'])}"
        + (f": {', '.join(sorted(set(fenced['fault'])))}" if fenced["fault"] else "")
        + " | | |"
    )
    said = ", ".join(f"{k}: {v}" for k, v in sorted(ev.items())) or "0"
    print(f"| control plane's events fenced / node_lost | {said} | | |")
    print(
        f"| heartbeat answer p50 / p99 s, calm | {pct(beats['calm'], 0.5)} / "
        f"{pct(beats['calm'], 0.99)} ({len(beats['calm'])} beats, {slow['calm']} over 0.2 s, "
        f"{missed['calm']} unanswered) "
        "| | |"
    )
    print(
        f"| heartbeat answer p50 / p99 / max s, during floods | {pct(beats['flood'], 0.5)} / "
        f"{pct(beats['flood'], 0.99)} / {pct(beats['flood'], 1.0)} ({len(beats['flood'])} beats,"
        f" {slow['flood']} over 0.2 s, {missed['flood']} unanswered) | p99 < 0.2 "
        f"| {met('heartbeat')} |"
    )
    if slow_in:
        print(f"| slow heartbeat answers (window) | {'; '.join(slow_in)} | | |")
    print(
        f"| 1 MiB manifest answer s, calm / during floods (max) | "
        f"{pct(big_calm, 1.0, digits=2)} / {pct(big_flood, 1.0, digits=2)} "
        f"({', '.join(sorted({status for *_, status in rec.big}))}) | < 1 | {met('1 MiB')} |"
    )
    print(
        f"| tenants' GET p50 / p99 ms, calm | {pct(gets['calm'], 0.5, 1000, 1)} / "
        f"{pct(gets['calm'], 0.99, 1000, 1)} | | |"
    )
    print(
        f"| tenants' GET p50 / p99 ms, during floods | {pct(gets['flood'], 0.5, 1000, 1)} / "
        f"{pct(gets['flood'], 0.99, 1000, 1)} | p99 < 500 | {met('GET')} |"
    )
    print(
        "| tenants' API+gateway p50 / p99 ms, calm / floods / faults | "
        + " / ".join(f"{pct(by[k], 0.5, 1000, 1)}, {pct(by[k], 0.99, 1000, 1)}" for k in by)
        + " | | |"
    )
    print(
        f"| workloads lost / doubled | {len(lost)} / {len(doubled)} "
        f"({len(rec.applied)} expected stored, {len(rec.uncertain)} unanswered applies/deletes)"
        f" | 0 / 0 | {met('lost')} |"
    )
    print(
        f"| services stored but running nowhere at the end | {len(result.get('idle', []))} "
        f"(phases: {', '.join(f'{k} {v}' for k, v in sorted(result.get('phases', {}).items()))})"
        " | | |"
    )
    for role in ("control plane", "gateway"):
        w = worst[role]
        print(
            f"| {role} RSS after warm-up -> last MiB | {'; '.join(growth[role]) or '-'} | "
            f"< 10% | {'met' if w is not None and w < 10 else 'MISSED'} |"
        )
    health = result.get("health", {})
    print(f"| health at the end | {health.get('status')} {health.get('problems') or ''} | ok | |")
    for note in rec.notes:
        print("  note:", note)
    for at, _node, line in rec.fenced[:20]:
        kind, label = windows.of(at)
        print(f"  fenced ({kind}{': ' + label if label else ''}): {line[:160]}")
    for t, line in unexpected[:15]:
        print(f"  unexpected ({windows.kind(t)}): {line}")
    if lost or doubled:
        print("  lost:", lost[:10], "doubled:", {k: rec.doubled[k][1] for k in doubled[:10]})
    if result.get("idle"):
        print("  running nowhere:", result["idle"][:10])
    ok = all(targets.values())
    print("targets:", "met" if ok else "MISSED")
    return ok


if __name__ == "__main__":  # `make bench` runs every bench/*.py: this one runs as soak.py's phase
    print("bench/soak_cluster.py is bench/soak.py's cluster phase: bench/soak.py --phase cluster")
