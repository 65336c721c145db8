"""An experiment's OpenRLHF arguments (gem_integrations.openrlhf.experiment) through OpenRLHF 0.11's own parser
(the launcher's, with rebn): the values OpenRLHF will use equal the experiment's, its defaults that would change
the run pinned, and the warm-up it computes from the ratio is the experiment's in optimizer steps."""

from __future__ import annotations

import math
import shlex

import pytest

from gem_core.experiment import parse_experiment, train_rows
from gem_core.experiment_scripts import warmup_optimizer_steps
from gem_integrations.openrlhf import agent_path, train_ppo_ray
from gem_integrations.openrlhf.experiment import PRECISION, arguments, render

EXPERIMENT = parse_experiment(
    "[rollout]\nepisodes_per_update = 16\ngroup_size = 4\ntemperature = 0.9\nlogprob_temperature = 0.9\n"
    '[algorithm]\nclip_low = 0.25\nclip_high = 0.28\nkl_coef = 0.05\nkl_estimator = "k3"\nentropy_coef = 0.01\ngamma = 0.8\n'
    "[optimizer]\nlr = 3e-4\nwarmup_updates = 2\nbetas = [0.9, 0.95]\neps = 1e-7\nweight_decay = 0.01\nmax_grad_norm = 0.5\n"
    "[training]\nupdates = 15\nepochs = 2\nmini_batches = 2\ngradient_checkpointing = true\neval_every = 3\n"
    "[env]\nmax_context_tokens = 160\n[seeds]\nseed = 7\n"
)


def parsed(experiment, tmp_path):
    argv = [
        a.replace("$MODEL", "some/model")
        .replace("$DATA", str(tmp_path))
        .replace("$(gem-core openrlhf agent-path)", agent_path())
        .replace("$PARAM_DTYPE", PRECISION["bf16"]["PARAM_DTYPE"])  # as the script sets it (test_the_precision...)
        for a in arguments(experiment)
    ]
    return train_ppo_ray.parse_args(argv)


def test_the_script_passes_exactly_these_arguments():
    script = render(EXPERIMENT)
    block = script.split("gem-core openrlhf train", 1)[1].split('"$@"', 1)[0]
    assert shlex.split(block.replace("\\\n", " ").replace('"$(gem-core openrlhf agent-path)"', "AGENT")) == [
        "AGENT" if a == "$(gem-core openrlhf agent-path)" else a for a in arguments(EXPERIMENT)
    ]


def test_openrlhf_uses_the_experiments_values(tmp_path):
    e = EXPERIMENT
    args = parsed(e, tmp_path)
    assert (args.algo.advantage.estimator, args.algo.advantage.gamma, args.algo.advantage.rebn_ddof) == ("rebn", e.gamma, 0)
    assert (args.rollout.batch_size * args.rollout.n_samples_per_prompt, args.rollout.n_samples_per_prompt) == (e.episodes_per_update, e.group_size)
    assert args.train.batch_size == e.mini_batch_episodes and args.train.max_epochs == e.ppo_epochs
    assert (args.rollout.temperature, args.rollout.top_p, args.train.seed) == (e.temperature, 1.0, e.seed)
    adam = args.actor.adam
    assert (adam.lr, tuple(adam.betas), adam.eps, adam.weight_decay, args.actor.max_norm) == (e.lr, e.betas, e.eps, e.weight_decay, e.max_grad_norm)
    assert args.actor.lr_scheduler == "constant_with_warmup"
    assert tuple(args.actor.eps_clip_low_high) == (e.clip_low, e.clip_high) and args.actor.loss_agg_mode == "token-mean"
    assert (args.algo.kl.init_coef, args.algo.kl.use_loss, args.algo.kl.estimator) == (e.kl_coef, True, "k3")
    assert args.actor.entropy_coef == e.entropy_coef and args.actor.gradient_checkpointing_enable is True
    assert tuple(args.reward.clip_range) == (-1e9, 1e9) and args.data.max_len == e.max_context_tokens
    assert args.data.shuffle is False  # the rows played in order (the launcher's data-order patch), as in every trainer
    # prepare_datasets cuts the held-out file to max_samples too: every held-out row stays (the training file holds its own)
    assert args.data.max_samples >= max(e.eval_episodes, train_rows(e))
    assert (args.eval.temperature, args.eval.n_samples_per_prompt, args.eval.steps) == (e.temperature, 1, e.eval_every)
    # OpenRLHF's step count (prepare_datasets) and warm-up (its DeepSpeed strategy: ceil(steps * ratio))
    max_steps = train_rows(e) * args.rollout.n_samples_per_prompt // args.train.batch_size * args.train.num_episodes * args.train.max_epochs
    assert max_steps == e.updates * e.optimizer_steps_per_update
    assert math.ceil(max_steps * args.actor.lr_warmup_ratio) == warmup_optimizer_steps(e)


@pytest.mark.parametrize("updates, warmup", [(15, 2), (100, 29), (7, 0), (3, 3)])
def test_the_warmup_ratio_gives_the_exact_step_count(updates, warmup, tmp_path):
    e = parse_experiment(f"[training]\nupdates = {updates}\n[optimizer]\nwarmup_updates = {warmup}\n")
    args = parsed(e, tmp_path)
    assert math.ceil(e.updates * args.actor.lr_warmup_ratio) == warmup


def test_openrlhfs_defaults_that_would_change_the_default_run_are_pinned(tmp_path):
    args = parsed(parse_experiment(""), tmp_path)
    assert args.data.shuffle is False and "plays the rows in order (--data.shuffle false" in render(parse_experiment(""))  # OpenRLHF: shuffled
    assert args.algo.kl.init_coef == 0.0 and not args.algo.kl.use_loss  # OpenRLHF: 0.01 in the reward
    assert tuple(args.actor.adam.betas) == (0.9, 0.999)  # OpenRLHF: (0.9, 0.95)
    assert args.train.seed == 0 and args.eval.n_samples_per_prompt == 1 and args.eval.temperature == 1.0


@pytest.mark.parametrize(("estimator", "name"), [("grpo", "group_norm"), ("drgrpo", "dr_grpo"), ("rloo", "rloo")])
def test_group_estimators_map_to_openrlhfs_own(estimator, name, tmp_path):
    e = parse_experiment(f'[rollout]\ngroup_size = 4\n[algorithm]\nestimator = "{estimator}"\n')
    assert parsed(e, tmp_path).algo.advantage.estimator == name


def test_the_precision_is_bf16_and_float32_is_refused(tmp_path):
    """OpenRLHF trains in bf16 (DeepSpeed's, float32 master weights) and has no float32: an experiment that says
    float32 is refused naming the key; an ``auto`` one stops where the machine would train in float32, in one line."""
    from gem_core.experiment import UnsupportedSettingError
    from helpers.scripts import script_precision

    assert parsed(EXPERIMENT, tmp_path).ds.param_dtype == "bf16"
    with pytest.raises(UnsupportedSettingError, match="openrlhf cannot run this experiment: training.precision="):
        arguments(parse_experiment('[training]\nprecision = "float32"\n'))
    script = render(EXPERIMENT)  # auto
    assert script_precision(script, {"GEM_PRECISION": "bf16"}) == {"PARAM_DTYPE": "bf16"}
    with pytest.raises(RuntimeError, match="training.precision auto is float32 on this machine, which openrlhf cannot train in"):
        script_precision(script, {"GEM_PRECISION": "float32"})
    assert script_precision(render(parse_experiment('[training]\nprecision = "bf16"\n'))) == {"PARAM_DTYPE": "bf16"}
