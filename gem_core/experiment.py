"""One experiment, every trainer: the plain-data description of a run, read from a small TOML file.

An :class:`Experiment` says what a run is (the model and its exact weights, the envs and seeds, the batch,
the estimator, the optimizer and its schedule, the PPO loss, the token limits, the temperature, the number
of updates, the precision, the evaluation), and nothing about where it runs (``training.precision = "auto"``
is the one setting decided there, by one rule for every trainer: :mod:`gem_core.precision`). ``gem-core train --experiment FILE`` runs it
in the reference trainer; ``gem-core experiment FILE --trainer NAME`` writes that trainer's own
configuration (each plugin's ``experiment`` module), every setting mapped explicitly and the trainer's own
defaults that would change the run pinned. A trainer that cannot express a setting refuses it in one line
naming it (:func:`refuse`).

The file has sections; every key is optional and defaults to the default run of ``gem-core train``, except
the ``[reference]`` keys (the warm start, the frozen layers, the KL schedule, skipping zero-signal batches:
``gem-core train``'s own, which every other trainer refuses), which default to off so that a file without them
runs in every trainer, and five the default run sets for ``gem-core train`` (``optimizer.lr``,
``training.updates``, ``training.mini_batches``, ``algorithm.kl_coef``, ``rollout.stop_after_box``), which
default to the run every trainer takes (``examples/experiments/default.toml`` spells out the default run,
``[reference]`` included; ``examples/experiments/portable.toml`` is the run every trainer takes;
docs/experiments.md describes each key)::

    [optimizer]
    lr = 1e-4
    warmup_updates = 2

:func:`load_experiment` reads it strictly: an unknown section or key, a value of the wrong type and a value
out of range are each one line naming the key (:class:`~gem_core.errors.InvalidArgumentError`, as
:mod:`gem_core.params` words them). TOML has no null: ``0`` means "none" for the optional limits.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gem_core.algo.estimators import DEFAULT_GAMMA, ESTIMATOR_NAMES, GROUP_ESTIMATORS
from gem_core.errors import InvalidArgumentError, InvalidArgumentTypeError
from gem_core.params import Param, invalid
from gem_core.precision import PRECISIONS

#: The estimators the experiment names (gem-core train's): ``rebn`` (ReBN, per-turn returns normalised over
#: the batch), ``reinforce`` (per-turn discounted returns), ``grpo``, ``drgrpo`` (GRPO without the std) and
#: ``rloo`` (the last three compare the episodes of a group).
ESTIMATORS = ESTIMATOR_NAMES  # the registry's (gem_core.algo.estimators)
#: How the per-token PPO loss becomes one number (the names verl uses): the mean over every model token of
#: the batch; the mean over episodes of each episode's token mean; the mean over episodes of each one's sum.
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
#: The KL estimators (Schulman's): k1 = log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r, r = pi_ref / pi.
KL_ESTIMATORS = ("k1", "k2", "k3")
# constant, or linear: the KL coefficient falls linearly from kl_coef at the first update to kl_final after the last
KL_SCHEDULES = ("constant", "linear")
VIEWS = ("turn", "sequence")
OPTIMIZERS = ("adamw",)
#: After the linear warm-up the rate stays ``lr`` (gem-core train's schedule).
LR_SCHEDULES = ("constant",)
#: Held-out seeds start here; training seeds are drawn below it (:func:`update_start_seeds`).
EVAL_SEED_START = 1_000_000
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Key:
    """One key of the file: its section, its name there, what it holds, and what it means."""

    section: str
    name: str
    param: Param
    doc: str
    #: "str_list": a list of strings; "table": a TOML table (env kwargs)
    shape: str = ""

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}"


@dataclass(frozen=True)
class Experiment:
    """What a run is. Field defaults are the default run of ``gem-core train`` (tested equal to its
    ``TrainConfig``). :data:`KEYS` maps each field to its key in the file."""

    # [model]
    model: str = "smollm2-135m-instruct"
    model_sha256: str = ""
    # [env]
    env_ids: tuple[str, ...] = ("game:GuessTheNumber-v0-easy",)
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    tools: tuple[str, ...] = ()
    max_turns: int = 0
    max_turn_tokens: int = 16
    max_context_tokens: int = 1024
    # [seeds]
    seed: int = 0
    eval_seed_start: int = EVAL_SEED_START
    eval_episodes: int = 200
    # [rollout]
    episodes_per_update: int = 32
    group_size: int = 1
    temperature: float = 1.0
    logprob_temperature: float = 1.0
    stop_after_box: bool = False
    # [algorithm]
    estimator: str = "rebn"
    gamma: float = DEFAULT_GAMMA
    view: str = "sequence"
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    loss_aggregation: str = "token-mean"
    # [optimizer]
    optimizer: str = "adamw"
    lr: float = 1e-4
    warmup_updates: int = 2
    lr_schedule: str = "constant"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    # [training]
    updates: int = 30
    ppo_epochs: int = 1
    mini_batches: int = 1
    turns_per_step: int = 0
    gradient_checkpointing: bool = False
    precision: str = "auto"
    eval_every: int = 0
    # [reference]: what only gem-core train runs. Left out, they are off (every trainer runs a file without
    # them); examples/experiments/default.toml sets the default run's. Other trainers refuse them on:
    # require_portable.
    warm_start_steps: int = 0
    trained_layers: int = 0
    warm_start_batch: int = 32
    warm_start_lr: float = 1e-4
    warm_start_transcript: bool = False
    kl_schedule: str = "constant"
    kl_final: float = 0.0
    skip_zero_signal: bool = False
    replay_failed: float = 0.0

    def __post_init__(self) -> None:
        check_experiment(self)

    @property
    def groups_per_update(self) -> int:
        """Start states per update (prompts, in most trainers' words): each played ``group_size`` times."""
        return self.episodes_per_update // self.group_size

    @property
    def mini_batch_episodes(self) -> int:
        """Episodes in one optimizer step (``episodes_per_update / mini_batches``; ``mini_batches`` 1 or more:
        with 0 the steps count turn samples, ``turns_per_step``)."""
        return self.episodes_per_update // self.mini_batches

    @property
    def optimizer_steps_per_update(self) -> int:
        return self.ppo_epochs * self.mini_batches

    def value_of(self, path: str) -> Any:
        """The value of the key ``section.name`` (as the file would hold it)."""
        return getattr(self, FIELD_OF[path])


KEYS: dict[str, Key] = {
    "model": Key("model", "id", Param(str), "the model: a local path, a hub id, or smollm2-135m-instruct (the embedded real model)"),
    "model_sha256": Key(
        "model",
        "sha256",
        Param(str),
        "the sha256 of the weights (weights_sha256: the model directory's weight files); checked where the model is local; empty: not checked",
    ),
    "env_ids": Key("env", "ids", Param(str), "the env ids played (today every trainer plays one: several are refused by name)", shape="str_list"),
    "env_kwargs": Key("env", "kwargs", Param(dict), "make() keyword arguments of every env", shape="table"),
    "tools": Key("env", "tools", Param(str), "tools the envs are wrapped with (python, search)", shape="str_list"),
    "max_turns": Key("env", "max_turns", Param(int, low=0, high=100_000), "turn limit on top of the env's own (0: the env's own)"),
    "max_turn_tokens": Key("env", "max_turn_tokens", Param(int, low=1, high=1_000_000), "tokens per response (one turn)"),
    "max_context_tokens": Key(
        "env",
        "max_context_tokens",
        Param(int, low=0, high=10_000_000),
        "tokens of the whole episode's context (0: no limit but the model's); an episode that would pass it ends truncated",
    ),
    "seed": Key(
        "seeds",
        "seed",
        Param(int, low=0, high=2**32 - 1),
        "the run's seed: sampling, and the training start states (the same in every trainer's rows: update_start_seeds) drawn below eval_start",
    ),
    "eval_seed_start": Key("seeds", "eval_start", Param(int, low=1, high=2**62), "the first held-out seed; training seeds stay below it"),
    "eval_episodes": Key(
        "seeds",
        "eval_episodes",
        Param(int, low=1, high=1_000_000),
        "held-out episodes per evaluation: seeds from eval_start (on GuessTheNumber each target equally often, as gem-core train's)",
    ),
    "episodes_per_update": Key("rollout", "episodes_per_update", Param(int, low=1, high=1_000_000), "episodes played for one update"),
    "group_size": Key("rollout", "group_size", Param(int, low=1, high=100_000), "episodes per start state (GRPO/RLOO need 2+)"),
    "temperature": Key("rollout", "temperature", Param(float, above=0.0, high=100.0), "sampling temperature of the rollout"),
    "logprob_temperature": Key(
        "rollout", "logprob_temperature", Param(float, above=0.0, high=100.0), "temperature at which the trainer recomputes the logprobs of the loss"
    ),
    "stop_after_box": Key(
        "rollout",
        "stop_after_box",
        Param(bool),
        "each response ends at the token that closes its \\boxed{} move (the dataset rows carry it; every trainer's rollout "
        "stops there, ROLL's excepted); off: a response runs to the template's end of turn or max_turn_tokens",
    ),
    "estimator": Key("algorithm", "estimator", Param(str, choices=ESTIMATORS), "advantage estimator"),
    "gamma": Key("algorithm", "gamma", Param(float, low=0.0, high=1.0), "discount over turns (not tokens)"),
    "view": Key("algorithm", "view", Param(str, choices=VIEWS), "training rows: one per episode with a loss mask (sequence), or one per turn"),
    "clip_low": Key("algorithm", "clip_low", Param(float, low=0.0, high=10.0), "PPO ratio clip below 1: ratio >= 1 - clip_low"),
    "clip_high": Key("algorithm", "clip_high", Param(float, low=0.0, high=10.0), "PPO ratio clip above 1: ratio <= 1 + clip_high"),
    "kl_coef": Key("algorithm", "kl_coef", Param(float, low=0.0, high=1e6), "KL penalty to the starting policy, in the loss (0: off, no reference model)"),
    "kl_estimator": Key("algorithm", "kl_estimator", Param(str, choices=KL_ESTIMATORS), "the KL estimator of that penalty"),
    "entropy_coef": Key("algorithm", "entropy_coef", Param(float, low=0.0, high=1e6), "entropy bonus at the model tokens (0: off)"),
    "loss_aggregation": Key("algorithm", "loss_aggregation", Param(str, choices=LOSS_AGGREGATIONS), "how the per-token loss becomes one number"),
    "optimizer": Key("optimizer", "name", Param(str, choices=OPTIMIZERS), "the optimizer"),
    "lr": Key("optimizer", "lr", Param(float, above=0.0, high=1.0), "learning rate after the warm-up"),
    "warmup_updates": Key(
        "optimizer",
        "warmup_updates",
        Param(int, low=0, high=1_000_000),
        "updates over which the rate rises linearly to lr: lr * (k + 1) / (warmup_updates + 1) at update k",
    ),
    "lr_schedule": Key("optimizer", "schedule", Param(str, choices=LR_SCHEDULES), "the rate after the warm-up"),
    "betas": Key("optimizer", "betas", Param(float, low=0.0, high=0.999999, pair=True), "AdamW's betas"),
    "eps": Key("optimizer", "eps", Param(float, above=0.0, high=1.0), "AdamW's epsilon"),
    "weight_decay": Key("optimizer", "weight_decay", Param(float, low=0.0, high=1.0), "AdamW's decoupled weight decay"),
    "max_grad_norm": Key("optimizer", "max_grad_norm", Param(float, low=0.0, high=1e6), "gradient clipping by global norm (0: off)"),
    "updates": Key(
        "training",
        "updates",
        Param(int, low=0, high=10_000_000),
        "RL updates (one rollout batch each); 0: gem-core train's warm start alone, its model evaluated and saved (other trainers need 1 or more)",
    ),
    "ppo_epochs": Key("training", "epochs", Param(int, low=1, high=1000), "passes over each update's batch"),
    "mini_batches": Key(
        "training",
        "mini_batches",
        Param(int, low=0, high=100_000),
        "optimizer steps per pass (the batch split in this many); 0: no fixed count, a step per training.turns_per_step turn samples",
    ),
    "turns_per_step": Key(
        "training",
        "turns_per_step",
        Param(int, low=0, high=10_000_000),
        'with mini_batches = 0 (and view = "turn"): turn samples per optimizer step, so an update\'s step count follows its '
        "turn count (ROLL's): each pass takes the update's turns in a random order, this many a step; the remainder "
        "(turns mod this) is dropped at random before the advantages' batch statistics (an update with fewer turns: "
        "random copies fill its one step); 0: mini_batches counts the steps",
    ),
    "gradient_checkpointing": Key("training", "gradient_checkpointing", Param(bool), "recompute activations in the backward pass (memory, not results)"),
    "precision": Key(
        "training",
        "precision",
        Param(str, choices=PRECISIONS),
        "bf16 (the update in bfloat16, float32 master weights and optimizer state; gem-core train's rollout on a bfloat16 "
        "copy of the weights, as a bf16 inference engine's), float32, or auto: bf16 where the "
        "machine computes in bfloat16 (a CUDA GPU with it, a CPU with AVX512-BF16 or AMX), float32 elsewhere, decided where the run starts",
    ),
    "eval_every": Key(
        "training",
        "eval_every",
        Param(int, low=0, high=10_000_000),
        "evaluate on the held-out seeds every N updates and save the model there (0: only before and after)",
    ),
    "warm_start_steps": Key(
        "reference",
        "warm_start_steps",
        Param(int, low=0, high=1_000_000),
        "gem-core train only: supervised steps on hint-blind random moves before RL (0: none); other trainers refuse it",
    ),
    "trained_layers": Key(
        "reference",
        "trained_layers",
        Param(int, low=0, high=100_000),
        "gem-core train only: train the top N decoder layers, the rest frozen (0: every weight); other trainers refuse it",
    ),
    "warm_start_batch": Key(
        "reference", "warm_start_batch", Param(int, low=1, high=1_000_000), "gem-core train only: episodes of random moves per warm-start step"
    ),
    "warm_start_lr": Key("reference", "warm_start_lr", Param(float, above=0.0, high=1.0), "gem-core train only: the warm start's learning rate"),
    "warm_start_transcript": Key(
        "reference",
        "warm_start_transcript",
        Param(bool),
        "gem-core train only: the warm start learns the whole transcripts (the env's text too), or (false) the moves alone",
    ),
    "kl_schedule": Key(
        "reference",
        "kl_schedule",
        Param(str, choices=KL_SCHEDULES),
        "gem-core train only: the KL coefficient constant, or linear: falling from kl_coef at the first update to kl_final "
        "after the last; other trainers refuse linear",
    ),
    "kl_final": Key(
        "reference",
        "kl_final",
        Param(float, low=0.0, high=1e6),
        "gem-core train only: where the linear KL schedule ends (0: the KL lets go entirely; above 0: it keeps pulling a "
        "policy whose rewards stopped saying anything back to the start); at most kl_coef, set only with kl_schedule "
        "linear; other trainers refuse it",
    ),
    "skip_zero_signal": Key(
        "reference",
        "skip_zero_signal",
        Param(bool),
        "gem-core train only: a batch whose every advantage is 0 (no KL, no entropy bonus) makes no optimizer step and leaves "
        "the schedule where it is; false: the zero-gradient step every trainer takes (Adam's momentum moves the weights, "
        "the schedule advances); other trainers refuse true",
    ),
    "replay_failed": Key(
        "reference",
        "replay_failed",
        Param(float, low=0.0, high=1.0),
        "gem-core train only: the share of each update's start states (rounded down) played again from the previous "
        "update's failed episodes, fresh ones filling the rest, so the situations the policy fails in come back while it "
        "learns them (0: every start state fresh); other trainers refuse it",
    ),
}
FIELD_OF = {key.path: name for name, key in KEYS.items()}
#: Keys that moved, old path -> new: a file with the old one still reads, with one warning naming the new.
MOVED_KEYS = {"reference.stop_after_box": "rollout.stop_after_box"}
SECTIONS = tuple(dict.fromkeys(key.section for key in KEYS.values()))


def check_experiment(experiment: Experiment, where: str = "experiment") -> None:
    """Every field of ``experiment`` in its range and the rules between fields; one
    :class:`InvalidArgumentError` line naming the key otherwise."""
    for name, key in KEYS.items():
        value = getattr(experiment, name)
        if key.shape == "str_list":
            if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) and item.strip() for item in value):
                raise invalid(key.path, value, "a list of non-empty strings", where, wrong_type=True)
        elif key.shape == "table":
            if not isinstance(value, Mapping):
                raise invalid(key.path, value, "a table (make() keyword arguments)", where, wrong_type=True)
        else:
            key.param.check(key.path, value, where)
    if not experiment.env_ids:
        raise invalid("env.ids", list(experiment.env_ids), "at least one env id", where)
    if not experiment.model.strip():
        raise invalid("model.id", experiment.model, "a model path, hub id or alias", where)
    if experiment.model_sha256 and not _SHA256.fullmatch(experiment.model_sha256):
        raise invalid("model.sha256", experiment.model_sha256, "64 lowercase hex digits, or empty (not checked)", where)
    if experiment.episodes_per_update % experiment.group_size:
        raise invalid("rollout.episodes_per_update", experiment.episodes_per_update, f"a multiple of rollout.group_size ({experiment.group_size})", where)
    if experiment.estimator in GROUP_ESTIMATORS and experiment.group_size < 2:
        raise invalid("rollout.group_size", experiment.group_size, f"2 or more: estimator {experiment.estimator} compares the episodes of a group", where)
    if experiment.mini_batches == 0 and not experiment.turns_per_step:
        raise invalid("training.mini_batches", 0, "1 or more, or 0 with training.turns_per_step set (optimizer steps counted in turn samples)", where)
    if experiment.turns_per_step and experiment.mini_batches:
        raise invalid("training.turns_per_step", experiment.turns_per_step, "0 unless training.mini_batches = 0 (steps counted in episodes)", where)
    if experiment.turns_per_step and experiment.view != "turn":
        raise invalid("training.turns_per_step", experiment.turns_per_step, 'set only with algorithm.view = "turn" (turn samples are its rows)', where)
    if experiment.mini_batches and experiment.episodes_per_update % experiment.mini_batches:
        raise invalid("training.mini_batches", experiment.mini_batches, f"a divisor of rollout.episodes_per_update ({experiment.episodes_per_update})", where)
    if experiment.kl_final and experiment.kl_schedule != "linear":
        raise invalid("reference.kl_final", experiment.kl_final, '0 unless reference.kl_schedule = "linear" (where the linear fall ends)', where)
    if experiment.kl_final > experiment.kl_coef:
        raise invalid("reference.kl_final", experiment.kl_final, f"at most algorithm.kl_coef ({experiment.kl_coef}): the schedule falls", where)
    if experiment.max_context_tokens and experiment.max_context_tokens <= experiment.max_turn_tokens:
        raise invalid("env.max_context_tokens", experiment.max_context_tokens, f"more than env.max_turn_tokens ({experiment.max_turn_tokens}), or 0", where)


# -- reading the file ---------------------------------------------------------------------------------


def _toml_module() -> Any:
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:
        import tomli
    except ImportError:  # pragma: no cover - a core dependency on Python 3.10
        raise InvalidArgumentError("reading an experiment file on Python 3.10 needs tomli: pip install tomli") from None
    return tomli


def parse_experiment(text: str, where: str = "experiment") -> Experiment:
    """The :class:`Experiment` the TOML ``text`` describes (keys left out keep their defaults); one
    :class:`InvalidArgumentError` line for a syntax error, an unknown section or key, a wrong type or a
    value out of range. ``where`` starts each message (the file's name)."""
    toml = _toml_module()
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise InvalidArgumentError(f"{where}: not valid TOML: {exc}") from None
    return experiment_from_dict(data, where)


def experiment_from_dict(data: Mapping[str, Any], where: str = "experiment") -> Experiment:
    """The :class:`Experiment` of the sections and keys in ``data`` (the file's shape), checked strictly."""
    values: dict[str, Any] = {}
    for section, table in data.items():
        if section not in SECTIONS:
            raise InvalidArgumentError(f"{where}: unknown section [{section}]; the sections are {', '.join(f'[{s}]' for s in SECTIONS)}", name=section)
        if not isinstance(table, Mapping):
            raise InvalidArgumentTypeError(f"{where}: {section} must be a section ([{section}]), got {table!r}", name=section, value=table)
        for name, value in table.items():
            path = f"{section}.{name}"
            if path in MOVED_KEYS:
                warnings.warn(f"{where}: {path} is now {MOVED_KEYS[path]}; the old name still reads for now", FutureWarning, stacklevel=2)
                path = MOVED_KEYS[path]
            if path not in FIELD_OF:
                known = ", ".join(key.name for key in KEYS.values() if key.section == section)
                raise InvalidArgumentError(f"{where}: unknown key {path}; [{section}] has {known}", name=path, value=value)
            field_name = FIELD_OF[path]
            values[field_name] = _plain_value(KEYS[field_name], value, where)
    try:
        return Experiment(**values)
    except InvalidArgumentError as exc:
        if str(exc).startswith(where):
            raise
        message = str(exc).split(": ", 1)[1] if str(exc).startswith("experiment: ") else str(exc)
        raise type(exc)(f"{where}: {message}", name=exc.name, value=exc.value, allowed=exc.allowed) from None


def _plain_value(key: Key, value: Any, where: str) -> Any:
    """``value`` as the field holds it (lists as tuples), its type checked here so that the message names
    the key as the file does."""
    if key.shape == "str_list" or key.param.pair:
        if not isinstance(value, list):
            expected = "a list of strings" if key.shape == "str_list" else "a pair of numbers, e.g. [0.9, 0.999]"
            raise invalid(key.path, value, expected, where, wrong_type=True)
        return tuple(value)
    if key.param.kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def load_experiment(path: str | Path) -> Experiment:
    """Read and check the experiment file at ``path`` (one clear line when it cannot be read or is wrong)."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidArgumentError(f"{where}: no such experiment file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidArgumentError(f"{where}: cannot read it: {reason}") from None
    return parse_experiment(text, where)


# -- writing it back -----------------------------------------------------------------------------------


def to_toml(experiment: Experiment) -> str:
    """The experiment as a TOML file (every key, section by section); :func:`parse_experiment` reads it back equal."""
    lines: list[str] = []
    for section in SECTIONS:
        if lines:
            lines.append("")
        lines.append(f"[{section}]")
        for name, key in KEYS.items():
            if key.section == section:
                lines.append(f"{key.name} = {_toml_value(getattr(experiment, name))}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_value(key)


# -- refusals and the weights ---------------------------------------------------------------------------


class UnsupportedSettingError(InvalidArgumentError):
    """A trainer cannot express a setting of the experiment: one line naming the trainer, the key and why."""


def refuse(trainer: str, experiment: Experiment, path: str, why: str) -> UnsupportedSettingError:
    """The error for a setting ``path`` (``section.name``) that ``trainer`` cannot express."""
    value = experiment.value_of(path)
    return UnsupportedSettingError(f"{trainer} cannot run this experiment: {path}={value!r}: {why}", name=path, value=value, allowed=why)


def require(trainer: str, experiment: Experiment, path: str, expressible: bool, why: str) -> None:
    """Refuse ``path`` (:func:`refuse`) unless ``expressible``."""
    if not expressible:
        raise refuse(trainer, experiment, path, why)


#: The files whose bytes are the model's weights (what ``model.sha256`` covers).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def weights_sha256(path: str | Path) -> str:
    """The sha256 over a model's weight files: for a directory, each weight file's name and bytes in name
    order; for a single file, its bytes."""
    root = Path(path)
    digest = hashlib.sha256()
    files = [root] if root.is_file() else sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise InvalidArgumentError(f"model.sha256: {root} has no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    for file in files:
        if root.is_dir():
            digest.update(file.name.encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


# -- what every trainer's configuration shares: the dataset files --------------------------------------


def train_rows(experiment: Experiment) -> int:
    """Rows of a trainer's training dataset: one start state (prompt) per group, ``updates`` batches of them."""
    return experiment.updates * experiment.groups_per_update


def update_start_seeds(run_seed: int, update: int, groups: int, below: int = EVAL_SEED_START) -> list[int]:
    """What seed ``run_seed`` means for the start states: the reset seeds of update ``update`` (0-based), one a group,
    ``groups`` draws in ``[0, below)`` from numpy's generator seeded ``[run_seed, update]``. ``gem-core train --seed S``
    plays these, and an experiment's training rows are these, update after update (:func:`run_start_seeds`), so that
    seed S is the same start states in the same order in every trainer that plays its rows in order. Each update's
    draw stands alone: a resumed run draws the same."""
    for name, value, low in (("run_seed", run_seed, 0), ("update", update, 0), ("groups", groups, 1), ("below", below, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    rng = np.random.default_rng([run_seed, update])
    return [int(seed) for seed in rng.integers(0, below, size=groups)]


def run_start_seeds(run_seed: int, rows: int, per_update: int, below: int = EVAL_SEED_START) -> list[int]:
    """The first ``rows`` start states of a run with seed ``run_seed`` and ``per_update`` groups an update, in the
    order it plays them (:func:`update_start_seeds`, update 0 first): an experiment's training rows."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be an integer >= 1, got {rows!r}")
    if isinstance(per_update, bool) or not isinstance(per_update, int) or per_update < 1:
        raise ValueError(f"per_update must be an integer >= 1, got {per_update!r}")
    updates = -(-rows // per_update)
    return [seed for update in range(updates) for seed in update_start_seeds(run_seed, update, per_update, below)][:rows]


#: The [reference] keys (what only gem-core train runs) and the value every other trainer needs.
REFERENCE_ONLY = {
    "reference.warm_start_steps": 0,
    "reference.trained_layers": 0,
    "reference.kl_schedule": "constant",
    "reference.kl_final": 0.0,
    "reference.skip_zero_signal": False,
    "reference.replay_failed": 0.0,
}


def require_portable(trainer: str, experiment: Experiment, *, turn_steps: bool = False) -> str:
    """What every trainer plugin checks first: the experiment's one env id (:func:`require_one_env`), no
    [reference] setting (a warm start, frozen layers, the KL schedule, skipping zero-signal batches: gem-core
    train's own, which no other trainer runs) and, unless the trainer counts optimizer steps in turn samples (``turn_steps``: ROLL),
    steps counted in episodes (``training.mini_batches`` 1 or more). Returns the env id."""
    require(trainer, experiment, "training.updates", experiment.updates > 0, "only gem-core train runs 0 updates (its warm start alone)")
    require(
        trainer,
        experiment,
        "training.mini_batches",
        turn_steps or experiment.mini_batches > 0,
        f"{trainer} counts optimizer steps in episodes, not in turn samples (training.turns_per_step: ROLL's way)",
    )
    for path, portable in REFERENCE_ONLY.items():
        require(
            trainer,
            experiment,
            path,
            experiment.value_of(path) == portable,
            f"only gem-core train runs it; set {path} = {json.dumps(portable)} to run the experiment here",
        )
    return require_one_env(trainer, experiment)


def require_one_env(trainer: str, experiment: Experiment) -> str:
    """The experiment's one env id; several are refused (a trainer's dataset here holds one env id)."""
    require(trainer, experiment, "env.ids", len(experiment.env_ids) == 1, f"{trainer}'s dataset here holds one env id (run one experiment per env)")
    return experiment.env_ids[0]
