"""Per-turn discounted returns over episodes: G_t = r_t + gamma * G_{t+1}, over turns (not tokens).

Episodes come either ragged (a list of per-turn reward lists) or flat (one reward per turn plus an
episode id per turn). The flat turns are laid out in a padded (episodes, max_turns) table, and the
reverse discounted sum runs as one vectorised step per turn column: a loop over at most the longest
episode's turn count, never over episodes or tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._backend import (
    Array,
    NumpyOps,
    TorchOps,
    check_discount,
    check_finite,
    check_nonempty,
    is_torch,
    ops_for,
)

Ops = NumpyOps | TorchOps


@dataclass(frozen=True)
class EpisodeLayout:
    """Where each flat turn sits in a padded (num_episodes, max_turns) table.

    Episode `e` is the one with the e-th smallest id (for ragged input: the e-th list), and a turn's
    position in its episode is its order of appearance among that episode's turns.
    """

    row: Array  # (num_turns,) episode index of each turn
    col: Array  # (num_turns,) position of each turn within its episode
    lengths: Array  # (num_episodes,) turns per episode
    num_episodes: int
    max_turns: int

    @property
    def num_turns(self) -> int:
        return int(self.row.shape[0])


def flatten_episodes(episodes: Sequence[Sequence[float]]) -> tuple[Array, Array]:
    """Ragged per-episode reward lists -> (flat rewards, episode ids 0..E-1), episodes in list order.

    Torch tensors stay torch (concatenated on their device); anything else becomes float64 numpy.
    """
    if isinstance(episodes, np.ndarray) or is_torch(episodes):
        raise ValueError("ragged input must be a list of per-episode sequences; for a flat array pass episode_ids")
    episodes = list(episodes)
    lengths = [len(episode) for episode in episodes]
    if any(is_torch(episode) for episode in episodes):
        import torch

        parts = [torch.as_tensor(episode).reshape(-1) for episode in episodes]
        flat = torch.cat(parts) if parts else torch.zeros(0)
        ids = torch.repeat_interleave(torch.arange(len(lengths), device=flat.device), torch.tensor(lengths, device=flat.device))
        return flat, ids
    parts = [np.asarray(episode, dtype=np.float64).reshape(-1) for episode in episodes]
    flat = np.concatenate(parts) if parts else np.zeros(0)
    ids = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    return flat, ids


def as_turns(rewards: Any, episode_ids: Any, what: str = "rewards") -> tuple[Ops, Array, Array, Array]:
    """Normalise the two input forms to (ops, flat float64 rewards, episode ids, like).

    `like` is the caller's array whose backend/dtype the result should take.
    """
    if episode_ids is None:
        rewards, episode_ids = flatten_episodes(rewards)
    ops = ops_for(rewards, episode_ids)
    anchor = rewards if is_torch(rewards) else (episode_ids if is_torch(episode_ids) else None)
    flat = ops.float64(rewards if is_torch(rewards) else np.asarray(rewards, dtype=np.float64), like=anchor)
    like = rewards if is_torch(rewards) else flat
    if flat.ndim != 1:
        raise ValueError(f"{what} must be 1-D (one value per turn) when episode_ids is given; got shape {tuple(flat.shape)}")
    episode_ids = _as_id_array(ops, episode_ids, like=flat)
    if episode_ids.shape[0] != flat.shape[0]:
        raise ValueError(f"episode_ids must have one id per turn: {flat.shape[0]} {what} but {episode_ids.shape[0]} ids")
    check_finite(ops, flat, what)
    return ops, flat, episode_ids, like


def _as_id_array(ops: Ops, ids: Any, like: Array) -> Array:
    """Episode ids as an int64 array on the backend; non-numeric ids (e.g. strings) are ranked first."""
    if is_torch(ids):
        return ids.reshape(-1).to(device=like.device)
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"episode_ids must be 1-D, got shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        ids = np.unique(ids, return_inverse=True)[1].reshape(-1)  # rank order == sorted-id order
    return ops.int64(ids, like=like)


def episode_layout(ops: Ops, episode_ids: Array) -> EpisodeLayout:
    """Row (episode) and column (turn position) of each flat turn, without a Python loop over turns."""
    n = int(episode_ids.shape[0])
    if n == 0:
        empty = ops.int64(np.zeros(0, dtype=np.int64), like=episode_ids)
        return EpisodeLayout(empty, empty, empty, 0, 0)
    already_sorted = ops.is_sorted(episode_ids)
    order = None if already_sorted else ops.argsort_stable(episode_ids)  # stable: keeps turn order
    sorted_ids = episode_ids if order is None else episode_ids[order]
    first_of_episode = ops.concat([sorted_ids[:1] == sorted_ids[:1], sorted_ids[1:] != sorted_ids[:-1]])
    starts = ops.flatnonzero(first_of_episode)
    row = ops.cumsum(ops.int64(first_of_episode, like=episode_ids)) - 1
    col = ops.arange(n, like=episode_ids) - starts[row]
    lengths = ops.concat([starts[1:], ops.int64([n], like=episode_ids)]) - starts
    if order is not None:  # scatter positions back to the caller's turn order
        row_out = ops.zeros((n,), like=row, dtype=row.dtype)
        col_out = ops.zeros((n,), like=col, dtype=col.dtype)
        row_out[order] = row
        col_out[order] = col
        row, col = row_out, col_out
    return EpisodeLayout(row, col, lengths, int(starts.shape[0]), ops.max_int(lengths))


def pad_turns(ops: Ops, values: Array, layout: EpisodeLayout, extra_cols: int = 0) -> Array:
    """Flat per-turn values -> a zero-padded (num_episodes, max_turns + extra_cols) table."""
    table = ops.zeros((layout.num_episodes, layout.max_turns + extra_cols), like=values, dtype=values.dtype)
    table[layout.row, layout.col] = values
    return table


def reverse_discounted_sum(ops: Ops, table: Array, discount: float) -> Array:
    """out[:, t] = table[:, t] + discount * out[:, t + 1], one vectorised step per column.

    Rows are zero-padded after their last valid entry, so padding never leaks into valid turns.
    """
    out = ops.zeros(tuple(table.shape), like=table, dtype=table.dtype)
    running = ops.zeros((table.shape[0],), like=table, dtype=table.dtype)
    for t in range(table.shape[1] - 1, -1, -1):
        running = table[:, t] + discount * running
        out[:, t] = running
    return out


def turn_returns(ops: Ops, rewards: Array, layout: EpisodeLayout, gamma: float) -> Array:
    """Flat per-turn discounted returns for flat float64 rewards in `layout` (internal building block)."""
    if layout.num_turns == 0:
        return rewards * 0.0
    table = reverse_discounted_sum(ops, pad_turns(ops, rewards, layout), gamma)
    return table[layout.row, layout.col]


def discounted_returns(rewards: Any, episode_ids: Any = None, *, gamma: float = 1.0) -> Array:
    """Per-turn discounted return G_t = r_t + gamma * G_{t+1} (G after an episode's last turn is 0).

    `rewards`: ragged per-episode lists (then the result is flat, episodes in list order), or a flat
    per-turn array with `episode_ids` (same length; result aligned with the input). numpy in ->
    float64 numpy out; torch in -> torch out in the rewards' floating dtype.
    """
    gamma = check_discount("gamma", gamma)
    ops, flat, ids, like = as_turns(rewards, episode_ids)
    check_nonempty(int(flat.shape[0]), "rewards")
    return ops.out(turn_returns(ops, flat, episode_layout(ops, ids), gamma), like=like)
