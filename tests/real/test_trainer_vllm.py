"""`gem-core train --rollout-engine vllm`: the trainer rolls out with the real vLLM (in its process) on the
real model and hands the engine its weights before every rollout. Checked by logprobs: what the engine
returned equals what the trainer's current model computes (at the sampling temperature), before and after
an update, and after the update it no longer equals the old model's."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.real import MOVED, assert_same_weights

from gem_core.train.trainer import Trainer, TrainConfig, training_rows

pytest.importorskip("vllm")

SEEDS = [0, 1, 2, 3]
# float32 on both sides: vLLM's CPU kernels and transformers' differ in summation order only, within the real
# tier's same-weights rule (helpers.real); sampled tokens at temperature 0.7 reach lower-probability ones


def _engine_gap(trainer, trajectories, model):
    """|engine logprob - model logprob| of each of the trajectories' model tokens, at the run's temperature."""
    rows = training_rows(trajectories, [[0.0] * t.num_turns for t in trajectories], "sequence", trainer.pad_id)
    with torch.no_grad():
        recomputed = trainer.logprobs(model, rows)
    mask = rows.targets >= 0
    assert int(mask.sum()) > 10
    return (recomputed - rows.old_logprobs).abs()[mask]


def test_the_engine_samples_from_the_trainers_current_weights(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    config = TrainConfig(
        model=model_dir,
        rollout_engine="vllm",
        estimator="reinforce",
        episodes_per_update=4,
        eval_episodes=1,
        max_turn_tokens=16,
        temperature=0.7,
        lr=1e-3,
        warmup_updates=0,
        max_context_tokens=1024,
        warm_start_steps=0,
        precision="float32",  # float32 on both sides (the default turns bf16 autocast on where the CPU has it)
        stop_after_box=False,
        trained_layers=0,
        out=str(tmp_path / "run"),
    )
    trainer = Trainer(config, model, tokenizer, log=lambda _: None)
    try:
        before = trainer.rollout(SEEDS, prefix="before-")
        gap_before = _engine_gap(trainer, before, trainer.model)
        assert_same_weights(gap_before, "engine vs trainer before the update")
        old_model = copy.deepcopy(trainer.model)
        metrics = trainer.update()
        assert metrics["grad_norm"] > 0  # REINFORCE: the untrained model's equal returns still move it (ReBN would give 0)
        after = trainer.rollout(SEEDS, prefix="after-")
        gap_after = _engine_gap(trainer, after, trainer.model)
        gap_to_old = _engine_gap(trainer, after, old_model)
        print(
            f"engine vs trainer, max (mean): {gap_before.max():.2e} ({gap_before.mean():.2e}) before the update, {gap_after.max():.2e} ({gap_after.mean():.2e}) after; vs the old weights {gap_to_old.max():.2e}"
        )
        assert_same_weights(gap_after, "engine vs trainer after the update")
        assert float(gap_to_old.max()) > MOVED  # the engine did change weights: it samples from the new ones
    finally:
        trainer.close()
