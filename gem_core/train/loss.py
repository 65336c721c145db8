"""The reference trainer's math, readable top to bottom: the advantages of a batch (the estimator registry,
:mod:`gem_core.algo.estimators`), the training rows of the turn-aware batch (each model token its turn's advantage
and the log-prob it was sampled with), the log-probs of a model at those tokens, the micro- and mini-batches, and
the loss (PPO-clipped policy gradient, KL to a reference, an entropy bonus)::

    advantages = estimate(batch.episode_rewards())          # one per turn, gem_core.algo
    rows = rows_of(batch, batch.per_token(advantages))      # prompt + response, targets, advantages, old log-probs
    loss = policy_loss(token_logprobs(model, rows), rows)   # -min(r A, clip(r) A) + kl_coef KL, a token mean

:class:`gem_core.train.trainer.Trainer` calls these in that order; the plugins are tested against them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gem_core import algo
from gem_core.batch import TokenBatch, sequence_batch, turn_batch
from gem_core.experiment import KL_SCHEDULES
from gem_core.rollout import Trajectory
from gem_core.rollout.policies import takes_logits_to_keep
from gem_core.train.decoder import FrozenBottom, decoder_hidden_states, top_hidden_states

# ------------------------------------------------------------------------------------------------
# Advantages: one value per turn, from the project's estimators.
# ------------------------------------------------------------------------------------------------


def kl_coef_at(kl_coef: float, schedule: str, step: int, steps: int, final: float = 0.0) -> float:
    """The KL coefficient of update ``step`` (0-based) of ``steps``: ``kl_coef`` throughout (``constant``), or
    ``final + (kl_coef - final) * (1 - step / steps)`` (``linear``: ``kl_coef`` at the first update, falling to
    ``final`` after the last). A linear fall lets the KL hold the policy near its start while it is learning what
    the rewards say, then lets it sharpen: KL(ref || pi), the direction of the k3 loss, keeps probability on every
    move the start policy plays, which a sampled evaluation pays for. A ``final`` above 0 keeps a pull back to the
    start to the end: once every episode of a batch earns the same reward (all advantages 0, as after a collapse
    to unreadable answers) the KL is the only gradient left."""
    if schedule == "constant" or kl_coef == 0:
        return kl_coef
    if schedule == "linear":
        return final + (kl_coef - final) * max(0.0, 1.0 - step / max(steps, 1))
    raise ValueError(f"kl_schedule must be one of {', '.join(KL_SCHEDULES)}, got {schedule!r}")


def turn_advantages(trajectories: Sequence[Trajectory], estimator: str, gamma: float, group_size: int = 1) -> list[list[float]]:
    """Per-turn advantages of a batch of trajectories (one list per trajectory), by ``estimator``
    (:func:`estimate`)."""
    rewards = [t.rewards for t in trajectories]
    flat = estimate(rewards, [t.group_id for t in trajectories], estimator, gamma)
    out, start = [], 0
    for episode in rewards:
        out.append(flat[start : start + len(episode)].tolist())
        start += len(episode)
    return out


def estimate(rewards: Sequence[Sequence[float]], groups: Sequence[Any], estimator: str, gamma: float) -> np.ndarray:
    """One advantage per turn (flat, episodes in order) from each episode's per-turn rewards and group, by the
    estimator registry (:mod:`gem_core.algo.estimators`: rebn, reinforce, grpo, drgrpo, rloo, each stated there).

    rebn: A_t = (G_t - mean(G)) / (std(G) + eps) over every turn of the batch (population std, eps 1e-6)."""
    return algo.estimate(rewards, groups, estimator, gamma)


# ------------------------------------------------------------------------------------------------
# Training rows and the loss.
# ------------------------------------------------------------------------------------------------


@dataclass
class Rows:
    """Padded training rows: ``input_ids`` (prompt + response), ``targets`` (the token predicted at
    each position, -100 where no loss), ``advantages`` and ``old_logprobs`` per target position."""

    input_ids: Any
    attention: Any
    targets: Any
    advantages: Any
    old_logprobs: Any

    def to(self, device: Any) -> Rows:
        """The same rows on ``device`` (built on the CPU; the model may be on a GPU)."""
        return Rows(*(getattr(self, name).to(device) for name in ("input_ids", "attention", "targets", "advantages", "old_logprobs")))


def training_rows(trajectories: Sequence[Trajectory], advantages: Sequence[Sequence[float]], view: str, pad_id: int) -> Rows:
    """The rows of one update from trajectories and their per-turn advantages (one list per trajectory):
    :func:`batch_of` the trajectories, then :func:`rows_of` the batch."""
    usable = [(t, a) for t, a in zip(trajectories, advantages) if t.turns]
    batch = batch_of([t for t, _ in usable], view)
    return rows_of(batch, batch.per_token([value for _, values in usable for value in values]), pad_id)


def batch_of(trajectories: Sequence[Trajectory], view: str) -> TokenBatch:
    """The turn-aware batch of an update (:mod:`gem_core.batch`). ``turn``: one row per turn (the context
    at the turn's start, then its response). ``sequence``: one row per episode (the first prompt, then
    every response and observation; environment tokens carry no loss)."""
    return turn_batch(trajectories) if view == "turn" else sequence_batch(trajectories)


def rows_of(batch: TokenBatch, token_advantages: np.ndarray, pad_id: int) -> Rows:
    """Padded training rows: each row's prompt then its response; every model token a target with its
    advantage (``token_advantages``, (rows, length) as :meth:`TokenBatch.per_token` gives) and the
    logprob the rollout sampled it with."""
    import torch

    lengths = [len(p) + n for p, n in zip(batch.prompt_ids, batch.lengths)]
    width = max(lengths)
    count = len(batch)
    input_ids = torch.full((count, width), pad_id, dtype=torch.long)
    attention = torch.zeros((count, width), dtype=torch.long)
    targets = torch.full((count, width), -100, dtype=torch.long)
    adv = torch.zeros((count, width), dtype=torch.float32)
    old = torch.zeros((count, width), dtype=torch.float32)
    for i in range(count):
        prompt = batch.prompt_ids[i]
        n = batch.lengths[i]
        response = batch.response_ids[i, :n]
        p = len(prompt)
        input_ids[i, :p] = torch.tensor(prompt, dtype=torch.long)
        input_ids[i, p : p + n] = torch.from_numpy(response)
        attention[i, : p + n] = 1
        # position j predicts token j + 1: the response token at p + k is predicted at p + k - 1
        model_tokens = batch.loss_mask[i, :n].astype(bool)
        positions = torch.arange(p - 1, p - 1 + n)[torch.from_numpy(model_tokens)]
        targets[i, positions] = torch.from_numpy(response[model_tokens])
        adv[i, positions] = torch.from_numpy(token_advantages[i, :n][model_tokens]).float()
        if batch.logprobs is not None:
            old[i, positions] = torch.from_numpy(batch.logprobs[i, :n][model_tokens]).float()
    return Rows(input_ids, attention, targets, adv, old)


def token_logprobs(
    model: Any,
    rows: Rows,
    temperature: float = 1.0,
    *,
    with_entropy: bool = False,
    chunk_tokens: int = 1024,
    share_prefix: bool = True,
    bottom: FrozenBottom | None = None,
) -> Any:
    """log pi(target | prefix) at every position (0 where there is no target); with ``with_entropy``,
    also the entropy of pi(. | prefix), as ``(logprobs, entropy)`` (0 where there is no target).

    Full-vocabulary logits (49k wide for a real model) at every position of a batch are what runs a
    real model out of memory. Where the model is a decoder followed by a plain output layer
    (:func:`output_layer`), the decoder's hidden states are taken at the target positions only and
    the vocabulary is reached ``chunk_tokens`` positions at a time, each chunk recomputed in the
    backward pass rather than kept: at most ``chunk_tokens`` x vocabulary logits exist at once. Other
    models get logits at the columns that hold a target (``logits_to_keep`` where the forward takes it).
    Both give the numbers of the full softmax (tested). ``share_prefix``: the rows' common prefix runs
    once (:func:`~gem_core.train.decoder.decoder_hidden_states`). ``bottom``: the rows' hidden states after the
    model's frozen lower layers, already computed (:func:`~gem_core.train.decoder.frozen_bottom`): only the
    layers above run (the same numbers)."""
    import torch

    has_target = rows.targets >= 0
    head = output_layer(model)
    if head is not None:
        decoder, lm_head = head
        hidden = decoder_hidden_states(decoder, rows, share_prefix=share_prefix) if bottom is None else top_hidden_states(decoder, rows, bottom)
        chosen, entropy = chunked_logprobs(hidden[has_target], lm_head, rows.targets[has_target], temperature, chunk_tokens, with_entropy)
        logprobs = hidden.new_zeros(rows.targets.shape, dtype=torch.float32).masked_scatter(has_target, chosen)
        if not with_entropy:
            return logprobs
        return logprobs, torch.zeros_like(logprobs).masked_scatter(has_target, entropy)
    columns = has_target.any(dim=0).nonzero()[:, 0]
    if takes_logits_to_keep(model) and len(columns) < rows.targets.shape[1]:
        logits = model(input_ids=rows.input_ids, attention_mask=rows.attention, logits_to_keep=columns).logits
        if logits.shape[1] == rows.targets.shape[1] != len(columns):  # took the argument but kept every column
            logits = logits[:, columns]
    else:
        logits = model(input_ids=rows.input_ids, attention_mask=rows.attention).logits[:, columns]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    targets = rows.targets[:, columns]
    chosen = logp.gather(-1, targets.clamp(min=0)[..., None])[..., 0] * (targets >= 0)
    logprobs = chosen.new_zeros(rows.targets.shape).index_copy(1, columns, chosen)
    if not with_entropy:
        return logprobs
    entropy = -(logp.exp() * logp).sum(-1) * (targets >= 0)
    return logprobs, entropy.new_zeros(rows.targets.shape).index_copy(1, columns, entropy)


def chunked_logprobs(hidden: Any, lm_head: Any, targets: Any, temperature: float, chunk_tokens: int, with_entropy: bool = False) -> tuple[Any, Any]:
    """``(log p(target), entropy or None)`` per position from hidden states ``[N, H]`` and the output layer,
    ``chunk_tokens`` positions at a time: log p = logit[target] / T - logsumexp(logits / T). With gradients
    on, each chunk goes through activation checkpointing, so its logits are made again in the backward
    pass instead of being kept for it."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def one_chunk(h: Any, t: Any) -> tuple[Any, Any]:
        logits = lm_head(h).float() / temperature
        normaliser = torch.logsumexp(logits, dim=-1)
        chosen = logits.gather(-1, t[:, None])[:, 0] - normaliser
        if not with_entropy:
            return chosen, chosen.new_zeros(())
        return chosen, normaliser - (torch.softmax(logits, dim=-1) * logits).sum(-1)

    chosen_parts, entropy_parts = [], []
    for begin in range(0, len(targets), max(int(chunk_tokens), 1)):
        h, t = hidden[begin : begin + chunk_tokens], targets[begin : begin + chunk_tokens]
        if torch.is_grad_enabled() and h.requires_grad:
            chosen, entropy = checkpoint(one_chunk, h, t, use_reentrant=False)
        else:
            chosen, entropy = one_chunk(h, t)
        chosen_parts.append(chosen)
        entropy_parts.append(entropy)
    if not chosen_parts:
        empty = hidden.new_zeros((0,), dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(chosen_parts), (torch.cat(entropy_parts) if with_entropy else None)


# Config attributes of models whose logits are not ``lm_head(last hidden state)`` as it stands (scaled,
# soft-capped): those take the plain path.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def output_layer(model: Any) -> tuple[Any, Any] | None:
    """``(decoder, lm_head)`` of a causal LM whose logits are ``lm_head(decoder(...).last_hidden_state)``
    (Llama, Qwen2, Mistral and the like: ``get_decoder`` and ``get_output_embeddings``); None otherwise."""
    config = getattr(model, "config", None)
    if config is None or any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    try:
        decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError, TypeError):
        return None
    if decoder is None or lm_head is None or decoder is model:
        return None
    return decoder, lm_head


def micro_batches(rows: Rows, token_budget: int) -> list[Rows]:
    """The rows in micro-batches of at most ``token_budget`` padded tokens each (a row longer than the
    budget goes alone). Rows are grouped by length, so little goes to padding, and each micro-batch is
    cut to its longest row: the padding of the whole batch is not carried into every pass."""
    import torch

    lengths = rows.attention.sum(dim=1)
    order = torch.argsort(lengths, stable=True).tolist()
    groups: list[list[int]] = []
    for index in order:
        width = int(lengths[index])
        if groups and width * (len(groups[-1]) + 1) <= token_budget:
            groups[-1].append(index)  # rows come shortest first: this row sets the group's width
        else:
            groups.append([index])
    parts = []
    for group in groups:
        picked = torch.tensor(group, dtype=torch.long)
        width = max(int(lengths[picked].max()), 1)
        parts.append(Rows(*(getattr(rows, name)[picked, :width] for name in ("input_ids", "attention", "targets", "advantages", "old_logprobs"))))
    return parts


def mini_batch_rows(rows: Rows, episode_ids: Sequence[str] | None, count: int) -> list[Rows]:
    """The rows in ``count`` mini-batches of consecutive episodes, as equal in episodes as their number allows
    (the first parts one episode larger), one optimizer step each: a trainer's mini-batches (verl's
    ``ppo_mini_batch_size``, OpenRLHF's ``train_batch_size`` over its rollout batch). An episode's rows stay in one
    part, so the turn and sequence views split alike. ``episode_ids``: each row's episode (rows of one episode
    consecutive, as :func:`batch_of` writes them); None: a row per episode. ``count`` 1: ``[rows]``; more than the
    batch's episodes (infra-failed ones left it): one part an episode."""
    if count == 1:
        return [rows]
    import torch

    rows_total = int(rows.input_ids.shape[0])
    ids = list(range(rows_total)) if episode_ids is None else list(episode_ids)
    if len(ids) != rows_total:
        raise ValueError(f"episode_ids: {len(ids)} for {rows_total} rows")
    starts = [row for row in range(rows_total) if row == 0 or ids[row] != ids[row - 1]]  # each episode's first row
    count = min(count, len(starts))  # infra-failed episodes leave the batch: never a step on no episode
    bounds = [*starts, rows_total]
    per_part, larger = divmod(len(starts), count)
    parts, first = [], 0
    for index in range(count):
        last = first + per_part + (1 if index < larger else 0)
        picked = torch.arange(bounds[first], bounds[last])
        parts.append(Rows(*(getattr(rows, name)[picked] for name in ("input_ids", "attention", "targets", "advantages", "old_logprobs"))))
        first = last
    return parts


def policy_loss(
    logprobs: Any,
    rows: Rows,
    clip: float,
    ref_logprobs: Any = None,
    kl_coef: float = 0.0,
    entropy: Any = None,
    entropy_coef: float = 0.0,
    tokens: float | None = None,
    clip_high: float | None = None,
) -> tuple[Any, dict[str, float]]:
    """PPO-clipped policy gradient, averaged over model tokens, plus ``kl_coef`` * KL to a reference,
    minus ``entropy_coef`` * the mean entropy at the model tokens.

    ratio = exp(logp - logp_rollout); loss = -min(ratio * A, clip(ratio, 1 - clip, 1 + clip_high) * A), where
    ``clip_high`` (the experiment's ``algorithm.clip_high``; DAPO's clip-higher) defaults to ``clip``.
    The KL term is the k3 estimator exp(ref - logp) - (ref - logp) - 1 on tokens sampled from the rollout
    policy: non-negative, an unbiased estimate of the value KL(pi || ref), but its gradient (taken through
    logp, the samples held fixed) is that of KL(ref || pi), the reverse direction, as in GRPO's k3 loss.
    Every sum is a global token mean: divided by the batch's model tokens, so a long turn weighs more than
    a short one.
    ``tokens``: the model tokens of the whole batch when ``rows`` is one of its micro-batches (the sums
    are divided by it, so the micro-batches' losses and statistics add up to the batch's); default:
    those of ``rows``.
    """
    import torch

    mask = (rows.targets >= 0).float()
    if tokens is None:
        tokens = mask.sum().clamp(min=1.0)
    ratio = torch.exp((logprobs - rows.old_logprobs) * mask)
    unclipped = ratio * rows.advantages
    high = clip if clip_high is None else clip_high
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + high) * rows.advantages
    pg = -(torch.minimum(unclipped, clipped) * mask).sum() / tokens
    with torch.no_grad():
        outside = (ratio < 1.0 - clip) | (ratio > 1.0 + high)
        stats = {"pg_loss": float(pg), "clip_fraction": float((outside.float() * mask).sum() / tokens)}
    loss = pg
    if ref_logprobs is not None and kl_coef > 0:
        delta = (ref_logprobs - logprobs) * mask
        kl = ((torch.exp(delta) - delta - 1) * mask).sum() / tokens
        loss = loss + kl_coef * kl
        stats["kl"] = float(kl.detach())
    if entropy is not None:
        mean_entropy = (entropy * mask).sum() / tokens
        loss = loss - entropy_coef * mean_entropy
        stats["entropy"] = float(mean_entropy.detach())
    return loss, stats
