"""The estimators the GEM paper compares ReBN against, on the same turn-level inputs as `rebn`.

Every function takes ragged per-episode reward lists, or flat per-turn rewards with `episode_ids`,
and returns one advantage per turn, aligned with the input (ragged: episodes in list order).
Episode-level estimators (GRPO, RLOO) give every turn of an episode that episode's advantage.
`group_by`: one key per episode (prompt group, env id...); None = the whole batch is one group.
A group of one episode has no baseline to compare with: GRPO and RLOO give it advantage 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._backend import Array, check_ddof, check_discount, check_eps, check_nonempty
from .rebn import group_codes, group_stats, standardise
from .returns import as_turns, episode_layout, turn_returns


def reinforce(rewards: Any, episode_ids: Any = None, *, gamma: float = 1.0) -> Array:
    """Vanilla multi-turn REINFORCE: A_t = G_t = r_t + gamma * G_{t+1} (no baseline, no normalisation)."""
    gamma = check_discount("gamma", gamma)
    flat, ids, back = as_turns(rewards, episode_ids)
    check_nonempty(flat.shape[0], "rewards")
    return back(turn_returns(flat, episode_layout(ids), gamma))


def reinforce_batch_mean(rewards: Any, episode_ids: Any = None, *, gamma: float = 1.0, group_by: Any = None) -> Array:
    """REINFORCE with a batch-mean baseline: A_t = G_t - mean(G), the mean over all turns of the batch (or group)."""
    gamma = check_discount("gamma", gamma)
    flat, ids, back = as_turns(rewards, episode_ids)
    check_nonempty(flat.shape[0], "rewards")
    layout = episode_layout(ids)
    returns = turn_returns(flat, layout, gamma)
    group, keys = group_codes(group_by, layout.num_episodes, "group_by")
    stats = group_stats(returns, group[layout.row], keys, ddof=0)
    return back(standardise(returns, group[layout.row], stats, eps=0.0, scale=False))


def _episode_returns(rewards: Any, episode_ids: Any, group_by: Any) -> tuple[Any, ...]:
    """Undiscounted episode returns R_e = sum_t r_t, each episode's group, and the turns' episodes."""
    flat, ids, back = as_turns(rewards, episode_ids)
    check_nonempty(flat.shape[0], "rewards")
    layout = episode_layout(ids)
    episode_return = np.bincount(layout.row, weights=flat, minlength=layout.num_episodes)
    group, keys = group_codes(group_by, layout.num_episodes, "group_by")
    return episode_return, group, keys, layout.row, back


def grpo(
    rewards: Any,
    episode_ids: Any = None,
    *,
    group_by: Any = None,
    eps: float = 1e-6,
    scale_by_std: bool = True,
    ddof: int = 1,
) -> Array:
    """GRPO: A_e = (R_e - mean_g(R)) / (std_g(R) + eps) over each group's episode returns R_e = sum_t r_t.

    scale_by_std=False gives Dr.GRPO (A_e = R_e - mean_g(R)). ddof=1 (default) matches torch.std, as
    verl's GRPO does. Each turn gets its episode's A_e.
    """
    eps, ddof = check_eps(eps), check_ddof(ddof)
    episode_return, group, keys, turn_episode, back = _episode_returns(rewards, episode_ids, group_by)
    stats = group_stats(episode_return, group, keys, ddof=ddof)
    return back(standardise(episode_return, group, stats, eps=eps, scale=scale_by_std)[turn_episode])


def rloo(rewards: Any, episode_ids: Any = None, *, group_by: Any = None) -> Array:
    """RLOO: A_e = R_e - mean of the other episodes' returns in its group = n/(n-1) * (R_e - mean_g(R)).

    R_e = sum_t r_t; each turn gets its episode's A_e; a group of one episode gets 0.
    """
    episode_return, group, keys, turn_episode, back = _episode_returns(rewards, episode_ids, group_by)
    stats = group_stats(episode_return, group, keys, ddof=0)
    n = stats.count[group]
    leave_one_out_scale = np.where(n > 1, n / np.maximum(n - 1.0, 1.0), 0.0)
    return back((leave_one_out_scale * (episode_return - stats.mean[group]))[turn_episode])
