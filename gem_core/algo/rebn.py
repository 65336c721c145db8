"""ReBN (return batch normalisation), the GEM paper's estimator, exactly as DESIGN.md defines it.

    G_t = r_t + gamma * G_{t+1}                      per episode, over turns
    A_t = (G_t - mean(G)) / (std(G) + eps)           mean/std over every turn in the batch (or group)

`rebn` below is the whole estimator: returns, then `group_stats` (count, mean, std), then
`standardise` (the division). The two halves are public too, so normalisation can happen before
or after subsampling: `normalization_stats` computes per-group (count, mean, std) on one set of
returns (e.g. the full batch, optionally over all ranks), and `normalize` applies them to any subset.
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
    check_ddof,
    check_discount,
    check_eps,
    check_finite,
    check_min_std,
    check_nonempty,
    encode_keys,
    is_torch,
    result_like,
    to_numpy,
)
from .returns import as_turns, episode_layout, turn_returns

# A group's std at or below this multiple of float64 epsilon times |mean| is rounding noise: the
# returns are equal, and dividing noise by a tiny std would turn it into +-1 advantages.
_CONSTANT_TOLERANCE = 8 * np.finfo(np.float64).eps


@dataclass(frozen=True)
class NormStats:
    """Per-group count, mean and std of a set of returns (float64, numpy or torch like the returns).

    `keys` are the sorted group keys (`None`: one group, the whole batch); `ddof` is how `std` was taken.
    """

    keys: np.ndarray | None
    count: Array
    mean: Array
    std: Array
    ddof: int


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
        order (ragged: list order, empty episodes skipped; flat: sorted episode id), and each group is
        normalised on its own.
    stats: precomputed `normalization_stats` (e.g. of the full batch, before subsampling) applied
        instead of statistics of these rewards; with groups, every `group_by` key must be in `stats`.
    distributed: statistics over every rank's turns via torch.distributed (each rank passes its shard).
    min_std: a group whose std is at or below this gets advantage 0 (default 0.0: only a constant group).
        ROLL's `step_reinforce` + batch `mean_std` is `ddof=1, eps=1e-6, min_std=1e-6`.
    numpy in -> float64 numpy out; torch in -> torch out in the rewards' floating dtype.
    """
    gamma, eps, ddof, min_std = check_discount("gamma", gamma), check_eps(eps), check_ddof(ddof), check_min_std(min_std)
    rewards, ids, back = as_turns(rewards, episode_ids)
    if not distributed:  # a rank may hold no turns; the batch over all ranks is checked in group_stats
        check_nonempty(rewards.shape[0], "rewards")
    layout = episode_layout(ids)

    # 1. Per-turn discounted returns, within each episode: G_t = r_t + gamma * G_{t+1}.
    returns = turn_returns(rewards, layout, gamma)

    # 2. Mean and std over every turn of the batch (all ranks), or of each group of episodes.
    group, stats = turn_stats(returns, layout.row, layout.num_episodes, group_by, "group_by", ddof, stats, distributed, process_group)

    # 3. A_t = (G_t - mean) / (std + eps), with the statistics of the turn's group.
    return back(standardise(returns, group, stats, eps=eps, min_std=min_std))


def group_stats(
    values: np.ndarray, group: np.ndarray, keys: np.ndarray | None, *, ddof: int, distributed: bool = False, process_group: Any = None
) -> NormStats:
    """Count, mean and std of flat float64 `values` per group; `group[i]` is value i's index in `keys`."""
    num_groups = 1 if keys is None else len(keys)
    count = np.bincount(group, minlength=num_groups).astype(np.float64)
    total = np.bincount(group, weights=values, minlength=num_groups)
    if distributed:  # sums over every rank's values
        count, total = np.split(_distributed.all_reduce_sum(np.concatenate([count, total]), process_group), 2)
    check_nonempty(int(count.sum()), "the batch (all ranks)" if distributed else "the batch")
    mean = total / np.maximum(count, 1.0)
    # A second pass around the mean: a large offset shared by every return never cancels a small spread.
    squares = np.bincount(group, weights=(values - mean[group]) ** 2, minlength=num_groups)
    if distributed:
        squares = _distributed.all_reduce_sum(squares, process_group)
    std = np.sqrt(squares / np.maximum(count - ddof, 1.0))  # ddof=1 with one value: 0, a constant group
    return NormStats(keys, count, mean, std, ddof)


def standardise(values: np.ndarray, group: np.ndarray, stats: NormStats, *, eps: float, min_std: float = 0.0, scale: bool = True) -> np.ndarray:
    """(value - mean) / (std + eps) with each value's group statistics (only centred when not `scale`).

    A group whose values are all equal (std within rounding of 0), or whose std <= min_std, gets 0:
    no NaN from 0/0, and no rounding noise blown up into +-1.
    """
    centred = values - stats.mean[group]
    if not scale:
        return centred
    constant = (stats.std <= _CONSTANT_TOLERANCE * np.abs(stats.mean)) | (stats.std <= min_std)
    denominator = np.where(constant, 1.0, stats.std + eps)  # 1.0 only keeps 0/0 out of the maths
    return np.where(constant[group], 0.0, centred / denominator[group])


def normalization_stats(values: Any, keys: Any = None, *, ddof: int = 0, distributed: bool = False, process_group: Any = None) -> NormStats:
    """Per-group (count, mean, std) of flat per-turn `values` (e.g. returns), `keys` one per value.

    With `distributed=True` the statistics cover every rank's values (torch.distributed all-reduce).
    Torch values give float64 tensors on their device.
    """
    ddof = check_ddof(ddof)
    flat = to_numpy(values, np.float64)
    if flat.ndim != 1:
        raise ValueError(f"values must be 1-D (one per turn), got shape {tuple(flat.shape)}")
    check_finite(flat, "values")
    if not distributed:
        check_nonempty(flat.shape[0], "values")
    group, keys = group_codes(keys, flat.shape[0], "keys (one per turn)", distributed, process_group)
    stats = group_stats(flat, group, keys, ddof=ddof, distributed=distributed, process_group=process_group)
    back = result_like(flat, values)  # float64, on the values' device
    return NormStats(stats.keys, back(stats.count), back(stats.mean), back(stats.std), ddof)


def normalize(values: Any, stats: NormStats, keys: Any = None, *, eps: float = 1e-6, scale: bool = True, min_std: float = 0.0) -> Array:
    """Apply precomputed stats: A = (v - mean_g) / (std_g + eps) for each value's group key g.

    Use it to normalise a subsample with statistics of the full batch. A key absent from `stats`
    is an error (its group has no statistics). `min_std`: as in :func:`rebn`.
    """
    eps, min_std = check_eps(eps), check_min_std(min_std)
    flat = to_numpy(values, np.float64)
    check_finite(flat, "values")
    back = result_like(values if is_torch(values) else flat, stats.mean)
    group = codes_in(stats, keys, flat.shape[0], "keys (one per turn)")
    return back(standardise(flat, group, numpy_stats(stats), eps=eps, min_std=min_std, scale=scale))


# ---------------------------------------------------------------------------------------------
# Group keys -> each value's index into the statistics.


def turn_stats(
    returns: np.ndarray,
    episode: np.ndarray,
    num_episodes: int,
    group_by: Any,
    what: str,
    ddof: int,
    stats: NormStats | None,
    distributed: bool,
    process_group: Any,
) -> tuple[np.ndarray, NormStats]:
    """(each turn's group code, numpy statistics): `stats` when given (e.g. of the batch before
    subsampling), else those of these returns. A turn's group is its episode's `group_by` key."""
    if stats is not None:
        return codes_in(stats, group_by, num_episodes, what)[episode], numpy_stats(stats)
    codes, keys = group_codes(group_by, num_episodes, what, distributed, process_group)
    return codes[episode], group_stats(returns, codes[episode], keys, ddof=ddof, distributed=distributed, process_group=process_group)


def group_codes(keys: Any, n: int, what: str, distributed: bool = False, process_group: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(codes, sorted keys) of `n` keys; keys None: all in group 0, keys None. Distributed, the keys
    are the union of every rank's, so group g is the same group on every rank."""
    if keys is None:
        return np.zeros(n, np.int64), None
    codes, uniques = encode_keys(keys, n, what)
    if not distributed:
        return codes, uniques
    every = _distributed.union_keys(uniques, process_group)
    return np.searchsorted(every, uniques)[codes], every


def codes_in(stats: NormStats, keys: Any, n: int, what: str) -> np.ndarray:
    """Each of `n` keys' index in the stats' key table (all zero for whole-batch stats)."""
    if stats.keys is None:
        if keys is not None:
            raise ValueError("these stats were computed over the whole batch (no group keys); pass keys=None")
        return np.zeros(n, dtype=np.int64)
    if keys is None:
        raise ValueError("these stats are per group: pass the group key of every value")
    codes, uniques = encode_keys(keys, n, what)
    position = np.searchsorted(stats.keys, uniques)
    found = (position < len(stats.keys)) & (stats.keys[np.minimum(position, len(stats.keys) - 1)] == uniques)
    if not found.all():
        raise ValueError(f"group keys {uniques[~found][:5].tolist()} have no statistics in `stats`")
    return position[codes]


def numpy_stats(stats: NormStats) -> NormStats:
    """The same statistics as float64 numpy arrays (they may be torch tensors on a device)."""
    return NormStats(stats.keys, *(to_numpy(x, np.float64) for x in (stats.count, stats.mean, stats.std)), stats.ddof)
