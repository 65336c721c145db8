"""Turn-level GAE (the GEM paper's PPO baseline): a critic value per turn, not per token.

delta_t = r_t + gamma * V_{t+1} - V_t          V after the last turn = last_value (0 if terminated)
A_t     = delta_t + gamma * lam * A_{t+1}       returns (critic targets) = A_t + V_t
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._backend import Array, check_discount, check_finite, check_nonempty, to_numpy
from .returns import as_turns, episode_layout, flatten_episodes, pad_turns, reverse_discounted_sum


def turn_gae(
    rewards: Any,
    values: Any,
    episode_ids: Any = None,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    last_values: Any = None,
) -> tuple[Array, Array]:
    """Turn-level GAE(gamma, lambda): A_t = sum_k (gamma*lam)^k delta_{t+k}, delta_t = r_t + gamma V_{t+1} - V_t.

    rewards, values: ragged per-episode lists, or flat per-turn arrays with `episode_ids`.
    last_values: per-episode bootstrap value after the last turn (for truncated episodes); default 0.
    Returns (advantages, returns = advantages + values), both flat and aligned with the turns.
    """
    gamma, lam = check_discount("gamma", gamma), check_discount("lam", lam)
    if episode_ids is None:
        values = flatten_episodes(values)[0]
    flat_rewards, ids, back = as_turns(rewards, episode_ids)
    check_nonempty(flat_rewards.shape[0], "rewards")
    flat_values = to_numpy(values, np.float64)
    if flat_values.shape != flat_rewards.shape:
        raise ValueError(f"values must have one value per turn: {flat_rewards.shape[0]} rewards but shape {flat_values.shape}")
    check_finite(flat_values, "values")
    layout = episode_layout(ids)

    # Column n_e of episode e's row holds its bootstrap value, so V_{t+1} is one shifted slice.
    value_table = pad_turns(flat_values, layout, extra_cols=1)
    if last_values is not None:
        bootstrap = to_numpy(last_values, np.float64)
        if bootstrap.shape != (layout.num_episodes,):
            raise ValueError(f"last_values must hold one value per episode: expected {layout.num_episodes}, got shape {bootstrap.shape}")
        check_finite(bootstrap, "last_values")
        value_table[np.arange(layout.num_episodes), layout.lengths] = bootstrap
    reward_table = pad_turns(flat_rewards, layout)
    valid = pad_turns(np.ones_like(flat_rewards), layout)  # 1 on real turns, 0 on padding
    delta = (reward_table + gamma * value_table[:, 1:] - value_table[:, :-1]) * valid
    advantage = reverse_discounted_sum(delta, gamma * lam)[layout.row, layout.col]
    return back(advantage), back(advantage + flat_values)
