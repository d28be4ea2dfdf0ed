"""Safe defaults on a shared GPU: does a plain job starve beside services?

A job that needs one second of CPU time (time paused by the QoS arbiter does not count) runs on one
simulated H200, time-sliced, under the real agent (its own reconcile loop, real shims, the real
arbiter process):

* solo;
* beside two idle services of a higher class (no SDK: transparent, their processes sleeping);
* beside a busy service of a higher class (its processes keep the GPU's SMs busy, as NVML's
  per-process reading shows; here the simulated GPU's), with the default job_min_share (10%);
* high-service-beside-low-job: a busy high service beside a low job that runs until stopped, 15 s,
  with the job's default min share and with ``min_share: 0`` (the baseline): how often the
  service's processes are found stopped (``T`` in /proc/PID/stat, or in a frozen cgroup; target
  0) and the job's share of the GPU's busy time by the arbiter's accounting (target: at least its
  min share).

Reported: the job's time to complete against solo, and the share of the GPU's turn time the arbiter
gave it. The targets: beside idle services no more than 1.5x solo (an idle service holds nothing);
beside a busy one at least 9% (its min share). Simulated GPUs; on the CPU.
Run: .venv/bin/python bench/defaults.py
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpufrac.devices import open_simulated
from gpufrac.model.manifest import parse_objects
from gpufrac.model.workload import WorkloadSpec
from gpufrac.runtime.agent import Agent
from gpufrac.runtime.cgroups import detect, process_frozen
from gpufrac.runtime.service import AgentService
from gpufrac.runtime.shim import read_status

PY = sys.executable
JOB = "import time\nwhile time.process_time() < 1.0: pass\n"
IDLE = "import time\ntime.sleep(600)\n"
BUSY = (
    "from gpufrac.sdk import report_gpu_use\nreport_gpu_use(1024, 100)\n"
    "import time\nwhile True: time.sleep(0.001)\n"  # busy on the GPU, light on the CPU
)


def spec(name: str, kind: str, code: str, priority: str) -> WorkloadSpec:
    restart = "  restart: always\n" if kind == "service" else ""
    text = (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}}}\nspec:\n"
        f"  type: {kind}\n  command: {json.dumps([PY, '-c', code])}\n"
        f"  resources: {{gpu: {{fraction: 0.3}}}}\n  sharing: timeslice\n  priority: {priority}\n"
        + restart
    )
    (obj,) = parse_objects(text)
    assert isinstance(obj, WorkloadSpec)
    return obj


@contextlib.contextmanager
def one_gpu_agent() -> Iterator[tuple[Agent, AgentService]]:
    """The real agent with its reconcile loop on one simulated H200, in a scratch directory; what
    it ran is deleted and its processes stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="gpufrac-defaults-") as tmp:
        data = Path(tmp)
        agent = Agent(data, open_simulated("h200:1", data), stop_grace=1.0)
        service = AgentService(agent)
        service.start()
        try:
            yield agent, service
        finally:
            service.stop()
            with agent.lock:
                for w in agent.store.workloads():
                    agent.delete(w.tenant, w.name)
            agent.close()


def run(beside: list[WorkloadSpec]) -> dict[str, Any]:
    with one_gpu_agent() as (agent, service):
        with agent.lock:
            for s in beside:
                agent.apply_workload(s)
        deadline = time.monotonic() + 30
        while any(
            service.states.get(f"default/{s.name}") is None
            or service.states[f"default/{s.name}"].phase != "running"
            for s in beside
        ):
            assert time.monotonic() < deadline, "the services did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # their activity is read, the arbiter has them
        started = time.monotonic()
        with agent.lock:
            agent.apply_workload(spec("job", "job", JOB, "normal"))
        service.wake()
        share = None
        pauses = 0
        while True:
            st = service.states.get("default/job")
            member = agent.arbiter.latest.get("default/job")
            if member is not None:
                share = member.get("share")
                pauses = int(member.get("pauses") or 0)  # the arbiter counts each one
            if st is not None and st.phase in ("succeeded", "failed"):
                break
            assert time.monotonic() < started + 120, "the job did not finish in 2 minutes"
            time.sleep(0.05)
        took = time.monotonic() - started
        return {"seconds": took, "share": share, "paused": pauses, "phase": st.phase}


CGROUPS = detect()


def proc_states(pgid: int) -> list[str]:
    """The state letter of every live process in the process group (``/proc/PID/stat``), and T for
    one whose cgroup is frozen (the arbiter pauses a workload by freezing its cgroup where it can:
    a frozen process shows D or S, not T)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid:
                out.append("T" if process_frozen(int(entry), CGROUPS) else fields[0])
    return out


def high_service_beside_low_job(min_share: str | None, seconds: float = 15.0) -> dict[str, Any]:
    """A busy `priority: high` service beside a `priority: low` job (the operator's job_min_share,
    or ``min_share``) on one time-sliced GPU: the service's processes sampled from /proc every
    0.1 s, the job's share of the GPU's busy time from the arbiter's accounting."""
    with one_gpu_agent() as (agent, service):
        job = spec("job", "job", "import time\nwhile True: time.sleep(0.005)\n", "low")
        if min_share is not None:
            job = replace(job, min_share_milli=int(min_share))
        with agent.lock:
            agent.apply_workload(spec("hot", "service", BUSY, "high"))
            agent.apply_workload(job)
        service.wake()
        deadline = time.monotonic() + 30
        pgid: dict[str, int] = {}
        while len(pgid) < 2:
            assert time.monotonic() < deadline, "the workloads did not start"
            for name in ("hot", "job"):
                stored = agent.store.workload("default", name)
                run_dir = stored and agent.runs.latest("default", name, stored.generation)
                status = read_status(run_dir) if run_dir else None
                if status is not None and status.child_pid is not None:
                    pgid[name] = status.child_pid
            time.sleep(0.1)
        time.sleep(1.5)  # the arbiter has both, and has seen the service busy
        first = dict(agent.arbiter.latest.get("default/job") or {})
        samples: dict[str, list[str]] = {"hot": [], "job": []}
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for name, group in pgid.items():
                samples[name] += proc_states(group)
            time.sleep(0.1)
        last = dict(agent.arbiter.latest.get("default/job") or {})
        busy = float(last.get("busy_s") or 0) - float(first.get("busy_s") or 0)
        ran = float(last.get("held_s") or 0) - float(first.get("held_s") or 0)
        return {
            "service_stopped": samples["hot"].count("T") / max(1, len(samples["hot"])),
            "job_stopped": samples["job"].count("T") / max(1, len(samples["job"])),
            "job_share": ran / busy if busy > 0 else None,
            "min_share": int(last.get("qos", {}).get("min_share_milli") or 0) / 1000,
            "pauses": int(last.get("pauses") or 0),
            "samples": len(samples["hot"]),
        }


def main() -> None:
    solo = run([])
    idle = run([spec(f"web-{i}", "service", IDLE, "high") for i in (1, 2)])
    busy = run([spec("hot", "service", BUSY, "high")])
    rows = [
        ("solo", solo),
        ("beside two idle services (high)", idle),
        ("beside a busy service (high)", busy),
    ]
    print(
        "## Safe defaults: a plain job (1 s of CPU time) on a shared GPU, simulated H200, "
        "under the agent\n"
    )
    print("| scenario | seconds | vs solo | paused (times) | arbiter share of the GPU |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in rows:
        share = "-" if r["share"] is None else f"{r['share']:.2f}"
        print(
            f"| {name} | {r['seconds']:.2f} | {r['seconds'] / solo['seconds']:.2f} | "
            f"{r['paused']} | {share} |"
        )
    idle_ok = idle["seconds"] <= 1.5 * solo["seconds"] and idle["paused"] == 0
    busy_ok = busy["phase"] == "succeeded" and (busy["share"] or 0) >= 0.09
    print(
        f"\ntargets: beside idle services <= 1.5x solo and never paused: "
        f"{'met' if idle_ok else 'MISSED'}; beside a busy one it finishes with >= 9% of the turns: "
        f"{'met' if busy_ok else 'MISSED'}"
    )
    protected = high_service_beside_low_job(None)
    baseline = high_service_beside_low_job("0")
    print(
        "\n## high-service-beside-low-job: a busy `priority: high` service and a `priority: low` "
        "job on one time-sliced simulated H200, 15 s, /proc sampled every 0.1 s\n"
    )
    print(
        "| job's min share | service stopped (of samples) | job stopped | job's share of busy "
        "time | job's pauses | samples |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in (protected, baseline):
        share = "-" if r["job_share"] is None else f"{r['job_share']:.3f}"
        print(
            f"| {r['min_share']:.0%} | {r['service_stopped']:.3f} | {r['job_stopped']:.3f} | "
            f"{share} | {r['pauses']} | {r['samples']} |"
        )
    ok = (
        protected["service_stopped"] == 0
        and baseline["service_stopped"] == 0
        and (protected["job_share"] or 0) >= protected["min_share"] - 0.02
    )
    print(
        "\ntarget: the service is never stopped (0) and the job gets at least its min share "
        f"(minus 2 points): {'met' if ok else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
