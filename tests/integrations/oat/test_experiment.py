"""An experiment's oat arguments (gem_integrations.oat.experiment) through the launcher's parser (oat's own
get_default_args and default_args_validation): the values oat will use equal the experiment's, oat's defaults
that would change the run pinned."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gem_core.experiment import UnsupportedSettingError, load_experiment, parse_experiment
from gem_integrations.oat.experiment import PRECISION, TURN_CAP, arguments, transitions_per_update

EXPERIMENT = parse_experiment(
    "[rollout]\nepisodes_per_update = 8\ntemperature = 0.9\nlogprob_temperature = 0.9\n"
    '[algorithm]\nclip_low = 0.25\nclip_high = 0.25\nview = "turn"\nloss_aggregation = "seq-mean-token-mean"\nkl_coef = 0.05\ngamma = 0.8\n'
    "[optimizer]\nlr = 3e-4\nwarmup_updates = 0\nbetas = [0.85, 0.99]\nweight_decay = 0.01\nmax_grad_norm = 0.5\n"
    "[training]\nupdates = 15\nepochs = 2\ngradient_checkpointing = true\n[env]\nmax_turns = 5\nmax_turn_tokens = 8\nmax_context_tokens = 160\n"
)


def parsed(experiment, monkeypatch, tmp_path, precision="bf16"):
    """oat's args of the experiment's arguments, ``$MODEL``/``$DATA`` and the precision's variables set as the script sets them."""
    import torch

    from gem_integrations.oat.launch import build_args

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # oat's validation counts GPUs; this machine has none
    values = {"MODEL": "tiny", "DATA": str(tmp_path), **PRECISION[precision]}
    argv = []
    for arg in arguments(experiment):
        for name, value in values.items():
            arg = arg.replace(f"${name}", value)
        argv.append(arg)
    return build_args([*argv, "--gpus", "1"])


def test_oat_uses_the_experiments_values(monkeypatch, tmp_path):
    e = EXPERIMENT
    args = parsed(e, monkeypatch, tmp_path)
    assert (args.critic_type, args.whiten_adv, args.gamma, args.lam, args.num_samples) == ("grpo", True, e.gamma, 1.0, 1)
    assert args.lr_warmup_ratio == 0.0
    assert (args.learning_rate, args.lr_scheduler, args.adam_beta_1, args.adam_beta_2, args.l2, args.max_norm) == (
        e.lr, "constant", e.betas[0], e.betas[1], e.weight_decay, e.max_grad_norm
    )  # fmt: skip
    assert (args.num_ppo_epochs, args.cliprange, args.beta, args.kl_penalty_coef) == (e.ppo_epochs, e.clip_low, e.kl_coef, 0.0)
    assert (args.temperature, args.top_p, args.top_k, args.generate_max_length) == (e.temperature, 1.0, -1, e.max_turn_tokens)
    assert (args.gem_episodes_per_step, args.gem_max_turns, args.gem_max_context_tokens) == (e.episodes_per_update, e.max_turns, e.max_context_tokens)
    assert args.rollout_batch_size_per_device == args.train_batch_size == e.episodes_per_update * e.max_turns  # no subsampling of an update
    assert args.pi_buffer_maxlen_per_device == transitions_per_update(e)  # oat's policy buffer (a deque) keeps every turn
    assert args.gradient_checkpointing is True and args.seed == e.seed


@pytest.mark.parametrize(("precision", "bf16", "flash_attn"), [("bf16", True, True), ("float32", False, False)])
def test_the_precision_is_pinned(precision, bf16, flash_attn, monkeypatch, tmp_path):
    """training.precision as oat's flags: bf16 (its DeepSpeed bf16, vLLM in bfloat16) or neither bf16 nor fp16
    (float32 weights, DeepSpeed and vLLM), with flash-attention only where it can compute (16 bits)."""
    e = dataclasses.replace(EXPERIMENT, precision=precision)
    args = parsed(e, monkeypatch, tmp_path, precision)
    assert (args.bf16, args.fp16, args.flash_attn) == (bf16, False, flash_attn)


TURN = Path(__file__).resolve().parents[3] / "examples" / "experiments" / "turn.toml"


def test_the_turn_file_runs_in_oat_with_its_values(monkeypatch, tmp_path):
    """examples/experiments/turn.toml (the default run with oat's per-turn rows and per-row token mean) through oat's own
    parser: the values oat will use are the file's."""
    e = load_experiment(TURN)
    assert (e.view, e.loss_aggregation, e.estimator, e.group_size, e.warmup_updates) == ("turn", "seq-mean-token-mean", "rebn", 1, 0)
    args = parsed(e, monkeypatch, tmp_path)
    assert (args.critic_type, args.whiten_adv, args.gamma, args.lam, args.num_samples) == ("grpo", True, 0.9, 1.0, 1)
    assert (args.learning_rate, args.lr_scheduler, args.lr_warmup_ratio, args.adam_beta_1, args.adam_beta_2, args.l2, args.max_norm) == (
        1e-4, "constant", 0.0, 0.9, 0.999, 0.0, 1.0
    )  # fmt: skip
    assert (args.num_ppo_epochs, args.cliprange, args.beta, args.kl_penalty_coef) == (1, 0.2, 0.0, 0.0)
    assert (args.temperature, args.top_p, args.top_k, args.generate_max_length) == (1.0, 1.0, -1, 16)
    assert (args.gem_episodes_per_step, args.gem_max_turns, args.gem_max_context_tokens) == (32, None, 1024)
    assert args.rollout_batch_size_per_device == args.train_batch_size == args.pi_buffer_maxlen_per_device == 32 * TURN_CAP  # every turn of an update
    assert args.gradient_checkpointing is False and args.seed == 0


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"mini_batches": 0, "turns_per_step": 32}, "training.mini_batches=0: oat counts optimizer steps in episodes"),
        ({"warmup_updates": 2}, "optimizer.warmup_updates=2: oat's constant schedule has no warm-up"),
        ({"view": "sequence"}, "algorithm.view='sequence'"),
    ],
)
def test_what_oat_cannot_express_in_the_turn_file_is_refused_in_one_line(change, says):
    with pytest.raises(UnsupportedSettingError) as caught:
        arguments(dataclasses.replace(load_experiment(TURN), **change))
    assert str(caught.value).startswith(f"oat cannot run this experiment: {says}") and "\n" not in str(caught.value)
