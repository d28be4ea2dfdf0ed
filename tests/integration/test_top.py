"""``gpufrac top`` in a real terminal (tmux, which ``make test`` installs) on a real agent: it shows
every GPU and workload, answers keys, shows an agent that went away and comes back, quits on ``q``
and on Ctrl-C, and leaves the terminal as it found it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningAgent

WORKLOADS = """
apiVersion: gpufrac/v1
kind: Workload
metadata: {name: ranker, tenant: search}
spec:
  type: service
  command: [sleep, '600']
  resources: {gpu: {mig: 1g.18gb}}
---
apiVersion: gpufrac/v1
kind: Workload
metadata: {name: trainer, tenant: research}
spec:
  type: service
  command: [sleep, '600']
  resources: {gpu: {memory: 24GiB, compute: 50%}}
  sharing: mps
---
apiVersion: gpufrac/v1
kind: Workload
metadata: {name: bigjob, tenant: research}
spec:
  type: job
  command: [sleep, '600']
  resources: {gpu: {count: 1}}
  priority: low
"""
# what the pane must show once the agent has placed them (GPU 0 is in MIG mode, GPU 1 is not)
EVERYTHING = [
    r"^ 0 +H200-141GB MIG",
    r"^ 1 +H200-141GB ",
    r"1g\.18gb@\d+ +search/ranker",
    r"mps 50% +research/trainer",
    r"^ research/trainer +running +GPU 1 mps",
    r"^ search/ranker +running +GPU 0 mig 1g\.18gb@\d+",
    r"^ research/bigjob .*needs 1 whole GPU",
]


class Pane:
    """One tmux session on a private server socket (killed at the end)."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=check
        )

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top", check=False).stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def wait(self, what: str, ok: Callable[[str], bool], seconds: float = 30) -> str:
        deadline = time.monotonic() + seconds
        while True:
            screen = self.screen()
            if ok(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"the pane never showed {what}; it shows:\n{screen}")
            time.sleep(0.2)


def shows(*patterns: str) -> Callable[[str], bool]:
    return lambda screen: all(re.search(p, screen, flags=re.M) for p in patterns)


def wait_file(path: Path, seconds: float = 15) -> str:
    deadline = time.monotonic() + seconds
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path.name} was never written: the program hangs"
        time.sleep(0.1)
    return path.read_text().strip()


@pytest.fixture
def pane() -> Iterator[Pane]:
    assert shutil.which("tmux"), "these tests need tmux: `make test` installs it (apt-get)"
    p = Pane(f"gpufrac-top-{uuid.uuid4().hex[:12]}")
    yield p
    p.tmux("kill-server", check=False)


def test_top_shows_the_fleet_answers_keys_and_quits(
    small_agent: RunningAgent, pane: Pane, tmp_path: Path
) -> None:
    r = httpx.post(small_agent.url + "/api/v1/workloads", content=WORKLOADS.encode(), timeout=30)
    assert r.status_code == 200, r.text
    top = f"{shlex.quote(sys.executable)} -m gpufrac.cli top --server {small_agent.url}"
    out = shlex.quote(str(tmp_path))
    # the terminal's settings before, between and after two runs (one quit by q, one by Ctrl-C)
    script = (
        f"stty -g > {out}/tty0; {top}; echo $? > {out}/rc1; stty -g > {out}/tty1; "
        f"{top}; echo $? > {out}/rc2; stty -g > {out}/tty2"
    )
    pane.tmux("new-session", "-d", "-s", "top", "-x", "160", "-y", "50", "bash", "-c", script)

    screen = pane.wait("every GPU and workload", shows(*EVERYTHING))
    assert screen.rstrip().splitlines()[-1].startswith("q quit")

    pane.keys("s")  # the next sort column
    pane.wait("the workloads sorted by phase", shows(r"workloads \(sorted by phase\)"))
    pane.keys("/", "ranker", "Enter")  # only what matches
    pane.wait(
        "only search/ranker",
        lambda s: (
            "filter: all tenants 'ranker'" in s
            and re.search(r"^ search/ranker +running", s, flags=re.M) is not None
            and "research/trainer" not in s
        ),
    )
    pane.keys("Escape")
    pane.wait("the filter cleared", shows(r"^ research/trainer +running"))

    small_agent.kill9()  # the agent goes away: shown, and asked again
    pane.wait("that the agent is not answering", shows(r"^agent not answering: cannot reach it"))
    assert "search/ranker" in pane.screen()  # its last answer stays on screen
    small_agent.start()
    pane.wait("the agent back", lambda s: "not answering" not in s and shows(*EVERYTHING)(s))

    pane.keys("q")
    assert wait_file(tmp_path / "rc1") == "0"
    pane.wait("the second run", shows(*EVERYTHING))
    pane.keys("C-c")
    assert wait_file(tmp_path / "rc2") == "0"
    wait_file(tmp_path / "tty2")
    tty = [(tmp_path / f"tty{i}").read_text() for i in range(3)]
    assert tty[0] == tty[1] == tty[2], "the terminal's settings were not restored"
    once = subprocess.run(
        [sys.executable, "-m", "gpufrac.cli", "top", "--once", "--server", small_agent.url],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert once.returncode == 0, once.stderr
    assert shows(*EVERYTHING)(once.stdout), once.stdout  # one frame, no terminal needed
    deadline = time.monotonic() + 10  # the shell ends: the session goes
    while pane.tmux("has-session", "-t", "top", check=False).returncode == 0:
        assert time.monotonic() < deadline, "the pane is still there"
        time.sleep(0.1)


def test_top_once_and_without_a_terminal() -> None:
    """--once without an agent: the frame says so, exit 2 (as every command); no terminal: exit
    2."""
    top = [sys.executable, "-m", "gpufrac.cli", "top", "--server", "http://127.0.0.1:9"]
    env = {**os.environ, "COLUMNS": "160"}
    gone = subprocess.run([*top, "--once"], capture_output=True, text=True, env=env)
    assert gone.returncode == 2
    assert "agent not answering: cannot reach it" in gone.stdout
    no_tty = subprocess.run(top, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert no_tty.returncode == 2 and "needs a terminal" in no_tty.stderr
    assert "Traceback" not in no_tty.stderr
