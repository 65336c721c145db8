"""End to end on CPU through TRL's own GRPOTrainer.train(): a tiny local model, GEM episodes from the gem
rollout, ReBN from the subclass. The updates change the parameters, environment tokens carry no loss, the
advantages the loss sees equal the core ReBN of the same trajectories, and one update raises the logprob
of the positively-advantaged tokens more than that of the negative ones."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from conftest import capture_loss_inputs, completion_logps, grpo_config

from gem_core.batch import sequence_batch
from gem_core.rollout import ScriptedPolicy
from gem_integrations.trl import GemGRPOTrainer, GemRollout, make_dataset

ENV = "game:GuessTheNumber-v0-easy"


def _random_guesser(tokenizer, seed: int = 0) -> ScriptedPolicy:
    """Well-formed random guesses (1..10), so episodes win, lose and run several turns: ReBN has signal."""
    rng = random.Random(seed)
    return ScriptedPolicy(tokenizer, lambda context: f"\\boxed{{{rng.randint(1, 10)}}}")


def test_updates_rebn_in_the_loss_and_no_loss_on_env_tokens(tokenizer, tiny_model, tmp_path):
    rollout = GemRollout(policy=_random_guesser(tokenizer))
    args = grpo_config(tmp_path, per_device_train_batch_size=8, num_generations=4, max_completion_length=96, max_steps=1, learning_rate=5e-3)
    trainer = GemGRPOTrainer(tiny_model, args=args, train_dataset=make_dataset(ENV, 8), processing_class=tokenizer, rollout_func=rollout)
    before = copy.deepcopy(trainer.model.state_dict())
    seen = capture_loss_inputs(trainer)
    trainer.train()

    assert len(seen) == 1
    inputs = seen[0]
    trajectories = rollout.last_trajectories
    assert len(trajectories) == 8 and len({t.num_turns for t in trajectories}) > 1
    assert {t.episode_return > 0 for t in trajectories} == {True, False}, "wins and losses: the advantages carry signal"

    # the advantages the loss saw are the core ReBN of the same trajectories (TRL shuffled the rows)
    reference = sequence_batch(trajectories)
    expected = reference.advantages(gamma=0.9, eps=1e-6, ddof=0)
    by_tokens = {(tuple(reference.prompt_ids[i]), tuple(reference.response_ids[i, : reference.lengths[i]].tolist())): i for i in range(len(reference))}
    advantages, loss_mask = inputs["advantages"], inputs["completion_mask"] * inputs["tool_mask"]
    assert advantages.shape == inputs["completion_ids"].shape
    for row in range(advantages.shape[0]):
        prompt = tuple(inputs["prompt_ids"][row][inputs["prompt_mask"][row].bool()].tolist())
        n = int(inputs["completion_mask"][row].sum())
        i = by_tokens[(prompt, tuple(inputs["completion_ids"][row, :n].tolist()))]
        np.testing.assert_allclose(advantages[row, :n].numpy(), expected[i, :n], atol=1e-6, rtol=0)
        # env tokens: no loss (TRL's mask is the rollout's env_mask) and no advantage
        assert loss_mask[row, :n].tolist() == reference.loss_mask[i, :n].tolist()
        assert not advantages[row, :n][reference.loss_mask[i, :n] == 0].any()

    # the loss does not depend on what sits on environment tokens
    probe = dict(inputs)
    env_tokens = (inputs["completion_mask"] == 1) & (inputs["tool_mask"] == 0)
    assert env_tokens.any()
    probe["advantages"] = inputs["advantages"].masked_fill(env_tokens, 1e3)
    with torch.no_grad():
        model = copy.deepcopy(trainer.model)
        model.load_state_dict(before)
        loss = trainer.original_compute_loss(model, inputs).item()
        assert loss != 0.0 and trainer.original_compute_loss(model, probe).item() == pytest.approx(loss, abs=1e-7)

    # the update changed the parameters and moved the policy the way the advantages say
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    with torch.no_grad():
        logps_after = completion_logps(trainer, trainer.model, inputs)
    # (a first-order step on -sum(A * logp) raises the advantage-weighted logprob of the model tokens)
    delta = (logps_after - inputs["logps_before"]) * loss_mask
    assert (advantages * delta).sum() > 0
    assert (delta * (advantages > 0)).sum() / (advantages > 0).sum() > (delta * (advantages < 0)).sum() / (advantages < 0).sum()


def test_trl_generate_policy_plays_episodes_with_the_training_model(tokenizer, tiny_model, tmp_path):
    """The default policy is TRL's own generation: the training model's generate with TRL's generation
    config; its logprobs are the ones TRL's loss recomputes for the same tokens."""
    rollout = GemRollout(max_turn_tokens=6)
    args = grpo_config(tmp_path, per_device_train_batch_size=4, num_generations=2, max_completion_length=48, max_steps=1)
    trainer = GemGRPOTrainer(tiny_model, args=args, train_dataset=make_dataset(ENV, 4), processing_class=tokenizer, rollout_func=rollout)
    seen = capture_loss_inputs(trainer)
    trainer.train()
    assert trainer.model.training, "the model is back in training mode after the rollout"
    trajectories = rollout.last_trajectories
    assert len(trajectories) == 4
    assert all(len(turn.response_ids) <= 6 for t in trajectories for turn in t.turns)
    assert all(len(t.as_sequence().response_ids) <= 48 for t in trajectories)
    inputs = seen[0]
    sampled = {tuple(t.as_sequence().response_ids): t.as_sequence() for t in trajectories}
    for row in range(inputs["completion_ids"].shape[0]):
        n = int(inputs["completion_mask"][row].sum())
        view = sampled[tuple(inputs["completion_ids"][row, :n].tolist())]
        model_tokens = torch.tensor(view.loss_mask, dtype=torch.bool)
        np.testing.assert_allclose(inputs["logps_before"][row, :n][model_tokens].numpy(), np.asarray(view.logprobs)[model_tokens.numpy()], atol=2e-4)
    logged = [entry for entry in trainer.state.log_history if "gem/success_rate" in entry]
    assert logged and 0.0 <= logged[0]["gem/success_rate"] <= 1.0 and logged[0]["rewards/episode_return/mean"] == pytest.approx(logged[0]["gem/episode_return"])
