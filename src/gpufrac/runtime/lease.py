"""A cluster node's lease file: until when the node's workloads may run without word from its
control plane (docs/cluster.md, fencing).

The node agent (``cluster/node.py``) renews it with each answer of its control plane
(``write_lease``); every run started under the lease reads it (the process runner's shim, every
``LEASE_CHECK_S``) and stops its workload once the lease has run out (``lease_ended``). The file is
the node's, not a runner's: each runner is given its path (``runtime.runner.Launch.lease``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

LEASE_CHECK_S = 0.25  # how often a shim reads its node's lease file


LEASE_BYTES = 96  # the lease file's fixed size: renewed in place, it needs no new space


def write_lease(path: Path, until: float, grace: float) -> None:
    """Renew a node's lease file: its workloads may run until ``until`` (wall clock), then get
    SIGTERM and, ``grace`` seconds on, SIGKILL.

    The file is written once whole (a new file, renamed into place), then renewed in place: the
    same ``LEASE_BYTES`` bytes over themselves, which a full disk does not refuse, so a node whose
    disk fills up keeps its work running while the control plane answers it. A shim that reads
    a renewal half written reads no lease and keeps the last one it read (``lease_ended``)."""
    text = json.dumps({"until": until, "grace": grace}).encode().ljust(LEASE_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(text)
        os.replace(tmp, path)
        return
    try:
        os.pwrite(fd, text, 0)
        if os.fstat(fd).st_size > len(text):  # written whole before, by an older version
            os.ftruncate(fd, len(text))
    finally:
        os.close(fd)


def read_lease(path: Path) -> tuple[float, float] | None:
    """(until, grace) from the lease file in ``path``, or None where it cannot be read."""
    try:
        lease = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(lease, dict):
        return None
    until, grace = lease.get("until"), lease.get("grace", 1.0)
    if not isinstance(until, int | float) or not isinstance(grace, int | float):
        return None
    return float(until), float(grace)


def lease_ended(path: Path, last: tuple[float, float] | None = None) -> tuple[float, float] | None:
    """(when it ended, the grace) if the lease in ``path`` has run out; None while it holds. A
    file that cannot be read (removed with its node's data) counts as the ``last`` lease read: a
    shim never stops a workload while a lease it saw holds, nor runs on past it unrenewed."""
    lease = read_lease(path) or last
    if lease is None:
        return None
    return lease if time.time() > lease[0] else None
