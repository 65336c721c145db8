"""The GPU check's TRL phase (scripts/gpu_check.sh --dry-run, benchmarks/gpu_check.py) where TRL is installed:
the example's GRPOTrainer with each update timed, then the reference trainer with the same settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_dry_run_times_trl_beside_the_reference_trainer(tmp_path):
    env = {**os.environ, "GEM_PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run", "--seeds", "0", "--out", str(tmp_path / "c")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    trl = json.loads((tmp_path / "c" / "results.json").read_text())["trl"]
    assert trl["trl_run"]["returncode"] == 0 and trl["reference_run"]["returncode"] == 0
    assert trl["trl"]["updates"] == trl["settings"]["steps"] == 1 and trl["trl"]["update_s"] > 0 and trl["trl"]["device"] == "cpu"
    assert trl["reference"]["updates"] == 1 and trl["reference"]["update_s"] > 0
    assert "| trl | 1 |" in (tmp_path / "c" / "results.md").read_text()
