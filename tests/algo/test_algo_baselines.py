"""REINFORCE, batch-mean REINFORCE, GRPO / Dr.GRPO, RLOO and turn-level GAE, each against hand-computed numbers."""

from __future__ import annotations

import numpy as np
import pytest

from gem_core.algo import (
    discounted_returns,
    grpo,
    reinforce,
    reinforce_batch_mean,
    rloo,
    turn_gae,
)

EPISODES = [[0, 0, 1], [0.5, -0.1], [0]]  # episode returns (undiscounted): 1.0, 0.4, 0.0


def test_reinforce_is_the_discounted_return() -> None:
    np.testing.assert_allclose(reinforce(EPISODES, gamma=0.9), [0.81, 0.9, 1.0, 0.41, -0.1, 0.0], atol=1e-12)


def test_reinforce_batch_mean_subtracts_the_mean_over_all_turns() -> None:
    returns = np.array([0.81, 0.9, 1.0, 0.41, -0.1, 0.0])
    np.testing.assert_allclose(reinforce_batch_mean(EPISODES, gamma=0.9), returns - returns.mean(), atol=1e-12)
    # grouped: episode 0 and 2 together, episode 1 alone
    out = reinforce_batch_mean(EPISODES, gamma=0.9, group_by=["a", "b", "a"])
    group_a = np.array([0.81, 0.9, 1.0, 0.0])
    np.testing.assert_allclose(out[[0, 1, 2, 5]], group_a - group_a.mean(), atol=1e-12)
    np.testing.assert_allclose(out[[3, 4]], [0.41 - 0.155, -0.1 - 0.155], atol=1e-12)


def test_grpo_normalises_episode_returns_within_groups() -> None:
    # group g: episodes 0, 1, 2 with R = 1.0, 0.4, 0.0: mean 0.4667, sample std 0.5033
    r = np.array([1.0, 0.4, 0.0])
    expected_episode = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    out = grpo(EPISODES, group_by=["g", "g", "g"])
    np.testing.assert_allclose(out, np.repeat(expected_episode, [3, 2, 1]), rtol=1e-12)
    np.testing.assert_allclose(out[:3], 1.05963, atol=1e-5)  # by hand: 0.5333 / 0.5033


def test_grpo_population_std_and_dr_grpo() -> None:
    r = np.array([1.0, 0.4, 0.0])
    np.testing.assert_allclose(grpo(EPISODES, ddof=0), np.repeat((r - r.mean()) / (r.std() + 1e-6), [3, 2, 1]), rtol=1e-12)
    # Dr.GRPO: centred only
    np.testing.assert_allclose(grpo(EPISODES, scale_by_std=False), np.repeat(r - r.mean(), [3, 2, 1]), atol=1e-12)


def test_grpo_two_groups_and_singletons() -> None:
    out = grpo(EPISODES, group_by=["a", "a", "b"])
    # group a: R = 1.0, 0.4 -> mean 0.7, sample std 0.42426 -> +-0.70711; group b alone -> 0
    np.testing.assert_allclose(out, [0.70711] * 3 + [-0.70711] * 2 + [0.0], atol=1e-5)


def test_grpo_all_equal_returns_in_a_group_give_zero() -> None:
    out = grpo([[1.0], [0.5, 0.5], [1.0]], group_by=[0, 0, 0])
    np.testing.assert_array_equal(out, 0.0)


def test_rloo_leave_one_out_baseline() -> None:
    # R = 1.0, 0.4, 0.0: baselines are the mean of the other two: 0.2, 0.5, 0.7
    out = rloo(EPISODES)
    np.testing.assert_allclose(out, [0.8] * 3 + [-0.1] * 2 + [-0.7], atol=1e-12)
    # a group of one has no other episode to compare with
    out = rloo(EPISODES, group_by=["a", "a", "b"])
    np.testing.assert_allclose(out, [0.6] * 3 + [-0.6] * 2 + [0.0], atol=1e-12)


def test_episode_level_estimators_use_undiscounted_sums_with_dense_negative_rewards() -> None:
    episodes = [[-1.0, -1.0, -1.0], [-0.5], [2.0, -3.0]]
    r = np.array([-3.0, -0.5, -1.0])
    np.testing.assert_allclose(grpo(episodes, ddof=0), np.repeat((r - r.mean()) / (r.std() + 1e-6), [3, 1, 2]))
    np.testing.assert_allclose(rloo(episodes), np.repeat(1.5 * (r - r.mean()), [3, 1, 2]), atol=1e-12)


def test_estimators_with_flat_input_and_episode_ids() -> None:
    rewards = np.array([0.5, 0.0, -0.1, 0.0, 1.0, 0.0])
    ids = np.array([1, 0, 1, 0, 0, 2])  # same episodes as EPISODES, turns interleaved
    expected = rloo(EPISODES)  # episodes 0, 1, 2 in list order == sorted ids 0, 1, 2
    np.testing.assert_allclose(rloo(rewards, ids), expected[[3, 0, 4, 1, 2, 5]], atol=1e-12)
    np.testing.assert_allclose(reinforce(rewards, ids, gamma=0.9), [0.41, 0.81, -0.1, 0.9, 1.0, 0.0], atol=1e-12)


def test_baselines_reject_empty_and_non_finite_batches() -> None:
    for estimator in (reinforce, reinforce_batch_mean, grpo, rloo):
        with pytest.raises(ValueError, match="empty batch"):
            estimator([])
        with pytest.raises(ValueError, match="must be finite"):
            estimator([[1.0, float("inf")]])


# ------------------------------------------------------------------ turn-level GAE


def test_gae_by_hand() -> None:
    rewards, values = [[0.0, 1.0], [2.0]], [[0.5, 0.8], [1.0]]
    gamma, lam = 0.9, 0.5
    # episode 0: delta_1 = 1 - 0.8 = 0.2; delta_0 = 0 + 0.9*0.8 - 0.5 = 0.22; A_0 = 0.22 + 0.45*0.2 = 0.31
    # episode 1: delta_0 = 2 - 1 = 1
    advantages, targets = turn_gae(rewards, values, gamma=gamma, lam=lam)
    np.testing.assert_allclose(advantages, [0.31, 0.2, 1.0], atol=1e-12)
    np.testing.assert_allclose(targets, [0.81, 1.0, 2.0], atol=1e-12)


def test_gae_lambda_one_is_return_minus_value_and_lambda_zero_is_td() -> None:
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=12)
    values = rng.normal(size=12)
    ids = np.repeat([0, 1, 2], [5, 4, 3])
    advantages, _ = turn_gae(rewards, values, ids, gamma=0.8, lam=1.0)
    np.testing.assert_allclose(advantages, discounted_returns(rewards, ids, gamma=0.8) - values, atol=1e-12)
    advantages, _ = turn_gae(rewards, values, ids, gamma=0.8, lam=0.0)
    next_values = np.where(np.r_[ids[1:] == ids[:-1], False], np.r_[values[1:], 0.0], 0.0)
    np.testing.assert_allclose(advantages, rewards + 0.8 * next_values - values, atol=1e-12)


def test_gae_bootstraps_truncated_episodes_from_last_values() -> None:
    advantages, targets = turn_gae([[1.0], [1.0]], [[0.0], [0.0]], gamma=0.5, lam=1.0, last_values=[4.0, 0.0])
    np.testing.assert_allclose(advantages, [3.0, 1.0])
    np.testing.assert_allclose(targets, [3.0, 1.0])


def test_gae_errors() -> None:
    with pytest.raises(ValueError, match="one value per turn"):
        turn_gae(np.ones(3), np.ones(2), np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="lam must be in"):
        turn_gae([[1.0]], [[0.0]], lam=1.5)
    with pytest.raises(ValueError, match="one value per episode"):
        turn_gae([[1.0], [1.0]], [[0.0], [0.0]], last_values=[1.0])
    with pytest.raises(ValueError, match="must be finite"):
        turn_gae([[1.0]], [[float("nan")]])
    with pytest.raises(ValueError, match="empty batch"):
        turn_gae([], [])
