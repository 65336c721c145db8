"""The estimators the GEM paper compares ReBN against, on the same turn-level inputs as `rebn`.

Every function takes ragged per-episode reward lists, or flat per-turn rewards with `episode_ids`,
and returns one advantage per turn, aligned with the input (ragged: episodes in list order).
Episode-level estimators (GRPO, RLOO) give every turn of an episode that episode's advantage.
`group_by`: one key per episode (prompt group, env id...); None = the whole batch is one group.
A group of one episode has no baseline to compare with: GRPO and RLOO give it advantage 0.
"""

from __future__ import annotations

from typing import Any

from ._backend import Array, check_ddof, check_discount, check_eps, check_nonempty
from .rebn import _per_turn_keys, apply_stats, compute_stats, group_codes
from .returns import as_turns, episode_layout, turn_returns


def reinforce(rewards: Any, episode_ids: Any = None, *, gamma: float = 1.0) -> Array:
    """Vanilla multi-turn REINFORCE: A_t = G_t = r_t + gamma * G_{t+1} (no baseline, no normalisation)."""
    gamma = check_discount("gamma", gamma)
    ops, flat, ids, like = as_turns(rewards, episode_ids)
    check_nonempty(int(flat.shape[0]), "rewards")
    return ops.out(turn_returns(ops, flat, episode_layout(ops, ids), gamma), like=like)


def reinforce_batch_mean(rewards: Any, episode_ids: Any = None, *, gamma: float = 1.0, group_by: Any = None) -> Array:
    """REINFORCE with a batch-mean baseline: A_t = G_t - mean(G), the mean over all turns of the batch (or group)."""
    gamma = check_discount("gamma", gamma)
    ops, flat, ids, like = as_turns(rewards, episode_ids)
    check_nonempty(int(flat.shape[0]), "rewards")
    layout = episode_layout(ops, ids)
    returns = turn_returns(ops, flat, layout, gamma)
    codes, uniques = group_codes(_per_turn_keys(group_by, layout, ops), layout.num_turns)
    stats, codes_b = compute_stats(ops, returns, codes, uniques, ddof=0)
    return ops.out(apply_stats(ops, returns, codes_b, stats, eps=0.0, scale=False), like=like)


def _episode_returns(rewards: Any, episode_ids: Any, group_by: Any) -> tuple[Any, ...]:
    """Undiscounted episode returns R_e = sum_t r_t, plus what is needed to broadcast back to turns."""
    ops, flat, ids, like = as_turns(rewards, episode_ids)
    check_nonempty(int(flat.shape[0]), "rewards")
    layout = episode_layout(ops, ids)
    episode_return = ops.segment_sum(flat, layout.row, layout.num_episodes)
    codes, uniques = (None, None) if group_by is None else group_codes(group_by, layout.num_episodes)
    return ops, like, layout, episode_return, codes, uniques


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
    eps = check_eps(eps)
    ddof = check_ddof(ddof)
    ops, like, layout, episode_return, codes, uniques = _episode_returns(rewards, episode_ids, group_by)
    stats, codes_b = compute_stats(ops, episode_return, codes, uniques, ddof=ddof)
    episode_advantage = apply_stats(ops, episode_return, codes_b, stats, eps=eps, scale=scale_by_std)
    return ops.out(episode_advantage[layout.row], like=like)


def rloo(rewards: Any, episode_ids: Any = None, *, group_by: Any = None) -> Array:
    """RLOO: A_e = R_e - mean of the other episodes' returns in its group = n/(n-1) * (R_e - mean_g(R)).

    R_e = sum_t r_t; each turn gets its episode's A_e; a group of one episode gets 0.
    """
    ops, like, layout, episode_return, codes, uniques = _episode_returns(rewards, episode_ids, group_by)
    stats, codes_b = compute_stats(ops, episode_return, codes, uniques, ddof=0)
    n = stats.count[codes_b]
    leave_one_out_scale = ops.where(n > 1, n / ops.clip_min(n - 1.0, 1.0), 0.0)
    episode_advantage = leave_one_out_scale * (episode_return - stats.mean[codes_b])
    return ops.out(episode_advantage[layout.row], like=like)
