"""From per-turn advantages to the (batch, length) token tensors a trainer's advantage hook works on.

Two training views (DESIGN.md, Trajectory):
- one row per episode: the row holds every turn's response, separated by environment tokens
  (response_mask 0). Turns are the runs of 1s in the mask (or given as turn ids / token spans) and a
  turn's reward sits on its tokens, usually its last one. `rebn_token_level` does the whole thing.
- one row per turn (the GEM default): each row is its own sample; pass `episode_ids`, one per row.

Runs of the mask are handled without any per-token index array: the flat tokens are cut into
intervals at every row start and every run edge, one segmented sum gives each interval's reward,
and one repeat of per-interval values paints the (B, L) result. On CPU with numba installed, those
two token passes are compiled instead (`_kernels`); the turn-level maths between them is shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _kernels
from ._backend import (
    NUMPY,
    Array,
    NumpyOps,
    TorchOps,
    check_ddof,
    check_discount,
    check_eps,
    check_finite,
    check_nonempty,
    encode_keys,
    is_torch,
    ops_for,
)
from .rebn import NormStats, _codes_in, apply_stats, compute_stats, global_codes, scaling, stats_from_sums
from .returns import as_turns, episode_layout, reverse_discounted_sum, turn_returns

Ops = NumpyOps | TorchOps

# CPU tensors are computed on zero-copy numpy views: on turn-sized arrays (tens of thousands of
# entries) torch's per-call overhead costs more than the maths. Tests switch it off to run the
# generic torch path (the one CUDA tensors take) on CPU.
CPU_TENSORS_VIA_NUMPY = True


def turn_ids_from_mask(response_mask: Any) -> Array:
    """Turn index of every token: each run of 1s in the mask starts a new turn (0, 1, ...).

    Environment tokens (mask 0) after a turn keep that turn's id, so a reward placed on them still
    counts for the turn that led to them; tokens before the first response token get -1.
    """
    ops = ops_for(response_mask)
    return ops.cumsum(ops.run_starts(_as_mask(ops, response_mask)), axis=1) - 1


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
    ids = np.where(inside, np.cumsum(start_marks, axis=1)[:, :length] - 1, -1)
    if is_torch(like):
        import torch

        return torch.as_tensor(ids, device=like.device)
    return ids


def broadcast_turns_to_tokens(turn_values: Any, turn_ids: Any = None, response_mask: Any = None) -> Array:
    """out[b, l] = turn_values[b, turn_ids[b, l]] on response tokens, 0 elsewhere.

    turn_values: a (B, T) table; or (B,) one value per row (the one-row-per-turn view, where
    turn_ids may be None). response_mask defaults to turn_ids >= 0.
    """
    ops = ops_for(turn_values, turn_ids, response_mask)
    table = turn_values if is_torch(turn_values) else np.asarray(turn_values, dtype=np.float64)
    if turn_ids is None:
        if response_mask is None:
            raise ValueError("pass turn_ids or a response_mask")
        if table.ndim != 1:
            raise ValueError("without turn_ids, turn_values must hold one value per row")
        return table[:, None] * _as_mask(ops, response_mask)
    cols = (turn_ids if is_torch(turn_ids) else np.asarray(turn_ids, dtype=np.int64)) + 1  # 0 = no turn
    if table.ndim == 1:
        table = table[:, None]  # one turn per row
    padded = ops.zeros((table.shape[0], table.shape[1] + 1), like=table, dtype=table.dtype)
    padded[:, 1:] = table
    if int(cols.max()) >= padded.shape[1]:
        raise ValueError(f"turn id {int(cols.max()) - 1} has no value: turn_values has {table.shape[1]} columns")
    keep = cols > 0 if response_mask is None else _as_mask(ops, response_mask) & (cols > 0)
    return ops.gather_rows(padded, cols) * keep


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
    torch out in the rewards' floating dtype. A turn's tokens are summed in the rewards' dtype
    (float32 stays float32); returns and statistics are float64.
    """
    options = {
        "gamma": check_discount("gamma", gamma),
        "eps": check_eps(eps),
        "ddof": check_ddof(ddof),
        "stats": stats,
        "distributed": distributed,
        "process_group": process_group,
    }
    ops = ops_for(token_level_rewards, response_mask, turn_ids)
    rewards = token_level_rewards if is_torch(token_level_rewards) else _float_array(token_level_rewards)
    mask = response_mask if is_torch(response_mask) else np.asarray(response_mask)  # any 0/1 dtype
    if ops.name == "torch" and not (is_torch(rewards) and is_torch(mask)):  # mixed inputs: all torch
        device = next(x.device for x in (token_level_rewards, response_mask, turn_ids) if is_torch(x))
        rewards, mask = ops.torch.as_tensor(rewards, device=device), ops.torch.as_tensor(mask, device=device)
    if rewards.ndim != 2 or tuple(mask.shape) != tuple(rewards.shape):
        raise ValueError(f"token_level_rewards and response_mask must both be (batch, length); got {tuple(rewards.shape)} and {tuple(mask.shape)}")
    if rewards.shape[0] * rewards.shape[1] == 0:
        raise ValueError(f"empty batch: token_level_rewards has shape {tuple(rewards.shape)}")

    out_dtype = _out_dtype(rewards)
    to_output = None
    empty = np.empty  # where (B, L) results are allocated
    if ops.name == "torch" and CPU_TENSORS_VIA_NUMPY and rewards.device.type == "cpu" and mask.device.type == "cpu":
        import torch

        final_dtype = out_dtype
        rewards = rewards.detach()
        rewards = (rewards if rewards.dtype in (torch.float32, torch.float64) else rewards.float()).numpy()
        mask = mask.detach().numpy()
        turn_ids = turn_ids.detach().cpu().numpy() if is_torch(turn_ids) else turn_ids
        episode_ids = episode_ids.detach().cpu().numpy() if is_torch(episode_ids) else episode_ids
        options["stats"] = None if stats is None else _stats_to_numpy(stats)
        ops, out_dtype = NUMPY, rewards.dtype

        def to_output(array: np.ndarray) -> Any:
            return torch.from_numpy(array).to(final_dtype)

        def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
            # torch's allocator: on a warm heap its large blocks come back without fresh page faults
            return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype).numpy()

    if episode_ids is not None:
        results = _rows_as_turns(ops, rewards, _as_mask(ops, mask), episode_ids, group_by, out_dtype, **options)
    elif turn_ids is not None:
        results = _explicit_turns(ops, rewards, _as_mask(ops, mask), turn_ids, group_by, out_dtype, **options)
    else:
        results = _runs(ops, rewards, mask, group_by, out_dtype, return_returns, empty, **options)
    if to_output is not None:
        results = tuple(to_output(result) for result in results)
    return (results[0], results[1]) if return_returns else results[0]


def _runs(ops, rewards, mask, group_by, out_dtype, return_returns, empty=np.empty, **options):
    """Turns are the runs of 1s in the mask: (advantages,) or (advantages, returns), both (B, L).

    Intervals start at every row start and every run edge (a run's first token, the first token
    after it), so each is a turn's run, the environment gap after a run, or a row's tokens before
    its first run (which must hold no reward).
    """
    batch, length = int(rewards.shape[0]), int(rewards.shape[1])
    compiled = _kernels.kernels() if ops is NUMPY else None
    if compiled is not None:
        return _runs_compiled(compiled, rewards, mask, group_by, out_dtype, return_returns, empty, **options)
    total = batch * length
    mask = _as_mask(ops, mask)  # one pass to bool makes the edge search ~4x cheaper than on int64
    boundaries = ops.flatnonzero(ops.run_boundaries(mask))  # sorted; boundaries[0] == 0
    lengths = ops.concat([boundaries[1:], boundaries[:1] * 0 + total]) - boundaries
    is_run = mask.reshape(-1)[boundaries] != 0
    at_row_start = boundaries % length == 0
    interval_sums = ops.reduceat(rewards.reshape(-1), boundaries)
    check_finite(ops, interval_sums, "token_level_rewards")
    stray = ~is_run & at_row_start & (interval_sums != 0)
    if bool(stray.any()):
        row = int(boundaries[ops.flatnonzero(stray)[0]]) // length
        raise ValueError(f"row {row} has rewards before its first response token; they belong to no turn")

    # Turns in row-major order; a turn's reward is its run plus the environment gap right after it.
    run_index = ops.flatnonzero(is_run)
    last = int(boundaries.shape[0]) - 1
    after = ops.clip_max(run_index + 1, last)
    gap_after = (run_index < last) & ~is_run[after] & ~at_row_start[after]
    turn_rewards = ops.float64(interval_sums[run_index]) + ops.where(gap_after, ops.float64(interval_sums[after]), 0.0)
    turn_row = boundaries[run_index] // length
    first_of_row = ops.concat([turn_row[:1] >= 0, turn_row[1:] != turn_row[:-1]])
    row_first_turn = ops.flatnonzero(first_of_row)[ops.cumsum(ops.int64(first_of_row, like=turn_row)) - 1]
    turn_index = ops.arange(int(turn_row.shape[0]), like=turn_row) - row_first_turn

    returns, advantages = _turn_advantages(ops, turn_rewards, turn_row, turn_index, batch, group_by, **options)
    painted = [_paint(ops, advantages, run_index, lengths, out_dtype, (batch, length))]
    if return_returns:
        painted.append(_paint(ops, returns, run_index, lengths, out_dtype, (batch, length)))
    return tuple(painted)


def _runs_compiled(compiled, rewards, mask, group_by, out_dtype, return_returns, empty, **options):
    """`_runs` with both token passes compiled (numba): the same turns, sums and checks."""
    batch, length = rewards.shape
    rewards, mask = np.ascontiguousarray(rewards), np.ascontiguousarray(mask)
    if mask.dtype == bool:
        mask = mask.view(np.uint8)  # one compiled variant fewer; the same bytes
    table, counts, codes = compiled.turn_table(rewards, mask)
    lead = table[0]
    check_finite(NUMPY, lead, "token_level_rewards (before a row's first turn)")
    if lead.any():
        row = int(np.flatnonzero(lead)[0])
        raise ValueError(f"row {row} has rewards before its first response token; they belong to no turn")
    # Turn-level maths on the zero-padded (B, max turns) table: row b's turns are its first counts[b].
    if not options["distributed"]:
        check_nonempty(int(counts.max()), "the batch (no response tokens in response_mask)")
    returns = compiled.returns(table, counts, options["gamma"])
    if not np.isfinite(returns).all():
        row = int(np.flatnonzero(~np.isfinite(returns).all(axis=1))[0])
        raise ValueError(f"token_level_rewards must be finite; row {row} sums to a non-finite turn reward")
    stats, row_codes = _row_stats(
        NUMPY,
        None,
        None,
        batch,
        group_by,
        options["ddof"],
        options["stats"],
        options["distributed"],
        options["process_group"],
        table=(returns, counts, compiled),
    )
    # apply_stats, row by row, inside the paint: (G - mean) / (std + eps), 0 for a constant group.
    constant, denominator = scaling(NUMPY, stats, options["eps"])
    out = empty((batch, length), out_dtype)
    painted = [compiled.paint(returns, codes, out, stats.mean[row_codes], denominator[row_codes], constant[row_codes])]
    if return_returns:
        painted.append(compiled.paint(returns, codes, empty((batch, length), out_dtype)))
    return tuple(painted)


def _paint(ops, turn_values, run_index, lengths, dtype, shape):
    """(B, L) array: turn_values[i] on every token of turn i's run, 0 on every other token."""
    interval_values = ops.zeros((int(lengths.shape[0]),), like=turn_values, dtype=dtype)
    interval_values[run_index] = ops.cast(turn_values, dtype)
    return ops.repeat(interval_values, lengths, shape[0] * shape[1]).reshape(shape)


def _turn_advantages(ops, turn_rewards, turn_row, turn_index, batch, group_by, *, gamma, eps, ddof, stats, distributed, process_group):
    """Flat per-turn (returns, advantages) from flat per-turn rewards and each turn's (row, index)."""
    if not distributed:
        check_nonempty(int(turn_rewards.shape[0]), "the batch (no response tokens in response_mask)")
    max_turns = ops.max_int(turn_index + 1)
    table = ops.zeros((batch, max_turns), like=turn_rewards)
    table[turn_row, turn_index] = turn_rewards
    returns = reverse_discounted_sum(ops, table, gamma)[turn_row, turn_index]
    return returns, _normalise(ops, returns, turn_row, batch, group_by, eps, ddof, stats, distributed, process_group)


def _normalise(ops, returns, turn_row, batch, group_by, eps, ddof, stats, distributed, process_group):
    """ReBN's second step on flat per-turn returns; the group of a turn is its row's key."""
    stats, row_codes = _row_stats(ops, returns, turn_row, batch, group_by, ddof, stats, distributed, process_group)
    return apply_stats(ops, returns, ops.int64(row_codes, like=returns)[turn_row], stats, eps=eps)


def _row_stats(ops, returns, turn_row, batch, group_by, ddof, stats, distributed, process_group, table=None):
    """(stats, each row's group code in them) for per-turn returns; a turn's group is its row's key.

    Given `stats` are used as they are; otherwise they are computed over the returns (all ranks when
    distributed): flat per-turn `returns` with their `turn_row`, or with `table=(returns, counts)` a
    zero-padded numpy (B, T) table whose row b holds counts[b] turns. Codes come back as numpy (B,).
    """
    codes, uniques = (None, None) if group_by is None else encode_keys(group_by, batch, "group_by (one key per row)")
    if stats is not None:
        return stats, _codes_in(stats, None if codes is None else uniques[codes], batch)
    if table is None:
        turn_codes = None if codes is None else codes[ops.to_numpy(turn_row)]
        stats, _ = compute_stats(ops, returns, turn_codes, uniques, ddof=ddof, distributed=distributed, process_group=process_group)
        if codes is None:
            return stats, np.zeros(batch, dtype=np.int64)
        return stats, np.searchsorted(stats.keys, uniques)[codes]  # distributed stats hold every rank's keys
    # The compiled path's (B, T) table: group sums over each row's first counts[b] entries.
    table_returns, counts, compiled = table
    codes, uniques = global_codes(codes, uniques, distributed, process_group)
    row_codes = np.zeros(batch, dtype=np.int64) if codes is None else codes
    num_groups = 1 if uniques is None else len(uniques)
    count, total = compiled.group_sums(table_returns, counts, row_codes, num_groups)
    stats = stats_from_sums(
        NUMPY,
        count,
        total,
        lambda mean: compiled.group_squares(table_returns, counts, row_codes, mean),
        uniques,
        ddof=ddof,
        distributed=distributed,
        process_group=process_group,
    )
    return stats, row_codes


def _explicit_turns(ops, rewards, mask, turn_ids, group_by, out_dtype, **options):
    """Turns given as (B, L) ids: a scatter-add sums each turn's rewards, a gather broadcasts back."""
    batch = int(rewards.shape[0])
    ids = ops.int64(turn_ids if is_torch(turn_ids) else np.asarray(turn_ids), like=rewards)
    if tuple(ids.shape) != tuple(mask.shape):
        raise ValueError(f"turn_ids must be (batch, length) like the rewards; got {tuple(ids.shape)}")
    if bool((ids < -1).any()):
        raise ValueError("turn ids must be >= -1 (-1 = token in no turn)")
    if bool((mask & (ids < 0)).any()):
        raise ValueError("a response token (response_mask 1) has turn id -1; every response token needs a turn")
    cols = ids + 1  # 0 collects tokens in no turn
    width = ops.max_int(cols) + 1
    sums = ops.scatter_add_rows(ops.zeros((batch, width), like=rewards, dtype=out_dtype), cols, rewards)
    present = ops.scatter_add_rows(ops.zeros((batch, width), like=rewards, dtype=out_dtype), cols, rewards * 0 + 1) > 0
    sums = ops.float64(sums, like=rewards)
    check_finite(ops, sums, "token_level_rewards (summed per turn)")
    if bool((sums[:, 0] != 0).any()):
        row = int(ops.flatnonzero(sums[:, 0] != 0)[0])
        raise ValueError(f"row {row} has rewards on tokens with turn id -1; they belong to no turn")
    num_turns = present[:, 1:].sum(1) if is_torch(present) else present[:, 1:].sum(axis=1)
    expected = ops.arange(width - 1, like=cols)[None, :] < num_turns[:, None]
    if bool((expected != present[:, 1:]).any()):
        row = int(ops.flatnonzero((expected != present[:, 1:]).any(1) if is_torch(present) else (expected != present[:, 1:]).any(axis=1))[0])
        raise ValueError(f"turn ids of row {row} must be 0, 1, ..., n-1 with none missing")
    turn_row, turn_index = _nonzero2d(expected)
    turn_rewards = sums[turn_row, turn_index + 1]
    returns, advantages = _turn_advantages(ops, turn_rewards, turn_row, turn_index, batch, group_by, **options)
    results = []
    for values in (advantages, returns):
        table = ops.zeros((batch, width), like=rewards, dtype=out_dtype)
        table[turn_row, turn_index + 1] = ops.cast(values, out_dtype)
        results.append(ops.mask_(ops.gather_rows(table, cols), mask))
    return tuple(results)


def _rows_as_turns(ops, rewards, mask, episode_ids, group_by, out_dtype, *, gamma, eps, ddof, stats, distributed, process_group):
    """One row per turn: a row's reward is the sum of its tokens; episodes by `episode_ids`, turns in row order."""
    batch = int(rewards.shape[0])
    row_rewards = rewards.sum(1) if is_torch(rewards) else rewards.sum(axis=1)
    _, flat, ids, _ = as_turns(row_rewards, episode_ids, "token_level_rewards (summed per row)")
    if not distributed:
        check_nonempty(batch, "token_level_rewards")
    returns = turn_returns(ops, flat, episode_layout(ops, ids), gamma)
    rows = ops.arange(batch, like=returns)
    advantages = _normalise(ops, returns, rows, batch, group_by, eps, ddof, stats, distributed, process_group)
    return tuple(ops.cast(values, out_dtype)[:, None] * mask for values in (advantages, returns))


def _stats_to_numpy(stats: NormStats) -> NormStats:
    """The same statistics as numpy arrays, for the CPU path that works on numpy views."""
    arrays = (x.detach().cpu().numpy() if is_torch(x) else np.asarray(x) for x in (stats.count, stats.mean, stats.std))
    return NormStats(stats.keys, *arrays, stats.ddof)


def _float_array(x: Any) -> np.ndarray:
    """numpy rewards as given when already floating (float32 stays float32: no copy of every token)."""
    array = np.asarray(x)
    return array if array.dtype in (np.float32, np.float64) else array.astype(np.float64)


def _as_mask(ops: Ops, response_mask: Any) -> Array:
    return ops.bool(response_mask if is_torch(response_mask) else np.asarray(response_mask))


def _nonzero2d(valid: Array) -> tuple[Array, Array]:
    if is_torch(valid):
        index = valid.nonzero()
        return index[:, 0], index[:, 1]
    return np.nonzero(valid)


def _out_dtype(rewards: Array) -> Any:
    """numpy results are float64; torch results keep the rewards' floating dtype."""
    if not is_torch(rewards):
        return np.float64
    import torch

    return rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
