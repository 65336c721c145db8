"""Trajectory views: the mask, per-turn samples against the sequence, returns, logprob alignment."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gem_core.rollout import Trajectory, Turn, scripted_logprob
from gem_core.testing.golden import golden_scenario


@pytest.fixture(scope="module")
def golden(tokenizer):
    return golden_scenario(tokenizer=tokenizer)


def test_mask_is_one_exactly_on_model_tokens(golden):
    for trajectory, sequence in zip(golden.trajectories, golden.sequences):
        expected = []
        for turn in trajectory.turns:
            expected += [1] * len(turn.response_ids) + [0] * len(turn.obs_delta_ids)
        assert sequence.loss_mask == expected
        model_tokens = [t for t, m in zip(sequence.response_ids, sequence.loss_mask) if m]
        assert model_tokens == [t for turn in trajectory.turns for t in turn.response_ids]
        env_tokens = [t for t, m in zip(sequence.response_ids, sequence.loss_mask) if not m]
        assert env_tokens == [t for turn in trajectory.turns for t in turn.obs_delta_ids]


def test_per_turn_samples_concatenate_back_to_the_sequence(golden):
    for trajectory, sequence in zip(golden.trajectories, golden.sequences):
        samples = trajectory.per_turn_samples()
        full = sequence.input_ids
        for k, sample in enumerate(samples):
            # each sample's prompt is the sequence up to its turn; prompt + response is a prefix of it
            assert full[: len(sample.prompt_ids)] == sample.prompt_ids
            assert full[len(sample.prompt_ids) : len(sample.prompt_ids) + len(sample.response_ids)] == sample.response_ids
            if k + 1 < len(samples):
                nxt = samples[k + 1].prompt_ids
                delta = nxt[len(sample.prompt_ids) + len(sample.response_ids) :]
                assert delta == trajectory.turns[k].obs_delta_ids and delta
        last = samples[-1]
        assert last.prompt_ids + last.response_ids == full  # the last turn's observation is never appended
        assert trajectory.full_ids() == full


def test_logprobs_are_aligned_with_response_tokens(golden):
    for trajectory, sequence in zip(golden.trajectories, golden.sequences):
        for turn in trajectory.turns:
            assert turn.logprobs == [scripted_logprob(t, i) for i, t in enumerate(turn.response_ids)]
        for position, (token, mask, logprob, turn_id) in enumerate(zip(sequence.response_ids, sequence.loss_mask, sequence.logprobs, sequence.turn_ids)):
            if mask:
                offset = position - sum(len(t.response_ids) + len(t.obs_delta_ids) for t in trajectory.turns[:turn_id])
                assert logprob == scripted_logprob(token, offset)
            else:
                assert logprob == 0.0


def test_reward_positions_are_the_last_model_token_of_each_turn(golden):
    for trajectory, sequence in zip(golden.trajectories, golden.sequences):
        assert len(sequence.reward_positions) == trajectory.num_turns
        for position, turn in zip(sequence.reward_positions, trajectory.turns):
            assert sequence.loss_mask[position] == 1
            assert position + 1 == len(sequence.response_ids) or sequence.loss_mask[position + 1] == 0
            assert sequence.turn_ids[position] == turn.index
        assert sum(sequence.token_rewards()) == pytest.approx(trajectory.episode_return)


def test_returns_match_the_design_golden_values():
    episodes = [[0, 0, 1], [0.5, -0.1], [0]]
    returns = []
    for k, rewards in enumerate(episodes):
        turns = [Turn(i, 0, [1], None, [], r, False, False) for i, r in enumerate(rewards)]
        returns += Trajectory(f"e{k}", [0], turns).returns(0.9)
    assert returns == pytest.approx([0.81, 0.9, 1.0, 0.41, -0.1, 0.0])


def test_rebn_from_both_views_agree_and_reach_every_model_token(golden):
    from gem_core.algo import rebn

    flat = np.asarray(rebn([t.rewards for t in golden.trajectories], gamma=golden.gamma, ddof=golden.ddof, eps=golden.eps))
    assert np.allclose(np.concatenate(golden.turn_advantages), flat, atol=1e-12)
    for trajectory, sequence, token_adv, turn_adv in zip(golden.trajectories, golden.sequences, golden.token_advantages, golden.turn_advantages):
        for value, mask, turn_id in zip(token_adv, sequence.loss_mask, sequence.turn_ids):
            assert value == (pytest.approx(turn_adv[turn_id]) if mask else 0.0)
        # the per-turn sample view: every token of a sample gets that turn's advantage
        for sample in trajectory.per_turn_samples(golden.gamma):
            assert sample.return_ == pytest.approx(trajectory.returns(golden.gamma)[sample.turn_index])


def test_to_dict_roundtrip_and_json(golden):
    for trajectory in golden.trajectories:
        data = trajectory.to_dict()
        assert Trajectory.from_dict(json.loads(json.dumps(data))).to_dict() == data
    json.dumps(golden.to_dict())  # plain data all the way down


def test_context_ids_checks_recorded_lengths(golden):
    trajectory = golden.trajectories[0]
    for turn in trajectory.turns:
        assert len(trajectory.context_ids(turn.index)) == turn.context_len


def test_text_only_trajectories_refuse_token_views():
    trajectory = Trajectory("t", [], [Turn(0, 0, [], None, [], 1.0, True, False)], token_mode=False)
    assert trajectory.returns(0.5) == [1.0]
    with pytest.raises(ValueError, match="text-only"):
        trajectory.as_sequence()
