"""``gpufrac gpus``: every GPU with its MIG instances and processes."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpufrac.cli.common import (
    DataDirOpt,
    JsonOpt,
    SimulateOpt,
    console,
    devices,
    handled_errors,
    print_json,
)
from gpufrac.model.gpu import GpuState


def gpus_command(
    simulate: SimulateOpt = None, data_dir: DataDirOpt = None, json: JsonOpt = False
) -> None:
    """Show the GPUs: memory, MIG mode, MIG instances and the processes on them."""
    with handled_errors(), devices(simulate, data_dir) as dev:
        states = dev.gpus()
    if json:
        print_json({"gpus": [g.to_json() for g in states]})
        return
    if not states:
        console.print("no GPUs found")
    for gpu in states:
        console.print(render_gpu(gpu))


def render_gpu(gpu: GpuState) -> Panel:
    if gpu.health != "ok":
        return Panel(Text(f"GPU {gpu.index}: {gpu.name}", style="bold red"), border_style="red")
    util = "n/a" if gpu.utilization_gpu is None else f"{gpu.utilization_gpu}%"
    mig = (
        gpu.mig_current
        if gpu.mig_current == gpu.mig_pending
        else f"{gpu.mig_current} → {gpu.mig_pending} (pending)"
    )
    head = Text.assemble(
        (f"{gpu.memory_used_mib:,} / {gpu.memory_total_mib:,} MiB used", "bold"),
        f"   util {util}   MIG {mig}   PCI {gpu.pci_device_id}\n",
        (gpu.uuid, "dim"),
    )
    parts: list[Text | Table] = [head]
    if gpu.instances:
        t = Table(title="MIG instances", title_justify="left", expand=False)
        for col in ("profile", "start", "GI", "memory MiB", "busy", "MIG device UUID"):
            t.add_column(col, overflow="fold")
        for inst in gpu.instances:
            mem = "?" if inst.memory_mib is None else f"{inst.memory_mib:,}"
            t.add_row(
                inst.profile,
                str(inst.start),
                str(inst.gi_id),
                mem,
                "yes" if inst.busy else "",
                inst.uuid or "-",
            )
        parts.append(t)
    elif gpu.mig_enabled:
        parts.append(Text("MIG enabled, no instances yet", style="dim"))
    if gpu.processes:
        t = Table(title="processes", title_justify="left")
        for col in ("pid", "memory MiB", "GI"):
            t.add_column(col)
        for p in gpu.processes:
            t.add_row(
                str(p.pid),
                "?" if p.used_memory_mib is None else f"{p.used_memory_mib:,}",
                "-" if p.gi_id is None else str(p.gi_id),
            )
        parts.append(t)
    for w in gpu.warnings:
        parts.append(Text(f"catalog differs from driver: {w}", style="yellow"))
    title = f"GPU {gpu.index} · {gpu.name}" + (" · simulated" if gpu.simulated else "")
    return Panel(Group(*parts), title=title, title_align="left")
