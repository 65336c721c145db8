"""The documented script, examples/trl/train_gtn_rebn.py (the file itself, imported, with small sizes given
through its own options), through TRL's whole train() step on CPU: the dataset, the rollout on the
training model's generate, rewards, TRL's left/right padding of the batch, ReBN in the loss, the
optimizer step, the metrics. Nothing stubbed."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import numpy as np
import torch
import trl_test_envs
from conftest import capture_loss_inputs, row_of

from gem_core.batch import sequence_batch

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "trl" / "train_gtn_rebn.py"


def _example():
    spec = importlib.util.spec_from_file_location("trl_train_gtn_rebn", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _small(tmp_path, *extra: str) -> list[str]:
    """The script's options with sizes a CPU test affords (every other setting its default)."""
    return [
        "--prompts",
        "4",
        "--num-generations",
        "2",
        "--batch-size",
        "4",
        "--steps",
        "1",
        "--max-completion-length",
        "160",
        "--out",
        str(tmp_path / "out"),
        *extra,
    ]


def _check_step(trainer, rollout, seen) -> tuple[dict, object]:
    """What every run of the script must show: one optimizer step whose loss saw the core's ReBN of the
    rollout's episodes, no loss on env tokens, and the gem metrics in TRL's log."""
    assert trainer.state.global_step == 1 and len(seen) == 1
    inputs = seen[0]
    trajectories = rollout.last_trajectories
    assert len(trajectories) == 4
    reference = sequence_batch(trajectories)
    expected = reference.advantages(gamma=0.9, eps=1e-6, ddof=0)
    advantages = inputs["advantages"]
    assert advantages.shape == inputs["completion_ids"].shape
    for row in range(advantages.shape[0]):
        i = row_of(inputs, row, reference)
        n = reference.lengths[i]
        np.testing.assert_allclose(advantages[row, :n].numpy(), expected[i, :n], atol=1e-6, rtol=0)
        assert inputs["tool_mask"][row, :n].tolist() == reference.loss_mask[i, :n].tolist()  # env tokens: no loss
        assert not inputs["completion_mask"][row, n:].any() and not advantages[row, n:].any()  # TRL's padding
    logged = [entry for entry in trainer.state.log_history if "gem/success_rate" in entry]
    assert logged and logged[0]["gem/infra_failed_episodes"] == 0
    return inputs, reference


def test_documented_script_defaults(tmp_path):
    """The script as documented (GuessTheNumber, the tiny local model, TRL's generation), small sizes."""
    example = _example()
    trainer = example.build_trainer(example.parse_args(_small(tmp_path)))
    assert type(trainer).__name__ == "GemGRPOTrainer" and trainer.rollout_func.policy is None  # TRL's own generation
    seen = capture_loss_inputs(trainer)
    trainer.train()
    _check_step(trainer, trainer.rollout_func, seen)
    assert {t.env_id for t in trainer.rollout_func.last_trajectories} == {"game:GuessTheNumber-v0-easy"}


def test_script_on_episodes_of_different_lengths_pads_and_learns(tmp_path):
    """The same script with --env naming an env whose episodes last 1-4 turns whatever the model writes
    (seed-dependent): TRL pads completions of different lengths, ReBN has signal, the update moves the policy."""
    example = _example()
    trainer = example.build_trainer(example.parse_args(_small(tmp_path, "--env", trl_test_envs.TURNS_ID, "--lr", "5e-3")))
    before = copy.deepcopy(trainer.model.state_dict())
    seen = capture_loss_inputs(trainer)
    trainer.train()
    inputs, reference = _check_step(trainer, trainer.rollout_func, seen)
    turns = {t.num_turns for t in trainer.rollout_func.last_trajectories}
    assert len(turns) > 1, "episodes of different lengths"
    lengths = inputs["completion_mask"].sum(dim=1)
    assert lengths.min() < lengths.max() == inputs["completion_ids"].shape[1], "TRL right-padded the shorter completions"
    assert inputs["advantages"].abs().sum() > 0
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
