"""No env left behind by the TRL plugin: every env GemRollout makes (through TaskSpec.make_env, in this
process) is closed exactly once, through TRL's own train() with episodes the infrastructure failed, and
when an env raises in the middle of a rollout (the other episodes in flight are stopped and closed too)."""

from __future__ import annotations

import pytest
import trl_test_envs
from conftest import grpo_config
from datasets import Dataset

import gem_core
from gem_core.tasks import TaskSpec
from gem_integrations.trl import GemGRPOTrainer, GemRollout
from gem_integrations.trl.dataset import prompt_of
from helpers.lifecycle import track_env_closes

CRASH_ID = "test:TRLCrashes-v0"


class CrashingTurns(trl_test_envs.FixedTurns):
    """FixedTurns whose step ``crash_at`` raises (an env bug, not an infrastructure failure)."""

    def __init__(self, turns: int | None = None, crash_at: int | None = None):
        super().__init__(turns=turns)
        self.crash_at = crash_at

    def step(self, action: str):
        if self.t + 1 == self.crash_at:
            raise RuntimeError("env bug (test)")
        return super().step(action)


gem_core.register(CRASH_ID, CrashingTurns, override=True)


@pytest.fixture()
def env_count(monkeypatch):
    """Every env made through TaskSpec.make_env in this process, with how often each was closed."""
    return track_env_closes(monkeypatch)


def _dataset(env_id: str, rows: list[dict]) -> Dataset:
    return Dataset.from_list([{"prompt": prompt_of(TaskSpec(env_id, seed=i, env_kwargs=kwargs))} for i, kwargs in enumerate(rows)])


def test_train_closes_every_env_infra_failed_episodes_included(tokenizer, tiny_model, tmp_path, env_count):
    rows = [{"turns": 3}, {"turns": 3, "infra_at": 2}, {"turns": 2}, {"turns": 4, "infra_at": 1}]
    dataset = _dataset(trl_test_envs.TURNS_ID, rows)
    env_count.clear()  # (prompt_of made and closed one env per row)
    rollout = GemRollout(max_turn_tokens=4)
    args = grpo_config(tmp_path, per_device_train_batch_size=8, num_generations=2, max_completion_length=160)
    trainer = GemGRPOTrainer(tiny_model, args=args, train_dataset=dataset, processing_class=tokenizer, rollout_func=rollout)
    trainer.train()

    trajectories = rollout.last_trajectories
    assert sum(t.infra_error is not None for t in trajectories) == 4, "both rows' two generations failed on the infrastructure"
    assert len(env_count) == len(trajectories) == 8, f"one env per episode, got {len(env_count)}"
    assert [r["closed"] for r in env_count] == [1] * 8


def test_an_env_raising_mid_rollout_leaves_no_env_open(tokenizer, tiny_model, tmp_path, env_count):
    rows = [{"turns": 4}, {"turns": 3, "crash_at": 2}, {"turns": 4}]
    dataset = _dataset(CRASH_ID, rows)
    env_count.clear()
    rollout = GemRollout(max_turn_tokens=4)
    args = grpo_config(tmp_path, per_device_train_batch_size=6, num_generations=2, max_completion_length=160)
    trainer = GemGRPOTrainer(tiny_model, args=args, train_dataset=dataset, processing_class=tokenizer, rollout_func=rollout)
    with pytest.raises(RuntimeError, match="env bug"):
        rollout([row["prompt"] for row in dataset], trainer)
    assert len(env_count) == 3, f"one env per prompt, got {len(env_count)}"
    assert [r["closed"] for r in env_count] == [1] * 3, f"envs not closed exactly once: {env_count}"
