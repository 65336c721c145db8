"""``scripts/train.sh``, the README's main job, run whole: it takes this virtualenv (``GEM_VENV``: torch
2.13.0 is there, so it installs only gem-core's ``train`` extra, already satisfied) and runs ``gem-core
train`` with the options it is given, here a one-update run of the tiny model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def test_the_main_job_script_installs_into_a_virtualenv_and_trains(tmp_path):
    env = {**os.environ, "GEM_VENV": sys.prefix}
    out = tmp_path / "run"
    args = ["--model", "tiny", "--steps", "1", "--batch-size", "2", "--eval-episodes", "2", "--warmup-steps", "0", "--no-progress", "--out", str(out)]
    done = subprocess.run(["bash", str(ROOT / "scripts" / "train.sh"), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "after 1 RL updates" in done.stdout and "success rate" in done.stdout
    assert (out / "metrics.jsonl").is_file() and (out / "model" / "config.json").is_file()
    assert "installing torch" not in done.stderr  # torch 2.13.0 was there: not installed again


def test_the_main_job_script_passes_a_bad_option_on_as_one_line(tmp_path):
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "train.sh"), "--steps", "zero"],
        cwd=tmp_path,
        env={**os.environ, "GEM_VENV": sys.prefix},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("gem-core train: error: argument --steps")
    assert "Traceback" not in done.stderr
