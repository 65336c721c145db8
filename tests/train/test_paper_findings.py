"""benchmarks/paper_findings.py counts a run for an arm only when the run's config.json is that arm's
(estimator, gamma, seed, the scale's settings and model): a finished run of other settings in the arm's
directory once counted."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from gem_core.train.trainer import TINY_RUN, TrainConfig, config_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def findings():
    spec = importlib.util.spec_from_file_location("paper_findings", ROOT / "benchmarks" / "paper_findings.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _finished_run(directory: Path, steps: int, **config) -> None:
    """A run directory as `gem-core train` leaves it: config.json and an evaluation after ``steps`` updates."""
    directory.mkdir(parents=True)
    saved = {**config_dict(TrainConfig(**config)), "weights": {"source": "built here", "files": {}}}
    (directory / "config.json").write_text(json.dumps(saved))
    lines = [{"step": 0, "phase": "start", "eval_success_rate": 0.1}, {"step": steps, "phase": "rl", "eval_success_rate": 0.3}]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def _tiny_extra() -> dict:
    extra = dict(TINY_RUN)
    extra.pop("steps")
    return extra


def test_a_reinforce_run_does_not_count_for_the_rebn_arm(findings, tmp_path):
    rebn = next(arm for arm in findings.ARMS if arm.name == "rebn-0.9")
    extra = _tiny_extra()
    directory = Path(findings.run_dir(str(tmp_path), rebn, 0, "tiny"))
    _finished_run(directory, 300, **extra, estimator="reinforce", gamma=0.5, seed=0)
    expected = findings.arm_config(rebn, 0, extra)
    assert not findings.finished(str(directory), 300, expected)
    assert {m.split(":")[0] for m in findings.mismatches(str(directory), expected)} == {"estimator", "gamma"}


@pytest.mark.parametrize(
    "change, field",
    [({"seed": 1}, "seed"), ({"model": TrainConfig.model}, "model"), ({"episodes": 32}, "episodes"), ({"gamma": 0.999}, "gamma")],
)
def test_a_run_of_another_seed_model_or_scale_does_not_count(findings, tmp_path, change, field):
    rebn = next(arm for arm in findings.ARMS if arm.name == "rebn-0.9")
    extra = _tiny_extra()
    directory = Path(findings.run_dir(str(tmp_path), rebn, 0, "tiny"))
    _finished_run(directory, 300, **{**extra, "estimator": "rebn", "gamma": 0.9, "seed": 0, **change})
    expected = findings.arm_config(rebn, 0, extra)
    assert not findings.finished(str(directory), 300, expected)
    assert [m.split(":")[0] for m in findings.mismatches(str(directory), expected)] == [field]


def test_the_arms_own_finished_run_counts_and_directories_name_the_scale(findings, tmp_path):
    rebn = next(arm for arm in findings.ARMS if arm.name == "rebn-0.9")
    extra = _tiny_extra()
    directory = Path(findings.run_dir(str(tmp_path), rebn, 0, "tiny"))
    assert directory.name == "tiny-rebn-0.9-seed0" and findings.run_dir(str(tmp_path), rebn, 0, "real").endswith("real-rebn-0.9-seed0")
    _finished_run(directory, 300, **extra, estimator="rebn", gamma=0.9, seed=0)
    assert findings.finished(str(directory), 300, findings.arm_config(rebn, 0, extra))
    assert not findings.finished(str(directory), 200, findings.arm_config(rebn, 0, extra))  # not that far
    real = findings.arm_config(rebn, 0, {})
    assert real["model"] == TrainConfig.model and not findings.finished(str(directory), 300, real)
