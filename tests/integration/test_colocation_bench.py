"""The co-location benchmark end to end on the CPU (--dry-run): same processes, arbiter and SDK as on a
GPU, spin-loop models. It checks the code path and the arbiter's splits, not GPU behaviour."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_colocation_benchmark_runs_end_to_end_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "coloc.json"
    run = subprocess.run(
        [sys.executable, "bench/colocation.py", "--dry-run", "--window", "0.6", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["dry_run"] and "not GPU behaviour" in result["machine"]
    rows = {r["scenario"]: r for r in result["rows"]}
    assert "infer-T + trainer, gpufrac" in rows and not any("error" in r for r in rows.values())
    assert rows["infer-R + trainer, gpufrac"]["p99_ms"] > 0
    assert all(t["value"] is not None for t in result["targets"])  # each target was measured
    # the arbiter's splits are the same code on a CPU: they hold here too (loosely, 2 busy cores)
    assert rows["two trainers, gpufrac 3:1"]["first_share"] == pytest.approx(0.75, abs=0.1)
    assert rows["two trainers, gpufrac 1:1"]["first_share"] == pytest.approx(0.5, abs=0.1)
    assert 1 - rows["high + low trainer (min_share 10%), gpufrac"]["first_share"] >= 0.07
    assert "target | want | measured | met" in run.stdout
