"""The golden scenario: deterministic, covers the cases the integrations must reproduce, pinned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gem_core.rollout import ScriptedPolicy
from gem_core.testing.golden import (
    GOLDEN_EPISODES,
    golden_formatter,
    golden_respond,
    golden_scenario,
    tool_episodes,
)

DIGEST = Path(__file__).parent / "data" / "golden_digest.json"


@pytest.fixture(scope="module")
def golden(tokenizer):
    return golden_scenario(tokenizer=tokenizer)


def test_is_a_pure_function_of_its_arguments(golden, tokenizer):
    assert golden_scenario(tokenizer=tokenizer).to_dict() == golden.to_dict()
    assert golden_scenario().to_dict() == golden.to_dict()  # its own tokenizer: the same ids


def test_matches_the_pinned_digest(golden):
    """Token ids, masks, rewards and advantages are pinned; a change to the tokenizer, the template,
    the games or the runner shows up here (regenerate the file only for a deliberate change:
    ``golden_scenario().digest()``)."""
    assert golden.digest() == json.loads(DIGEST.read_text())


def test_covers_the_cases_integrations_must_reproduce(golden, tokenizer):
    by_id = {t.episode_id: t for t in golden.trajectories}
    assert [e.episode_id for e in golden.episodes] == [e.episode_id for e in GOLDEN_EPISODES + tool_episodes()]
    # a sparse win
    assert by_id["gtn-easy"].terminated and by_id["gtn-easy"].rewards[-1] == 1.0
    # a response cut by max_tokens, then closed by the next observation delta
    cut = by_id["gtn-default"].turns[0]
    assert cut.finish_reason == "length" and cut.response_ids[-1] != golden_formatter(tokenizer).end_of_turn_id
    assert tokenizer.decode(cut.obs_delta_ids).startswith("<|im_end|>\n<|im_start|>user\n")
    assert by_id["gtn-default"].rewards[-1] == 1.0
    # thinking cut before the answer: a format error
    assert by_id["gtn-hard"].rewards == [-0.1] and by_id["gtn-hard"].turns[0].action == ""
    # a group of two from one state
    group = [t for t in golden.trajectories if t.group_id == "mm-easy"]
    assert len(group) == 2 and group[0].initial_observation == group[1].initial_observation
    assert group[0].num_turns >= 2 and group[0].rewards == group[1].rewards  # a deterministic policy plays one game twice
    # the context limit, with the reward of the last turn kept
    hard = by_id["mm-hard"]
    assert hard.truncation_reason == "context_limit" and hard.rewards[-1] == 0.25
    assert len(hard.full_ids()) <= golden.max_context_tokens
    # a tool turn (when gem_core.tools is there): the tool's output comes back as the template's tool turn
    if tool_episodes():
        tool = by_id["gtn-python"]
        assert tool.turns[0].info["tool_turn"] and "<python>" in tool.turns[0].action
        assert "<tool_response>\n<output>\n5\n</output>\n</tool_response>" in tokenizer.decode(tool.turns[0].obs_delta_ids)
        assert tool.terminated and tool.rewards[-1] == 1.0
    for trajectory in golden.trajectories:
        if trajectory.episode_id != "mm-hard":
            assert len(trajectory.full_ids()) < golden.max_context_tokens


def test_advantages_per_token_follow_the_turns(golden):
    for sequence, tokens, turns in zip(golden.sequences, golden.token_advantages, golden.turn_advantages):
        assert len(tokens) == len(sequence.response_ids)
        assert [a for a, m in zip(tokens, sequence.loss_mask) if not m] == [0.0] * sequence.loss_mask.count(0)
        for position, value in zip(sequence.reward_positions, turns):
            assert tokens[position] == pytest.approx(value)
    flat = [a for turns in golden.turn_advantages for a in turns]
    assert sum(flat) == pytest.approx(0.0, abs=1e-9)  # normalised over the whole batch


def test_other_settings_still_agree_across_views(tokenizer):
    sample_std = golden_scenario(tokenizer=tokenizer, ddof=1, gamma=1.0)
    assert sample_std.ddof == 1 and sample_std.gamma == 1.0
    assert sample_std.turn_returns[0] == [1.0, 1.0, 1.0, 1.0]


def test_scripted_policy_reads_only_the_context():
    context = (
        "<|im_start|>user\nYou are playing Guess The Number.\nGuess the number between 1 and 10 (inclusive)<|im_end|>\n"
        "<|im_start|>assistant\nyou guessed 9, and the target number is lower than<|im_end|>\n"  # the model's own text: ignored
        "<|im_start|>user\nAt turn 1, you guessed 5, and the target number is higher than 5.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert golden_respond(context) == "I guess \\boxed{8}."
    assert isinstance(ScriptedPolicy(None, golden_respond), ScriptedPolicy)
