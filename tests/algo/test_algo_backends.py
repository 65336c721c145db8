"""numpy and torch give the same numbers (to 1e-6) for every estimator, on random ragged batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gem_core.algo._backend import encode_keys
from gem_core.algo import (
    discounted_returns,
    grpo,
    normalization_stats,
    normalize,
    rebn,
    rebn_token_level,
    reinforce,
    reinforce_batch_mean,
    rloo,
    turn_gae,
    turn_ids_from_mask,
)

torch = pytest.importorskip("torch")


def random_batch(seed: int, episodes: int = 30, max_turns: int = 7) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Flat per-turn rewards (dense, negative and positive), shuffled episode ids, per-episode group keys."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_turns + 1, size=episodes)
    ids = np.repeat(np.arange(episodes), lengths)
    order = rng.permutation(ids.size)
    # keep each episode's turn order while interleaving episodes
    ids = ids[np.sort(order)] if seed % 2 else ids
    rewards = rng.normal(size=ids.size).astype(np.float32).astype(np.float64)  # exact in float32 too
    keys = [f"prompt-{k}" for k in rng.integers(0, 4, size=episodes)]
    return rewards, ids, keys


ESTIMATORS: dict[str, Callable[..., Any]] = {
    "returns": lambda r, i, k: discounted_returns(r, i, gamma=0.9),
    "rebn": lambda r, i, k: rebn(r, i, gamma=0.9),
    "rebn_ddof1_grouped": lambda r, i, k: rebn(r, i, gamma=0.95, ddof=1, group_by=k),
    "reinforce": lambda r, i, k: reinforce(r, i, gamma=0.8),
    "reinforce_batch_mean": lambda r, i, k: reinforce_batch_mean(r, i, gamma=0.8, group_by=k),
    "grpo": lambda r, i, k: grpo(r, i, group_by=k),
    "dr_grpo": lambda r, i, k: grpo(r, i, group_by=k, scale_by_std=False),
    "rloo": lambda r, i, k: rloo(r, i, group_by=k),
    "gae": lambda r, i, k: turn_gae(r, np.cos(r) if not torch.is_tensor(r) else torch.cos(r), i, gamma=0.9, lam=0.7)[0],
}


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_numpy_and_torch_agree(name: str, seed: int) -> None:
    rewards, ids, keys = random_batch(seed)
    estimator = ESTIMATORS[name]
    expected = estimator(rewards, ids, keys)
    assert isinstance(expected, np.ndarray) and expected.dtype == np.float64
    for dtype in (torch.float64, torch.float32):
        out = estimator(torch.tensor(rewards, dtype=dtype), torch.tensor(ids), keys)
        assert torch.is_tensor(out) and out.dtype == dtype
        np.testing.assert_allclose(out.numpy(), expected, atol=1e-6, rtol=0)


def test_ragged_torch_episodes() -> None:
    episodes = [torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.5, -0.1]), torch.tensor([0.0])]
    out = rebn(episodes, gamma=0.9, ddof=1)
    np.testing.assert_allclose(out.numpy(), [0.6468, 0.8366, 1.0475, -0.1968, -1.2724, -1.0615], atol=5e-5)


def test_torch_stats_two_step() -> None:
    rewards, ids, _ = random_batch(3)
    returns = discounted_returns(torch.tensor(rewards), torch.tensor(ids), gamma=0.9)
    stats = normalization_stats(returns, ddof=1)
    assert torch.is_tensor(stats.mean) and stats.mean.dtype == torch.float64
    np.testing.assert_allclose(normalize(returns[:7], stats).numpy(), rebn(rewards, ids, gamma=0.9, ddof=1)[:7], atol=1e-12)


def token_batch(seed: int, rows: int = 24, length: int = 40) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Rows of alternating response runs and environment gaps, dense rewards on every token."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((rows, length), dtype=np.int64)
    for row in range(rows):
        position = int(rng.integers(0, 3))
        while position < length:
            run = int(rng.integers(1, 6))
            mask[row, position : position + run] = 1
            position += run + int(rng.integers(1, 4))
    rewards = rng.normal(size=(rows, length)).astype(np.float32)
    rewards[turn_ids_from_mask(mask) < 0] = 0.0  # nothing before a row's first turn
    keys = [f"g{k}" for k in rng.integers(0, 3, size=rows)]
    return rewards, mask, keys


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("ddof", [0, 1])
def test_token_level_numpy_and_torch_agree(seed: int, ddof: int) -> None:
    rewards, mask, keys = token_batch(seed)
    expected_adv, expected_ret = rebn_token_level(rewards, mask, keys, gamma=0.9, ddof=ddof, return_returns=True)
    for dtype, mask_dtype in (
        (torch.float32, torch.int64),
        (torch.float64, torch.bool),
        (torch.bfloat16, torch.float32),
    ):
        advantages, returns = rebn_token_level(
            torch.tensor(rewards).to(dtype),
            torch.tensor(mask).to(mask_dtype),
            keys,
            gamma=0.9,
            ddof=ddof,
            return_returns=True,
        )
        assert advantages.dtype == dtype and advantages.shape == rewards.shape
        tolerance = 1e-6 if dtype != torch.bfloat16 else 5e-2
        reference = (expected_adv, expected_ret)
        if dtype == torch.bfloat16:  # bf16 rewards are rounded before any maths: compare with the same rounding
            rounded = torch.tensor(rewards).to(dtype).float().numpy()
            reference = rebn_token_level(rounded, mask, keys, gamma=0.9, ddof=ddof, return_returns=True)
        np.testing.assert_allclose(advantages.float().numpy(), reference[0], atol=tolerance, rtol=0)
        np.testing.assert_allclose(returns.float().numpy(), reference[1], atol=tolerance * 10, rtol=tolerance)


def test_token_level_matches_flat_rebn_on_random_batches() -> None:
    rewards, mask, keys = token_batch(5)
    ids = turn_ids_from_mask(mask)
    num_turns = ids.max(axis=1) + 1
    # per-turn rewards (everything from a turn's first token up to the next turn) and their episode
    flat_rewards = np.array([rewards[row][ids[row] == turn].sum(dtype=np.float64) for row in range(len(mask)) for turn in range(num_turns[row])])
    episode = np.repeat(np.arange(len(mask)), num_turns)
    per_turn = rebn(flat_rewards, episode, gamma=0.8, group_by=keys)
    out = rebn_token_level(torch.tensor(rewards), torch.tensor(mask), keys, gamma=0.8)
    first_token = [np.flatnonzero((ids[row] == turn) & (mask[row] == 1))[0] for row in range(len(mask)) for turn in range(num_turns[row])]
    np.testing.assert_allclose(out.numpy()[episode, first_token], per_turn, atol=1e-6)
    # outside the response mask: exactly zero
    assert (out.numpy()[mask == 0] == 0).all()


def test_token_level_explicit_ids_and_rows_as_turns_in_torch() -> None:
    rewards, mask, keys = token_batch(7)
    ids = turn_ids_from_mask(mask)
    expected = rebn_token_level(rewards, mask, keys, gamma=0.9)
    out = rebn_token_level(torch.tensor(rewards), torch.tensor(mask), keys, gamma=0.9, turn_ids=torch.tensor(ids))
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-6)
    row_rewards = np.zeros((6, 3), dtype=np.float32)
    row_rewards[:, 2] = [0, 0, 1, 0.5, -0.1, 0]
    out = rebn_token_level(torch.tensor(row_rewards), torch.ones(6, 3), episode_ids=torch.tensor([0, 0, 0, 1, 1, 2]), gamma=0.9, ddof=1)
    np.testing.assert_allclose(out[:, 0].numpy(), [0.6468, 0.8366, 1.0475, -0.1968, -1.2724, -1.0615], atol=5e-5)


def test_token_level_torch_errors() -> None:
    rewards, mask, _ = token_batch(2)
    rewards[0, 3] = np.nan
    with pytest.raises(ValueError, match="must be finite"):
        rebn_token_level(torch.tensor(rewards), torch.tensor(mask))
    with pytest.raises(ValueError, match="empty batch"):
        rebn_token_level(torch.zeros(4, 6), torch.zeros(4, 6, dtype=torch.int64))


def test_tensors_that_require_grad_are_accepted() -> None:
    rewards, mask, _ = token_batch(4)
    leaf = torch.tensor(rewards, requires_grad=True)
    out = rebn_token_level(leaf, torch.tensor(mask))
    assert not out.requires_grad and torch.isfinite(out).all()


@settings(max_examples=20)
@given(seed=st.integers(0, 10_000), gamma=st.floats(0, 1))
def test_property_token_level_agrees_across_backends(seed: int, gamma: float) -> None:
    rewards, mask, keys = token_batch(seed, rows=8, length=20)
    rewards = rewards.astype(np.float64)  # same input dtype on both sides: same sums, same answer
    expected = rebn_token_level(rewards, mask, keys, gamma=gamma, ddof=1)
    out = rebn_token_level(torch.tensor(rewards), torch.tensor(mask), keys, gamma=gamma, ddof=1)
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["b", "a", "c", "uuid-1", "uuid-0", 3, 2]), min_size=1, max_size=30),
    st.booleans(),
)
def test_encode_keys_matches_a_plain_reference(keys, contiguous):
    """Contiguous groups (a trainer's layout, the fast path) and scattered ones give the same answer:
    sorted unique keys, and codes into them."""
    keys = [str(k) for k in keys]
    if contiguous:
        keys = sorted(keys, key=keys.index)  # each key's rows together, in order of first appearance
    codes, uniques = encode_keys(np.array(keys, dtype=object), len(keys))
    assert uniques.tolist() == sorted(set(keys))
    assert [uniques[c] for c in codes] == keys
    list_codes, list_uniques = encode_keys(keys, len(keys))
    assert list_codes.tolist() == codes.tolist() and list_uniques.tolist() == uniques.tolist()


def test_encode_keys_counts_the_keys():
    with pytest.raises(ValueError, match="expected 3 keys, got 4"):
        encode_keys(["a", "a", "b", "a"], 3)
