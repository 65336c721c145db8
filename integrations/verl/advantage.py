"""``rebn`` and ``gem_reinforce`` as verl advantage estimators (``algorithm.adv_estimator=rebn``).

verl calls an estimator as ``fn(token_level_rewards=..., response_mask=..., config=algorithm_config,
index=uid)`` on the driver, over the whole training batch, and reads back ``(advantages, returns)``.

How per-turn rewards get here: one row per episode (verl's agent-loop sequence view). The ``gem_env``
agent loop puts each turn's reward on that turn's last model token in ``rm_scores``, which verl copies to
``token_level_scores`` -> ``token_level_rewards`` unchanged (KL-in-reward, if on, adds per-token terms).
Turns are then the runs of 1s in ``response_mask`` (verl's mask is 0 on the env/template tokens between
turns), so :func:`gem_core.algo.rebn_token_level` recovers per-turn rewards without any side channel.
verl 0.9's advantage call passes no ``non_tensor_batch``, so turn ids in ``extra_fields`` could not reach
an estimator; the mask already carries the same information.

Options come from the ``algorithm`` config (add them with ``+algorithm.rebn_gamma=0.9`` etc.):
``rebn_gamma`` (default: ``algorithm.gamma``), ``rebn_eps`` (1e-6), ``rebn_ddof`` (0: population std,
as oat; 1: sample std, as ROLL), ``rebn_group_by`` (``null``/``batch``: whole batch, ReBN's default;
``uid``: per prompt group, i.e. verl's ``index``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

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


def compute_rebn_advantage(
    token_level_rewards: Any,
    response_mask: Any,
    index: Any = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """ReBN for verl: per-turn returns over turns, normalised over every turn of the batch.

    Returns ``(advantages, returns)``, both (batch, response_length), the turn's value on each of its
    model tokens and 0 elsewhere. Extra keyword arguments verl may pass (``reward_baselines``) are ignored.
    """
    from gem_core.algo import rebn_token_level

    options = rebn_options(config)
    group_by = _groups(options.pop("group_by"), index, int(token_level_rewards.shape[0]))
    advantages, returns = rebn_token_level(token_level_rewards, response_mask, group_by, return_returns=True, **options)
    return advantages, returns


def compute_gem_reinforce_advantage(
    token_level_rewards: Any,
    response_mask: Any,
    index: Any = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """The ablation: per-turn discounted returns as advantages, no normalisation (``rebn_gamma``)."""
    from gem_core.algo import rebn_token_level

    options = rebn_options(config)
    _, returns = rebn_token_level(
        token_level_rewards, response_mask, gamma=options["gamma"], eps=options["eps"], ddof=options["ddof"], return_returns=True
    )
    return returns, returns


ESTIMATORS = {REBN: compute_rebn_advantage, GEM_REINFORCE: compute_gem_reinforce_advantage}


def register_estimators() -> None:
    """Add ``rebn`` and ``gem_reinforce`` to verl's advantage registry (idempotent)."""
    from verl.trainer.ppo import core_algos

    for name, fn in ESTIMATORS.items():
        if core_algos.ADV_ESTIMATOR_REGISTRY.get(name) is not fn:
            core_algos.register_adv_est(name)(fn)
