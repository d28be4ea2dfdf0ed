"""The driver's tools that simulated GPUs stand in for, on the simulation's PATH.

``nvidia-cuda-mps-control``: ``-d`` makes the pipe directory's ``control`` (as the real daemon's
named pipe is there while it runs) and keeps there the devices it serves: those of its
``CUDA_VISIBLE_DEVICES`` (one or several, comma-separated, as the real daemon serves them:
remapped to its clients as device 0, 1, ...). Commands read on stdin are answered as by a daemon
with one server running, whose pid (``mps_server_pid`` of the pipe directory, past Linux's
largest: no process has it) the simulated NVML lists while the daemon has clients
(``get_server_list`` prints it: a real daemon starts its server for its first client; ``quit``
removes ``control``); a
device ordinal (``set_default_device_pinned_mem_limit DEV VALUE``, ``set_device_pinned_mem_limit
PID DEV VALUE``) must be one of the daemon's devices, and a command malformed or naming a device
it does not serve is answered with an error line and recorded with ``error``. Every call is
recorded, one JSON line each (with the pipe directory and ``CUDA_VISIBLE_DEVICES``), in
``mps-control.log`` beside the program, so CPU tests see the commands the agent sends the real
daemon and the devices each daemon was started for.
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_LOG = "mps-control.log"
MPS_SERVER_PID = 1 << 22  # Linux's PID_MAX_LIMIT: no process has this pid or one above it


def mps_server_pid(pipe: str) -> int:
    """The pid the simulation gives the MPS server of the daemon at pipe directory ``pipe`` (the
    stand-in's ``get_server_list`` and the simulated NVML's process list agree on it)."""
    return MPS_SERVER_PID + 64 * (zlib.crc32(pipe.encode()) & 0xFFFFF)


_MPS_STANDIN = '''#!{python} -S
"""A stand-in for nvidia-cuda-mps-control on simulated GPUs (gpufrac.devices.sim_tools)."""
import json, os, sys, time, zlib

here = os.path.dirname(os.path.abspath(__file__))
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")


def record(command, error=None):
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # the devices a daemon (-d) serves
    entry = {{"command": command, "pipe": pipe, "visible": visible, "at": time.time()}}
    if error is not None:
        entry["error"] = error
    with open(os.path.join(here, "{log}"), "a") as f:
        f.write(json.dumps(entry) + "\\n")


def served():
    """How many devices the daemon of this pipe directory serves (0: none runs; None: every
    device of the machine, started without CUDA_VISIBLE_DEVICES: not checked here)."""
    try:
        with open(os.path.join(pipe, "control")) as f:
            return len([d for d in f.read().strip().split(",") if d]) or None
    except FileNotFoundError:
        return 0


def check(words):
    """Why a command is refused (None: accepted), as to a daemon serving served() devices."""
    name, args = words[0], words[1:]
    shapes = {{
        "get_server_list": 0,
        "quit": 0,
        "set_default_active_thread_percentage": 1,
        "set_active_thread_percentage": 2,
        "set_default_device_pinned_mem_limit": 2,
        "set_device_pinned_mem_limit": 3,
    }}
    if name not in shapes:
        return None  # others are taken as they come
    if len(args) != shapes[name]:
        return f"{{name}} takes {{shapes[name]}} argument(s)"
    if name.endswith("pinned_mem_limit"):
        dev, count = args[-2], served()
        if not dev.isdigit() or (count is not None and int(dev) >= count):
            return f"no device {{dev}}: the daemon serves {{count}}"
        value = args[-1]
        if not (value[:-1].isdigit() and value[-1] in "MG"):
            return f"bad limit {{value}}"
    if name.endswith("thread_percentage") and not args[-1].isdigit():
        return f"bad percentage {{args[-1]}}"
    return None


if sys.argv[1:] == ["-d"]:
    os.makedirs(pipe, exist_ok=True)
    with open(os.path.join(pipe, "control"), "w") as f:
        f.write(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    record("-d")
    sys.exit(0)
for line in sys.stdin:
    command = line.strip()
    if not command:
        continue
    error = check(command.split())
    record(command, error)
    if error is not None:
        print("error: " + error)
        continue
    if command == "get_server_list" and served() != 0:
        print({server_pid} + 64 * (zlib.crc32(pipe.encode()) & 0xFFFFF))
    if command == "quit":
        try:
            os.unlink(os.path.join(pipe, "control"))
        except FileNotFoundError:
            pass
'''


def write_sim_tools(directory: Path) -> Path:
    """Write the stand-ins into ``directory`` (once; kept as they are after) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    program = directory / MPS_CONTROL
    text = _MPS_STANDIN.format(python=sys.executable, log=MPS_LOG, server_pid=MPS_SERVER_PID)
    if not program.exists() or program.read_text() != text:
        tmp = directory / f".{MPS_CONTROL}.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, program)
    return directory
