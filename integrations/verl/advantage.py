"""``rebn`` and ``gem_reinforce`` as verl advantage estimators (``algorithm.adv_estimator=rebn``).

verl calls an estimator as ``fn(token_level_rewards=..., response_mask=..., config=algorithm_config,
index=uid)`` on the driver, over the whole training batch, and reads back ``(advantages, returns)``.

How per-turn rewards get here: one row per episode (verl's agent-loop sequence view). The ``gem_env``
agent loop puts each turn's reward on that turn's last model token in ``rm_scores``, which verl copies to
``token_level_scores`` -> ``token_level_rewards`` unchanged (KL-in-reward, if on, adds per-token terms).

How turns get here (explicit, DESIGN.md contract 6): the agent loop also stores each token's turn index
in the field :data:`TURN_IDS_FIELD` (the turn on its model tokens and on the env tokens after them). verl 0.9's v1
trainer reads a fixed field list from TransferQueue in ``PPOTrainer._compute_advantage`` and
``compute_advantage`` hands an estimator only rewards, mask, config, index and baselines, so the plugin
wraps ``_compute_advantage`` (:func:`wrap_compute_advantage`, a :class:`gem_core.plugins.Patch`): for the
gem estimators only, it reads :data:`TURN_IDS_FIELD` for the same keys, pads it as verl pads the batch
(``-1``) and makes it the batch's turn ids (:func:`batch_turn_ids`) while verl's own step runs; the
estimator gives them to :func:`gem_core.algo.rebn_token_level`. So verl's token-level rollout rejection
(``rollout_rs=token_k*``, which zeroes single mask tokens before the estimator) never splits a turn.

Rows that carry no turns (:func:`row_turn_ids`): verl's ``_balance_batch`` pads a batch that the
data-parallel size or the PPO mini-batch does not divide with synthetic rows copied from row 0 (tag
``is_padding``, a one-token masked response, zero ``rm_scores``) that keep row 0's turn ids; they get
none, so they add nothing to ReBN's statistics (``gem/padding_rows`` counts them).

Episodes the infrastructure failed (the engine aborted a request, a sandbox or env worker died:
``Trajectory.infra_error``, DESIGN.md contract 8) come from the loop with mask 0, zero rewards, turn ids
-1 and their reason in :data:`INFRA_FIELD`. Mask 0 keeps them out of the loss, but verl's group
estimators (GRPO, RLOO, OPO, GPG, ...) sum ``token_level_rewards`` per row and group rows by uid whatever
the mask, so a failed row's 0 would enter its group's baseline (three solved episodes and a dead sandbox:
GRPO +0.5 each instead of 0). So, for every estimator, the wrapper reads :data:`INFRA_FIELD`, counts the
failures in the step's metrics (``gem/infra_failed_episodes``, ``gem/infra_failed_fraction``) and marks
their keys (:func:`failed_rows`) while verl's step runs; the second patch,
:func:`wrap_multi_trajectory_advantage` around verl's ``compute_advantage_for_multi_trajectories`` (the
step's estimator call), hands verl's estimator the healthy rows alone (:func:`gem_core.batch.healthy_rows`)
and gives the failed rows advantages and returns 0. Every estimator in verl's registry then gives each healthy row what it would
have given had the failed episode never been played (group statistics, leave-one-out, batch whitening,
GPG's batch factor alike); verl's own singleton rules apply to a group left with one row (GRPO: mean 0,
std 1; RLOO: the score itself), except where verl refuses a group of one (``grpo_passk``): that row gets 0.

Fallback (documented, not silent): a batch without turn ids (rows from another agent loop, or the
estimator called directly) has its turns found as the runs of 1s in ``response_mask``; the wrapper
then reports ``gem/turn_ids_from_mask=1`` in the step's metrics.

Options come from the ``algorithm`` config (add them with ``+algorithm.rebn_gamma=0.9`` etc.):
``rebn_gamma`` (default: ``algorithm.gamma``), ``rebn_eps`` (1e-6), ``rebn_ddof`` (0: population std,
as oat; 1: sample std, as ROLL), ``rebn_group_by`` (``null``/``batch``: whole batch, ReBN's default;
``uid``: per prompt group, i.e. verl's ``index``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: The agent loop's per-token turn ids, as stored in TransferQueue next to ``response_mask``.
TURN_IDS_FIELD = "gem_turn_ids"
#: The agent loop's per-row infrastructure failure (``Trajectory.infra_error``; "" when none).
INFRA_FIELD = "gem_infra_error"
#: The agent loop's per-row outcome (``Trajectory.success``: the env's ``info["success"]`` on the last turn), 1.0 or 0.0.
SUCCESS_FIELD = "gem_success"
#: The tag verl's ``_balance_batch`` puts on the synthetic rows it pads a batch with.
PADDING_TAG = "is_padding"
_BATCH_TURN_IDS: ContextVar[Any] = ContextVar("gem_verl_batch_turn_ids", default=None)
_FAILED_KEYS: ContextVar[frozenset[str]] = ContextVar("gem_verl_failed_keys", default=frozenset())

REBN = "rebn"
GEM_REINFORCE = "gem_reinforce"
_GROUPINGS = (None, "batch", "uid")


def _option(config: Any, name: str, default: Any) -> Any:
    """``config.<name>`` for a DictConfig, a dict, a verl BaseConfig dataclass, or None."""
    if config is None:
        return default
    getter = getattr(config, "get", None)
    if callable(getter):
        try:
            value = getter(name, default)
        except Exception:  # a dataclass whose .get does not take a default
            value = getattr(config, name, default)
    else:
        value = getattr(config, name, default)
    return default if value is None else value


def rebn_options(config: Any) -> dict[str, Any]:
    """The ReBN settings read from verl's ``algorithm`` config (see the module docstring)."""
    gamma = _option(config, "rebn_gamma", _option(config, "gamma", 1.0))
    group_by = _option(config, "rebn_group_by", None)
    if isinstance(group_by, str) and group_by.lower() in ("none", "null", ""):
        group_by = None
    if group_by not in _GROUPINGS:
        raise ValueError(f"algorithm.rebn_group_by must be one of null, 'batch', 'uid'; got {group_by!r}")
    return {
        "gamma": float(gamma),
        "eps": float(_option(config, "rebn_eps", 1e-6)),
        "ddof": int(_option(config, "rebn_ddof", 0)),
        "group_by": group_by,
    }


def _groups(group_by: str | None, index: Any, batch: int) -> Any:
    if group_by in (None, "batch"):
        return None
    if index is None:
        raise ValueError("algorithm.rebn_group_by='uid' needs verl's uid index, which this batch lacks")
    keys = np.asarray(index, dtype=object)
    if keys.shape[0] != batch:
        raise ValueError(f"index has {keys.shape[0]} entries for a batch of {batch}")
    return [str(k) for k in keys]


@contextmanager
def batch_turn_ids(turn_ids: Any) -> Iterator[None]:
    """Make ``turn_ids`` ((batch, response_length), -1 where no turn) the turn ids the gem estimators use
    while the block runs (how :func:`wrap_compute_advantage` hands them through verl's own step)."""
    token = _BATCH_TURN_IDS.set(turn_ids)
    try:
        yield
    finally:
        _BATCH_TURN_IDS.reset(token)


def _turn_ids(turn_ids: Any, token_level_rewards: Any) -> Any:
    """The explicit turn ids for this call: the ``turn_ids`` argument, else the batch's
    (:func:`batch_turn_ids`), else None (mask-run fallback). A shape that does not match the rewards is
    an error, never a silent fallback."""
    if turn_ids is None:
        turn_ids = _BATCH_TURN_IDS.get()
    if turn_ids is None:
        return None
    if tuple(turn_ids.shape) != tuple(token_level_rewards.shape):
        raise ValueError(f"turn ids of shape {tuple(turn_ids.shape)} for token_level_rewards of shape {tuple(token_level_rewards.shape)}")
    return turn_ids


def _rebn(token_level_rewards: Any, response_mask: Any, index: Any, config: Any, turn_ids: Any, *, grouped: bool) -> tuple[Any, Any]:
    from gem_core.algo import rebn_token_level

    options = rebn_options(config)
    grouping = options.pop("group_by")
    group_by = _groups(grouping, index, int(token_level_rewards.shape[0])) if grouped else None
    turns = _turn_ids(turn_ids, token_level_rewards)
    return rebn_token_level(token_level_rewards, response_mask, group_by, turn_ids=turns, return_returns=True, **options)


def compute_rebn_advantage(
    token_level_rewards: Any, response_mask: Any, index: Any = None, config: Any = None, turn_ids: Any = None, **kwargs: Any
) -> tuple[Any, Any]:
    """ReBN for verl: per-turn returns over turns, normalised over every turn of the batch.

    Returns ``(advantages, returns)``, both (batch, response_length), the turn's value on each of its
    model tokens (``response_mask`` 1) and 0 elsewhere. Turns: ``turn_ids`` or the batch's (see the module
    docstring), else the runs of ``response_mask``. Extra keyword arguments verl may pass
    (``reward_baselines``) are ignored.
    """
    return _rebn(token_level_rewards, response_mask, index, config, turn_ids, grouped=True)


def compute_gem_reinforce_advantage(
    token_level_rewards: Any, response_mask: Any, index: Any = None, config: Any = None, turn_ids: Any = None, **kwargs: Any
) -> tuple[Any, Any]:
    """The ablation: per-turn discounted returns as advantages, no normalisation (``rebn_gamma``)."""
    _, returns = _rebn(token_level_rewards, response_mask, index, config, turn_ids, grouped=False)
    return returns, returns


ESTIMATORS = {REBN: compute_rebn_advantage, GEM_REINFORCE: compute_gem_reinforce_advantage}


def register_estimators() -> None:
    """Add ``rebn`` and ``gem_reinforce`` to verl's advantage registry (idempotent)."""
    from verl.trainer.ppo import core_algos

    for name, fn in ESTIMATORS.items():
        if core_algos.ADV_ESTIMATOR_REGISTRY.get(name) is not fn:
            core_algos.register_adv_est(name)(fn)


# ------------------------------------------------------------------------------------------------
# verl's v1 trainer: turn ids into its advantage step; configurations that would lose per-turn rewards.
# ------------------------------------------------------------------------------------------------


def check_trainer_config(config: Any) -> None:
    """Refuse, with the reason, configurations where the gem estimators would not see per-turn rewards.

    * ``trainer.use_v1=False``: the legacy trainer keeps one reward per row.
    * ``reward.reward_model.enable=True``: a co-located reward model writes its own ``rm_scores`` over the
      per-turn ones (``PPOTrainer._compute_reward_colocate``); a streaming one is never asked for rows
      that carry a score. Either way the reward model's score or the env's turns would be dropped silently.
    """
    algorithm = _option(config, "algorithm", None)
    estimator = _option(algorithm, "adv_estimator", None)
    if estimator not in ESTIMATORS:
        return
    trainer = _option(config, "trainer", None)
    if not _option(trainer, "use_v1", True):
        raise ValueError(
            f"algorithm.adv_estimator={estimator} needs per-turn rewards, which only verl's v1 trainer "
            "(trainer.use_v1=True) stores; the legacy trainer keeps one reward per row"
        )
    reward_model = _option(_option(config, "reward", None), "reward_model", None)
    if _option(reward_model, "enable", False):
        raise ValueError(
            f"algorithm.adv_estimator={estimator} takes each turn's reward from the gem_env agent loop (rm_scores); "
            "with reward.reward_model.enable=True verl's reward model would overwrite them (co-located) or never "
            "score the episodes (streaming). Disable the reward model, or make its score part of the env's reward."
        )


def row_turn_ids(turn_ids: Sequence[Any], response_lengths: Sequence[int], padding: Sequence[bool]) -> tuple[Any, int]:
    """The batch's turn ids, (rows, longest response), -1 where a token is in no turn, and how many real
    rows were given none because their stored ids do not match their response.

    A row's stored ids count only where the row is the gem_env loop's own episode: verl's padding rows
    (``is_padding``, added by ``_balance_batch`` as copies of row 0 with a one-token, masked response) keep
    row 0's :data:`TURN_IDS_FIELD`, and counting those turns would add row 0's turns with return 0 to
    ReBN's statistics once per padding row. A row whose ids are not one per response token was not
    written by the loop for that response either: it gets none too (logged; a row that still carries
    model tokens or rewards then fails in the estimator with the reason)."""
    import torch

    if not (len(turn_ids) == len(response_lengths) == len(padding)):
        raise ValueError(f"{len(turn_ids)} rows of turn ids for {len(response_lengths)} responses and {len(padding)} tags")
    width = max((int(n) for n in response_lengths), default=0)
    out = torch.full((len(turn_ids), width), -1, dtype=torch.int64)
    mismatched = 0
    for row, (ids, length, is_padding) in enumerate(zip(turn_ids, response_lengths, padding)):
        if is_padding:
            continue
        ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        if ids.numel() != int(length):
            mismatched += 1
            logger.warning(
                "gem: row %d has %d turn ids for a response of %d tokens (not the gem_env loop's row); it gets no turns",
                row,
                ids.numel(),
                int(length),
            )
            continue
        out[row, : int(length)] = ids
    return out, mismatched


def _rows(field: Any) -> list[Any]:
    """One entry per row of a TransferQueue field: a tensor's rows (nested or padded), or a non-tensor
    stack's values."""
    import torch

    if isinstance(field, torch.Tensor):
        return list(field.unbind(0))
    return list(field.tolist()) if hasattr(field, "tolist") else list(field)


def fetch_gem_fields(batch: Any, *, turn_ids: bool = True) -> tuple[Any, dict[str, float], frozenset[str]]:
    """What the gem_env loop stored for the TransferQueue rows ``batch`` (a ``KVBatchMeta``) names: their
    turn ids (:func:`row_turn_ids`, padding rows left out by verl's ``is_padding`` tag; None when the rows
    carry none, or ``turn_ids=False``), the step's ``gem/*`` metrics (``gem/success_rate``: the share of the
    batch's episodes, padding and infra-failed rows left out, that the env scored a success, from
    :data:`SUCCESS_FIELD`) and the keys of the episodes the
    infrastructure failed (:data:`INFRA_FIELD`; padding rows, copies of row 0, neither counted nor marked:
    they are verl's, under a uid of their own)."""
    import transfer_queue as tq

    tags = list(getattr(batch, "tags", None) or [{} for _ in batch.keys])
    padding = [bool((tag or {}).get(PADDING_TAG, False)) for tag in tags]
    real = len(padding) - sum(padding)
    metrics = {"gem/padding_rows": float(sum(padding))}
    ids = None
    if turn_ids:
        try:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=[TURN_IDS_FIELD, "response_mask"])
            stored, masks = _rows(data[TURN_IDS_FIELD]), _rows(data["response_mask"])
        except Exception as exc:  # rows written by another agent loop: no such field
            logger.warning("gem: no %s in this batch (%s); rebn finds turns from response_mask runs", TURN_IDS_FIELD, exc)
        else:
            ids, mismatched = row_turn_ids(stored, [len(m) for m in masks], padding)
            metrics["gem/rows_without_turn_ids"] = float(mismatched)
    try:
        reasons = _rows(tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=[INFRA_FIELD])[INFRA_FIELD])
    except Exception:  # rows from another agent loop carry no flag
        reasons = [""] * len(padding)
    failed = frozenset(key for key, reason, is_padding in zip(batch.keys, reasons, padding) if reason and not is_padding)
    metrics["gem/infra_failed_episodes"] = float(len(failed))
    metrics["gem/infra_failed_fraction"] = len(failed) / max(real, 1)
    try:
        outcomes = _rows(tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=[SUCCESS_FIELD])[SUCCESS_FIELD])
    except Exception:  # rows from another agent loop carry no outcome: no success rate
        pass
    else:
        # the batch's episodes the infrastructure let finish (TRL's gem/success_rate, gem-core train's success_rate)
        played = [float(outcome) for key, outcome, is_padding in zip(batch.keys, outcomes, padding) if not is_padding and key not in failed]
        if played:
            metrics["gem/success_rate"] = sum(played) / len(played)
    return ids, metrics, failed


@contextmanager
def failed_rows(keys: Any) -> Iterator[None]:
    """Mark the TransferQueue ``keys`` of infra-failed episodes while the block runs (how
    :func:`wrap_compute_advantage` tells :func:`wrap_multi_trajectory_advantage` which rows to leave out)."""
    token = _FAILED_KEYS.set(frozenset(keys))
    try:
        yield
    finally:
        _FAILED_KEYS.reset(token)


def wrap_compute_advantage(original: Any) -> Any:
    """``PPOTrainer._compute_advantage`` that runs verl's own step with the batch's infra-failed rows
    marked (:func:`failed_rows`, for every estimator) and, for the gem estimators, its explicit turn ids
    (:func:`batch_turn_ids`); the ``gem/*`` metrics join the step's (see :func:`fetch_gem_fields`)."""

    @functools.wraps(original)
    def _compute_advantage(self: Any, batch: Any, metrics: dict) -> Any:
        gem_estimator = self.config.algorithm.adv_estimator in ESTIMATORS
        turn_ids, gem_metrics, failed = fetch_gem_fields(batch, turn_ids=gem_estimator)
        metrics.update(gem_metrics)
        if gem_estimator:
            metrics["gem/turn_ids_from_mask"] = float(turn_ids is None)
        with failed_rows(failed), batch_turn_ids(turn_ids):
            return original(self, batch, metrics)

    return _compute_advantage


#: verl estimators that refuse a uid group of one row (``grpo_passk``: "Pass@k requires at least 2 samples
#: per group"): a group its failed rows leave with one healthy row gets 0 there, not a crashed step.
NEEDS_TWO_PER_GROUP = ("grpo_passk",)


def wrap_multi_trajectory_advantage(original: Any) -> Any:
    """verl's ``compute_advantage_for_multi_trajectories(data, batch_keys, adv_estimator, ...)`` (the v1
    step's estimator call) run on the healthy rows alone when :func:`failed_rows` marks some of
    ``batch_keys``: the failed rows get advantages and returns 0 and are in no estimator's statistics, the
    others get what verl's estimator gives the batch without them. Nothing marked: verl's call as it is."""

    @functools.wraps(original)
    def compute_advantage_for_multi_trajectories(data: Any, batch_keys: Sequence[str], *args: Any, **kwargs: Any) -> Any:
        import torch

        from gem_core.batch import healthy_rows

        failed = _FAILED_KEYS.get()
        keys = list(batch_keys)
        if len(keys) != len(data):
            raise ValueError(f"{len(keys)} batch keys for {len(data)} rows")
        dead = np.asarray([key in failed for key in keys], dtype=bool)
        if not dead.any():
            return original(data, batch_keys, *args, **kwargs)
        estimator = kwargs.get("adv_estimator", args[0] if args else None)
        uids = data.non_tensor_batch.get("uid") if str(getattr(estimator, "value", estimator)) in NEEDS_TWO_PER_GROUP else None
        keep = healthy_rows(dead, None if uids is None else [str(u) for u in uids])
        shape = tuple(data.batch["token_level_rewards"].shape)
        advantages = torch.zeros(shape, dtype=torch.float32)
        returns = torch.zeros(shape, dtype=torch.float32)
        if keep.size:
            turn_ids = _BATCH_TURN_IDS.get()
            with batch_turn_ids(None if turn_ids is None else turn_ids[torch.as_tensor(keep)]):
                healthy = original(data.select_idxs(keep), [keys[i] for i in keep], *args, **kwargs)
            if len(healthy) != keep.size:  # e.g. a reweighting step that resamples rows: cannot be put back
                raise ValueError(f"verl's advantage step returned {len(healthy)} rows for {keep.size}; the infra-failed rows cannot be left out")
            advantages = advantages.to(healthy.batch["advantages"].dtype)
            returns = returns.to(healthy.batch["returns"].dtype)
            index = torch.as_tensor(keep)
            advantages[index] = healthy.batch["advantages"].to(advantages.device)
            returns[index] = healthy.batch["returns"].to(returns.device)
        device = data.batch["token_level_rewards"].device
        data.batch["advantages"] = advantages.to(device)
        data.batch["returns"] = returns.to(device)
        return data

    return compute_advantage_for_multi_trajectories


def wrap_trainer_init(original: Any) -> Any:
    """``PPOTrainer.__init__`` that first refuses configurations losing per-turn rewards
    (:func:`check_trainer_config`), so a run stops at start-up, not after its first rollout."""

    @functools.wraps(original)
    def __init__(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        check_trainer_config(config)
        original(self, config, *args, **kwargs)

    return __init__
