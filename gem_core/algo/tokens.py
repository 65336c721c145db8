"""From per-turn advantages to the (batch, length) token tensors a trainer's advantage hook works on.

Two training views (DESIGN.md, Trajectory):
- one row per episode: the row holds every turn's response, separated by environment tokens
  (response_mask 0). Turns are the runs of 1s in the mask (or given as turn ids / token spans) and a
  turn's reward sits on its tokens, usually its last one. `rebn_token_level` does the whole thing.
- one row per turn (the GEM default): each row is its own sample; pass `episode_ids`, one per row.

Either way a token's turn id picks its turn: one weighted bincount sums every turn's rewards into a
(rows, turns) table, the ReBN of `rebn.py` runs on that table, and one gather paints it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._backend import (
    Array,
    check_ddof,
    check_discount,
    check_eps,
    check_nonempty,
    is_torch,
    on_device_of,
    result_like,
    to_numpy,
)
from .rebn import NormStats, standardise, turn_stats
from .returns import as_turns, episode_layout, reverse_discounted_sum, turn_returns


def turn_ids_from_mask(response_mask: Any) -> Array:
    """Turn index of every token: each run of 1s in the mask starts a new turn (0, 1, ...).

    Environment tokens (mask 0) after a turn keep that turn's id, so a reward placed on them still
    counts for the turn that led to them; tokens before the first response token get -1.
    """
    mask = to_numpy(response_mask).astype(bool)
    run_starts = mask.copy()
    run_starts[:, 1:] &= ~mask[:, :-1]  # a 1 after a 0, or a 1 in column 0
    return on_device_of(np.cumsum(run_starts, axis=1, dtype=np.int64) - 1, response_mask)


def turn_ids_from_spans(spans: Sequence[Sequence[tuple[int, int]]], length: int, like: Any = None) -> Array:
    """(B, length) turn ids from each row's turn spans [(start, end), ...] (end exclusive), -1 elsewhere.

    A row's spans must be non-empty, in order and non-overlapping. numpy out, or torch on `like`'s device.
    """
    rows = np.fromiter((b for b, row in enumerate(spans) for _ in row), dtype=np.int64)
    bounds = np.asarray([span for row in spans for span in row], dtype=np.int64).reshape(-1, 2)
    starts, ends = bounds[:, 0], bounds[:, 1]
    bad = (starts < 0) | (ends > length) | (ends <= starts)
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        raise ValueError(f"span {tuple(bounds[index].tolist())} of row {rows[index]} is empty or outside [0, {length}]")
    if ((rows[1:] == rows[:-1]) & (starts[1:] < ends[:-1])).any():
        raise ValueError("spans of a row must be in order and must not overlap")
    start_marks = np.zeros((len(spans), length + 1), dtype=np.int64)
    end_marks = np.zeros_like(start_marks)
    start_marks[rows, starts] = 1
    end_marks[rows, ends] = 1
    inside = np.cumsum(start_marks - end_marks, axis=1)[:, :length] > 0
    return on_device_of(np.where(inside, np.cumsum(start_marks, axis=1)[:, :length] - 1, -1), like)


def broadcast_turns_to_tokens(turn_values: Any, turn_ids: Any = None, response_mask: Any = None) -> Array:
    """out[b, l] = turn_values[b, turn_ids[b, l]] on response tokens, 0 elsewhere.

    turn_values: a (B, T) table; or (B,) one value per row (the one-row-per-turn view, where
    turn_ids may be None). response_mask defaults to turn_ids >= 0. Torch out in turn_values' dtype.
    """
    table = to_numpy(turn_values, np.float64)
    back = result_like(table, turn_values, turn_ids, response_mask, dtype=turn_values.dtype if is_torch(turn_values) else None)
    mask = None if response_mask is None else to_numpy(response_mask).astype(bool)
    if turn_ids is None:
        if mask is None:
            raise ValueError("pass turn_ids or a response_mask")
        if table.ndim != 1:
            raise ValueError("without turn_ids, turn_values must hold one value per row")
        return back(table[:, None] * mask)
    cols = to_numpy(turn_ids).astype(np.int64) + 1  # column 0 = no turn
    padded = np.concatenate([np.zeros((table.shape[0], 1)), table.reshape(table.shape[0], -1)], axis=1)
    if int(cols.max()) >= padded.shape[1]:
        raise ValueError(f"turn id {int(cols.max()) - 1} has no value: turn_values has {padded.shape[1] - 1} columns")
    keep = cols > 0 if mask is None else mask & (cols > 0)
    return back(np.take_along_axis(padded, cols, axis=1) * keep)


def rebn_token_level(
    token_level_rewards: Any,
    response_mask: Any,
    group_by: Any = None,
    *,
    gamma: float = 1.0,
    eps: float = 1e-6,
    ddof: int = 0,
    turn_ids: Any = None,
    episode_ids: Any = None,
    stats: NormStats | None = None,
    distributed: bool = False,
    process_group: Any = None,
    return_returns: bool = False,
) -> Any:
    """ReBN on (B, L) token tensors: A_t = (G_t - mean(G)) / (std(G) + eps) on every token of turn t.

    Each row is one episode; its turns are the runs of 1s in `response_mask` (or `turn_ids`, -1 = no
    turn) and a turn's reward is the sum of `token_level_rewards` from its first token up to the
    next turn (environment tokens after a turn count for it). With `episode_ids` (one per row), each
    row is instead one turn of that episode, turns in row order.
    group_by: one key per row (a trainer's prompt index); None = whole batch. Other options as `rebn`.
    Returns (B, L) advantages, 0 outside the turns; with `return_returns`, (advantages, returns)
    where returns holds each token's turn return G_t. numpy in -> float64 numpy out; torch in ->
    torch out in the rewards' floating dtype. Sums, returns and statistics are float64.
    """
    gamma, eps, ddof = check_discount("gamma", gamma), check_eps(eps), check_ddof(ddof)
    options = {"ddof": ddof, "stats": stats, "distributed": distributed, "process_group": process_group}
    rewards = to_numpy(token_level_rewards)
    back = result_like(token_level_rewards if is_torch(token_level_rewards) else rewards, response_mask, turn_ids)
    rewards, mask = rewards.astype(np.float64), to_numpy(response_mask).astype(bool)  # any 0/1 mask dtype
    if rewards.ndim != 2 or mask.shape != rewards.shape:
        raise ValueError(f"token_level_rewards and response_mask must both be (batch, length); got {rewards.shape} and {mask.shape}")
    if rewards.size == 0:
        raise ValueError(f"empty batch: token_level_rewards has shape {rewards.shape}")
    batch = rewards.shape[0]

    if episode_ids is not None:  # one row per turn: a row's reward is the sum of its tokens
        row_rewards, ids, _ = as_turns(rewards.sum(axis=1), episode_ids, "token_level_rewards (summed per row)")
        layout = episode_layout(ids)
        returns = turn_returns(row_rewards, layout, gamma)
        group, stats = turn_stats(returns, np.arange(batch), batch, group_by, "group_by (one key per row)", **options)
        advantages = standardise(returns, group, stats, eps=eps)
        results = [back(values[:, None] * mask) for values in (advantages, returns)]
        return tuple(results) if return_returns else results[0]

    # Each token's turn: the runs of the mask, or the given ids (-1: in no turn).
    ids = turn_ids_from_mask(mask) if turn_ids is None else _checked_turn_ids(turn_ids, mask)
    num_turns = ids.max(axis=1) + 1  # per row: ids run 0..n-1
    width = int(num_turns.max()) + 1  # column 0 collects the tokens of no turn

    # Every turn's reward in one (B, turns + 1) table: one weighted bincount over the tokens.
    cell = ids + (width * np.arange(batch) + 1)[:, None]  # token -> its (row, turn + 1) cell in the table
    sums = np.bincount(cell.ravel(), weights=rewards.ravel(), minlength=batch * width).reshape(batch, width)
    if not np.isfinite(sums).all():
        row = int(np.flatnonzero(~np.isfinite(sums).all(axis=1))[0])
        raise ValueError(f"token_level_rewards must be finite; row {row} sums to a non-finite turn reward")
    if sums[:, 0].any():
        row = int(np.flatnonzero(sums[:, 0])[0])
        where = "before its first response token" if turn_ids is None else "on tokens with turn id -1"
        raise ValueError(f"row {row} has rewards {where}; they belong to no turn")
    if turn_ids is not None:
        present = np.bincount(cell.ravel(), minlength=batch * width).reshape(batch, width)[:, 1:] > 0
        missing = (np.arange(width - 1) < num_turns[:, None]) & ~present
        if missing.any():
            raise ValueError(f"turn ids of row {int(np.flatnonzero(missing.any(axis=1))[0])} must be 0, 1, ..., n-1 with none missing")

    # ReBN over the turns (row b: its first num_turns[b] columns), as in `rebn`.
    valid = np.arange(width - 1) < num_turns[:, None]
    if not distributed:
        check_nonempty(int(valid.sum()), "the batch (no response tokens in response_mask)")
    turn_row = np.nonzero(valid)[0]
    returns = reverse_discounted_sum(sums[:, 1:], gamma)[valid]  # zero past a row's last turn: nothing leaks
    group, stats = turn_stats(returns, turn_row, batch, group_by, "group_by (one key per row)", **options)
    advantages = standardise(returns, group, stats, eps=eps)

    def paint(per_turn: np.ndarray) -> Array:  # each turn's value on its response tokens, 0 elsewhere
        table = np.zeros((batch, width))
        table[:, 1:][valid] = per_turn
        return back(table.ravel()[cell] * mask)

    return (paint(advantages), paint(returns)) if return_returns else paint(advantages)


def _checked_turn_ids(turn_ids: Any, mask: np.ndarray) -> np.ndarray:
    """Explicit (B, L) turn ids as int64, with every response token in a turn."""
    ids = to_numpy(turn_ids).astype(np.int64)
    if ids.shape != mask.shape:
        raise ValueError(f"turn_ids must be (batch, length) like the rewards; got {ids.shape}")
    if (ids < -1).any():
        raise ValueError("turn ids must be >= -1 (-1 = token in no turn)")
    if (mask & (ids < 0)).any():
        raise ValueError("a response token (response_mask 1) has turn id -1; every response token needs a turn")
    return ids
