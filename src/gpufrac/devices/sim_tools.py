"""The driver's tools that simulated GPUs stand in for, on the simulation's PATH.

``nvidia-cuda-mps-control``: ``-d`` makes the pipe directory's ``control`` (as the real daemon's
named pipe is there while it runs), commands read on stdin are answered as by a daemon with no
server running (``get_server_list`` prints nothing; ``quit`` removes ``control``), and every call
is recorded, one JSON line each (with the pipe directory and ``CUDA_VISIBLE_DEVICES``), in
``mps-control.log`` beside the program, so CPU tests see the commands the agent sends the real
daemon and the device each daemon was started for.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_LOG = "mps-control.log"

_MPS_STANDIN = '''#!{python} -S
"""A stand-in for nvidia-cuda-mps-control on simulated GPUs (gpufrac.devices.sim_tools)."""
import json, os, sys, time

here = os.path.dirname(os.path.abspath(__file__))
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")


def record(command):
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # the device a daemon (-d) serves
    line = json.dumps({{"command": command, "pipe": pipe, "visible": visible, "at": time.time()}})
    with open(os.path.join(here, "{log}"), "a") as f:
        f.write(line + "\\n")


if sys.argv[1:] == ["-d"]:
    os.makedirs(pipe, exist_ok=True)
    open(os.path.join(pipe, "control"), "w").close()
    record("-d")
    sys.exit(0)
for line in sys.stdin:
    command = line.strip()
    if not command:
        continue
    record(command)
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
    text = _MPS_STANDIN.format(python=sys.executable, log=MPS_LOG)
    if not program.exists() or program.read_text() != text:
        tmp = directory / f".{MPS_CONTROL}.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, program)
    return directory
