"""``gem-core train --experiment FILE``: an experiment file (:mod:`gem_core.experiment`) as the reference
trainer's options.

The file says what the run is; the command line says where it runs. So an option that the file sets
(``--lr``, ``--env``, ``--steps``, ``--bf16``...) given beside ``--experiment`` is refused in one line (edit the
file, or copy it), while the options the file does not hold (``--out``, ``--device``, ``--micro-batch-tokens``,
``--rollout-engine``, ``--resume``, ``--checkpoint-every``, ``--tensorboard``, ``--eval-set``...)
apply as usual. To tell an option given from one left at its default, the options
the file sets get an :class:`Unset` default (:func:`mark_defaults`); :func:`apply_experiment` puts the
real defaults back when no file is given.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, replace
from typing import Any

from gem_core.experiment import Experiment, load_experiment, refuse, require, weights_sha256
from gem_core.models import EMBEDDED_MODELS, resolve_model
from gem_core.train.config import EVAL_SEED_BASE, TrainConfig

TRAINER = "gem-core train"
#: training.precision as ``--bf16``: on, off, or (auto) the device's rule (gem_core.precision.bf16_by_default).
BF16_OF_PRECISION = {"auto": None, "bf16": True, "float32": False}


@dataclass(frozen=True)
class Unset:
    """The default of an option the experiment file sets: ``value`` unless the option is given."""

    value: Any


#: Each ``gem-core train`` option (its argparse dest) that an experiment sets, and the value it gets.
OPTION_VALUES: dict[str, Any] = {
    "env": lambda e: e.env_ids[0],
    "env_kwargs": lambda e: json.dumps(dict(e.env_kwargs)),
    "tools": lambda e: ",".join(e.tools),
    "model": lambda e: e.model,
    "steps": lambda e: e.updates,
    "episodes": lambda e: e.episodes_per_update,
    "group_size": lambda e: e.group_size,
    "estimator": lambda e: e.estimator,
    "gamma": lambda e: e.gamma,
    "view": lambda e: e.view,
    "lr": lambda e: e.lr,
    "clip": lambda e: e.clip_low,
    "epochs": lambda e: e.ppo_epochs,
    "mini_batches": lambda e: e.mini_batches,
    "kl_coef": lambda e: e.kl_coef,
    "kl_schedule": lambda e: e.kl_schedule,
    "entropy_coef": lambda e: e.entropy_coef,
    "max_grad_norm": lambda e: e.max_grad_norm,
    "gradient_checkpointing": lambda e: e.gradient_checkpointing,
    "bf16": lambda e: BF16_OF_PRECISION[e.precision],
    "temperature": lambda e: e.temperature,
    "max_tokens": lambda e: e.max_turn_tokens,
    "max_turns": lambda e: e.max_turns or None,
    "eval_every": lambda e: e.eval_every,
    "eval_episodes": lambda e: e.eval_episodes,
    "seed": lambda e: e.seed,
    "warmup_steps": lambda e: e.warm_start_steps,
    "train_layers": lambda e: e.trained_layers,
    "stop_after_box": lambda e: e.stop_after_box,
    "skip_zero_signal": lambda e: e.skip_zero_signal,
}


def add_experiment_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--experiment FILE`` to ``gem-core train``'s parser and mark the options it sets (:func:`mark_defaults`)."""
    parser.add_argument(
        "--experiment",
        metavar="FILE",
        default=None,
        help="run the experiment file (TOML, docs/experiments.md); the options it sets cannot be given beside it",
    )
    mark_defaults(parser)


def mark_defaults(parser: argparse.ArgumentParser) -> None:
    """Wrap the default of every option in :data:`OPTION_VALUES` in :class:`Unset`."""
    for action in parser._actions:
        if action.dest in OPTION_VALUES and not isinstance(action.default, Unset):
            action.default = Unset(action.default)


def option_name(parser_dest: str) -> str:
    return {"env": "--env", "episodes": "--batch-size", "steps": "--steps"}.get(parser_dest, "--" + parser_dest.replace("_", "-"))


def apply_experiment(args: argparse.Namespace) -> tuple[argparse.Namespace, Experiment | None]:
    """``args`` with the experiment's values in the options it sets (or their defaults, without
    ``--experiment``), and the experiment. An option given beside the file, and a setting this trainer
    cannot express, are one line (ValueError)."""
    args = argparse.Namespace(**vars(args))  # the caller's stay as parsed
    path = getattr(args, "experiment", None)
    values = vars(args)
    if path is None:
        for dest in OPTION_VALUES:
            if isinstance(values.get(dest), Unset):
                values[dest] = values[dest].value
        return args, None
    given = [dest for dest in OPTION_VALUES if dest in values and not isinstance(values[dest], Unset)]
    if given:
        names = ", ".join(option_name(dest) for dest in given)
        raise ValueError(f"{names}: set by the experiment file {path}; edit the file (or a copy) rather than give it beside --experiment")
    experiment = load_experiment(path)
    check_expressible(experiment)
    for dest, value_of in OPTION_VALUES.items():
        values[dest] = value_of(experiment)
    if experiment.model_sha256:
        values["model"] = checked_weights(experiment)
    return args, experiment


def check_expressible(experiment: Experiment) -> None:
    """Refuse, naming the key, what the reference trainer cannot run."""
    require(TRAINER, experiment, "env.ids", len(experiment.env_ids) == 1, "gem-core train plays one env id (run one experiment per env)")
    require(
        TRAINER, experiment, "algorithm.clip_high", experiment.clip_high == experiment.clip_low, "gem-core train clips symmetrically (clip_low = clip_high)"
    )
    require(TRAINER, experiment, "algorithm.kl_estimator", experiment.kl_estimator == "k3" or experiment.kl_coef == 0, "gem-core train's KL is k3")
    require(TRAINER, experiment, "algorithm.loss_aggregation", experiment.loss_aggregation == "token-mean", "gem-core train averages over every model token")
    require(
        TRAINER,
        experiment,
        "rollout.logprob_temperature",
        experiment.logprob_temperature == experiment.temperature,
        "gem-core train recomputes logprobs at the rollout's temperature",
    )
    require(
        TRAINER,
        experiment,
        "training.mini_batches",
        experiment.mini_batches >= 1,
        "gem-core train counts its optimizer steps in episodes (mini_batches 1 or more), not in turn samples",
    )
    require(TRAINER, experiment, "optimizer.betas", tuple(experiment.betas) == (0.9, 0.999), "gem-core train's AdamW has torch's betas (0.9, 0.999)")
    require(TRAINER, experiment, "optimizer.eps", experiment.eps == 1e-8, "gem-core train's AdamW has torch's eps 1e-8")
    require(TRAINER, experiment, "optimizer.weight_decay", experiment.weight_decay == 0.0, "gem-core train's AdamW has no weight decay")
    require(
        TRAINER,
        experiment,
        "seeds.eval_start",
        experiment.eval_seed_start == EVAL_SEED_BASE,
        f"gem-core train's held-out seeds start at {EVAL_SEED_BASE}",
    )


def checked_weights(experiment: Experiment) -> str:
    """The local weights ``model.id`` names, their sha256 equal to ``model.sha256`` (else one line)."""
    name = experiment.model
    if name.strip().lower() in EMBEDDED_MODELS:
        name = resolve_model(name, prefer_hub=False)  # the checkpoint converted here: the weights that are checked are those trained
    if not os.path.exists(name):
        raise refuse(TRAINER, experiment, "model.sha256", f"the weights are checked where they are local, and {experiment.model!r} is not a local path")
    found = weights_sha256(name)
    if found != experiment.model_sha256:
        raise refuse(TRAINER, experiment, "model.sha256", f"the weights at {name} have sha256 {found}")
    return name


def config_with_experiment(config: TrainConfig, experiment: Experiment | None) -> TrainConfig:
    """``config`` with the settings the experiment holds that ``gem-core train`` has no option for."""
    if experiment is None:
        return config
    return replace(config, lr_warmup=experiment.warmup_updates, max_context_tokens=experiment.max_context_tokens or None)


def experiment_of(config: TrainConfig) -> Experiment:
    """The experiment a :class:`TrainConfig` runs (the other direction; ``default.toml`` equals ``experiment_of(TrainConfig())``)."""
    return Experiment(
        model=config.model or "tiny",
        env_ids=(config.env_id,),
        env_kwargs=dict(config.env_kwargs),
        tools=tuple(config.tools),
        max_turns=config.max_turns or 0,
        max_turn_tokens=config.max_tokens,
        max_context_tokens=config.max_context_tokens or 0,
        seed=config.seed,
        eval_seed_start=EVAL_SEED_BASE,
        eval_episodes=config.eval_episodes,
        episodes_per_update=config.episodes,
        group_size=config.group_size,
        temperature=float(config.temperature),
        logprob_temperature=float(config.temperature),
        estimator=config.estimator,
        gamma=float(config.gamma),
        view=config.view,
        clip_low=float(config.clip),
        clip_high=float(config.clip),
        kl_coef=float(config.kl_coef),
        entropy_coef=float(config.entropy_coef),
        lr=float(config.lr),
        warmup_updates=config.lr_warmup,
        max_grad_norm=float(config.max_grad_norm),
        updates=config.steps,
        ppo_epochs=config.epochs,
        mini_batches=config.mini_batches,
        gradient_checkpointing=config.gradient_checkpointing,
        precision={value: key for key, value in BF16_OF_PRECISION.items()}[config.bf16],
        eval_every=config.eval_every,
        warm_start_steps=config.warmup_steps,
        trained_layers=config.train_layers,
        stop_after_box=config.stop_after_box,
        kl_schedule=config.kl_schedule,
        skip_zero_signal=config.skip_zero_signal,
    )
