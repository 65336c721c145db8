"""ReBN over turns in place of RL2's episode-level REINFORCE: a replacement for RL2's ``compute_advantages``.

RL2's ``compute_advantages`` (``RL2/utils/algorithms.py``; rl-square 0.0.2 and HEAD) sums each
trajectory's rewards for ``adv.estimator=reinforce`` (one advantage for every token of the episode:
gamma unused, no per-turn returns). ``RL2.trainer.ppo`` imports the name into its module and calls it
there at run time (0.0.2: ``compute_advantages(config.adv, tensor_dict, cu_seqs, step)``; HEAD:
``compute_advantages(config, tensor_dict, cu_seqs, step)``), so the launcher replaces
``RL2.trainer.ppo.compute_advantages`` (a :class:`gem_core.plugins.Patch`, reverted exactly) without
forking RL2. ``adv.estimator`` stays ``reinforce``, so RL2 builds no critic.

The replacement first runs RL2's own function unchanged (its checks, logging and, at HEAD, the KL
penalty folded into the rewards), then, for ``reinforce`` with ReBN on, overwrites
``tensor_dict["advantages"]``: per trajectory (the rows ``cu_seqs`` groups: RL2 splits a trajectory
into several sequences when the next state does not extend the text), each turn's reward is what RL2
put on that turn's tokens (its last model token), ``G_t = r_t + gamma * G_{t+1}`` over turns, and
``A_t = (G_t - mean(G)) / (std(G) + eps)`` over every turn of the batch (:func:`gem_core.algo.rebn`),
painted on the turn's action tokens. Every other estimator (``gae``) and ``reinforce`` with
``+adv.rebn=false`` are RL2's own function, untouched.

Settings (hydra keys under ``adv``): ``gamma`` (RL2's own discount; 1.0 by default in RL2's config),
``+adv.rebn_eps`` (1e-6), ``+adv.rebn_ddof`` (0 population std, 1 sample std), ``+adv.rebn_group_by``
(``null``: whole batch; ``prompt``: each prompt's ``responses_per_prompt`` trajectories), ``+adv.rebn``
(true).

Turns: RL2's batch has no turn-id channel (its tensor dicts have fixed keys), so a turn is a run of
``action_mask`` within a sequence row. That is exact for RL2: its action mask comes straight from the
rollout's per-token record and no RL2 path zeroes tokens inside a turn. HEAD's ``kl.type=advantage``
(a KL term subtracted from the advantages after the estimator) is refused with ReBN.

Infrastructure failures (DESIGN.md contract 8): before any estimator runs, every row of a trajectory
the infrastructure failed has no action token and no reward (0.0.2: the env module's reward marker,
turned into that here by :func:`mask_infra_failed`; HEAD: the env module writes the episode so), so
RL2's loss (its token counts come from ``action_mask``) and ReBN's statistics leave it out. RL2's own
``reinforce`` (``+adv.rebn=false``) groups trajectories by position (``rewards.sum(-1).view(-1,
responses_per_prompt)``) whatever the mask, so a failed trajectory's 0 would enter its group's mean and
std (``global_norm``: the batch's): while RL2's function runs, its ``compute_reinforce_adv`` (a second
patch, :func:`make_compute_reinforce_adv`, idle otherwise) runs RL2's own code on each group's healthy
trajectories as a group of their own size (:func:`gem_core.batch.healthy_groups`; ``global_norm``: on
every healthy trajectory), so each gets what it would have had without the failed ones; a failed
trajectory, and a group's only healthy one (RL2's std of one value is NaN), get 0. ``gae`` has no group
baseline (its whitening counts action tokens only). The env module's counts (``gem/infra_failed_episodes``, ``gem/abandoned_episodes``) are logged with RL2's ``wandb.log``
at each step (:func:`log_metrics`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable

import numpy as np

from gem_integrations.rl2 import metrics

ESTIMATOR = "reinforce"  # the RL2 estimator whose advantages ReBN replaces
_FAILED_TRAJECTORIES: ContextVar[np.ndarray | None] = ContextVar("gem_rl2_failed_trajectories", default=None)


def _get(config: Any, name: str, default: Any) -> Any:
    getter = getattr(config, "get", None)
    if getter is not None:
        value = getter(name, default)
    else:
        value = getattr(config, name, default)
    return default if value is None and default is not None else value


def rebn_settings(adv: Any) -> dict[str, Any] | None:
    """ReBN's settings from RL2's ``adv`` config, or None when RL2's own estimator runs."""
    if _get(adv, "estimator", None) != ESTIMATOR or not bool(_get(adv, "rebn", True)):
        return None
    group_by = _get(adv, "rebn_group_by", None)
    if group_by not in (None, "prompt"):
        raise ValueError(f"adv.rebn_group_by must be null or 'prompt', got {group_by!r}")
    return {
        "gamma": float(_get(adv, "gamma", 1.0)),
        "eps": float(_get(adv, "rebn_eps", 1e-6)),
        "ddof": int(_get(adv, "rebn_ddof", 0)),
        "group_by": group_by,
        "responses_per_prompt": int(_get(adv, "responses_per_prompt", 1)),
    }


def turn_rewards(tensor_dict: dict, cu_seqs: Any) -> tuple[list[list[float]], list[list[tuple[int, np.ndarray]]]]:
    """Per trajectory: each turn's reward (the sum of RL2's rewards on its tokens) and where its tokens
    are (row, boolean mask over the row)."""
    from gem_core.algo import turn_ids_from_mask

    mask = tensor_dict["action_mask"].detach().cpu().numpy().astype(bool)
    rewards = tensor_dict["rewards"].detach().to(dtype=_float64(tensor_dict["rewards"])).cpu().numpy()
    turn_ids = np.asarray(turn_ids_from_mask(mask))
    bounds = [int(b) for b in cu_seqs]
    episodes: list[list[float]] = []
    places: list[list[tuple[int, np.ndarray]]] = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        episode: list[float] = []
        where: list[tuple[int, np.ndarray]] = []
        for row in range(start, end):
            for turn in range(int(turn_ids[row].max(initial=-1)) + 1):
                tokens = mask[row] & (turn_ids[row] == turn)
                episode.append(float(rewards[row][tokens].sum()))
                where.append((row, tokens))
        episodes.append(episode)
        places.append(where)
    return episodes, places


def _float64(tensor: Any) -> Any:
    import torch

    return torch.float64


def rebn_advantages(
    tensor_dict: dict, cu_seqs: Any, *, gamma: float, eps: float = 1e-6, ddof: int = 0, group_by: str | None = None, responses_per_prompt: int = 1
) -> Any:
    """ReBN advantages for RL2's packed batch, shaped like ``tensor_dict["states"]`` (0 off the action tokens)."""
    import torch

    from gem_core.algo import rebn

    episodes, places = turn_rewards(tensor_dict, cu_seqs)
    keys = None
    if group_by == "prompt":  # one key per episode with a turn (rebn skips the empty ones)
        keys = [i // max(responses_per_prompt, 1) for i, e in enumerate(episodes) if e]
    flat = np.asarray(rebn(episodes, gamma=gamma, eps=eps, ddof=ddof, group_by=keys), dtype=np.float64) if any(episodes) else np.zeros(0)
    out = np.zeros(tuple(tensor_dict["states"].shape), dtype=np.float64)
    index = 0
    for where in places:
        for row, tokens in where:
            out[row][tokens] = flat[index]
            index += 1
    return torch.from_numpy(out).to(torch.zeros(()).dtype)


def mask_infra_failed(tensor_dict: dict, cu_seqs: Any) -> np.ndarray:
    """Every row of a trajectory whose rewards hold :data:`~gem_integrations.rl2.metrics.INFRA_REWARD`
    (rl-square 0.0.2's marker of an infra-failed episode) loses its actions and rewards (``action_mask``
    and ``rewards`` 0), so no loss term, ReBN statistic or whitening sees it. Returns which trajectories
    (one bool each, in ``cu_seqs`` order)."""
    import torch

    marked = torch.isnan(tensor_dict["rewards"]).any(-1)
    bounds = [int(b) for b in cu_seqs]
    failed = np.zeros(max(len(bounds) - 1, 0), dtype=bool)
    for trajectory, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if bool(marked[start:end].any()):
            tensor_dict["action_mask"][start:end] = 0
            tensor_dict["rewards"][start:end] = 0
            failed[trajectory] = True
    return failed


@contextmanager
def failed_trajectories(failed: np.ndarray) -> Iterator[None]:
    """Mark the batch's infra-failed trajectories while the block runs (RL2's advantage step), for
    :func:`make_compute_reinforce_adv`."""
    token = _FAILED_TRAJECTORIES.set(np.asarray(failed, dtype=bool))
    try:
        yield
    finally:
        _FAILED_TRAJECTORIES.reset(token)


def make_compute_reinforce_adv(original: Callable[..., Any]) -> Callable[..., Any]:
    """RL2's ``compute_reinforce_adv(tensor_dict, responses_per_prompt, global_norm, norm_var)`` (one row
    per trajectory) that, when :func:`failed_trajectories` marks some rows, runs RL2's own function on the
    healthy rows alone: per group, as a group of the size it keeps (``global_norm``: all of them at once);
    failed rows and a group's lone healthy row get 0. Nothing marked: RL2's function as it is."""

    def compute_reinforce_adv(tensor_dict: dict, responses_per_prompt: int, global_norm: bool, norm_var: bool, *args: Any, **kwargs: Any) -> Any:
        import torch

        from gem_core.batch import healthy_groups, healthy_rows

        failed = _FAILED_TRAJECTORIES.get()
        if failed is None or not failed.any():
            return original(tensor_dict, responses_per_prompt, global_norm, norm_var, *args, **kwargs)
        mask = tensor_dict["action_mask"]
        if mask.shape[0] != failed.size:
            raise ValueError(f"gem: RL2 computes advantages over {mask.shape[0]} rows for {failed.size} trajectories; cannot leave the infra-failed ones out")
        advantages = torch.zeros(mask.shape, dtype=torch.promote_types(tensor_dict["rewards"].dtype, mask.dtype))

        def healthy(rows: np.ndarray, group_size: int, whole_batch: bool) -> None:
            index = torch.as_tensor(rows.reshape(-1))
            part = {key: value[index] for key, value in tensor_dict.items()}
            advantages[index] = original(part, group_size, whole_batch, norm_var, *args, **kwargs)["advantages"].to(advantages.dtype)

        if global_norm:
            keep = healthy_rows(failed)
            if keep.size > 1:  # a lone healthy trajectory: nothing to normalise against, 0
                healthy(keep, 1, True)
        else:
            for size, rows in healthy_groups(failed, int(responses_per_prompt)).items():
                if size > 1:
                    healthy(rows, size, False)
        return {"advantages": advantages}

    compute_reinforce_adv.__wrapped__ = original  # type: ignore[attr-defined]
    return compute_reinforce_adv


def log_metrics(step: int) -> dict[str, float]:
    """The env module's counts since the last step (:func:`gem_integrations.rl2.metrics.pop`), logged
    with RL2's own logger (``wandb.log``) at ``step``; returned too."""
    import wandb

    counts = metrics.pop()
    wandb.log(counts, step=step)
    return counts


def make_compute_advantages(original: Callable[..., Any]) -> Callable[..., Any]:
    """The patch's replacement for ``RL2.trainer.ppo.compute_advantages`` (0.0.2's and HEAD's signature)."""

    def compute_advantages(config: Any, tensor_dict: dict, cu_seqs: Any, step: int) -> Any:
        whole = _get(config, "adv", None) is not None  # HEAD passes the whole config, 0.0.2 config.adv
        adv = config.adv if whole else config
        settings = rebn_settings(adv)
        if settings is not None and whole:
            kl = config.actor.kl
            if float(_get(kl, "coef", 0.0)) > 0 and _get(kl, "type", None) == "advantage":
                raise ValueError("ReBN with actor.kl.type=advantage is not supported (use kl.type=reward or loss)")
        with failed_trajectories(mask_infra_failed(tensor_dict, cu_seqs)):
            result = original(config, tensor_dict, cu_seqs, step)
        if settings is not None:
            tensor_dict["advantages"] = rebn_advantages(tensor_dict, cu_seqs, **settings)
        log_metrics(step)
        return result

    compute_advantages.__wrapped__ = original  # type: ignore[attr-defined]
    compute_advantages.__doc__ = "RL2's compute_advantages with ReBN over turns for adv.estimator=reinforce (gem_integrations.rl2)."
    return compute_advantages
