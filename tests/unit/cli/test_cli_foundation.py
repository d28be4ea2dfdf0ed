from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufrac.cli.app import app

runner = CliRunner()
SIM = ["--simulate", "h200:1:mig,h200:1"]


def run(*args: str) -> tuple[int, str]:
    """Exit code and stdout (or everything printed, for non-JSON calls)."""
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout if "--json" in args else result.output


def test_gpus_json_shape() -> None:
    code, out = run("gpus", *SIM, "--json")
    assert code == 0
    gpus = json.loads(out)["gpus"]
    assert len(gpus) == 2
    for g in gpus:
        assert {
            "uuid",
            "index",
            "model",
            "name",
            "pci_device_id",
            "memory_total_mib",
            "memory_used_mib",
            "mig_mode",
            "instances",
            "processes",
        } <= set(g)
        assert set(g["mig_mode"]) == {"current", "pending"}
    assert gpus[0]["mig_mode"] == {"current": "enabled", "pending": "enabled"}


def test_gpus_table_shows_instances() -> None:
    from gpufrac.config import data_dir
    from gpufrac.devices import open_simulated

    dev = open_simulated("h200:1:mig,h200:1", data_dir())
    dev.create_instance(dev.gpus()[0].uuid, "3g.71gb", 4)
    code, out = run("gpus", *SIM)
    assert code == 0
    assert "3g.71gb" in out and "MIG-" in out and "simulated" in out


def test_gpufrac_simulate_env_selects_the_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFRAC_SIMULATE", "a30:2")
    code, out = run("gpus", "--json")
    assert code == 0
    assert [g["model"] for g in json.loads(out)["gpus"]] == ["A30-24GB", "A30-24GB"]


def test_mig_profiles_json_fields() -> None:
    code, out = run("mig", "profiles", "--gpu", "h200", "--json")
    assert code == 0
    profiles = json.loads(out)
    assert [p["name"] for p in profiles][:2] == ["1g.18gb", "1g.18gb+me"]
    for p in profiles:
        assert {
            "name",
            "profile_id",
            "compute_slices",
            "memory_slots",
            "max_instances",
            "placement_starts",
            "memory_mib",
            "sm_count",
        } <= set(p)


def test_mig_profiles_b200_shows_unknown_not_invented() -> None:
    code, out = run("mig", "profiles", "--gpu", "b200", "--json")
    assert code == 0
    assert all(p["memory_mib"] is None for p in json.loads(out))
    code, out = run("mig", "profiles", "--gpu", "b200")
    assert "unknown" in out and "UNKNOWN" in out.replace("\n", " ")


@pytest.mark.parametrize(
    ("layout", "exit_code"),
    [("3g.71gb@0,2g.35gb@4,1g.18gb@6", 0), ("3g.71gb@0,4g.71gb@0", 1), ("3g.71gb", 2), ("", 0)],
)
def test_mig_check_exit_codes(layout: str, exit_code: int) -> None:
    code, _ = run("mig", "check", "--gpu", "h200", "--layout", layout)
    assert code == exit_code


def test_mig_check_json_lists_problems() -> None:
    code, out = run("mig", "check", "--gpu", "h200", "--layout", "3g.71gb@0,3g.71gb@2", "--json")
    assert code == 1
    report = json.loads(out)
    assert report["valid"] is False
    assert [p["rule"] for p in report["problems"]] == ["placement"]


def test_mig_check_ambiguous_model_is_bad_input() -> None:
    code, out = run("mig", "check", "--gpu", "a100", "--layout", "1g.10gb@0")
    assert code == 2
    assert "--gpu" in out and "ambiguous" in out


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufrac.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_without_a_driver_gpus_exits_2_with_a_hint_and_demo_falls_back(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUFRAC_SIMULATE"}
    env["GPUFRAC_DATA_DIR"] = str(tmp_path)
    env["LD_LIBRARY_PATH"] = str(tmp_path)  # no libnvidia-ml here
    probe = subprocess.run(
        [sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"], capture_output=True, env=env
    )
    if probe.returncode == 0:
        pytest.skip("this machine has an NVIDIA driver")
    res = _cli("gpus", env=env)
    assert res.returncode == 2
    assert "--simulate" in res.stderr
    demo = _cli("demo", env=env)
    assert demo.returncode == 0, demo.stderr
    assert "notice" in demo.stderr and "simulated" in demo.stderr
    assert "NVIDIA H200" in demo.stdout and "3g.71gb" in demo.stdout
