"""A workload that counts, and a child of it that left its process group (``setsid``) and counts
too, each to its own file: frozen, neither count advances (the tests of cgroup freezing read them,
not ``/proc`` state, which a frozen process does not show as T)."""

from __future__ import annotations

import time
from pathlib import Path

COUNTER = """
import os, sys, time
out = sys.argv[1]
if os.fork() == 0:
    os.setsid()  # leaves the workload's process group
    out += ".escaped"
n = 0
while True:
    n += 1
    with open(out + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(out + ".tmp", out)
    time.sleep(0.01)
"""


def count(path: Path, tries: int = 500) -> int:
    """The count in ``path``, once it has been written (at most ``tries`` x 10 ms)."""
    for _ in range(tries):
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.01)
    raise AssertionError(f"{path} never written")
