"""The turn-aware batch: explicit turn and episode ids per token, and ReBN that no mask edit can re-split."""

from __future__ import annotations

import numpy as np
import pytest

from gem_core.algo import rebn_token_level
from gem_core.batch import NO_TURN, sequence_batch, turn_batch


@pytest.fixture(scope="module")
def golden():
    from gem_core.testing.golden import golden_scenario

    return golden_scenario()


def test_sequence_batch_matches_the_golden_reference(golden):
    batch = sequence_batch(golden.trajectories)
    advantages = batch.advantages(gamma=golden.gamma, eps=golden.eps, ddof=golden.ddof)
    for i, (sequence, expected) in enumerate(zip(golden.sequences, golden.token_advantages)):
        n = len(sequence.response_ids)
        assert batch.response_ids[i, :n].tolist() == sequence.response_ids
        assert batch.loss_mask[i, :n].tolist() == sequence.loss_mask
        assert batch.turn_ids[i, :n].tolist() == sequence.turn_ids
        assert (batch.turn_ids[i, n:] == NO_TURN).all() and (batch.loss_mask[i, n:] == 0).all()
        np.testing.assert_allclose(advantages[i, :n], expected, rtol=0, atol=1e-9)
    assert batch.episode_ids == [t.episode_id for t in golden.trajectories]


def test_turn_batch_gives_each_turn_its_episode_advantage(golden):
    batch = turn_batch(golden.trajectories)
    assert len(batch) == sum(t.num_turns for t in golden.trajectories)
    advantages = batch.advantages(gamma=golden.gamma, eps=golden.eps, ddof=golden.ddof)
    row = 0
    for trajectory, turn_values in zip(golden.trajectories, golden.turn_advantages):
        for t, value in enumerate(turn_values):
            n = batch.lengths[row]
            assert batch.episode_ids[row] == trajectory.episode_id and set(batch.turn_ids[row, :n].tolist()) == {t}
            np.testing.assert_allclose(advantages[row, :n], value, rtol=0, atol=1e-9)
            row += 1


def test_a_rejected_token_changes_no_other_advantage(golden):
    """verl's token-level rollout rejection zeroes single mask tokens before advantages: with explicit
    turn ids every other token keeps its advantage; mask-run inference would split the turn."""
    batch = sequence_batch(golden.trajectories)
    options = dict(gamma=golden.gamma, eps=golden.eps, ddof=golden.ddof)
    before = rebn_token_level(batch.token_rewards, batch.loss_mask, turn_ids=batch.turn_ids, **options)
    row = 0
    inside = np.flatnonzero(batch.loss_mask[row])[2]  # a token in the middle of the first turn
    assert batch.loss_mask[row, inside - 1] and batch.loss_mask[row, inside + 1]
    mask = batch.loss_mask.copy()
    mask[row, inside] = 0
    after = rebn_token_level(batch.token_rewards, mask, turn_ids=batch.turn_ids, **options)
    keep = np.ones_like(mask, dtype=bool)
    keep[row, inside] = False
    np.testing.assert_array_equal(after[keep], before[keep])
    assert after[row, inside] == 0.0
    inferred = rebn_token_level(batch.token_rewards, mask, **options)  # the fallback sees one turn more
    assert not np.allclose(inferred[keep], before[keep])


def test_length_is_never_cut_silently(golden):
    with pytest.raises(ValueError, match="more than length"):
        sequence_batch(golden.trajectories, length=3)
    with pytest.raises(ValueError, match="empty batch"):
        sequence_batch([])


def test_run_config_rejects_bad_values():
    from gem_core.rollout import RunConfig, SamplingParams

    for kwargs, match in [
        ({"max_turns": 0}, "max_turns"),
        ({"max_turns": 2.5}, "max_turns"),
        ({"max_turns": "5"}, "max_turns"),
        ({"max_context_tokens": 1}, "max_context_tokens"),
        ({"min_turn_tokens": 0}, "min_turn_tokens"),
        ({"step_in_thread": "yes"}, "step_in_thread"),
    ]:
        with pytest.raises(ValueError, match=match):
            RunConfig(**kwargs)
    with pytest.raises(TypeError, match="SamplingParams"):
        RunConfig(params={"max_tokens": 5})
    assert RunConfig(params=SamplingParams(max_tokens=5)).replace(max_turns=3).max_turns == 3


def test_run_episode_rejects_a_config_of_the_wrong_type():
    import asyncio

    import gem_core
    from gem_core.rollout import RandomPolicy, run_episode

    with pytest.raises(TypeError, match="RunConfig"):
        asyncio.run(run_episode(gem_core.make("game:GuessTheNumber-v0-easy"), RandomPolicy(10), None, {"max_turns": 3}))


@pytest.mark.parametrize("pack", [sequence_batch, turn_batch])
def test_the_batch_gives_the_estimators_their_input_and_paints_their_output_back(golden, pack):
    """episode_rewards() is each episode's per-turn rewards (what an estimator takes), and per_token()
    puts each turn's value on that turn's model tokens: ReBN through them equals the golden reference."""
    from gem_core.algo import rebn

    batch = pack(golden.trajectories)
    rewards, groups = batch.episode_rewards()
    assert rewards == [t.rewards for t in golden.trajectories if t.turns]
    assert groups == [t.group_id for t in golden.trajectories if t.turns]
    tokens = batch.per_token(rebn(rewards, gamma=golden.gamma, eps=golden.eps, ddof=golden.ddof))
    np.testing.assert_allclose(tokens, batch.advantages(gamma=golden.gamma, eps=golden.eps, ddof=golden.ddof) * (batch.loss_mask != 0), rtol=0, atol=1e-9)
    assert (tokens[batch.loss_mask == 0] == 0).all()
    with pytest.raises(ValueError, match="turn values for a batch of"):
        batch.per_token([0.0])


def test_rows_with_one_episode_id_twice_are_two_episodes_in_the_sequence_view(golden):
    """A sequence row is an episode even when two rows share an id (a reused episode id never merges two
    episodes' returns)."""
    first = golden.trajectories[0]
    batch = sequence_batch([first, first])
    rewards, _ = batch.episode_rewards()
    assert rewards == [first.rewards, first.rewards]
