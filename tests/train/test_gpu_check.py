"""scripts/gpu_check.sh --dry-run: the GPU check's steps on the CPU at a tiny size, so that the check cannot rot
between the times a GPU is there (the figures of a real run: docs/benchmarks.md#gpu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the dry run trains a tiny model: torch (the core session; core_py has none)")

ROOT = Path(__file__).resolve().parents[2]


def run_dry(out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GEM_PYTHON": sys.executable}
    return subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_dry_run_trains_every_seed_and_writes_every_record(tmp_path):
    result = run_dry(tmp_path / "check")
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads((tmp_path / "check" / "results.json").read_text())
    assert results["device"] == "cpu" and results["model"] == "tiny" and results["machine"]["torch"]
    assert sorted(results["seeds"]) == ["0", "1"]
    for row in results["seeds"].values():
        assert row["run"]["returncode"] == 0 and not row["run"]["stopped"]
        assert row["updates"] == 2 and row["rollout_s"] > 0 and row["learning_s"] > 0
        assert row["sampled"] is not None and row["greedy"] is not None  # evaluated after RL
        assert row["peak_gpu_gb"] is None  # no GPU: no GPU figure
    table = (tmp_path / "check" / "results.md").read_text()
    assert "| 0 | 2 |" in table and "2 of 2 runs finished" in table
    with tarfile.open(tmp_path / "check" / "runs.tar.gz") as archive:
        names = archive.getnames()
    assert "runs/seed0/metrics.jsonl" in names and "runs/seed1/config.json" in names
    assert not [name for name in names if "/model/" in name]


def test_a_run_that_fails_fails_the_check(tmp_path):
    # a seed's run that cannot start (a model that is not there) is a failed check, said so, not a quiet table
    env = {**os.environ, "GEM_PYTHON": sys.executable}
    command = ["bash", "scripts/gpu_check.sh", "--dry-run", "--seeds", "0", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "c")]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("gpu_check: seed0 failed; see ")
    assert "0 of 1 runs finished" in (tmp_path / "c" / "results.md").read_text()


def test_training_rows_go_to_the_models_device(monkeypatch, tmp_path):
    # the rows are built on the CPU; the trainer moves them to its device before the loss (a CUDA run failed
    # without it). On a CPU-only machine the move is watched, not a second device.
    from gem_core.train import loss as loss_module
    from gem_core.train.loss import Rows

    rows = Rows(*(torch.zeros((1, 2), dtype=torch.long) for _ in range(3)), torch.zeros((1, 2)), torch.zeros((1, 2)))
    moved = rows.to("meta")
    assert all(getattr(moved, name).device.type == "meta" for name in ("input_ids", "attention", "targets", "advantages", "old_logprobs"))
    seen = []
    original = loss_module.Rows.to
    monkeypatch.setattr(loss_module.Rows, "to", lambda self, device: seen.append(device) or original(self, device))
    from gem_core.train.run import tiny_model, warm_start
    from gem_core.train.trainer import Trainer, TrainConfig

    model, tokenizer = tiny_model(0)
    trainer = Trainer(
        TrainConfig(out=str(tmp_path / "run"), episodes_per_update=2, updates=1, eval_episodes=2, kl_coef=0.0), model, tokenizer, log=lambda _: None
    )
    try:
        warm_start(trainer, 1, 2)
        trainer.update()
    finally:
        trainer.close()
    assert seen == ["cpu", "cpu"]  # the warm start's rows and the update's
    assert trainer.peak_device_memory() == {}  # no GPU figure on a CPU run
