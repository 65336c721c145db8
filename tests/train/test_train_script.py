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
    args = [
        "--model",
        "tiny",
        "--updates",
        "1",
        "--episodes-per-update",
        "2",
        "--eval-episodes",
        "2",
        "--warm-start-steps",
        "0",
        "--no-progress",
        "--out",
        str(out),
    ]
    done = subprocess.run(["bash", str(ROOT / "scripts" / "train.sh"), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "after 1 RL updates" in done.stdout and "success rate" in done.stdout
    assert (out / "metrics.jsonl").is_file() and (out / "model" / "config.json").is_file()
    assert "installing torch" not in done.stderr  # torch 2.13.0 was there: not installed again


def test_the_main_job_script_passes_a_bad_option_on_as_one_line(tmp_path):
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "train.sh"), "--updates", "zero"],
        cwd=tmp_path,
        env={**os.environ, "GEM_VENV": sys.prefix},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("gem-core train: error: argument --training.updates/--updates")
    assert "Traceback" not in done.stderr


def test_without_a_gpu_torch_comes_from_pytorchs_cpu_index_as_an_extra_index(tmp_path):
    """A virtualenv without torch 2.13.0 on a machine where no nvidia-smi answers: the script asks pip for the pin with
    PyTorch's CPU index as an *extra* index (its ``+cpu`` build wins where reachable; torch's dependencies, and the pin
    itself on an offline mirror, come from the usual index), then gem-core's ``train`` extra, then runs gem-core train.
    The virtualenv's python and gem-core here record what they are asked (no network, nothing installed)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls"
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nif [ "$1" = -c ]; then exit 1; fi\necho "python $*" >> {calls}\n')  # torch check: not there
    gem_core = venv / "bin" / "gem-core"
    gem_core.write_text(f'#!/bin/sh\necho "gem-core $*" >> {calls}\n')
    for tool in (python, gem_core):
        tool.chmod(0o755)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if not (Path(p) / "nvidia-smi").exists())
    env = {**os.environ, "GEM_VENV": str(venv), "PATH": path}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "train.sh"), "--updates", "3"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = calls.read_text().splitlines()
    assert lines == [
        "python -m pip install -q torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu --retries 1",
        f"python -m pip install -q -e {ROOT}[train]",
        "gem-core train --updates 3",
    ], lines
    assert "CPU build" in done.stderr
