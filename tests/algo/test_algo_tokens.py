"""Token level: turn ids from masks and spans, broadcast, and `rebn_token_level` against the per-turn `rebn`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gem_core.algo import (
    broadcast_turns_to_tokens,
    discounted_returns,
    normalization_stats,
    rebn,
    rebn_token_level,
    turn_ids_from_mask,
    turn_ids_from_spans,
)

#            turn 0     turn 1        turn 0        turn 1     turn 0   (row 3: no turn)   turn 0 (whole row)
MASK = np.array(
    [
        [0, 1, 1, 0, 1, 1, 0],
        [1, 1, 1, 0, 0, 1, 1],
        [0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1],
    ]
)


def golden_batch() -> np.ndarray:
    """The DESIGN.md golden episodes laid out as rows: [[0, 0, 1] ...] needs 3 turns, so use row 0..2 + 4."""
    rewards = np.zeros(MASK.shape)
    rewards[0, 5] = 1.0  # row 0: turns [0, 1]
    rewards[1, 2], rewards[1, 6] = 0.5, -0.1  # row 1: [0.5, -0.1]
    rewards[2, 3] = 0.3  # row 2: [0.3]
    rewards[4, 6] = 2.0  # row 4: [2.0]
    return rewards


EPISODES = [[0.0, 1.0], [0.5, -0.1], [0.3], [2.0]]


def test_turn_ids_from_mask() -> None:
    expected = [
        [-1, 0, 0, 0, 1, 1, 1],
        [0, 0, 0, 0, 0, 1, 1],
        [-1, -1, -1, 0, 0, 0, 0],
        [-1] * 7,
        [0] * 7,
    ]
    np.testing.assert_array_equal(turn_ids_from_mask(MASK), expected)


def test_turn_ids_from_spans() -> None:
    ids = turn_ids_from_spans([[(1, 3), (4, 6)], [(0, 3), (5, 7)], []], length=7)
    np.testing.assert_array_equal(ids[0], [-1, 0, 0, -1, 1, 1, -1])
    np.testing.assert_array_equal(ids[1], [0, 0, 0, -1, -1, 1, 1])
    np.testing.assert_array_equal(ids[2], [-1] * 7)
    with pytest.raises(ValueError, match="overlap"):
        turn_ids_from_spans([[(0, 3), (2, 5)]], length=7)
    with pytest.raises(ValueError, match="empty or outside"):
        turn_ids_from_spans([[(3, 3)]], length=7)
    with pytest.raises(ValueError, match="empty or outside"):
        turn_ids_from_spans([[(5, 9)]], length=7)


def test_broadcast_turn_table_and_row_values() -> None:
    ids = turn_ids_from_spans([[(1, 3), (4, 6)], [(0, 2)]], length=6)
    out = broadcast_turns_to_tokens(np.array([[1.5, -2.0], [7.0, 0.0]]), ids)
    np.testing.assert_array_equal(out, [[0, 1.5, 1.5, 0, -2, -2], [7, 7, 0, 0, 0, 0]])
    rows = broadcast_turns_to_tokens(np.array([2.0, -1.0]), response_mask=np.array([[1, 1, 0], [0, 1, 1]]))
    np.testing.assert_array_equal(rows, [[2, 2, 0], [0, -1, -1]])
    with pytest.raises(ValueError, match="has no value"):
        broadcast_turns_to_tokens(np.array([[1.0], [2.0]]), ids)


@pytest.mark.parametrize("ddof", [0, 1])
def test_rebn_token_level_matches_per_turn_rebn(ddof: int) -> None:
    advantages, returns = rebn_token_level(golden_batch(), MASK, gamma=0.9, ddof=ddof, return_returns=True)
    per_turn = rebn(EPISODES, gamma=0.9, ddof=ddof)
    turn_returns = discounted_returns(EPISODES, gamma=0.9)
    # every token of a turn carries that turn's advantage and return; every other token 0
    ids = turn_ids_from_mask(MASK)
    offsets = {0: 0, 1: 2, 2: 4, 4: 5}
    for row, first in offsets.items():
        for col in range(MASK.shape[1]):
            turn = first + ids[row, col]
            expected_adv = per_turn[turn] if MASK[row, col] else 0.0
            expected_ret = turn_returns[turn] if MASK[row, col] else 0.0
            assert advantages[row, col] == pytest.approx(expected_adv, abs=1e-12)
            assert returns[row, col] == pytest.approx(expected_ret, abs=1e-12)
    np.testing.assert_array_equal(advantages[3], 0.0)


def test_explicit_turn_ids_and_spans_give_the_same_result() -> None:
    from_mask = rebn_token_level(golden_batch(), MASK, gamma=0.9)
    from_ids = rebn_token_level(golden_batch(), MASK, gamma=0.9, turn_ids=turn_ids_from_mask(MASK))
    np.testing.assert_allclose(from_ids, from_mask, atol=1e-15)
    spans = [[(1, 3), (4, 6)], [(0, 3), (5, 7)], [(3, 4)], [], [(0, 7)]]
    ids = turn_ids_from_spans(spans, length=7)
    rewards = golden_batch()
    rewards[1, 6], rewards[1, 5] = 0.0, -0.1  # spans end at the turn: keep every reward inside one
    from_spans = rebn_token_level(rewards, MASK, gamma=0.9, turn_ids=ids)
    np.testing.assert_allclose(from_spans, from_mask, atol=1e-15)


def test_explicit_turn_ids_errors() -> None:
    ids = turn_ids_from_mask(MASK)
    bad = ids.copy()
    bad[0, 1] = -1  # a response token with no turn
    with pytest.raises(ValueError, match="needs a turn"):
        rebn_token_level(golden_batch(), MASK, turn_ids=bad)
    skipping = ids.copy()
    skipping[0, 4:] = 2  # row 0 jumps from turn 0 to turn 2
    with pytest.raises(ValueError, match="none missing"):
        rebn_token_level(golden_batch(), MASK, turn_ids=skipping)
    rewards = golden_batch()
    rewards[2, 0] = 1.0  # a reward on a token of no turn
    with pytest.raises(ValueError, match="belong to no turn"):
        rebn_token_level(rewards, MASK, turn_ids=ids)


def test_rewards_on_environment_tokens_count_for_the_turn_before_them() -> None:
    moved = golden_batch()
    moved[0, 5], moved[0, 6] = 0.0, 1.0  # row 0's reward now on the env token after turn 1
    np.testing.assert_allclose(rebn_token_level(moved, MASK, gamma=0.9), rebn_token_level(golden_batch(), MASK, gamma=0.9), atol=1e-15)


def test_rewards_before_the_first_turn_are_an_error() -> None:
    rewards = golden_batch()
    rewards[0, 0] = 0.2
    with pytest.raises(ValueError, match="row 0 has rewards before its first response token"):
        rebn_token_level(rewards, MASK)
    rewards = golden_batch()
    rewards[3, 4] = 0.2  # row 3 has no turn at all
    with pytest.raises(ValueError, match="row 3"):
        rebn_token_level(rewards, MASK)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_token_rewards_are_an_error(bad: float) -> None:
    rewards = golden_batch()
    rewards[1, 4] = bad
    with pytest.raises(ValueError, match="must be finite"):
        rebn_token_level(rewards, MASK)


def test_empty_inputs_are_errors() -> None:
    with pytest.raises(ValueError, match="empty batch"):
        rebn_token_level(np.zeros((0, 5)), np.zeros((0, 5)))
    with pytest.raises(ValueError, match="empty batch"):
        rebn_token_level(np.zeros((3, 5)), np.zeros((3, 5)))  # no response token anywhere
    with pytest.raises(ValueError, match="both be"):
        rebn_token_level(np.zeros((3, 5)), np.zeros((3, 4)))


def test_group_by_rows() -> None:
    keys = ["p", "q", "p", "x", "q"]  # row 3 has no turn; its key never matters
    out = rebn_token_level(golden_batch(), MASK, keys, gamma=0.9, ddof=1)
    per_turn = rebn(EPISODES, gamma=0.9, ddof=1, group_by=["p", "q", "p", "q"])
    np.testing.assert_allclose(out[0, [1, 4]], per_turn[[0, 1]], atol=1e-12)
    np.testing.assert_allclose(out[1, [0, 5]], per_turn[[2, 3]], atol=1e-12)
    np.testing.assert_allclose(out[2, 3], per_turn[4], atol=1e-12)
    np.testing.assert_allclose(out[4, 0], per_turn[5], atol=1e-12)


def test_stats_from_another_batch_are_applied() -> None:
    stats = normalization_stats(np.array([0.0, 1.0, 2.0, 3.0]), ddof=0)
    out = rebn_token_level(golden_batch(), MASK, gamma=0.9, stats=stats)
    returns = discounted_returns(EPISODES, gamma=0.9)
    expected = (returns - 1.5) / (np.sqrt(1.25) + 1e-6)
    np.testing.assert_allclose(out[0, [1, 4]], expected[:2], atol=1e-12)


def test_rows_as_turns_view_reproduces_the_golden_values() -> None:
    # GEM's default view: one row per turn. Golden episodes [[0,0,1],[0.5,-0.1],[0]] as six rows.
    rewards = np.zeros((6, 4))
    rewards[:, 3] = [0, 0, 1, 0.5, -0.1, 0]
    mask = np.ones((6, 4))
    mask[:, 0] = 0  # the prompt
    for ddof, golden in (
        (1, [0.6468, 0.8366, 1.0475, -0.1968, -1.2724, -1.0615]),
        (0, [0.7085, 0.9164, 1.1474, -0.2156, -1.3939, -1.1628]),
    ):
        advantages, returns = rebn_token_level(rewards, mask, episode_ids=[0, 0, 0, 1, 1, 2], gamma=0.9, ddof=ddof, return_returns=True)
        np.testing.assert_allclose(advantages[:, 1], golden, atol=5e-5)
        np.testing.assert_array_equal(advantages[:, 0], 0.0)
        np.testing.assert_allclose(returns[:, 2], [0.81, 0.9, 1.0, 0.41, -0.1, 0.0], atol=1e-12)


@st.composite
def token_batches(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random masks (rows with no turn, one-token runs, whole-row runs) and sparse rewards from a row's first turn on."""
    batch, length = draw(st.integers(1, 9)), draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mask = rng.random((batch, length)) < draw(st.sampled_from([0.2, 0.5, 0.9, 1.0]))
    mask[rng.integers(0, batch)] = True  # at least one turn in the batch
    rewards = np.where(rng.random((batch, length)) < 0.3, rng.normal(size=(batch, length)), 0.0)
    first = np.where(mask.any(axis=1), mask.argmax(axis=1), length)
    rewards[np.arange(length)[None, :] < first[:, None]] = 0.0  # nothing before a row's first turn
    return rewards, mask, rng.integers(0, 3, batch)


@settings(max_examples=150, deadline=None)
@given(token_batches(), st.sampled_from([0.0, 0.9, 1.0]), st.booleans(), st.sampled_from([bool, np.uint8, np.int64, np.float32]))
def test_token_level_equals_a_token_by_token_walk(data, gamma, grouped, mask_dtype) -> None:
    """Against a plain walk over the tokens: a turn starts at each run of the mask and takes every reward
    up to the next run; per-turn `rebn` on those turns, painted on each run's tokens."""
    rewards, mask, groups = data
    episodes, keys, turn_of = [], [], np.full(mask.shape, -1)
    for row in range(mask.shape[0]):
        turns: list[float] = []
        for col in range(mask.shape[1]):
            if mask[row, col] and (col == 0 or not mask[row, col - 1]):
                turns.append(0.0)
            if turns:
                turns[-1] += rewards[row, col]
                turn_of[row, col] = sum(len(e) for e in episodes) + len(turns) - 1
        if turns:
            episodes.append(turns)
            keys.append(groups[row])
    per_turn = rebn(episodes, gamma=gamma, group_by=keys if grouped else None)
    per_turn_returns = discounted_returns(episodes, gamma=gamma)
    advantages, returns = rebn_token_level(rewards, mask.astype(mask_dtype), groups if grouped else None, gamma=gamma, return_returns=True)
    np.testing.assert_allclose(advantages, np.where(mask, per_turn[turn_of], 0.0), atol=1e-9)
    np.testing.assert_allclose(returns, np.where(mask, per_turn_returns[turn_of], 0.0), atol=1e-12)
