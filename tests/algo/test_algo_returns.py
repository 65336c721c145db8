"""Per-turn discounted returns: golden values, both input forms, edge cases and clear errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from gem_core.algo import discounted_returns, flatten_episodes
from gem_core.algo.returns import episode_layout

GOLDEN_EPISODES = [[0, 0, 1], [0.5, -0.1], [0]]
GOLDEN_RETURNS = [0.81, 0.9, 1.0, 0.41, -0.1, 0.0]


def test_golden_returns_from_design() -> None:
    np.testing.assert_allclose(discounted_returns(GOLDEN_EPISODES, gamma=0.9), GOLDEN_RETURNS, atol=1e-12)


def test_flat_input_with_episode_ids_matches_ragged() -> None:
    rewards, ids = flatten_episodes(GOLDEN_EPISODES)
    np.testing.assert_array_equal(ids, [0, 0, 0, 1, 1, 2])
    np.testing.assert_allclose(discounted_returns(rewards, ids, gamma=0.9), GOLDEN_RETURNS, atol=1e-12)


def test_interleaved_episode_ids_keep_each_episodes_turn_order() -> None:
    # episode 7: rewards 1, 2, 3 (in that order); episode 3: rewards 10, 20; turns interleaved.
    rewards = np.array([1.0, 10.0, 2.0, 20.0, 3.0])
    ids = np.array([7, 3, 7, 3, 7])
    expected = [1 + 0.5 * 2 + 0.25 * 3, 10 + 0.5 * 20, 2 + 0.5 * 3, 20, 3]
    np.testing.assert_allclose(discounted_returns(rewards, ids, gamma=0.5), expected)


def test_string_episode_ids() -> None:
    out = discounted_returns([1.0, 2.0, 5.0], ["b", "b", "a"], gamma=1.0)
    np.testing.assert_allclose(out, [3.0, 2.0, 5.0])


def test_episode_layout_rows_and_columns() -> None:
    layout = episode_layout(np.array([5, 2, 5, 2, 2]))
    np.testing.assert_array_equal(layout.row, [1, 0, 1, 0, 0])  # episode 2 is row 0 (sorted ids)
    np.testing.assert_array_equal(layout.col, [0, 0, 1, 1, 2])
    np.testing.assert_array_equal(layout.lengths, [3, 2])
    assert (layout.num_episodes, layout.max_turns, layout.num_turns) == (2, 3, 5)


def test_gamma_zero_is_the_immediate_reward() -> None:
    np.testing.assert_allclose(discounted_returns(GOLDEN_EPISODES, gamma=0.0), [0, 0, 1, 0.5, -0.1, 0])


def test_gamma_one_is_the_undiscounted_reward_to_go() -> None:
    np.testing.assert_allclose(discounted_returns(GOLDEN_EPISODES, gamma=1.0), [1, 1, 1, 0.4, -0.1, 0], atol=1e-12)


def test_one_turn_episodes_return_their_reward() -> None:
    np.testing.assert_allclose(discounted_returns([[3.0], [-2.0], [0.5]], gamma=0.7), [3.0, -2.0, 0.5])


def test_dense_negative_rewards_in_one_long_episode() -> None:
    rewards = [-1.0] * 50
    out = discounted_returns([rewards], gamma=0.95)
    # closed form of a constant reward stream: -(1 - gamma^(n - t)) / (1 - gamma)
    expected = [-(1 - 0.95 ** (50 - t)) / 0.05 for t in range(50)]
    np.testing.assert_allclose(out, expected, rtol=1e-12)


def test_empty_batch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="empty batch"):
        discounted_returns([], gamma=0.9)
    with pytest.raises(ValueError, match="empty batch"):
        discounted_returns([[], []], gamma=0.9)
    with pytest.raises(ValueError, match="empty batch"):
        discounted_returns(np.zeros(0), np.zeros(0, dtype=np.int64))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rewards_are_a_clear_error(bad: float) -> None:
    with pytest.raises(ValueError, match="must be finite"):
        discounted_returns([[0.0, bad], [1.0]], gamma=0.9)


@pytest.mark.parametrize("gamma", [-0.1, 1.5, float("nan")])
def test_gamma_outside_unit_interval_is_an_error(gamma: float) -> None:
    with pytest.raises(ValueError, match="gamma must be in"):
        discounted_returns(GOLDEN_EPISODES, gamma=gamma)


def test_mismatched_ids_and_2d_rewards_are_errors() -> None:
    with pytest.raises(ValueError, match="one id per turn"):
        discounted_returns(np.ones(3), np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError, match="1-D"):
        discounted_returns(np.ones((2, 2)), np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError, match="ragged input"):
        discounted_returns(np.ones(3))


def test_import_does_not_import_torch() -> None:
    code = "import sys, gem_core.algo; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
