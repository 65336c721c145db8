"""An experiment (:mod:`gem_core.experiment`) as RL2's own configuration: hydra overrides of RL2's
``ppo`` config for ``gem-core rl2 train`` (rl-square 0.0.2) and the ``make-dataset rl2`` commands.

Imports nothing from RL2: it writes text. RL2's defaults that would change the run are pinned:
``actor.weight_decay`` (0.01), ``actor.gradient_checkpointing`` (true), ``actor.warmup_ratio`` (0.1),
``rollout.dynamic_filtering`` (true: groups whose rewards are all equal dropped), the test sampling's
temperature (0: greedy), ``adv.global_norm``/``norm_var``, the SGLang engine's dtype (bfloat16 by default).
RL2's training precision is fixed in its code: FSDP mixed precision in bfloat16 (gradients reduced in bfloat16
too), the weights loaded in the checkpoint's own dtype (a bfloat16 checkpoint trains bfloat16 master weights:
give it a float32 one); float32 is refused. ``tests/integrations/rl2/test_experiment.py``
composes RL2's config with these overrides and checks what RL2 will use.
"""

from __future__ import annotations

from typing import Any

from gem_core.experiment import Experiment, require, require_portable
from gem_core.experiment_scripts import dataset_command, hydra_overrides, launch_script, require_precision, warmup_optimizer_steps

TRAINER = "rl2"
#: loss_aggregation as RL2's actor.avg_level. Not seq-mean-token-mean ("sequence"): rl-square 0.0.2's Actor.update
#: passes its bool clip-ratio metric through aggregate_values, whose sequence branch takes torch.finfo of it and raises
#: on every update (tests/integrations/rl2/test_same_update.py).
AVG_LEVEL = {"token-mean": "token"}
#: What stands for "no turn limit" (the launcher's own default: far above every env's limit).
MAX_TURNS = 1000
#: training.precision as the shell variable the overrides name (float32: the reason RL2 cannot).
PRECISION = {
    "bf16": {"ROLLOUT_DTYPE": "bfloat16"},
    "float32": "RL2 0.0.2's FSDP mixed precision is bfloat16, fixed in its code",
}


def check(experiment: Experiment) -> None:
    """Refuse, naming the key, what RL2 cannot run."""
    require_portable(TRAINER, experiment)
    e = experiment
    require_precision(TRAINER, e, PRECISION)
    require(TRAINER, e, "algorithm.estimator", e.estimator == "rebn", "RL2's own estimators are episode-level; the plugin's is rebn")
    require(
        TRAINER,
        e,
        "algorithm.loss_aggregation",
        e.loss_aggregation in AVG_LEVEL,
        "RL2 0.0.2 runs token-mean only (actor.avg_level=sequence raises in its Actor.update)",
    )
    require(TRAINER, e, "algorithm.clip_high", e.clip_high == e.clip_low, "RL2 clips symmetrically (actor.clip)")
    require(TRAINER, e, "training.epochs", e.ppo_epochs == 1, "RL2 makes one pass over each rollout (actor.update_per_rollout mini-batches)")
    require(TRAINER, e, "optimizer.betas", tuple(e.betas) == (0.9, 0.999), "RL2's AdamW has torch's betas (0.9, 0.999)")
    require(TRAINER, e, "optimizer.eps", e.eps == 1e-8, "RL2's AdamW has torch's eps 1e-8")
    require(TRAINER, e, "rollout.logprob_temperature", e.logprob_temperature == e.temperature, "RL2 recomputes logprobs at the rollout's temperature")
    require(
        TRAINER,
        e,
        "training.mini_batches",
        e.groups_per_update % e.mini_batches == 0,
        f"RL2 splits the {e.groups_per_update} start states of an update evenly",
    )


def settings(experiment: Experiment) -> dict[str, Any]:
    """Every RL2 config key the experiment sets (``$MODEL``/``$DATA`` stand for the paths, ``$ROLLOUT_DTYPE`` for
    the precision's: :data:`PRECISION`)."""
    check(experiment)
    e = experiment
    total = e.updates * e.mini_batches
    warmup = warmup_optimizer_steps(e)
    return {
        "train_data.path": "$DATA/train.jsonl",
        # the rows are the run's start states in order (gem_core.experiment.update_start_seeds): RL2 would shuffle them
        "+train_data.shuffle": False,
        "train_data.prompts_per_rollout": e.groups_per_update,
        "train_data.responses_per_prompt": e.group_size,
        "test_data.path": "$DATA/eval.jsonl",
        "test_data.prompts_per_rollout": e.eval_episodes,
        "test_data.responses_per_prompt": 1,
        "actor.model_name": "$MODEL",
        "actor.gradient_checkpointing": e.gradient_checkpointing,
        "actor.update_per_rollout": e.mini_batches,
        "actor.clip": e.clip_low,
        "actor.avg_level": AVG_LEVEL[e.loss_aggregation],
        "actor.lr": e.lr,
        "actor.weight_decay": e.weight_decay,
        "actor.max_grad_norm": e.max_grad_norm,
        "actor.scheduler": "constant_with_warmup",
        # RL2 warms up for int(warmup_ratio * steps): half a step above the target survives the floor
        "actor.warmup_ratio": 0.0 if warmup == 0 else (warmup + 0.5) / total,
        "actor.kl.coef": e.kl_coef,
        "actor.kl.type": "loss" if e.kl_coef > 0 else None,
        "actor.kl.loss_estimator": e.kl_estimator,
        "actor.entropy.coef": e.entropy_coef,
        "rollout.train_sampling_params.temperature": e.temperature,
        "rollout.train_sampling_params.max_new_tokens": e.max_turn_tokens,
        "rollout.test_sampling_params.temperature": e.temperature,
        "rollout.max_turns": e.max_turns or MAX_TURNS,
        "rollout.server_args.dtype": "$ROLLOUT_DTYPE",
        "rollout.dynamic_filtering": False,
        "rollout.env_path": "$(gem-core rl2 env-path)",
        "adv.estimator": "reinforce",
        "adv.gamma": e.gamma,
        "adv.global_norm": False,
        "adv.norm_var": False,
        "+adv.rebn": True,
        "+adv.rebn_eps": 1e-6,
        "+adv.rebn_ddof": 0,
        "+adv.rebn_group_by": None,
        "trainer.n_epochs": 1,
        "trainer.test_freq": e.eval_every if e.eval_every else None,
        "trainer.save_freq": e.eval_every if e.eval_every else None,
    }


def overrides(experiment: Experiment) -> list[str]:
    """The hydra overrides, ``key=value`` (``null``, ``true``/``false``)."""
    return hydra_overrides(settings(experiment))


def render(experiment: Experiment, source: str = "experiment.toml") -> str:
    """The script: the two datasets (training rows, held-out rows), then the launcher."""
    train = dataset_command(TRAINER, experiment, "$DATA/train.jsonl")
    held_out = dataset_command(TRAINER, experiment, "$DATA/eval.jsonl", held_out=True)
    command = ["gem-core", "rl2", "train", *overrides(experiment)]
    note = "# RL2 plays the rows in order (train_data.shuffle=false: the plugin's launcher); torchrun, SGLang and GPU options are yours to add:"
    return launch_script(TRAINER, experiment, source, [train, held_out], PRECISION, command, note)
