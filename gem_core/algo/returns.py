"""Per-turn discounted returns over episodes: G_t = r_t + gamma * G_{t+1}, over turns (not tokens).

Episodes come either ragged (a list of per-turn reward lists) or flat (one reward per turn plus an
episode id per turn). The turns are laid out in a zero-padded (episodes, max_turns) table and the
return is summed backwards one turn column at a time: a loop over the longest episode's turns, never
over episodes or tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._backend import Array, check_discount, check_finite, check_nonempty, is_torch, result_like, to_numpy


@dataclass(frozen=True)
class EpisodeLayout:
    """Where each flat turn sits in a padded (num_episodes, max_turns) table.

    Episode `e` is the one with the e-th smallest id (for ragged input: the e-th list), and a turn's
    position in its episode is its order of appearance among that episode's turns.
    """

    row: np.ndarray  # (num_turns,) episode index of each turn
    col: np.ndarray  # (num_turns,) position of each turn within its episode
    lengths: np.ndarray  # (num_episodes,) turns per episode
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
        return flat, torch.repeat_interleave(torch.arange(len(lengths), device=flat.device), torch.tensor(lengths, device=flat.device))
    parts = [np.asarray(episode, dtype=np.float64).reshape(-1) for episode in episodes]
    flat = np.concatenate(parts) if parts else np.zeros(0)
    return flat, np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)


def as_turns(rewards: Any, episode_ids: Any, what: str = "rewards") -> tuple[np.ndarray, np.ndarray, Callable[[np.ndarray], Array]]:
    """Both input forms -> (flat float64 rewards, int64 episode ids, how to give results back)."""
    if episode_ids is None:
        rewards, episode_ids = flatten_episodes(rewards)
    flat = to_numpy(rewards, np.float64)
    back = result_like(rewards if is_torch(rewards) else flat, episode_ids)
    if flat.ndim != 1:
        raise ValueError(f"{what} must be 1-D (one value per turn) when episode_ids is given; got shape {tuple(flat.shape)}")
    ids = to_numpy(episode_ids).reshape(-1) if is_torch(episode_ids) else np.asarray(episode_ids)
    if ids.ndim != 1:
        raise ValueError(f"episode_ids must be 1-D, got shape {ids.shape}")
    if ids.shape[0] != flat.shape[0]:
        raise ValueError(f"episode_ids must have one id per turn: {flat.shape[0]} {what} but {ids.shape[0]} ids")
    if not np.issubdtype(ids.dtype, np.integer):
        ids = np.unique(ids, return_inverse=True)[1].reshape(-1)  # e.g. strings: rank order == sorted-id order
    check_finite(flat, what)
    return flat, ids.astype(np.int64, copy=False), back


def episode_layout(episode_ids: np.ndarray) -> EpisodeLayout:
    """Row (episode, in sorted-id order) and column (turn position) of each flat turn."""
    n = int(episode_ids.shape[0])
    order = np.argsort(episode_ids, kind="stable")  # stable: keeps each episode's turn order
    sorted_ids = episode_ids[order]
    first_of_episode = np.concatenate([[True], sorted_ids[1:] != sorted_ids[:-1]]) if n else np.zeros(0, bool)
    starts = np.flatnonzero(first_of_episode)
    row, col = np.empty(n, np.int64), np.empty(n, np.int64)
    row[order] = np.cumsum(first_of_episode) - 1
    col[order] = np.arange(n) - starts[row[order]]
    lengths = np.diff(np.append(starts, n))
    return EpisodeLayout(row, col, lengths, len(starts), int(lengths.max(initial=0)))


def pad_turns(values: np.ndarray, layout: EpisodeLayout, extra_cols: int = 0) -> np.ndarray:
    """Flat per-turn values -> a zero-padded (num_episodes, max_turns + extra_cols) table."""
    table = np.zeros((layout.num_episodes, layout.max_turns + extra_cols))
    table[layout.row, layout.col] = values
    return table


def reverse_discounted_sum(table: np.ndarray, discount: float) -> np.ndarray:
    """out[:, t] = table[:, t] + discount * out[:, t + 1]: rows zero-padded after their last entry, so
    padding never leaks into a valid turn."""
    out = np.zeros_like(table)
    running = np.zeros(table.shape[0])
    for t in reversed(range(table.shape[1])):
        running = table[:, t] + discount * running
        out[:, t] = running
    return out


def turn_returns(rewards: np.ndarray, layout: EpisodeLayout, gamma: float) -> np.ndarray:
    """Flat per-turn discounted returns of flat per-turn rewards laid out by `layout`."""
    return reverse_discounted_sum(pad_turns(rewards, layout), gamma)[layout.row, layout.col]


def discounted_returns(rewards: Any, episode_ids: Any = None, *, gamma: float = 1.0) -> Array:
    """Per-turn discounted return G_t = r_t + gamma * G_{t+1} (G after an episode's last turn is 0).

    `rewards`: ragged per-episode lists (then the result is flat, episodes in list order), or a flat
    per-turn array with `episode_ids` (same length; result aligned with the input). numpy in ->
    float64 numpy out; torch in -> torch out in the rewards' floating dtype.
    """
    gamma = check_discount("gamma", gamma)
    flat, ids, back = as_turns(rewards, episode_ids)
    check_nonempty(flat.shape[0], "rewards")
    return back(turn_returns(flat, episode_layout(ids), gamma))
