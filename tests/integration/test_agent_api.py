"""The real agent over HTTP, with real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gpufrac.runtime.cgroups import detect
from gpufrac.runtime.shim import cgroup_of, read_status
from tests.conftest import kill_leftover_runs
from tests.integration.conftest import RunningAgent
from tests.prom import samples, value

PY = sys.executable


def manifest(
    name: str,
    command: list[str],
    gpu: str = "{memory: 4GiB}",
    kind: str = "service",
    tenant: str = "default",
) -> str:
    cmd = ", ".join(f'"{c}"' for c in command)
    extra = "  restart: always\n" if kind == "service" else ""
    return (
        f"apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {{name: {name}, tenant: "
        f"{tenant}}}\nspec:\n  type: {kind}\n  command: [{cmd}]\n  resources: {{gpu: "
        f"{gpu}}}\n  sharing: timeslice\n{extra}"
    )


def wait_for(agent: RunningAgent, predicate, timeout: float = 30.0) -> dict:  # type: ignore[no-untyped-def, type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = httpx.get(agent.url + "/api/v1/workloads", timeout=5).json()
        if predicate(data["workloads"]):
            return data
        time.sleep(0.1)
    raise AssertionError(f"timed out: {data}")


def test_apply_runs_the_workload_with_its_gpu_and_logs(agent: RunningAgent) -> None:
    code = (
        "import os,time; print('on', os.environ['CUDA_VISIBLE_DEVICES'], flush=True); "
        "time.sleep(60)"
    )
    r = httpx.post(
        agent.url + "/api/v1/workloads", content=manifest("web", [PY, "-c", code]), timeout=10
    )
    assert r.status_code == 200 and r.json()["results"][0]["result"] == "created"
    wait_for(agent, lambda ws: ws and ws[0]["phase"] == "running")
    w = httpx.get(agent.url + "/api/v1/workloads/default/web").json()
    gpu = w["placement"]["gpus"][0]
    assert w["env"]["CUDA_VISIBLE_DEVICES"] == gpu == w["env"]["NVIDIA_VISIBLE_DEVICES"]
    for _ in range(50):
        lines = httpx.get(agent.url + "/api/v1/workloads/default/web/logs").json()["lines"]
        if lines:
            break
        time.sleep(0.1)
    assert lines == [f"on {gpu}"]
    again = httpx.post(
        agent.url + "/api/v1/workloads", content=manifest("web", [PY, "-c", code]), timeout=10
    ).json()
    assert again["results"][0]["result"] == "unchanged"
    assert httpx.delete(agent.url + "/api/v1/workloads/default/web").status_code == 200
    assert httpx.get(agent.url + "/api/v1/workloads").json()["workloads"] == []


def test_bad_input_is_a_422_with_the_field_path_and_stores_nothing(agent: RunningAgent) -> None:
    good = manifest("ok", [PY, "-c", "pass"])
    bad = manifest("bad", [PY, "-c", "pass"], gpu="{memory: 4GiB, mig: 1g.18gb}")
    r = httpx.post(agent.url + "/api/v1/workloads", content=good + "---\n" + bad, timeout=10)
    assert r.status_code == 422
    detail = r.json()["detail"][0]
    assert detail["loc"][:4] == ["doc", "2", "spec", "resources"] and detail["fix"]
    # a key with dots (HAMi's nvidia.com/mig-1g.10gb) is one part of the location, not three
    dotted = manifest("dots", [PY, "-c", "pass"], gpu="{nvidia.com/mig-1g.10gb: two}")
    r = httpx.post(agent.url + "/api/v1/workloads", content=dotted, timeout=10)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["spec", "resources", "gpu", "nvidia.com/mig-1g.10gb"]
    # a lone surrogate (no character) is refused, named: stored, every list naming it was a 500
    lone = (
        '{"apiVersion": "gpufrac/v1", "kind": "Workload", "metadata": {"name": "s", "labels": '
        '{"\\ud800": "v"}}, "spec": {"command": ["a"], "resources": {"gpu": {"memory": "1Gi"}}}}'
    )
    r = httpx.post(
        agent.url + "/api/v1/workloads",
        content=lone,
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == [
        "metadata",
        "labels",
        "\\ud800",
    ]
    assert httpx.get(agent.url + "/api/v1/workloads").status_code == 200
    assert (
        httpx.get(agent.url + "/api/v1/workloads").json()["workloads"] == []
    )  # the good one neither


def test_an_impossible_request_is_refused_at_once(agent: RunningAgent) -> None:
    r = httpx.post(
        agent.url + "/api/v1/workloads",
        content=manifest("huge", [PY, "-c", "pass"], gpu="{memory: 900GiB}"),
        timeout=10,
    )
    result = r.json()["results"][0]
    assert result["result"] == "refused" and "could ever hold" in result["decision"]["reason"]
    assert httpx.get(agent.url + "/api/v1/workloads").json()["workloads"] == []


def test_kill_9_with_20_workloads_running_then_restart_accounts_for_all_20(
    agent: RunningAgent,
) -> None:
    docs = "---\n".join(
        manifest(f"w{i}", [PY, "-c", "import time; time.sleep(120)"], gpu="{memory: 2GiB}")
        for i in range(20)
    )
    assert httpx.post(agent.url + "/api/v1/workloads", content=docs, timeout=30).status_code == 200
    wait_for(
        agent, lambda ws: len(ws) == 20 and all(w["phase"] == "running" for w in ws), timeout=60
    )
    runs = sorted((agent.data_dir / "runs" / "default").glob("*/g1-*"))
    pids = {r.parent.name: read_status(r).child_pid for r in runs}
    assert len(runs) == 20 and all(pids.values())
    cgroups = {r.parent.name: cgroup_of(r) for r in runs}
    if detect().usable:  # each in its own cgroup
        assert all(cg is not None and cg.pids() == {pids[n]} for n, cg in cgroups.items())
    agent.kill9()
    agent.start()
    data = wait_for(
        agent, lambda ws: len(ws) == 20 and all(w["phase"] == "running" for w in ws), timeout=60
    )
    assert all(w["attempts"] == 1 for w in data["workloads"])  # none started twice
    after = sorted((agent.data_dir / "runs" / "default").glob("*/g1-*"))
    assert len(after) == 20 and {r.parent.name: read_status(r).child_pid for r in after} == pids
    for pid in pids.values():
        assert pid is not None
        os.kill(pid, 0)  # still the same processes, alive
    for name, cg in cgroups.items():  # and their cgroups, as they were
        assert cg is None or (
            cg.pids() == {pids[name]} and cgroup_of(runs[0].parent.parent / name / "g1-1") == cg
        )


def test_the_cli_talks_to_the_agent(agent: RunningAgent, tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(manifest("cli", [PY, "-c", "print('done')"], kind="job"))
    env = {**os.environ, "GPUFRAC_SERVER": agent.url}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PY, "-m", "gpufrac.cli", *args], capture_output=True, text=True, env=env, timeout=60
        )

    assert "created" in cli("apply", "-f", str(f)).stdout
    wait_for(agent, lambda ws: ws and ws[0]["phase"] == "succeeded")
    assert "succeeded" in cli("get", "workloads").stdout
    assert cli("logs", "cli").stdout.strip() == "done"
    assert cli("logs", "cli", "-f").stdout.strip() == "done"  # follows until the job is over
    assert "CUDA_VISIBLE_DEVICES" in cli("describe", "workload", "cli").stdout
    known = cli("clear-unknown", "cli")  # its outcome is known (exit 0): nothing to clear
    assert known.returncode != 0 and "is not unknown" in known.stdout + known.stderr, known
    assert cli("delete", "cli").returncode == 0
    assert cli("delete", "cli").returncode == 1


def test_gpufrac_up_runs_the_quickstart_to_the_end_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    root = Path(__file__).parents[2]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "GPUFRAC_DATA_DIR": str(tmp_path / "data"),
        "GPUFRAC_SIMULATE": "h200:1:mig,h200:1",
    }
    r = subprocess.run(
        [PY, "-m", "gpufrac.cli", "up", "examples/quickstart.yaml", "--until-done"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    assert "7 workloads: 4 succeeded, 1 failed; memory limits enforced: 1" in r.stdout.replace(
        "\n", " "
    )
    runs = list((tmp_path / "data" / "runs").glob("*/*/*"))
    assert runs == []  # stopped and cleaned up on the way out


def test_metrics_use_dcgm_names_and_leave_out_what_nvml_does_not_give(agent: RunningAgent) -> None:
    report = "from gpufrac import sdk; import time; sdk.report_gpu_use(1500, {}); time.sleep(60)"
    docs = (
        manifest("ts", [PY, "-c", report.format(0)])
        + "---\n"
        + manifest("mg", [PY, "-c", report.format(40)], gpu="{mig: 1g.18gb}").replace(
            "  sharing: timeslice\n", ""
        )
        + "---\n"
        # alone under MPS on its GPU: the MPS server's sample (its one client's use) is its own
        + manifest("mp", [PY, "-c", report.format(35)], gpu="{memory: 4GiB, compute: 30%}").replace(
            "sharing: timeslice", "sharing: mps"
        )
    )
    assert httpx.post(agent.url + "/api/v1/workloads", content=docs, timeout=10).status_code == 200
    wait_for(agent, lambda ws: len(ws) == 3 and all(w["phase"] == "running" for w in ws))
    deadline = time.monotonic() + 20
    text = ""
    used = "gpufrac_workload_gpu_memory_used_bytes"
    sm_name = "gpufrac_workload_sm_utilization_percent"
    while time.monotonic() < deadline:
        text = httpx.get(agent.url + "/metrics").text
        if (
            all(
                value(text, used, tenant="default", workload=w, source="simulated") == 1572864000
                for w in ("ts", "mg")
            )
            and (value(text, sm_name, workload="mg") or 0) > 39
            and value(text, sm_name, workload="mp") == 35
        ):  # GPM: a rate, from 2 readings
            break
        time.sleep(0.2)
    assert value(text, used, workload="ts", source="simulated") == 1572864000
    assert value(text, "gpufrac_workload_gpu_memory_limit_bytes", workload="ts") == 4294967296
    fb = samples(text, "DCGM_FI_DEV_FB_USED", modelName="NVIDIA H200")
    assert len(fb) > 4 and any("GPU_I_ID" in labels for labels, _ in fb)
    sm = {labels["workload"]: (labels, v) for labels, v in samples(text, sm_name)}
    assert "ts" in sm
    # NVML gives no per-process SM use on MIG: a MIG workload's is its instance's engine activity
    labels, mig_sm = sm["mg"]
    at = {"UUID": labels["UUID"], "GPU_I_ID": labels["GPU_I_ID"]}
    active = value(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", **at)
    assert active is not None and mig_sm == round(100 * active, 3) and 39 < mig_sm <= 40
    assert value(text, sm_name, workload="mp") == 35  # under MPS: the server's, all its own
    # the two GPUs without MIG; the MIG-enabled ones report none, not zero
    assert len(samples(text, "DCGM_FI_DEV_GPU_UTIL")) == 2
    assert value(text, "gpufrac_workload_state", workload="ts", phase="running") == 1
    # an Accept header prometheus_client cannot read gets the text format, not a 500
    odd = httpx.get(
        agent.url + "/metrics", headers={"accept": "application/openmetrics-text; version=abc"}
    )
    assert odd.status_code == 200 and "gpufrac_workload_state" in odd.text


def test_cordon_and_drain_through_the_cli(agent: RunningAgent) -> None:
    env = {**os.environ, "GPUFRAC_SERVER": agent.url}
    assert (
        httpx.post(
            agent.url + "/api/v1/workloads",
            content=manifest("svc", [PY, "-c", "import time; time.sleep(60)"]),
            timeout=10,
        ).status_code
        == 200
    )
    data = wait_for(agent, lambda ws: ws and ws[0]["phase"] == "running")
    gpu = data["workloads"][0]["placement"]["gpus"][0]
    r = subprocess.run(
        [PY, "-m", "gpufrac.cli", "drain", gpu], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 0 and "drained" in r.stdout
    data = wait_for(
        agent,
        lambda ws: ws and ws[0]["phase"] == "running" and ws[0]["placement"]["gpus"][0] != gpu,
    )
    r = subprocess.run(
        [PY, "-m", "gpufrac.cli", "uncordon", gpu],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0 and "uncordoned" in r.stdout
    assert (
        subprocess.run(
            [PY, "-m", "gpufrac.cli", "cordon", "99"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        ).returncode
        == 1
    )


def test_preemption_and_quota_refusal_through_the_api(agent: RunningAgent) -> None:
    url = agent.url + "/api/v1/workloads"
    low = manifest("low", [PY, "-c", "import time; time.sleep(60)"], gpu="{count: 2}").replace(
        "priority", "x"
    )
    low = low.replace("  sharing: timeslice\n", "  priority: low\n")
    high = manifest("high", [PY, "-c", "import time; time.sleep(60)"], gpu="{count: 2}").replace(
        "  sharing: timeslice\n", "  priority: high\n"
    )
    assert (
        httpx.post(url, content=low, timeout=10).json()["results"][0]["decision"]["outcome"]
        == "placed"
    )
    wait_for(agent, lambda ws: ws and ws[0]["phase"] == "running")
    r = httpx.post(url, content=high, timeout=10).json()["results"][0]
    assert r["decision"]["outcome"] == "placed" and r["decision"]["evicted"] == ["default/low"]
    data = wait_for(
        agent,
        lambda ws: {w["name"]: w["phase"] for w in ws} == {"low": "pending", "high": "running"},
    )
    low_state = next(w for w in data["workloads"] if w["name"] == "low")
    assert "preempted by default/high" in low_state["reason"] or "preempted" in str(
        low_state["placement"]
    )
    # a request larger than the whole fleet is refused at once, nothing stored
    huge = manifest("huge", [PY, "-c", "pass"], gpu="{count: 5}")
    assert httpx.post(url, content=huge, timeout=10).json()["results"][0]["result"] == "refused"
    assert {w["name"] for w in httpx.get(url).json()["workloads"]} == {"low", "high"}


def test_quota_refusal_and_waiting_through_the_api(tmp_path: Path) -> None:
    from tests.integration.conftest import free_port

    data = tmp_path / "data"
    data.mkdir()
    (data / "gpufrac.yaml").write_text("tenants:\n  team: {gpu_memory: 6GiB}\n")
    port = free_port()
    running = RunningAgent(f"http://127.0.0.1:{port}", data, port, None)  # type: ignore[arg-type]
    running.start()
    try:
        url = running.url + "/api/v1/workloads"
        big = manifest("big", [PY, "-c", "pass"], gpu="{memory: 8GiB}", tenant="team")
        r = httpx.post(url, content=big, timeout=10).json()["results"][0]
        assert r["result"] == "refused" and "quota" in r["decision"]["reason"]
        a = manifest("a", [PY, "-c", "import time; time.sleep(60)"], tenant="team")
        b = manifest("b", [PY, "-c", "import time; time.sleep(60)"], tenant="team")
        results = httpx.post(url, content=a + "---\n" + b, timeout=10).json()["results"]
        assert [x["decision"]["outcome"] for x in results] == ["placed", "pending"]
        assert "quota" in results[1]["decision"]["reason"]
    finally:
        running.proc.kill()
        running.proc.wait(timeout=10)
        kill_leftover_runs(data)


def test_logs_follow_prints_output_as_it_comes(agent: RunningAgent, tmp_path: Path) -> None:
    code = "import time; [print('tick', i, flush=True) or time.sleep(0.3) for i in range(6)]"
    f = tmp_path / "t.yaml"
    f.write_text(
        manifest("ticker", [PY, "-c", code.replace("\n", "; ").replace(":; ", ": ")], kind="job")
    )
    env = {**os.environ, "GPUFRAC_SERVER": agent.url}
    assert (
        subprocess.run(
            [PY, "-m", "gpufrac.cli", "apply", "-f", str(f)],
            capture_output=True,
            env=env,
            timeout=60,
        ).returncode
        == 0
    )
    wait_for(agent, lambda ws: ws and ws[0]["phase"] in ("running", "succeeded"))
    r = subprocess.run(
        [PY, "-m", "gpufrac.cli", "logs", "ticker", "-f"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.stdout.split("\n")[:6] == [f"tick {i}" for i in range(6)]


def test_mig_changes_through_the_api(agent: RunningAgent) -> None:
    gpus = httpx.get(agent.url + "/api/v1/gpus").json()["gpus"]
    mig_gpu = next(g for g in gpus if g["mig_mode"]["current"] == "enabled")
    body = {
        "mig_enabled": True,
        "instances": [{"profile": "3g.71gb", "start": 0}, {"profile": "3g.71gb", "start": 4}],
    }
    r = httpx.post(agent.url + f"/api/v1/gpus/{mig_gpu['index']}/mig", json=body, timeout=30)
    assert r.status_code == 200 and [a["kind"] for a in r.json()["actions"]].count("create_gi") == 2
    bad = httpx.post(
        agent.url + f"/api/v1/gpus/{mig_gpu['index']}/mig",
        json={"instances": [{"profile": "3g.71gb", "start": 2}]},
        timeout=30,
    )
    assert bad.status_code == 422
    plain = next(g for g in gpus if g["mig_mode"]["current"] == "disabled")
    refused = httpx.post(
        agent.url + f"/api/v1/gpus/{plain['index']}/mig",
        json={"instances": [{"profile": "7g.141gb", "start": 0}]},
        timeout=30,
    )
    assert refused.status_code == 409 and "allow-mode-change" in refused.json()["detail"]
    after = {g["uuid"]: g for g in httpx.get(agent.url + "/api/v1/gpus").json()["gpus"]}
    assert [i["profile"] for i in after[mig_gpu["uuid"]]["instances"]] == ["3g.71gb", "3g.71gb"]
    assert after[plain["uuid"]]["mig_mode"]["current"] == "disabled"


def test_mig_apply_goes_through_a_running_agent(agent: RunningAgent, tmp_path: Path) -> None:
    from tests.integration.conftest import FLEET

    gpus = httpx.get(agent.url + "/api/v1/gpus").json()["gpus"]
    mig_gpu = next(g for g in gpus if g["mig_mode"]["current"] == "enabled")
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "uuid": mig_gpu["uuid"],
                        "index": mig_gpu["index"],
                        "instances": [{"profile": "7g.141gb", "start": 0}],
                    }
                ]
            }
        )
    )
    env = {
        **os.environ,
        "GPUFRAC_SERVER": agent.url,
        "GPUFRAC_SIMULATE": FLEET,
        "GPUFRAC_DATA_DIR": str(agent.data_dir),
    }
    r = subprocess.run(
        [PY, "-m", "gpufrac.cli", "mig", "apply", "--plan", str(plan), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert [a["kind"] for a in json.loads(r.stdout)["actions"]] == ["create_gi", "create_ci"]
    events = httpx.get(agent.url + "/api/v1/events").json()["events"]
    assert any(e["kind"] == "mig_changed" and e["subject"] == mig_gpu["uuid"] for e in events)


def test_mig_enable_goes_through_a_running_agent(agent: RunningAgent) -> None:
    from tests.integration.conftest import FLEET

    gpus = httpx.get(agent.url + "/api/v1/gpus").json()["gpus"]
    plain = next(g for g in gpus if g["mig_mode"]["current"] == "disabled")
    env = {
        **os.environ,
        "GPUFRAC_SERVER": agent.url,
        "GPUFRAC_SIMULATE": FLEET,
        "GPUFRAC_DATA_DIR": str(agent.data_dir),
    }
    r = subprocess.run(
        [PY, "-m", "gpufrac.cli", "mig", "enable", "--gpu", str(plain["index"])],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    events = httpx.get(agent.url + "/api/v1/events").json()["events"]
    assert any(e["kind"] == "mig_changed" and e["subject"] == plain["uuid"] for e in events)
    # the agent's scheduler now places MIG work there
    doc = manifest("m", [PY, "-c", "import time; time.sleep(30)"], gpu="{mig: 7g.141gb}").replace(
        "  sharing: timeslice\n", ""
    )
    assert (
        httpx.post(
            agent.url + "/api/v1/workloads",
            content=doc
            + "---\n"
            + doc.replace("name: m,", "name: n,")
            + "---\n"
            + doc.replace("name: m,", "name: o,"),
            timeout=10,
        ).status_code
        == 200
    )
    placed = wait_for(agent, lambda ws: sum(w["phase"] == "running" for w in ws) == 3)
    assert plain["uuid"] in {w["placement"]["gpus"][0] for w in placed["workloads"]}


def test_changed_manifest_shows_the_diff_and_replaces(agent: RunningAgent, tmp_path: Path) -> None:
    env = {**os.environ, "GPUFRAC_SERVER": agent.url}
    f = tmp_path / "w.yaml"
    f.write_text(manifest("w", [PY, "-c", "import time; time.sleep(60)"]))
    subprocess.run(
        [PY, "-m", "gpufrac.cli", "apply", "-f", str(f)], env=env, capture_output=True, timeout=60
    )
    f.write_text(manifest("w", [PY, "-c", "import time; time.sleep(61)"], gpu="{memory: 6GiB}"))
    r = subprocess.run(
        [PY, "-m", "gpufrac.cli", "apply", "-f", str(f)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        "replaced" in r.stdout
        and "gpu.memory_mib: 4096 -> 6144" in r.stdout
        and "command:" in r.stdout
    )


def test_restarts_with_backoff_and_on_failure_after_an_agent_restart(agent: RunningAgent) -> None:
    crash = "import time; time.sleep(0.5); raise SystemExit(4)"
    job = manifest("crashy", [PY, "-c", crash], kind="job")
    assert httpx.post(agent.url + "/api/v1/workloads", content=job, timeout=10).status_code == 200
    data = wait_for(agent, lambda ws: ws and ws[0]["attempts"] >= 2, timeout=30)
    assert data["workloads"][0]["restarts"] >= 1
    before = data["workloads"][0]["attempts"]
    agent.kill9()  # the agent dies; the job keeps failing on its own
    time.sleep(1.5)
    agent.start()
    after = wait_for(agent, lambda ws: ws and ws[0]["attempts"] > before, timeout=40)
    assert after["workloads"][0]["attempts"] > before
    events = httpx.get(agent.url + "/api/v1/workloads/default/crashy").json()["events"]
    assert [e["kind"] for e in events].count("restarted") >= 2


def test_the_memory_watchdog_stops_an_over_limit_workload(agent: RunningAgent) -> None:
    hog = (
        "from gpufrac import sdk; import time; sdk.report_gpu_memory(sdk.memory_limit_mib() * "
        "2); time.sleep(60)"
    )
    job = manifest("hog", [PY, "-c", hog], kind="job").replace(
        "  sharing: timeslice\n", "  sharing: timeslice\n  restart: never\n"
    )
    assert httpx.post(agent.url + "/api/v1/workloads", content=job, timeout=10).status_code == 200
    data = wait_for(agent, lambda ws: ws and ws[0]["phase"] == "failed", timeout=40)
    assert "over its 4096 MiB limit" in data["workloads"][0]["reason"]
