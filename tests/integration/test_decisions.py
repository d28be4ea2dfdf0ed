"""Decisions carried out through a real agent (real processes, simulated GPUs): MIG re-cut by
demand, a failing action that stays one workload's problem, and `gpufrac mig apply` through the
agent."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from gpufrac.devices.simfleet import SimulatedFleet
from tests.integration.conftest import RunningAgent
from tests.integration.test_agent_api import wait_for

PY = sys.executable


def doc(
    name: str, gpu: str, code: str, *, kind: str = "job", tenant: str = "default", **spec: str
) -> str:
    extra = "".join(f"  {k}: {v}\n" for k, v in spec.items())
    return (
        "apiVersion: gpufrac/v1\nkind: Workload\n"
        f"metadata: {{name: {name}, tenant: {tenant}}}\n"
        f"spec:\n  type: {kind}\n  command: [{PY!r}, '-c', {code!r}]\n"
        f"  resources: {{gpu: {gpu}}}\n{extra}"
    )


def post(agent: RunningAgent, text: str) -> dict[str, Any]:
    r = httpx.post(agent.url + "/api/v1/workloads", content=text, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def phase_of(ws: list[dict[str, Any]], key: str) -> str | None:
    return next((w["phase"] for w in ws if f"{w['tenant']}/{w['name']}" == key), None)


def events(agent: RunningAgent, kind: str | None = None) -> list[dict[str, Any]]:
    found = httpx.get(agent.url + "/api/v1/events?limit=1000", timeout=10).json()["events"]
    return [e for e in found if kind is None or e["kind"] == kind]


def mig_gpu(agent: RunningAgent) -> dict[str, Any]:
    gpus = httpx.get(agent.url + "/api/v1/gpus", timeout=10).json()["gpus"]
    return next(g for g in gpus if g["mig_mode"]["current"] == "enabled")


def two_small_jobs_done(agent: RunningAgent) -> None:
    post(agent, doc("a", "{mig: 1g.18gb}", "pass") + "---\n" + doc("b", "{mig: 1g.18gb}", "pass"))
    wait_for(
        agent,
        lambda ws: phase_of(ws, "default/a") == phase_of(ws, "default/b") == "succeeded",
    )
    assert len(mig_gpu(agent)["instances"]) == 2  # idle instances left behind by finished work


def test_idle_mig_instances_are_recut_for_a_differently_sized_request(
    small_agent: RunningAgent,
) -> None:
    two_small_jobs_done(small_agent)
    post(small_agent, doc("big", "{mig: 7g.141gb}", "import time; time.sleep(0.5)"))
    wait_for(small_agent, lambda ws: phase_of(ws, "default/big") == "succeeded")
    destroyed = events(small_agent, "mig_destroyed")
    assert len(destroyed) == 2 and all("re-cut for default/big" in e["message"] for e in destroyed)
    assert any("7g.141gb@0" in e["message"] for e in events(small_agent, "mig_created"))
    assert not events(small_agent, "action_failed") and not events(small_agent, "reconcile_error")
    w = httpx.get(small_agent.url + "/api/v1/workloads/default/big", timeout=10).json()
    assert w["placement"]["where"]["mig"] == {"profile": "7g.141gb", "start": 0}  # kept once done


def test_a_failing_action_is_reported_once_and_does_not_stop_other_tenants(
    small_agent: RunningAgent,
) -> None:
    two_small_jobs_done(small_agent)
    gpu = mig_gpu(small_agent)
    # a process outside gpufrac takes one of the idle instances the re-cut would destroy
    squatter = subprocess.Popen([PY, "-c", "import time; time.sleep(120)"])
    fleet = SimulatedFleet.open(small_agent.fleet, small_agent.data_dir)
    try:
        fleet.attach_process(gpu["uuid"], squatter.pid, 100, gi_id=gpu["instances"][0]["gi_id"])
        post(small_agent, doc("big", "{mig: 7g.141gb}", "import time; time.sleep(0.5)"))
        # another tenant's service on the other GPU starts while the re-cut keeps failing
        post(
            small_agent,
            doc(
                "web", "{memory: 4GiB}", "import time; time.sleep(60)",
                kind="service", tenant="other", sharing="timeslice",
            ),
        )  # fmt: skip
        wait_for(small_agent, lambda ws: phase_of(ws, "other/web") == "running")
        time.sleep(3)  # several passes and retries
        big = httpx.get(small_agent.url + "/api/v1/workloads/default/big", timeout=10).json()
        assert big["phase"] == "backoff", big
        assert "destroy MIG instance" in big["reason"] and "processes on it" in big["reason"]
        failed = [e for e in big["events"] if e["kind"] == "action_failed"]
        # once per condition (each instance the re-cut must destroy is one), not once per pass
        assert failed and len(failed) == len({e["message"] for e in failed}), failed
        assert (
            phase_of(
                httpx.get(small_agent.url + "/api/v1/workloads", timeout=10).json()["workloads"],
                "other/web",
            )
            == "running"
        )
    finally:
        fleet.detach_process(squatter.pid)
        squatter.kill()
        squatter.wait()
    # the instance is idle again: the retry goes through
    wait_for(small_agent, lambda ws: phase_of(ws, "default/big") == "succeeded", timeout=90)
    assert events(small_agent, "action_recovered")


def test_mig_apply_through_the_agent_changes_only_what_differs_and_pins(
    small_agent: RunningAgent, tmp_path: Path
) -> None:
    gpus = httpx.get(small_agent.url + "/api/v1/gpus", timeout=10).json()["gpus"]
    mig, plain = (
        next(g for g in gpus if g["mig_mode"]["current"] == want)
        for want in ("enabled", "disabled")
    )
    # MPS work on the plain GPU, which the plan lists untouched
    post(
        small_agent,
        doc(
            "mps", "{memory: 8GiB, compute: 30%}", "import time; time.sleep(60)",
            kind="service", sharing="mps",
        ),
    )  # fmt: skip
    before = wait_for(small_agent, lambda ws: phase_of(ws, "default/mps") == "running")
    env_before = before["workloads"][0]["env"]
    plan = {
        "gpus": [
            {"uuid": mig["uuid"], "index": mig["index"], "mig_enabled": True,
             "instances": [{"profile": "3g.71gb", "start": 4}]},
            {"uuid": plain["uuid"], "index": plain["index"], "mig_enabled": False, "instances": []},
        ]
    }  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "GPUFRAC_SERVER": small_agent.url, "GPUFRAC_SIMULATE": small_agent.fleet,
           "GPUFRAC_DATA_DIR": str(small_agent.data_dir)}  # fmt: skip
    cli = [PY, "-m", "gpufrac.cli", "mig"]
    r = subprocess.run(
        [*cli, "apply", "--plan", str(tmp_path / "plan.json"), "--json"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    results = {g["index"]: g["result"] for g in out["gpus"]}
    assert results == {mig["index"]: "changed", plain["index"]: "unchanged"}
    assert [g["pinned"] for g in out["gpus"] if g["index"] == mig["index"]] == [True]
    after = httpx.get(small_agent.url + "/api/v1/workloads/default/mps", timeout=10).json()
    assert after["phase"] == "running" and after["attempts"] == 1 and after["env"] == env_before
    # re-running it changes nothing
    again = subprocess.run(
        [*cli, "apply", "--plan", str(tmp_path / "plan.json")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert again.returncode == 0 and "unchanged" in again.stdout and "changed (" not in again.stdout
    # the pinned layout is not re-cut: a 7g waits, with a reason; released, it runs
    post(small_agent, doc("big", "{mig: 7g.141gb}", "import time; time.sleep(0.5)"))
    time.sleep(1.5)
    big = httpx.get(small_agent.url + "/api/v1/workloads/default/big", timeout=10).json()
    assert big["phase"] == "pending" and big["reason"], big
    rel = subprocess.run(
        [*cli, "release", "--gpu", str(mig["index"])],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert rel.returncode == 0, rel.stderr
    wait_for(small_agent, lambda ws: phase_of(ws, "default/big") == "succeeded")
    # a plan the agent refuses on one GPU is reported per GPU, exit 1, the other GPU still done
    post(
        small_agent,
        doc("held", "{mig: 1g.18gb}", "import time; time.sleep(60)", kind="service"),
    )
    wait_for(small_agent, lambda ws: phase_of(ws, "default/held") == "running")
    plan["gpus"][0]["instances"] = [{"profile": "7g.141gb", "start": 0}]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    bad = subprocess.run(
        [*cli, "apply", "--plan", str(tmp_path / "plan.json")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 1
    assert "refused" in bad.stdout and "default/held" in bad.stdout and "unchanged" in bad.stdout
    # a dry run makes the change's own checks, through the agent: refused the same, exit 1
    dry = subprocess.run(
        [*cli, "apply", "--plan", str(tmp_path / "plan.json"), "--dry-run", "--json"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert dry.returncode == 1, dry.stdout + dry.stderr
    told = json.loads(dry.stdout)
    assert told["dry_run"] and not told["changed"]
    assert {g["index"]: g["result"] for g in told["gpus"]} == {
        mig["index"]: "refused",
        plain["index"]: "unchanged",
    }
    assert "default/held" in told["gpus"][0]["reason"]
    # what the agent would allow (--drain) is listed, and nothing is changed or moved
    layout = [i["profile"] for i in mig_gpu(small_agent)["instances"]]
    allowed = subprocess.run(
        [*cli, "apply", "--plan", str(tmp_path / "plan.json"), "--dry-run", "--drain"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "would change (dry run)" in allowed.stdout and "nvidia-smi mig" in allowed.stdout
    assert [i["profile"] for i in mig_gpu(small_agent)["instances"]] == layout
    held = httpx.get(small_agent.url + "/api/v1/workloads/default/held", timeout=10).json()
    assert held["phase"] == "running" and held["attempts"] == 1
    # done with --drain: the workload it displaced is printed with what became of it
    drained = subprocess.run(
        [*cli, "apply", "--plan", str(tmp_path / "plan.json"), "--drain"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert re.search(r"(evicted|moved|requeued) default/held: ", drained.stdout), drained.stdout


def test_mig_endpoints_take_strict_bodies_and_change_nothing_on_bad_input(
    small_agent: RunningAgent,
) -> None:
    gpus = httpx.get(small_agent.url + "/api/v1/gpus", timeout=10).json()["gpus"]
    mig = next(g for g in gpus if g["mig_mode"]["current"] == "enabled")
    plain = next(g for g in gpus if g["mig_mode"]["current"] == "disabled")
    url = small_agent.url + f"/api/v1/gpus/{mig['index']}/mig"
    layout = [{"profile": "7g.141gb", "start": 0}]
    for body in (
        b"",
        b"not json",
        b"[]",
        json.dumps({"instancez": layout}).encode(),
        json.dumps({"instances": layout, "drain": "no"}).encode(),
        json.dumps({"instances": layout, "mig_enabled": "false"}).encode(),
    ):
        r = httpx.post(url, content=body, timeout=10)
        assert r.status_code == 422, (body, r.status_code, r.text)
        assert r.json()["detail"][0]["loc"]
    assert mig_gpu(small_agent)["instances"] == []  # nothing was made
    r = httpx.delete(small_agent.url + f"/api/v1/gpus/{plain['index']}/mig/pin", timeout=10)
    assert r.status_code == 422 and "not in MIG mode" in r.text
