"""ReBN exactly as DESIGN.md defines it: golden values, groups, the two-step API and edge cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gem_core.algo import discounted_returns, normalization_stats, normalize, rebn

GOLDEN_EPISODES = [[0, 0, 1], [0.5, -0.1], [0]]
GOLDEN_DDOF1 = [0.6468, 0.8366, 1.0475, -0.1968, -1.2724, -1.0615]  # ROLL step_reinforce + batch mean_std
GOLDEN_DDOF0 = [0.7085, 0.9164, 1.1474, -0.2156, -1.3939, -1.1628]  # oat whitening


def test_golden_ddof1() -> None:
    np.testing.assert_allclose(rebn(GOLDEN_EPISODES, gamma=0.9, ddof=1), GOLDEN_DDOF1, atol=5e-5)


def test_golden_ddof0() -> None:
    np.testing.assert_allclose(rebn(GOLDEN_EPISODES, gamma=0.9, ddof=0), GOLDEN_DDOF0, atol=5e-5)


def test_formula_by_hand() -> None:
    returns = np.array([0.81, 0.9, 1.0, 0.41, -0.1, 0.0])
    expected = (returns - returns.mean()) / (returns.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(rebn(GOLDEN_EPISODES, gamma=0.9, ddof=1, eps=1e-6), expected, rtol=1e-12)


def test_eps_is_added_to_the_std() -> None:
    returns = np.array([0.81, 0.9, 1.0, 0.41, -0.1, 0.0])
    expected = (returns - returns.mean()) / (returns.std() + 0.5)
    np.testing.assert_allclose(rebn(GOLDEN_EPISODES, gamma=0.9, eps=0.5), expected, rtol=1e-12)


def test_group_by_normalises_each_group_on_its_own() -> None:
    episodes = [[1.0, 0.0], [0.0, 2.0], [5.0], [3.0, 3.0, 1.0]]
    keys = ["env:a", "env:b", "env:a", "env:b"]
    returns = discounted_returns(episodes, gamma=0.5)
    turn_keys = np.repeat(keys, [len(e) for e in episodes])
    expected = np.empty_like(returns)
    for key in set(keys):
        group = returns[turn_keys == key]
        expected[turn_keys == key] = (group - group.mean()) / (group.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(rebn(episodes, gamma=0.5, ddof=1, group_by=keys), expected, rtol=1e-12)
    # integer keys give the same grouping
    np.testing.assert_allclose(rebn(episodes, gamma=0.5, ddof=1, group_by=[0, 1, 0, 1]), expected, rtol=1e-12)


def test_group_by_with_flat_input_follows_sorted_episode_ids() -> None:
    rewards = np.array([1.0, 0.0, 2.0, 4.0])
    ids = np.array([10, 20, 10, 30])  # episodes in sorted-id order: 10, 20, 30
    grouped = rebn(rewards, ids, group_by=["x", "y", "y"], gamma=1.0)
    # episode 10 alone in group x: turns [3, 2] -> (+-0.5) / (0.5 + eps)
    np.testing.assert_allclose(grouped[[0, 2]], [1.0, -1.0], atol=1e-5)
    # episodes 20 and 30 in group y: one turn each, returns 0 and 4 -> -1, +1
    np.testing.assert_allclose(grouped[[1, 3]], [-1.0, 1.0], atol=1e-5)


def test_group_by_needs_one_key_per_episode() -> None:
    with pytest.raises(ValueError, match="one key per episode"):
        rebn(GOLDEN_EPISODES, group_by=["a", "b"])


@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_all_equal_returns_give_zero_not_nan(ddof: int, eps: float) -> None:
    out = rebn([[0.7], [0.7], [0.7], [0.7]], gamma=0.9, ddof=ddof, eps=eps)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out, 0.0)
    out = rebn([[0.1, 0.1, 0.1], [0.3]], gamma=0.0, ddof=ddof, eps=eps, group_by=["a", "b"])
    np.testing.assert_array_equal(out, 0.0)


def test_one_episode_one_turn_gives_zero() -> None:
    np.testing.assert_array_equal(rebn([[3.0]], ddof=1), [0.0])
    np.testing.assert_array_equal(rebn([[3.0]], ddof=0), [0.0])


def test_one_episode_many_turns_is_normalised_over_its_turns() -> None:
    out = rebn([[1.0, -2.0, 0.5, 4.0]], gamma=1.0, ddof=0)
    assert abs(out.mean()) < 1e-12 and abs(out.std() - 1) < 1e-5


def test_gamma_zero_and_one() -> None:
    rewards = np.array([0, 0, 1, 0.5, -0.1, 0])
    np.testing.assert_allclose(rebn(GOLDEN_EPISODES, gamma=0.0, eps=0.0), (rewards - rewards.mean()) / rewards.std(), rtol=1e-12)
    returns = np.array([1, 1, 1, 0.4, -0.1, 0])
    np.testing.assert_allclose(rebn(GOLDEN_EPISODES, gamma=1.0, eps=0.0), (returns - returns.mean()) / returns.std(), rtol=1e-12)


def test_normalise_a_subsample_with_full_batch_stats() -> None:
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=40)
    ids = np.repeat(np.arange(10), 4)
    keys = np.repeat(np.array(["p0", "p1"]), 20)  # per turn, for the low-level API
    full = rebn(rewards, ids, gamma=0.9, group_by=["p0"] * 5 + ["p1"] * 5)
    returns = discounted_returns(rewards, ids, gamma=0.9)
    stats = normalization_stats(returns, keys, ddof=0)
    subset = rng.choice(40, size=13, replace=False)
    np.testing.assert_allclose(normalize(returns[subset], stats, keys[subset]), full[subset], rtol=1e-12)
    # the same through rebn(stats=...): a subsample of episodes, normalised with the full batch's stats
    episodes_kept = ids < 3
    sub = rebn(rewards[episodes_kept], ids[episodes_kept], gamma=0.9, group_by=["p0"] * 3, stats=stats)
    np.testing.assert_allclose(sub, full[episodes_kept], rtol=1e-12)
    assert stats.count.tolist() == [20.0, 20.0] and list(stats.keys) == ["p0", "p1"]


def test_normalize_rejects_unknown_and_missing_keys() -> None:
    stats = normalization_stats(np.array([1.0, 2.0, 3.0]), ["a", "a", "b"])
    with pytest.raises(ValueError, match="no statistics"):
        normalize(np.array([1.0]), stats, ["c"])
    with pytest.raises(ValueError, match="per group"):
        normalize(np.array([1.0]), stats)
    whole = normalization_stats(np.array([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="whole batch"):
        normalize(np.array([1.0]), whole, ["a"])


def test_option_validation() -> None:
    with pytest.raises(ValueError, match="ddof"):
        rebn(GOLDEN_EPISODES, ddof=2)
    with pytest.raises(ValueError, match="eps"):
        rebn(GOLDEN_EPISODES, eps=-1.0)
    with pytest.raises(ValueError, match="gamma"):
        rebn(GOLDEN_EPISODES, gamma=2.0)
    with pytest.raises(ValueError, match="empty batch"):
        rebn([])
    with pytest.raises(ValueError, match="must be finite"):
        rebn([[1.0, float("nan")]])
    with pytest.raises(ValueError, match="must be finite"):
        normalization_stats(np.array([1.0, np.inf]))


episodes_strategy = st.lists(st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=1, max_size=6), min_size=1, max_size=12)


@given(episodes=episodes_strategy, gamma=st.floats(0, 1), ddof=st.sampled_from([0, 1]))
def test_advantages_are_standardised_whenever_returns_vary(episodes: list, gamma: float, ddof: int) -> None:
    out = rebn(episodes, gamma=gamma, ddof=ddof, eps=0.0)
    returns = discounted_returns(episodes, gamma=gamma)
    assert np.isfinite(out).all()
    if len(returns) > ddof and returns.std() > 1e-6 * max(1.0, np.abs(returns).max()):
        assert abs(out.mean()) < 1e-6
        assert abs(out.std(ddof=ddof) - 1.0) < 1e-6
    # ReBN never reorders turns: a higher return always means a higher advantage
    order = np.argsort(returns, kind="stable")
    assert (np.diff(out[order]) >= -1e-9).all()


# ------------------------------------------------------------------------------------------------
# min_std: ROLL's reward normalisation (zeros when n <= 1 or std <= 1e-6) as core settings.
# ------------------------------------------------------------------------------------------------


def test_min_std_roll_golden_values():
    from gem_core.algo import rebn

    out = np.asarray(rebn([[0, 0, 1], [0.5, -0.1], [0]], gamma=0.9, ddof=1, eps=1e-6, min_std=1e-6))
    np.testing.assert_allclose(out, [0.6468, 0.8366, 1.0475, -0.1968, -1.2724, -1.0615], atol=5e-5)


def test_min_std_zeroes_tiny_spreads_that_eps_alone_would_scale():
    from gem_core.algo import rebn

    rewards = [[0.0], [4e-7]]  # sample std ~2.8e-7: above rounding noise, at or below ROLL's 1e-6
    plain = np.asarray(rebn(rewards, ddof=1, eps=1e-6))
    assert np.abs(plain).max() > 0.1  # without min_std the spread is scaled up
    np.testing.assert_array_equal(np.asarray(rebn(rewards, ddof=1, eps=1e-6, min_std=1e-6)), [0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(rebn([[3.0]], ddof=1, min_std=1e-6)), [0.0])  # n = 1


def test_min_std_per_group_and_normalize():
    from gem_core.algo import normalization_stats, normalize, rebn

    rewards = [[1.0], [1.0 + 1e-7], [0.0], [2.0]]
    out = np.asarray(rebn(rewards, ddof=1, min_std=1e-6, group_by=["a", "a", "b", "b"]))
    np.testing.assert_array_equal(out[:2], [0.0, 0.0])
    np.testing.assert_allclose(out[2:], [-1 / (np.sqrt(2) + 1e-6), 1 / (np.sqrt(2) + 1e-6)])
    stats = normalization_stats([1.0, 1.0 + 1e-7], ddof=1)
    np.testing.assert_array_equal(np.asarray(normalize([1.0, 1.0 + 1e-7], stats, min_std=1e-6)), [0.0, 0.0])


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "1e-6", True])
def test_min_std_bad_values(bad):
    from gem_core.algo import rebn

    with pytest.raises(ValueError, match="min_std"):
        rebn([[1.0, 2.0]], min_std=bad)
