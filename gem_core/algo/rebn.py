"""ReBN (return batch normalisation), the GEM paper's estimator, exactly as DESIGN.md defines it.

    G_t = r_t + gamma * G_{t+1}                      per episode, over turns
    A_t = (G_t - mean(G)) / (std(G) + eps)           mean/std over every turn in the batch (or group)

Two steps, both public, so normalisation can happen before or after subsampling:
`normalization_stats` computes per-group (count, mean, std) on one set of returns (e.g. the full
batch, optionally over all ranks), and `normalize` applies them to any subset. `rebn` does both.
A group whose returns are all equal (including a one-turn group) gets advantage 0, never NaN;
`min_std` widens that to any group whose std is at or below it (ROLL's reward normalisation gives 0
when the std is <= 1e-6).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import distributed as _distributed
from ._backend import (
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
from .returns import as_turns, episode_layout, turn_returns

Ops = NumpyOps | TorchOps

# A group's std at or below this multiple of float64 epsilon times |mean| is rounding noise: the
# returns are equal, and dividing noise by a tiny std would turn it into +-1 advantages.
_CONSTANT_TOLERANCE = 8 * np.finfo(np.float64).eps


@dataclass(frozen=True)
class NormStats:
    """Per-group count, mean and std of a set of returns (float64, on the returns' backend/device).

    `keys` are the sorted group keys (`None`: one group, the whole batch); `ddof` is how `std` was taken.
    """

    keys: np.ndarray | None
    count: Array
    mean: Array
    std: Array
    ddof: int


def group_codes(keys: Any, n: int, what: str = "group_by") -> tuple[np.ndarray | None, np.ndarray | None]:
    """(codes, sorted unique keys) for `n` keys, or (None, None) when `keys` is None (one group)."""
    if keys is None:
        return None, None
    return encode_keys(keys, n, what)


def compute_stats(
    ops: Ops,
    values: Array,
    codes: np.ndarray | None,
    uniques: np.ndarray | None,
    *,
    ddof: int,
    distributed: bool = False,
    process_group: Any = None,
) -> tuple[NormStats, Array]:
    """Group statistics of flat float64 `values`; returns (stats, per-value group codes on the backend)."""
    codes, uniques = global_codes(codes, uniques, distributed, process_group)
    num_groups = 1 if uniques is None else len(uniques)
    n = int(values.shape[0])
    codes_b = ops.int64(np.zeros(n, dtype=np.int64) if codes is None else codes, like=values)

    def squared_deviation(mean: Array) -> Array:
        centered = values - mean[codes_b]
        return ops.segment_sum(centered * centered, codes_b, num_groups)

    stats = stats_from_sums(
        ops,
        ops.segment_sum(values * 0.0 + 1.0, codes_b, num_groups),
        ops.segment_sum(values, codes_b, num_groups),
        squared_deviation,
        uniques,
        ddof=ddof,
        distributed=distributed,
        process_group=process_group,
    )
    return stats, codes_b


def global_codes(codes: np.ndarray | None, uniques: np.ndarray | None, distributed: bool, process_group: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Local group codes and keys -> codes into the union of every rank's keys (when distributed)."""
    if distributed and uniques is not None:
        global_keys = _distributed.union_keys(uniques, process_group)
        return np.searchsorted(global_keys, uniques)[codes], global_keys
    return codes, uniques


def stats_from_sums(
    ops: Ops,
    count: Array,
    total: Array,
    squared_deviation: Any,
    uniques: np.ndarray | None,
    *,
    ddof: int,
    distributed: bool,
    process_group: Any,
) -> NormStats:
    """Per-group stats from per-group count and sum, then sum of squared deviations from the mean.

    `squared_deviation(mean)` gives the per-group sums of (value - mean of its group)^2: two passes,
    so a large mean never cancels a small spread. Distributed, every sum is all-reduced.
    """
    num_groups = int(count.shape[0])
    if distributed:
        reduced = _distributed.all_reduce_sum(ops, ops.concat([count, total]), process_group)
        count, total = reduced[:num_groups], reduced[num_groups:]
    check_nonempty(int(count.sum()), "the batch (all ranks)" if distributed else "the batch")
    mean = total / ops.clip_min(count, 1.0)
    deviation = squared_deviation(mean)
    if distributed:
        deviation = _distributed.all_reduce_sum(ops, deviation, process_group)
    std = ops.sqrt(deviation / ops.clip_min(count - ddof, 1.0))
    return NormStats(uniques, count, mean, std, ddof)


def apply_stats(ops: Ops, values: Array, codes_b: Array, stats: NormStats, *, eps: float, scale: bool = True, min_std: float = 0.0) -> Array:
    """(values - mean_g) / (std_g + eps) per value's group g; only centred when `scale` is False."""
    centered = values - stats.mean[codes_b]
    if not scale:
        return centered
    constant, denominator = scaling(ops, stats, eps, min_std)
    return ops.where(constant[codes_b], 0.0, centered / denominator[codes_b])


def scaling(ops: Ops, stats: NormStats, eps: float, min_std: float = 0.0) -> tuple[Array, Array]:
    """Per group: (constant, denominator). A constant group's values all get advantage 0 (no NaN
    from 0/0), as does a group whose std is at or below `min_std`; the others are divided by std + eps."""
    constant = stats.std <= _CONSTANT_TOLERANCE * ops.abs(stats.mean)
    if min_std > 0.0:
        constant = constant | (stats.std <= min_std)
    return constant, ops.where(constant, 1.0, stats.std + eps)  # 1.0 only to keep 0/0 out of the maths


def normalization_stats(
    values: Any,
    keys: Any = None,
    *,
    ddof: int = 0,
    distributed: bool = False,
    process_group: Any = None,
) -> NormStats:
    """Per-group (count, mean, std) of flat per-turn `values` (e.g. returns), `keys` one per value.

    With `distributed=True` the statistics cover every rank's values (torch.distributed all-reduce).
    """
    ddof = check_ddof(ddof)
    ops = ops_for(values)
    flat = ops.float64(values if is_torch(values) else np.asarray(values, dtype=np.float64))
    if flat.ndim != 1:
        raise ValueError(f"values must be 1-D (one per turn), got shape {tuple(flat.shape)}")
    check_finite(ops, flat, "values")
    if not distributed:
        check_nonempty(int(flat.shape[0]), "values")
    codes, uniques = group_codes(keys, int(flat.shape[0]), "keys (one per turn)")
    return compute_stats(ops, flat, codes, uniques, ddof=ddof, distributed=distributed, process_group=process_group)[0]


def normalize(values: Any, stats: NormStats, keys: Any = None, *, eps: float = 1e-6, scale: bool = True, min_std: float = 0.0) -> Array:
    """Apply precomputed stats: A = (v - mean_g) / (std_g + eps) for each value's group key g.

    Use it to normalise a subsample with statistics of the full batch. A key absent from `stats`
    is an error (its group has no statistics). `min_std`: as in :func:`rebn`.
    """
    eps = check_eps(eps)
    min_std = check_min_std(min_std)
    ops = ops_for(values, stats.mean)
    flat = ops.float64(values if is_torch(values) else np.asarray(values, dtype=np.float64), like=stats.mean)
    check_finite(ops, flat, "values")
    codes = _codes_in(stats, keys, int(flat.shape[0]))
    codes_b = ops.int64(codes, like=flat)
    return ops.out(
        apply_stats(ops, flat, codes_b, stats, eps=eps, scale=scale, min_std=min_std),
        like=values if is_torch(values) else flat,
    )


def _codes_in(stats: NormStats, keys: Any, n: int) -> np.ndarray:
    """Codes of `keys` in the stats' key table (all zero for whole-batch stats)."""
    if stats.keys is None:
        if keys is not None:
            raise ValueError("these stats were computed over the whole batch (no group keys); pass keys=None")
        return np.zeros(n, dtype=np.int64)
    if keys is None:
        raise ValueError("these stats are per group: pass the group key of every value")
    local_codes, local_keys = encode_keys(keys, n, "keys (one per turn)")
    position = np.searchsorted(stats.keys, local_keys)
    found = (position < len(stats.keys)) & (stats.keys[np.minimum(position, len(stats.keys) - 1)] == local_keys)
    if not found.all():
        missing = local_keys[~found][:5].tolist()
        raise ValueError(f"group keys {missing} have no statistics in `stats`")
    return position[local_codes]


def rebn(
    rewards: Any,
    episode_ids: Any = None,
    *,
    gamma: float = 1.0,
    eps: float = 1e-6,
    ddof: int = 0,
    group_by: Any = None,
    stats: NormStats | None = None,
    distributed: bool = False,
    process_group: Any = None,
    min_std: float = 0.0,
) -> Array:
    """Per-turn ReBN advantages: A_t = (G_t - mean(G)) / (std(G) + eps), G_t = r_t + gamma * G_{t+1}.

    rewards: ragged per-episode reward lists, or flat per-turn rewards with `episode_ids`; the result
        is flat and aligned with the turns (ragged: episodes in list order).
    gamma: discount over turns (default 1.0: undiscounted). eps: added to the std (default 1e-6).
    ddof: 0 = population std (default; GEM/oat whitening), 1 = sample std (ROLL's batch mean_std).
    group_by: None = normalise over the whole batch; else one key (str/int) per episode, in episode
        order (ragged: list order; flat: sorted episode id), and each group is normalised on its own.
    stats: precomputed `normalization_stats` (e.g. of the full batch, before subsampling) applied
        instead of statistics of these rewards; with groups, every `group_by` key must be in `stats`.
    distributed: statistics over every rank's turns via torch.distributed (each rank passes its shard).
    min_std: a group whose std is at or below this gets advantage 0 (default 0.0: only a constant group).
        ROLL's `step_reinforce` + batch `mean_std` is `ddof=1, eps=1e-6, min_std=1e-6`.
    """
    gamma = check_discount("gamma", gamma)
    eps = check_eps(eps)
    min_std = check_min_std(min_std)
    ddof = check_ddof(ddof)
    ops, flat, ids, like = as_turns(rewards, episode_ids)
    if not distributed:
        check_nonempty(int(flat.shape[0]), "rewards")
    layout = episode_layout(ops, ids)
    returns = turn_returns(ops, flat, layout, gamma)
    turn_keys = _per_turn_keys(group_by, layout, ops)
    if stats is not None:
        codes_b = ops.int64(_codes_in(stats, turn_keys, layout.num_turns), like=returns)
    else:
        codes, uniques = group_codes(turn_keys, layout.num_turns, "group_by")
        stats, codes_b = compute_stats(ops, returns, codes, uniques, ddof=ddof, distributed=distributed, process_group=process_group)
    return ops.out(apply_stats(ops, returns, codes_b, stats, eps=eps, min_std=min_std), like=like)


def check_min_std(min_std: Any) -> float:
    """`min_std` as a float >= 0 (a clear ValueError otherwise)."""
    if isinstance(min_std, bool) or not isinstance(min_std, (int, float)) or not np.isfinite(min_std) or min_std < 0:
        raise ValueError(f"min_std must be a finite number >= 0, got {min_std!r}")
    return float(min_std)


def _per_turn_keys(group_by: Any, layout: Any, ops: Ops) -> np.ndarray | None:
    """Per-episode group keys -> one key per turn (None stays None)."""
    if group_by is None:
        return None
    if is_torch(group_by):
        group_by = group_by.detach().cpu().numpy()
    keys = np.asarray(group_by)
    if keys.dtype == object:
        keys = keys.astype(str)
    if keys.ndim != 1 or keys.shape[0] != layout.num_episodes:
        raise ValueError(f"group_by must hold one key per episode: expected {layout.num_episodes}, got shape {keys.shape}")
    return keys[ops.to_numpy(layout.row)]
