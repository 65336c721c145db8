"""Episodes the infrastructure failed (a step's info carries gem_core.errors.INFRA_ERROR, as a tool whose sandbox
worker died reports it) through TRL's own train(): no loss on them, no part in ReBN's statistics, no part
in TRL's reward statistics, and counted in TRL's metrics as gem/infra_failed_episodes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import trl_test_envs
from conftest import capture_loss_inputs, grpo_config, row_of
from datasets import Dataset

from gem_core.batch import sequence_batch
from gem_core.tasks import TaskSpec
from gem_integrations.trl import GemGRPOTrainer, GemRollout, episode_return
from gem_integrations.trl.dataset import prompt_of
from gem_integrations.trl.rollout import trl_fields

#: (turns, infra_at) per dataset row; each row is played num_generations=2 times
ROWS = ((3, None), (3, 2), (2, None), (4, None))


def _dataset() -> Dataset:
    specs = [TaskSpec(trl_test_envs.TURNS_ID, seed=i, env_kwargs={"turns": turns, "infra_at": infra_at}) for i, (turns, infra_at) in enumerate(ROWS)]
    return Dataset.from_list([{"prompt": prompt_of(spec)} for spec in specs])


def test_infra_failed_episodes_stay_out_of_the_loss_and_the_statistics(tokenizer, tiny_model, tmp_path):
    rollout = GemRollout(max_turn_tokens=4)
    args = grpo_config(tmp_path, per_device_train_batch_size=8, num_generations=2, max_completion_length=160, learning_rate=5e-3)
    trainer = GemGRPOTrainer(tiny_model, args=args, train_dataset=_dataset(), processing_class=tokenizer, rollout_func=rollout)
    seen = capture_loss_inputs(trainer)
    trainer.train()

    trajectories = rollout.last_trajectories
    failed = [t for t in trajectories if t.infra_error is not None]
    ok = [t for t in trajectories if t.infra_error is None]
    assert len(failed) == 2 and all(t.num_turns == 2 and t.truncation_reason == "infra_error" for t in failed)
    assert all(t.turns[0].response_ids for t in failed), "the failed episodes have model tokens that would carry a loss"

    # the reference: ReBN over the healthy episodes alone; it differs from ReBN with the failed ones counted
    expected = sequence_batch(ok).advantages(gamma=0.9, eps=1e-6, ddof=0)
    counted = sequence_batch([dataclasses.replace(t, infra_error=None) for t in trajectories]).advantages(gamma=0.9, eps=1e-6, ddof=0)
    healthy_rows = [i for i, t in enumerate(trajectories) if t.infra_error is None]
    assert not np.allclose(counted[healthy_rows][:, : expected.shape[1]], expected, atol=1e-3), "the failed episodes would move the statistics"

    inputs = seen[0]
    loss_mask = inputs["completion_mask"] * inputs["tool_mask"]
    healthy, broken = sequence_batch(ok), sequence_batch(failed)
    rows_failed = 0
    for row in range(inputs["completion_ids"].shape[0]):
        n = int(inputs["completion_mask"][row].sum())
        completion = inputs["completion_ids"][row, :n].tolist()
        if any(completion == broken.response_ids[i, : broken.lengths[i]].tolist() for i in range(len(broken))):
            rows_failed += 1
            assert not loss_mask[row].any(), "no loss on an infra-failed episode"
            assert not inputs["advantages"][row].any()
            continue
        i = row_of(inputs, row, healthy)
        np.testing.assert_allclose(inputs["advantages"][row, :n].numpy(), expected[i, :n], atol=1e-6, rtol=0)
        assert loss_mask[row, :n].tolist() == healthy.loss_mask[i, :n].tolist()
    assert rows_failed == 2

    logged = [entry for entry in trainer.state.log_history if "gem/infra_failed_episodes" in entry][0]
    assert logged["gem/infra_failed_episodes"] == 2 and logged["gem/infra_failed_fraction"] == pytest.approx(0.25)
    # TRL's reward statistics and the gem metrics are over the healthy episodes only
    assert logged["rewards/episode_return/mean"] == pytest.approx(np.mean([t.episode_return for t in ok]))
    assert logged["gem/episode_return"] == pytest.approx(np.mean([t.episode_return for t in ok]))
    assert logged["gem/turns_per_episode"] == pytest.approx(np.mean([t.num_turns for t in ok]))


def test_rollout_fields_of_an_infra_failed_episode(tokenizer, tiny_model, tmp_path):
    """The rollout's fields for a failed episode carry nothing to learn from, and the reward function
    gives TRL None for it (TRL: left out of the baselines, advantage 0)."""
    rollout = GemRollout(max_turn_tokens=4)
    args = grpo_config(tmp_path, per_device_train_batch_size=4, num_generations=2, max_completion_length=160)
    trainer = GemGRPOTrainer(tiny_model, args=args, train_dataset=_dataset(), processing_class=tokenizer, rollout_func=rollout)
    trainer.temperature = 0.0
    out = rollout([row["prompt"] for row in _dataset()][:2], trainer)
    trajectories = rollout.last_trajectories
    assert [t.infra_error is not None for t in trajectories] == [False, True]
    assert out["gem_infra_error"] == ["", "sandbox worker died (test)"]
    assert set(out["env_mask"][1]) == {0} and set(out["gem_turn_ids"][1]) == {-1} and out["gem_turn_rewards"][1] == []
    assert 1 in out["env_mask"][0] and out["gem_turn_rewards"][0] == trajectories[0].rewards
    assert out["completion_ids"][1] == list(trajectories[1].as_sequence().response_ids)  # the row keeps its tokens
    assert episode_return(gem_return=out["gem_return"], gem_infra_error=out["gem_infra_error"]) == [trajectories[0].episode_return, None]
    assert trl_fields(trajectories, 0)["gem_infra_error"] == out["gem_infra_error"]
