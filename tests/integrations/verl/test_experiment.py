"""An experiment's verl configuration (gem_integrations.verl.experiment) through verl 0.9's own config code:
hydra composes verl's ppo_trainer config with the written overrides, verl's validate_config passes, and the
values verl will use (its config dataclasses, its estimator options, its lr schedule) equal the experiment's."""

from __future__ import annotations

import os
import shlex

import pytest

from gem_core.experiment import parse_experiment
from gem_integrations.verl.experiment import PRECISION, overrides, render

EXPERIMENT = parse_experiment(
    "[rollout]\nepisodes_per_update = 16\ngroup_size = 4\ntemperature = 0.9\nlogprob_temperature = 0.9\n"
    '[algorithm]\nclip_low = 0.25\nclip_high = 0.28\nkl_coef = 0.05\nkl_estimator = "k3"\nentropy_coef = 0.01\ngamma = 0.8\n'
    'loss_aggregation = "seq-mean-token-mean"\n'
    "[optimizer]\nlr = 3e-4\nwarmup_updates = 2\nbetas = [0.9, 0.95]\nweight_decay = 0.01\nmax_grad_norm = 0.5\n"
    "[training]\nupdates = 3\nepochs = 2\nmini_batches = 2\ngradient_checkpointing = true\neval_every = 1\n"
    "[env]\nmax_turns = 5\nmax_turn_tokens = 8\nmax_context_tokens = 160\n[seeds]\nseed = 7\n"
)


def composed(experiment, model_dir, data_dir, precision="float32"):
    """verl's config of the overrides, ``$MODEL``/``$DATA`` and the precision's variables set as the script sets them."""
    import verl
    from hydra import compose, initialize_config_dir

    values = {"MODEL": model_dir, "DATA": data_dir, **PRECISION[precision]}
    argv = []
    for override in overrides(experiment):
        for name, value in values.items():
            override = override.replace(f"${name}", value)
        argv.append(override)
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=[*argv, "actor_rollout_ref.rollout.name=vllm"])


def test_the_script_passes_exactly_these_overrides(model_dir, tmp_path):
    script = render(EXPERIMENT)
    block = script.split("python \\\n  -m verl.trainer.main_ppo", 1)[1].split('"$@"', 1)[0]
    assert shlex.split(block.replace("\\\n", " ")) == overrides(EXPERIMENT)


def test_verl_validates_and_uses_the_experiments_values(model_dir, tmp_path):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from gem_integrations.verl.advantage import check_trainer_config, rebn_options

    e = EXPERIMENT
    config = composed(e, model_dir, str(tmp_path))
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    check_trainer_config(config)
    assert need_reference_policy(config) and not need_critic(config)  # the KL loss needs the reference model
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert (actor.optim.lr, actor.optim.weight_decay, list(actor.optim.betas)) == (e.lr, e.weight_decay, list(e.betas))
    # verl's scheduler steps once an update: the warm-up in updates (2 here, of 4 optimizer steps each)
    assert actor.optim.lr_warmup_steps == e.warmup_updates == 2 and e.optimizer_steps_per_update == 4
    assert actor.optim.lr_scheduler_type == "constant"
    assert actor.grad_clip == actor.optim.clip_grad == e.max_grad_norm
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (e.clip_low, e.clip_high, e.loss_aggregation)
    assert actor.clip_ratio_c >= 1e9 and actor.policy_loss.loss_mode == "vanilla"
    assert (actor.use_kl_loss, actor.kl_loss_coef, actor.kl_loss_type, actor.entropy_coeff) == (True, e.kl_coef, "low_var_kl", e.entropy_coef)
    assert actor.ppo_epochs == e.ppo_epochs and actor.shuffle is False
    # verl counts the mini-batch in prompts; times rollout.n it is the experiment's episodes per optimizer step
    assert actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n == e.mini_batch_episodes
    assert config.data.train_batch_size * config.actor_rollout_ref.rollout.n == e.episodes_per_update
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert (rollout.n, rollout.temperature, rollout.top_p, rollout.top_k, rollout.seed) == (e.group_size, e.temperature, 1.0, -1, e.seed)
    assert (rollout.val_kwargs.do_sample, rollout.val_kwargs.temperature, rollout.val_kwargs.n) == (True, e.temperature, 1)
    assert rollout.multi_turn.max_assistant_turns == e.max_turns and rollout.agent.default_agent_loop == "gem_env"
    assert config.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert config.data.shuffle is False and config.algorithm.use_kl_in_reward is False
    assert (config.trainer.total_training_steps, config.trainer.test_freq, config.trainer.use_v1) == (e.updates, e.eval_every, True)
    assert config.algorithm.adv_estimator == "rebn"
    assert rebn_options(config.algorithm) == {"gamma": e.gamma, "eps": 1e-6, "ddof": 0, "group_by": None}
    # verl's own scheduler for lr_scheduler_type=constant (its FSDP engine builds this one), stepped once an update
    # (verl's engine workers, after each update's last mini-batch): the warm-up's updates under lr, then lr
    import torch
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=actor.optim.lr)
    scheduler = get_constant_schedule_with_warmup(optimizer=optimizer, num_warmup_steps=actor.optim.lr_warmup_steps)
    rates = []
    for _ in range(e.updates):
        rates.append(scheduler.get_last_lr()[0])
        for _step in range(e.optimizer_steps_per_update):
            optimizer.step()
        scheduler.step()
    warmup = e.warmup_updates
    assert all(rate < e.lr for rate in rates[:warmup]) and rates[warmup:] == pytest.approx([e.lr] * (len(rates) - warmup))


def test_verls_defaults_that_would_change_the_default_run_are_pinned(model_dir, tmp_path):
    """The default experiment: verl's own defaults (weight decay 0.01, gradient checkpointing on, data shuffled,
    greedy validation, dual clip 3) would each change the run; the written overrides hold the experiment's."""
    from verl.utils.config import omega_conf_to_dataclass

    e = parse_experiment("")
    config = composed(e, model_dir, str(tmp_path))
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert actor.optim.weight_decay == 0.0 and actor.use_kl_loss is False and actor.entropy_coeff == 0.0
    assert config.actor_rollout_ref.model.enable_gradient_checkpointing is False and config.data.shuffle is False
    assert config.actor_rollout_ref.rollout.val_kwargs.do_sample is True


@pytest.mark.parametrize(("estimator", "verl_name", "norm"), [("grpo", "grpo", True), ("drgrpo", "grpo", False), ("rloo", "rloo", None)])
def test_group_estimators_map_to_verls_own(estimator, verl_name, norm, model_dir, tmp_path):
    e = parse_experiment(f'[rollout]\ngroup_size = 4\n[algorithm]\nestimator = "{estimator}"\n')
    config = composed(e, model_dir, str(tmp_path))
    assert config.algorithm.adv_estimator == verl_name
    if norm is not None:
        assert config.algorithm.norm_adv_by_std_in_grpo is norm


@pytest.mark.parametrize(
    ("precision", "compute", "rollout_dtype", "attention"),
    [("bf16", "bfloat16", "bfloat16", "flash_attention_2"), ("float32", "float32", "float32", "sdpa")],
)
def test_the_precision_is_pinned_through_verls_own_config(precision, compute, rollout_dtype, attention, model_dir, tmp_path):
    """training.precision as verl's FSDP engine reads it: the weights loaded in float32 (the master copy), the
    forward and backward in the precision's dtype with gradients reduced in float32, the engine's dtype, and an
    attention that computes in it; for the actor and the reference model (the KL's) alike."""
    import torch
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.torch_dtypes import PrecisionType

    config = composed(EXPERIMENT, model_dir, str(tmp_path), precision)
    for role in ("actor", "ref"):
        fsdp = omega_conf_to_dataclass(config.actor_rollout_ref[role].fsdp_config)
        assert PrecisionType.to_dtype(fsdp.model_dtype) == torch.float32, role
        mixed = fsdp.mixed_precision
        assert PrecisionType.to_dtype(mixed["param_dtype"]) == getattr(torch, compute), role
        assert PrecisionType.to_dtype(mixed["reduce_dtype"]) == PrecisionType.to_dtype(mixed["buffer_dtype"]) == torch.float32, role
    assert config.actor_rollout_ref.rollout.dtype == rollout_dtype
    assert config.actor_rollout_ref.model.override_config.attn_implementation == attention


def test_an_auto_script_picks_its_precision_where_it_runs():
    """``auto`` (the default) is decided by the script where it runs: this machine's precision
    (gem_core.precision), or ``$GEM_PRECISION``; each gives verl the values above."""
    from gem_core.precision import machine_precision
    from helpers.scripts import script_precision

    script = render(EXPERIMENT)
    assert script_precision(script) == PRECISION[machine_precision()]
    for precision in ("bf16", "float32"):
        assert script_precision(script, {"GEM_PRECISION": precision}) == PRECISION[precision]
    pinned = render(parse_experiment('[training]\nprecision = "bf16"\n'))
    assert script_precision(pinned, {"GEM_PRECISION": "float32"}) == PRECISION["bf16"]  # a pinned precision is not the machine's
