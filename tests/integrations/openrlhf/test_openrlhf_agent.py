"""The agent file through OpenRLHF's own loader, MultiTurnAgentExecutor and response->Experience code."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import label_of, run_executor, samples_generator, vllm_like_params
from openrlhf.utils.agent import AgentExecutorBase, MultiTurnAgentExecutor

from gem_core.testing.golden import GOLDEN_MAX_CONTEXT_TOKENS


def expected_ranges(trajectory, sequence):
    ranges, position = [], len(sequence.prompt_ids)
    for turn in trajectory.turns:
        ranges.append((position, position + len(turn.response_ids)))
        position += len(turn.response_ids) + len(turn.obs_delta_ids)
    return ranges


def test_openrlhf_loader_loads_the_agent_file(executor):
    assert isinstance(executor, AgentExecutorBase)
    assert isinstance(executor, MultiTurnAgentExecutor)
    assert type(executor).__module__ == "agent_module"  # loaded by path, as OpenRLHF does


def test_scenario_covers_the_interesting_cases(golden):
    reasons = {t.truncation_reason for t in golden.trajectories}
    finishes = {turn.finish_reason for t in golden.trajectories for turn in t.turns}
    assert "context_limit" in reasons and "length" in finishes and len(golden.trajectories) == 7
    assert any(turn.info.get("tool_turn") for t in golden.trajectories for turn in t.turns)


def test_execute_reproduces_golden_tokens_and_action_ranges(golden, responses):
    for trajectory, sequence, response in zip(golden.trajectories, golden.sequences, responses):
        assert response["observation_tokens"] == sequence.prompt_ids + sequence.response_ids, trajectory.episode_id
        assert [tuple(r) for r in response["action_ranges"]] == expected_ranges(trajectory, sequence)
        assert response["reward"] == pytest.approx(sum(trajectory.rewards))
        assert response["truncated"] == (trajectory.turns[-1].finish_reason == "length")


def test_execute_reproduces_golden_logprobs(golden, responses):
    for sequence, response in zip(golden.sequences, responses):
        expected = [0.0] * len(sequence.prompt_ids) + sequence.logprobs
        assert response["rollout_log_probs"] == pytest.approx(expected, abs=1e-12)


def test_extra_logs_have_turn_rewards_and_the_same_keys(golden, responses):
    keys = {frozenset(r["extra_logs"]) for r in responses}
    assert len(keys) == 1
    assert set(next(iter(keys))) == {"gem_episode_length", "gem_success", "gem_truncated", "gem_context_limit", "gem_turn_rewards"}
    for trajectory, response in zip(golden.trajectories, responses):
        logs = response["extra_logs"]
        assert logs["gem_turn_rewards"] == pytest.approx(trajectory.rewards)
        assert logs["gem_episode_length"] == trajectory.num_turns
        assert logs["gem_context_limit"] == float(trajectory.truncation_reason == "context_limit")
        assert logs["gem_success"] == float(bool(trajectory.turns[-1].info.get("success")))


def test_turn_rewards_are_off_without_the_switch(executor, tokenizer, golden, monkeypatch):
    monkeypatch.delenv("GEM_OPENRLHF_TURN_REWARDS")
    response = run_executor(executor, tokenizer, golden.episodes[0])
    assert "gem_turn_rewards" not in response["extra_logs"]
    assert response["observation_tokens"] == golden.sequences[0].prompt_ids + golden.sequences[0].response_ids


def test_process_response_into_experience_masks_match(golden, responses):
    generator = samples_generator()
    for trajectory, sequence, response in zip(golden.trajectories, golden.sequences, responses):
        experience = generator._process_response_into_experience(response, max_len=GOLDEN_MAX_CONTEXT_TOKENS)
        full_mask = [0] * len(sequence.prompt_ids) + sequence.loss_mask
        assert experience.sequences[0].tolist() == sequence.prompt_ids + sequence.response_ids
        assert experience.action_mask[0].tolist() == full_mask[1:]  # OpenRLHF's action mask is shifted by one
        assert experience.info["gem_turn_rewards"].tolist() == [pytest.approx(trajectory.rewards)]
        assert experience.rewards.tolist() == pytest.approx([sum(trajectory.rewards)])


def test_group_of_one_prompt_starts_from_one_state(executor, tokenizer, golden):
    a, b = (run_executor(executor, tokenizer, golden.episodes[0]) for _ in range(2))
    assert a["observation_tokens"] == b["observation_tokens"]


def test_bad_label_fails_clearly(executor, tokenizer):
    from gem_integrations.openrlhf.engine import PolicyEngine
    from gem_core.testing.golden import golden_formatter, golden_policy

    engine = PolicyEngine(golden_policy(tokenizer), golden_formatter(tokenizer))
    with pytest.raises(ValueError, match="env_id"):
        asyncio.run(executor.execute("p", json.dumps({"answer": 3}), vllm_like_params(), 400, tokenizer, engine))


def test_skip_special_tokens_is_refused(executor, tokenizer, golden):
    from gem_integrations.openrlhf.engine import PolicyEngine
    from gem_core.testing.golden import golden_formatter, golden_policy

    params = vllm_like_params()
    params.skip_special_tokens = True
    engine = PolicyEngine(golden_policy(tokenizer), golden_formatter(tokenizer), max_tokens_per_turn=40)
    with pytest.raises(ValueError, match="skip_special_tokens"):
        asyncio.run(executor.execute("p", label_of(golden.episodes[0]), params, 460, tokenizer, engine))
