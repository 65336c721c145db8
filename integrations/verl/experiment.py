"""An experiment (:mod:`gem_core.experiment`) as verl 0.9's own configuration: hydra overrides of
``verl.trainer.main_ppo`` (the v1 trainer, the ``gem_env`` agent loop) and the ``make-dataset verl`` commands.

Imports nothing from verl: it writes text. Every setting is mapped, and verl's defaults that would change the
run are pinned: ``weight_decay`` (verl 0.01), ``enable_gradient_checkpointing`` (verl true), ``entropy_coeff``,
``use_kl_loss``/``use_kl_in_reward``, ``loss_agg_mode``, ``clip_ratio_c`` (verl's dual clip, 3.0: off here),
``data.shuffle`` (verl true: the rows play in order), the validation sampling (verl greedy: the experiment's
temperature), the seeds, and the precision (:data:`PRECISION`: FSDP's mixed precision, bf16 by default, the
weights loaded in float32, the rollout engine's dtype, bfloat16 by default, and the attention, flash-attention 2 by
default, which has no float32 kernel). ``tests/integrations/verl/test_experiment.py`` composes verl's config with these
overrides and checks what verl will use.
"""

from __future__ import annotations

from typing import Any

from gem_core.experiment import Experiment, refuse, require, require_portable
from gem_core.experiment_scripts import dataset_command, hydra_overrides, launch_script, require_precision

TRAINER = "verl"
#: The experiment's estimators as verl's ``algorithm.adv_estimator`` (rebn and gem_reinforce: the plugin's).
ESTIMATOR = {"rebn": "rebn", "reinforce": "gem_reinforce", "grpo": "grpo", "drgrpo": "grpo", "rloo": "rloo"}
#: verl's KL estimator names (``kl_loss_type``).
KL_TYPE = {"k1": "k1", "k2": "k2", "k3": "low_var_kl"}
#: No dual clip: verl applies ``clip_ratio_c`` to negative advantages; the experiment's PPO has none.
NO_DUAL_CLIP = 1.0e9
#: max_grad_norm 0 (no clipping): a norm no gradient reaches.
NO_GRAD_CLIP = 1.0e9
#: training.precision as the shell variables the overrides name: FSDP's compute dtype (gradients reduced and
#: buffers kept in float32, the weights loaded in float32: their master copy), the rollout engine's dtype, the
#: attention (flash-attention 2, verl's default, computes in 16 bits only).
PRECISION = {
    "bf16": {"ACTOR_DTYPE": "bf16", "ROLLOUT_DTYPE": "bfloat16", "ATTENTION": "flash_attention_2"},
    "float32": {"ACTOR_DTYPE": "fp32", "ROLLOUT_DTYPE": "float32", "ATTENTION": "sdpa"},
}
MIXED_PRECISION = "{param_dtype:$ACTOR_DTYPE,reduce_dtype:fp32,buffer_dtype:fp32}"


def settings(experiment: Experiment) -> dict[str, Any]:
    """Every verl config key the experiment sets, with its value (``$MODEL``/``$DATA`` stand for the paths, the
    variables of :data:`PRECISION` for the precision's values)."""
    check(experiment)
    e = experiment
    context = e.max_context_tokens or 32768
    out: dict[str, Any] = {
        "algorithm.adv_estimator": ESTIMATOR[e.estimator],
        "algorithm.use_kl_in_reward": False,
        "data.train_files": "$DATA/train.parquet",
        "data.val_files": "$DATA/eval.parquet",
        "data.train_batch_size": e.groups_per_update,
        "data.val_batch_size": e.eval_episodes,
        "data.shuffle": False,
        "data.seed": e.seed,
        # the row's own limits (max_context_tokens, max_turn_tokens) bind first; these only have to hold them
        "data.max_prompt_length": context,
        "data.max_response_length": context,
        "actor_rollout_ref.model.path": "$MODEL",
        "actor_rollout_ref.model.enable_gradient_checkpointing": e.gradient_checkpointing,
        "+actor_rollout_ref.model.override_config.attn_implementation": "$ATTENTION",
        "actor_rollout_ref.actor.fsdp_config.model_dtype": "fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision": MIXED_PRECISION,
        "actor_rollout_ref.ref.fsdp_config.model_dtype": "fp32",
        "+actor_rollout_ref.ref.fsdp_config.mixed_precision": MIXED_PRECISION,
        "actor_rollout_ref.rollout.dtype": "$ROLLOUT_DTYPE",
        "actor_rollout_ref.actor.optim.optimizer": "AdamW",
        "actor_rollout_ref.actor.optim.lr": e.lr,
        # verl steps its scheduler once an update (after the update's last mini-batch), so the warm-up is in updates
        "actor_rollout_ref.actor.optim.lr_warmup_steps": e.warmup_updates,
        "actor_rollout_ref.actor.optim.lr_scheduler_type": "constant",
        "actor_rollout_ref.actor.optim.weight_decay": e.weight_decay,
        "actor_rollout_ref.actor.optim.betas": list(e.betas),
        "actor_rollout_ref.actor.optim.clip_grad": e.max_grad_norm if e.max_grad_norm > 0 else NO_GRAD_CLIP,
        "actor_rollout_ref.actor.grad_clip": e.max_grad_norm if e.max_grad_norm > 0 else NO_GRAD_CLIP,
        "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
        "actor_rollout_ref.actor.clip_ratio_low": e.clip_low,
        "actor_rollout_ref.actor.clip_ratio_high": e.clip_high,
        "actor_rollout_ref.actor.clip_ratio_c": NO_DUAL_CLIP,
        "actor_rollout_ref.actor.loss_agg_mode": e.loss_aggregation,
        "actor_rollout_ref.actor.use_kl_loss": e.kl_coef > 0,
        "actor_rollout_ref.actor.kl_loss_coef": e.kl_coef,
        "actor_rollout_ref.actor.kl_loss_type": KL_TYPE[e.kl_estimator],
        "actor_rollout_ref.actor.entropy_coeff": e.entropy_coef,
        "actor_rollout_ref.actor.ppo_epochs": e.ppo_epochs,
        "actor_rollout_ref.actor.ppo_mini_batch_size": e.groups_per_update // e.mini_batches,
        "actor_rollout_ref.actor.shuffle": False,
        # micro-batches are memory, not the run (gradients accumulate to the mini-batch): 1, raise them on a GPU
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 1,
        "actor_rollout_ref.rollout.n": e.group_size,
        "actor_rollout_ref.rollout.temperature": e.temperature,
        "actor_rollout_ref.rollout.top_p": 1.0,
        "actor_rollout_ref.rollout.top_k": -1,
        "actor_rollout_ref.rollout.seed": e.seed,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.agent.default_agent_loop": "gem_env",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": e.max_turns or None,
        "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
        "actor_rollout_ref.rollout.val_kwargs.temperature": e.temperature,
        "actor_rollout_ref.rollout.val_kwargs.top_p": 1.0,
        "actor_rollout_ref.rollout.val_kwargs.top_k": -1,
        "actor_rollout_ref.rollout.val_kwargs.n": 1,
        "trainer.use_v1": True,
        "trainer.total_epochs": 1,
        "trainer.total_training_steps": e.updates,
        "trainer.val_before_train": True,
        "trainer.test_freq": e.eval_every if e.eval_every else -1,
    }
    if e.estimator in ("rebn", "reinforce"):
        # the plugin's options (added keys: verl's AlgoConfig has no such fields)
        out.update({"+algorithm.rebn_gamma": e.gamma, "+algorithm.rebn_eps": 1e-6, "+algorithm.rebn_ddof": 0, "+algorithm.rebn_group_by": None})
    if e.estimator in ("grpo", "drgrpo"):
        out["algorithm.norm_adv_by_std_in_grpo"] = e.estimator == "grpo"
    return out


def check(experiment: Experiment) -> None:
    """Refuse, naming the key, what verl cannot run."""
    require_portable(TRAINER, experiment)
    e = experiment
    require(TRAINER, e, "rollout.logprob_temperature", e.logprob_temperature == e.temperature, "verl recomputes logprobs at rollout.temperature")
    require_precision(TRAINER, e, PRECISION)
    require(TRAINER, e, "optimizer.eps", e.eps == 1e-8, "verl's FSDP optimizer config has no eps (torch's AdamW default 1e-8)")
    require(
        TRAINER,
        e,
        "training.mini_batches",
        e.groups_per_update % e.mini_batches == 0,
        f"verl's ppo_mini_batch_size counts start states: {e.groups_per_update} per update must split evenly",
    )
    if e.view == "turn" and e.loss_aggregation != "token-mean":
        raise refuse(TRAINER, e, "algorithm.view", "verl's gem_env loop trains one row per episode (sequence); per-turn rows differ under seq-mean losses")


def overrides(experiment: Experiment) -> list[str]:
    """The hydra overrides, ``key=value`` (verl's own value syntax: ``null``, ``True``, ``[a,b]``)."""
    return hydra_overrides(settings(experiment), python_bools=True)


def render(experiment: Experiment, source: str = "experiment.toml") -> str:
    """The script: the two datasets (training rows in order, held-out rows), then verl's main_ppo."""
    train = dataset_command(TRAINER, experiment, "$DATA/train.parquet")
    held_out = dataset_command(TRAINER, experiment, "$DATA/eval.parquet", held_out=True, extra=("--split", "test"))
    command = ["python", "-m", "verl.trainer.main_ppo", *overrides(experiment)]
    return launch_script(TRAINER, experiment, source, [train, held_out], PRECISION, command)
