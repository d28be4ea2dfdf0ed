"""The QoS arbiter with real processes: its own process, SDK clients over its socket, signals.

The workloads' "GPU work" is a timed critical section (tests/integration/qos_worker.py). Assertions
count turns and the arbiter's own accounting, with tolerances that hold on a busy 2-core machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gpufrac.model.qos import QosParams
from gpufrac.runtime.arbiter_link import ArbiterLink, MemberSpec
from gpufrac.runtime.cgroups import HostLimits, WorkloadCgroup, detect, process_frozen
from tests.counter import COUNTER, count
from tests.integration.conftest import RunningAgent
from tests.prom import value

ROOT = Path(__file__).resolve().parents[2]
CGROUPS = detect()


def proc_state(pid: int) -> str:
    """The kernel's state letter for ``pid`` (T: stopped), and T too for a process whose cgroup
    is frozen (the arbiter freezes the cgroup of a workload that has one)."""
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return "T" if process_frozen(pid, CGROUPS) else state


def wait_for(check: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or check}")


@pytest.fixture
def link(tmp_path: Path) -> Iterator[ArbiterLink]:
    link = ArbiterLink(tmp_path / "arbiter", quantum_ms=10, window_s=60, trace=tmp_path / "trace")
    link.sync({}, start=True)
    yield link
    link.close()


@pytest.fixture
def members() -> dict[str, MemberSpec]:
    """What the test registered with the arbiter, as the agent does for each workload it starts."""
    return {}


@pytest.fixture
def spawn(
    link: ArbiterLink, members: dict[str, MemberSpec]
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(key: str, rank: int, weight: int = 1, min_share: int = 0, mode: str = "loop"):  # type: ignore[no-untyped-def]
        # its claims in the hello are ignored: the arbiter knows it by its process group
        args = [link.address, key, "999", "1", "0", mode]
        p = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.qos_worker", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        procs.append(p)
        members[key] = MemberSpec("gpu-0", QosParams(rank, weight, min_share), p.pid)
        link.sync(members)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def held(link: ArbiterLink, *keys: str) -> dict[str, float]:
    stats = link.stats()
    return {k: float(stats[k]["held_s"]) if k in stats else 0.0 for k in keys}


def connected(link: ArbiterLink, *keys: str) -> bool:
    """Each member has said hello (it takes turns through the SDK, no longer a plain process)."""
    stats = link.stats()
    return all(k in stats and stats[k]["mode"] != "transparent" for k in keys)


def turns(link: ArbiterLink) -> int:
    return sum(int(m["turns"]) for m in link.stats().values())


@pytest.mark.parametrize(("wa", "wb"), [(1, 1), (3, 1)])
def test_weights_split_the_turns_of_two_busy_loops(link, spawn, wa: int, wb: int) -> None:  # type: ignore[no-untyped-def]
    spawn("t/a", 0, wa)
    spawn("t/b", 0, wb)
    wait_for(lambda: connected(link, "t/a", "t/b"), what="both clients")
    start = held(link, "t/a", "t/b")
    wait_for(lambda: turns(link) >= 800, timeout=60, what="800 turns")
    end = held(link, "t/a", "t/b")
    a, b = end["t/a"] - start["t/a"], end["t/b"] - start["t/b"]
    # The exact split is the arbiter's rule, checked with a simulated clock in test_arbiter.py. Here
    # real processes ask again after each turn; on a loaded CPU a client sometimes asks late and the
    # GPU goes to the other (work-conserving), which pulls a 3:1 split toward 1:1 (0.68 with a CPU
    # hog on both cores). So: equal weights split evenly, and the heavier weight gets clearly more.
    if wa == wb:
        assert a / (a + b) == pytest.approx(0.5, abs=0.08)
    else:
        assert a / (a + b) >= 0.6


def test_a_lower_class_is_granted_only_while_no_higher_class_waits(link, spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spawn("t/lo", 0)  # connected first: until then it is a plain process, paused by t/hi's class
    wait_for(lambda: connected(link, "t/lo"), what="the low client")
    spawn("t/hi", 10)
    wait_for(lambda: connected(link, "t/lo", "t/hi"), what="both clients")
    wait_for(lambda: turns(link) >= 600, timeout=60, what="600 turns")
    grants = [
        json.loads(line)
        for line in (tmp_path / "trace").read_text().splitlines()
        if '"grant"' in line
    ]
    lows = [g for g in grants if g["member"] == "t/lo"]
    assert grants and all(w["rank"] <= 0 for g in lows for w in g["wanting"])
    # The rule, from the arbiter's own trace: a lower class is granted only while no higher class
    # waits. How much time that leaves it depends on how fast the higher client asks again after
    # each turn, which a loaded CPU slows (a share test here failed with other work on the machine).
    assert len(lows) < len(grants)


def test_min_share_holds_beside_a_busy_higher_class(link, spawn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spawn("t/hi", 10)
    spawn("t/lo", 0, 1, 100)
    wait_for(lambda: connected(link, "t/lo", "t/hi"), what="both clients")
    wait_for(lambda: turns(link) >= 800, timeout=60, what="800 turns")
    lo = link.stats()["t/lo"]
    assert lo["held_s"] / lo["busy_s"] >= 0.09  # of the GPU's busy time, beside the higher class
    trace = [json.loads(line) for line in (tmp_path / "trace").read_text().splitlines()]
    assert not [e for e in trace if e["action"] == "askyield" and e["member"] == "t/hi"]


def test_a_crashed_holder_releases_its_turn(link, spawn) -> None:  # type: ignore[no-untyped-def]
    holder = spawn("t/holder", 10, mode="hold")
    assert holder.stdout is not None and holder.stdout.readline() == b"holding\n"
    spawn("t/other", 0)
    wait_for(lambda: "t/other" in link.stats(), what="the other client")
    time.sleep(0.3)
    assert link.stats()["t/other"]["turns"] == 0  # it waits behind the holder
    holder.kill()
    wait_for(
        lambda: link.stats().get("t/other", {}).get("turns", 0) > 10, what="turns after the crash"
    )
    assert "t/holder" not in link.stats()


def test_a_transparent_process_group_is_paused_for_a_higher_class_and_resumed(
    link, spawn, members
) -> None:  # type: ignore[no-untyped-def]
    bg = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        members["t/bg"] = MemberSpec("gpu-0", QosParams(0), bg.pid)
        link.sync(members)
        wait_for(lambda: proc_state(bg.pid) in "RS", what="bg running")
        holder = spawn("t/hi", 10, mode="hold")
        assert holder.stdout is not None and holder.stdout.readline() == b"holding\n"
        wait_for(lambda: proc_state(bg.pid) == "T", what="bg paused")
        holder.kill()
        wait_for(lambda: proc_state(bg.pid) != "T", what="bg resumed")
        assert link.stats()["t/bg"]["mode"] == "transparent"
    finally:
        bg.kill()
        bg.wait(timeout=10)


@pytest.mark.skipif(not CGROUPS.usable, reason="no writable cgroup hierarchy here")
def test_a_pause_freezes_the_whole_cgroup_even_a_child_that_left_its_group(
    link, spawn, members, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    cgroup = WorkloadCgroup.for_run(CGROUPS, f"gpufrac-test-{os.getpid()}-qos")
    cgroup.create(HostLimits())
    out = tmp_path / "n"
    bg = subprocess.Popen(
        [sys.executable, "-c", COUNTER, str(out)],
        preexec_fn=lambda: cgroup.enter(os.getpid()),
        start_new_session=True,
    )
    escaped = Path(f"{out}.escaped")
    try:
        count(out), count(escaped)
        members["t/bg"] = MemberSpec("gpu-0", QosParams(0), bg.pid, cgroup=cgroup)
        link.sync(members)
        holder = spawn("t/hi", 10, mode="hold")
        assert holder.stdout is not None and holder.stdout.readline() == b"holding\n"
        wait_for(lambda: cgroup.frozen() is True, what="bg's cgroup frozen")
        events = "cgroup.events" if cgroup.versions["freeze"] == 2 else "freezer.state"
        said = (cgroup.dirs["freeze"] / events).read_text()
        assert "frozen 1" in said or "FROZEN" in said
        before = (count(out), count(escaped))
        time.sleep(0.3)
        assert (count(out), count(escaped)) == before  # neither advanced: both frozen
        assert link.stats()["t/bg"]["paused"]
        holder.kill()
        wait_for(lambda: cgroup.frozen() is False, what="bg's cgroup thawed")
        wait_for(lambda: count(escaped) > before[1], what="the escaped child running again")
    finally:
        cgroup.remove()
        bg.wait(timeout=10)


def test_the_arbiter_resumes_everything_when_its_agent_dies(link, spawn, members) -> None:  # type: ignore[no-untyped-def]
    bg = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        members["t/bg"] = MemberSpec("gpu-0", QosParams(0), bg.pid)
        link.sync(members)
        holder = spawn("t/hi", 10, mode="hold")
        assert holder.stdout is not None and holder.stdout.readline() == b"holding\n"
        wait_for(lambda: proc_state(bg.pid) == "T", what="bg paused")
        link.close()  # what the arbiter sees when the agent dies: its pipe closes
        wait_for(lambda: proc_state(bg.pid) != "T", what="bg resumed")
    finally:
        bg.kill()
        bg.wait(timeout=10)


# -- through the agent ----------------------------------------------------------------------------

HOLDER = (
    "import time\n"
    "from gpufrac.sdk import gpu_turn\n"
    "while True:\n"
    "    with gpu_turn():\n"
    "        time.sleep(0.2)\n"
)
MANIFEST = """
apiVersion: gpufrac/v1
kind: Workload
metadata: {{name: {name}}}
spec:
  type: {type}
  command: {command}
  resources: {{gpu: {{fraction: 0.4}}}}
  sharing: timeslice
  priority: {priority}
  min_share: 0  # paused for as long as the higher class holds (the default for jobs is 10%)
"""


def _apply(
    agent: RunningAgent, name: str, kind: str, command: list[str], priority: str
) -> dict[str, object]:
    body = MANIFEST.format(name=name, type=kind, command=json.dumps(command), priority=priority)
    r = httpx.post(agent.url + "/api/v1/workloads", content=body, timeout=30)
    assert r.status_code == 200, r.text
    result: dict[str, object] = r.json()["results"][0]
    return result


def _child(agent: RunningAgent, name: str) -> int:
    runs = sorted((agent.data_dir / "runs" / "default" / name).glob("g*-*"))
    return int(json.loads((runs[-1] / "child.json").read_text())["pid"])


def test_an_agent_restart_leaves_no_workload_paused(agent: RunningAgent) -> None:
    _apply(agent, "busy", "job", [sys.executable, "-c", "while True: pass"], "low")
    _apply(agent, "latency", "service", [sys.executable, "-c", HOLDER], "high")
    wait_for(lambda: (agent.data_dir / "runs/default/busy").exists(), what="busy started")
    wait_for(lambda: any((agent.data_dir / "runs/default/busy").glob("*/child.json")))
    busy = _child(agent, "busy")
    wait_for(lambda: proc_state(busy) == "T", timeout=30, what="busy paused by the arbiter")
    w = httpx.get(agent.url + "/api/v1/workloads/default/busy", timeout=10).json()
    assert w["qos"]["mode"] == "transparent" and w["qos"]["class"] == 0

    def paused_in_metrics() -> bool:  # the metrics show the arbiter's reading of the last pass
        metrics = httpx.get(agent.url + "/metrics", timeout=10).text
        return value(metrics, "gpufrac_workload_qos_paused", workload="busy") == 1

    wait_for(paused_in_metrics, timeout=10, what="the metrics to show busy paused")

    agent.kill9()
    wait_for(lambda: proc_state(busy) != "T", what="busy resumed after the agent died")
    agent.start()
    # the new agent's arbiter pauses it again while the latency service holds its turns ...
    wait_for(lambda: proc_state(busy) == "T", timeout=30, what="busy paused again")
    # ... and a live change (no restart) lifts the busy job above the service
    result = _apply(agent, "busy", "job", [sys.executable, "-c", "while True: pass"], "1000")
    assert result["result"] == "updated" and result["diff"] == ["priority: 0 -> 1000"]
    wait_for(lambda: proc_state(busy) != "T", what="busy running at its new priority")
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufrac.cli",
            "describe",
            "workload",
            "busy",
            "--server",
            agent.url,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert "Class:     2000 (priority 1000, throughput)" in shown and "Measured:" in shown
    assert _child(agent, "busy") == busy  # the same process: applied live
    assert os.getpgid(busy) == busy


def _raw(link: ArbiterLink) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(link.address)
    s.settimeout(10)
    return s


_CLIENT = """
import json, socket, sys
address, script = sys.argv[1], sys.argv[2]
sys.stdin.readline()  # registered as a workload's by now

def conn():
    s = socket.socket(socket.AF_UNIX)
    s.connect(address)
    s.settimeout(10)
    return s

def said(s):
    return s.recv(4096).decode(errors="replace")

out = {}
exec(script)
print(json.dumps(out), flush=True)
sys.stdin.readline()  # its connections held until the test is done
"""


def _member_client(
    link: ArbiterLink, members: dict[str, MemberSpec], script: str
) -> tuple[subprocess.Popen[str], dict[str, object]]:
    """A process registered as a workload's (its own group, alone in a domain of its own, so
    never paused) that runs ``script`` against the arbiter's socket and says what it saw (``out``);
    it keeps its connections until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, link.address, script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    members["t/tester"] = MemberSpec("tester-only", QosParams(0, 1, 0), proc.pid)
    link.sync(members)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return proc, json.loads(proc.stdout.readline())


def _first_line_of_a_stranger(link: ArbiterLink) -> bytes:
    """What a process no workload holds (its own session) is told when it connects."""
    code = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(10)\n"
        "sys.stdout.buffer.write(s.recv(4096))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, link.address],
        capture_output=True,
        timeout=30,
        start_new_session=True,
        check=True,
    )
    return out.stdout


def test_bad_lines_are_answered_and_workloads_cannot_give_agent_commands(  # type: ignore[no-untyped-def]
    link, spawn, members
) -> None:
    bg = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    lines = [
        'H {"qos": [1]}',
        "H not json",
        "Z",
        'S {"key": "x", "domain": "gpu-0", "pgid": ' + str(bg.pid) + "}",
        "Q",
    ]
    script = (
        f"s = conn()\nout['answers'] = []\nfor line in {lines!r}:\n"
        "    s.sendall(line.encode() + b'\\n'); out['answers'].append(said(s))\n"
        # a line longer than any message is cut off, with the connection
        "long = conn(); long.sendall(b'H ' + b'x' * 70_000)\n"
        "out['long'] = [said(long), said(long)]\n"
        # and on a connection whose hello was refused, no turn at all
        "out['after'] = []\nfor line in ('A', 'R'):\n"
        "    s.sendall(line.encode() + b'\\n'); out['after'].append(said(s))\n"
    )
    client, seen = _member_client(link, members, script)
    try:
        answers = seen["answers"]
        assert isinstance(answers, list)
        assert answers[0].startswith("K "), answers  # a member's hello (its qos claim ignored)
        assert all(a.startswith("E ") for a in answers[1:]), answers
        time.sleep(0.2)
        assert proc_state(bg.pid) != "T" and "x" not in link.stats()
        long = seen["long"]
        assert isinstance(long, list) and long[0].startswith("E ") and long[1] == "", long
        after = seen["after"]
        assert isinstance(after, list)
        assert all(a.startswith("E ") and "hello was refused" in a for a in after), after
        # a process the agent did not start is no workload: not kept, whatever it would claim
        told = _first_line_of_a_stranger(link)
        assert told.startswith(b"E ") and b"unknown peer" in told, told
        spawn("t/real", 0)  # the arbiter survived all of it and still grants turns
        wait_for(lambda: link.stats().get("t/real", {}).get("turns", 0) > 5, what="turns")
    finally:
        client.kill()
        client.wait(timeout=10)
        bg.kill()
        bg.wait(timeout=10)


def test_one_process_cannot_use_up_the_arbiters_connections(link, spawn, members) -> None:  # type: ignore[no-untyped-def]
    """From the hostile reviews: 20,000 connections from one process took every descriptor of
    the arbiter, which then spun and refused every workload's client; later, 1,054 from processes
    of one container that each left its process group (setsid) and said nothing."""
    from gpufrac.runtime.arbiter_server import MAX_CONNS_PER_MEMBER

    n = MAX_CONNS_PER_MEMBER
    script = (
        f"socks = [conn() for _ in range({n + 20})]\n"
        f"answers = [said(s) for s in socks[{n}:]]\n"
        "out['refused'] = sum('too many connections' in a for a in answers)\n"
    )
    client, seen = _member_client(link, members, script)
    try:
        assert seen["refused"] == 20, seen
        assert "t/tester" in link.stats()  # the agent's own connection still answers
        # a process that left the workload's group is no workload's: not kept at all
        told = _first_line_of_a_stranger(link)
        assert told.startswith(b"E ") and b"unknown peer" in told, told
        spawn("t/real", 0)  # and another workload's client is still taken
        wait_for(lambda: link.stats().get("t/real", {}).get("turns", 0) > 5, what="turns")
    finally:
        client.kill()
        client.wait(timeout=10)


def test_an_idle_arbiter_stops_at_once_on_sigterm(link) -> None:  # type: ignore[no-untyped-def]
    assert link.proc is not None
    started = time.monotonic()
    link.proc.terminate()
    link.proc.wait(timeout=5)
    assert time.monotonic() - started < 2
    assert not Path(link.address).exists()


def test_a_hung_arbiter_is_killed_and_what_it_paused_runs_again(link, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        members = {"t/a": MemberSpec("gpu-0", QosParams(0, 1, 0), sleeper.pid)}
        link.sync(members)
        old = link.proc
        assert old is not None and link.running
        os.kill(old.pid, signal.SIGSTOP)  # hung: alive, answering nothing
        os.killpg(sleeper.pid, signal.SIGSTOP)  # as the hung arbiter had paused it
        t0 = time.monotonic()
        assert link.stats() == {}  # no answer within the call timeout: taken for dead
        took = time.monotonic() - t0
        assert old.poll() is not None  # and killed after its grace, not left behind
        assert took < link.child.call_timeout + link.child.grace + 2.0
        assert proc_state(sleeper.pid) == "T"
        link.sync(members, start=True)  # the next pass: what was paused runs, a new arbiter starts
        assert proc_state(sleeper.pid) != "T"
        assert link.running and link.proc is not None and link.proc.pid != old.pid
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)
