"""Infrastructure failures are not policy failures (DESIGN.md contract 8): one info field, the episode
ends there, and the turn-aware batch keeps it out of the loss and out of ReBN's statistics."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from rollout_envs import ScriptedRewardEnv

import gem_core
from gem_core.batch import infra_metrics, sequence_batch, turn_batch
from gem_core.errors import INFRA_ERROR, infra_error
from gem_core.rollout import Generation, RunConfig, ScriptedPolicy, run_episode
from gem_core.rollout.trajectory import ENGINE_ABORTED
from gem_core.tools.base import Tool, ToolCall, ToolResult
from gem_core.wrappers import ToolEnvWrapper


def _play(env, policy, formatter, seed=0):
    return asyncio.run(run_episode(env, policy, formatter, RunConfig(), seed=seed))


class InfraFailsAtTurn(ScriptedRewardEnv):
    """Reports an infrastructure failure at turn ``at`` (as a dead sandbox worker would), with a reward
    that must not reach training."""

    def __init__(self, rewards, at):
        super().__init__(rewards)
        self.at = at

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.turn - 1 == self.at:
            info[INFRA_ERROR] = "python sandbox: worker 3 died"
        return obs, reward, terminated, truncated, info


def test_infra_error_reads_only_a_real_reason():
    assert infra_error({INFRA_ERROR: "pool shut down"}) == "pool shut down"
    assert infra_error({}) is None and infra_error({INFRA_ERROR: None}) is None and infra_error("x") is None


def test_a_step_reporting_an_infra_failure_ends_the_episode(tokenizer, formatter):
    policy = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")
    env = InfraFailsAtTurn([0.1, 5.0, 1.0], at=1)
    trajectory = _play(env, policy, formatter)
    assert env.turn == 2, "the episode must stop at the failed step"
    assert trajectory.infra_error == "python sandbox: worker 3 died"
    assert trajectory.truncated and trajectory.truncation_reason == "infra_error"


def test_an_engine_abort_is_an_infra_failure_an_empty_answer_is_not(tokenizer, formatter):
    inner = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")

    class Ends:
        def __init__(self, generation):
            self.generation = generation

        async def generate(self, prompt_ids, params, *, request_id=""):
            if request_id.endswith("turn-1"):
                return self.generation
            return await inner.generate(prompt_ids, params, request_id=request_id)

    aborted = _play(ScriptedRewardEnv([0.4, 1.0]), Ends(Generation([5], None, "abort")), formatter)
    assert aborted.infra_error == ENGINE_ABORTED and aborted.truncation_reason == "abort"
    empty = _play(ScriptedRewardEnv([0.4, 1.0]), Ends(Generation([], None, "stop")), formatter)
    assert empty.infra_error is None and empty.truncation_reason == "abort"


@pytest.mark.parametrize("view", ["sequence", "turn"])
def test_the_batch_keeps_infra_failed_episodes_out_of_the_loss_and_the_statistics(tokenizer, formatter, view):
    policy = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")
    clean = [_play(ScriptedRewardEnv(rewards), policy, formatter, seed=i) for i, rewards in enumerate([[0, 0, 1], [0.5, -0.1], [0]])]
    failed = _play(InfraFailsAtTurn([0.0, 7.0], at=1), policy, formatter, seed=9)
    assert failed.infra_error is not None
    build = sequence_batch if view == "sequence" else turn_batch
    reference = build(clean).advantages(gamma=0.9)
    mixed = [clean[0], failed, clean[1], clean[2]]
    batch = build(mixed)
    advantages = batch.advantages(gamma=0.9)
    failed_rows = [i for i, flag in enumerate(batch.infra_failed) if flag]
    assert failed_rows and all(batch.episode_ids[i] == failed.episode_id for i in failed_rows)
    assert (batch.loss_mask[failed_rows] == 0).all() and (batch.turn_ids[failed_rows] == -1).all()
    assert (advantages[failed_rows] == 0).all() and (batch.token_rewards[failed_rows] == 0).all()
    kept = [i for i, flag in enumerate(batch.infra_failed) if not flag]
    # the clean episodes' advantages are exactly what they are without the failed one (7.0 never counts)
    width = min(reference.shape[1], advantages.shape[1])
    np.testing.assert_allclose(advantages[kept][:, :width], reference[:, :width], atol=1e-12)
    assert infra_metrics(mixed) == {"gem/infra_failed_episodes": 1.0, "gem/infra_failed_fraction": 0.25}


class DeadSandboxTool(Tool):
    """A tool whose machinery reports what PythonTool reports when its worker died."""

    name = "python"

    def find_call(self, action):
        return ToolCall(self.name, action, 0, len(action)) if "<python>" in action else None

    def run(self, call):
        return ToolResult("<output>\n\n</output>", ok=False, info={"sandbox_error": "worker died", INFRA_ERROR: "python sandbox: worker died"})

    def instructions(self):
        return "Call <python>."


def test_a_tool_whose_machinery_failed_reports_it_in_the_step_info():
    env = ToolEnvWrapper(gem_core.make("game:GuessTheNumber-v0-easy"), [DeadSandboxTool()])
    env.reset(seed=0)
    _, _, _, _, info = env.step("<python>print(1)</python>")
    assert info[INFRA_ERROR] == "python sandbox: worker died"
    _, _, _, _, info = env.step("\\boxed{3}")
    assert INFRA_ERROR not in info


def test_healthy_groups_keeps_each_groups_played_rows_by_size():
    """Position-grouped batches (OpenRLHF's and RL2's ``reshape(-1, n)``): each group's rows without the
    infra-failed ones, blocked by how many it keeps; a group with none left is absent."""
    from gem_core.batch import healthy_groups

    failed = [0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1]
    groups = healthy_groups(failed, 4)
    assert sorted(groups) == [1, 3, 4]
    assert groups[3].tolist() == [[0, 1, 2]] and groups[4].tolist() == [[4, 5, 6, 7]] and groups[1].tolist() == [[9]]
    assert healthy_groups([0, 1, 0, 1], 2)[1].tolist() == [[0], [2]]
    with pytest.raises(ValueError, match="not whole groups of 4"):
        healthy_groups([0, 0, 0], 4)
