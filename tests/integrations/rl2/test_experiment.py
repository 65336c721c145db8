"""An experiment's RL2 overrides (gem_integrations.rl2.experiment) through RL2's own config: hydra composes
rl-square's ppo.yaml with them, and the values RL2 will use (its interpolations resolved, its warm-up rule, the
plugin's ReBN options) equal the experiment's, RL2's defaults that would change the run pinned."""

from __future__ import annotations

import pytest
from test_rl2 import compose_rl2

from gem_core.experiment import parse_experiment
from gem_core.experiment_scripts import warmup_optimizer_steps
from gem_integrations.rl2.advantage import rebn_settings
from gem_integrations.rl2.experiment import PRECISION, overrides, render

EXPERIMENT = parse_experiment(
    "[rollout]\nepisodes_per_update = 16\ngroup_size = 4\ntemperature = 0.9\nlogprob_temperature = 0.9\n"
    '[algorithm]\nclip_low = 0.25\nclip_high = 0.25\nkl_coef = 0.05\nkl_estimator = "k3"\nentropy_coef = 0.01\ngamma = 0.8\nloss_aggregation = "token-mean"\n'
    "[optimizer]\nlr = 3e-4\nwarmup_updates = 2\nweight_decay = 0.01\nmax_grad_norm = 0.5\n"
    "[training]\nupdates = 29\nmini_batches = 2\neval_every = 3\n[env]\nmax_turns = 5\nmax_turn_tokens = 8\n"
)


def composed(experiment, tmp_path):
    values = {"$MODEL": "some/model", "$DATA": str(tmp_path), "$(gem-core rl2 env-path)": "env.py", "$ROLLOUT_DTYPE": PRECISION["bf16"]["ROLLOUT_DTYPE"]}
    argv = []
    for override in overrides(experiment):
        for name, value in values.items():
            override = override.replace(name, value)
        argv.append(override)
    return compose_rl2(argv)


def test_rl2_uses_the_experiments_values(tmp_path):
    e = EXPERIMENT
    config = composed(e, tmp_path)
    actor = config.actor
    assert (config.train_data.prompts_per_rollout * config.train_data.responses_per_prompt, config.rollout.responses_per_prompt) == (16, 4)
    assert (actor.lr, actor.weight_decay, actor.max_grad_norm, actor.scheduler) == (e.lr, e.weight_decay, e.max_grad_norm, "constant_with_warmup")
    assert (actor.update_per_rollout, actor.clip, actor.avg_level) == (e.mini_batches, e.clip_low, "token")
    assert (actor.kl.coef, actor.kl.type, actor.kl.loss_estimator, actor.entropy.coef) == (e.kl_coef, "loss", "k3", e.entropy_coef)
    assert actor.temperature == e.temperature == config.rollout.train_sampling_params.temperature  # the recompute's, by RL2's interpolation
    assert config.rollout.test_sampling_params.temperature == e.temperature  # RL2: 0 (greedy)
    assert (config.rollout.train_sampling_params.max_new_tokens, config.rollout.max_turns) == (e.max_turn_tokens, e.max_turns)
    assert config.rollout.dynamic_filtering is False and actor.gradient_checkpointing is False
    assert (config.trainer.n_epochs, config.trainer.test_freq) == (1, e.eval_every)
    assert config.train_data.shuffle is False  # the rows in the run's order (gem_integrations.rl2.data_order)
    assert rebn_settings(config.adv) == {"gamma": e.gamma, "eps": 1e-6, "ddof": 0, "group_by": None, "responses_per_prompt": e.group_size}
    # RL2's scheduler (trainer/base.py prepare_scheduler): int(warmup_ratio * n_epochs * batches * update_per_rollout)
    batches = e.updates  # the training rows hold exactly `updates` batches of prompts_per_rollout
    assert int(actor.warmup_ratio * config.trainer.n_epochs * batches * actor.update_per_rollout) == warmup_optimizer_steps(e)


@pytest.mark.parametrize("updates, warmup", [(100, 29), (15, 2), (7, 0), (3, 3)])
def test_the_warmup_ratio_gives_the_exact_step_count(updates, warmup, tmp_path):
    e = parse_experiment(f"[training]\nupdates = {updates}\n[optimizer]\nwarmup_updates = {warmup}\n")
    assert int(composed(e, tmp_path).actor.warmup_ratio * updates) == warmup


def test_the_precision_is_rl2s_bf16_and_float32_is_refused(tmp_path):
    """RL2 trains in bfloat16, fixed in its code (FSDP's MixedPrecision, checked here in rl-square 0.0.2): the
    experiment pins its engine's dtype to match, refuses float32 naming the key, and an ``auto`` script stops in
    one line where the machine would train in float32."""
    import inspect

    from RL2.utils import data_parallelism

    from gem_core.experiment import UnsupportedSettingError
    from helpers.scripts import script_precision

    source = inspect.getsource(data_parallelism)
    assert all(f"{name}=torch.bfloat16" in source for name in ("param_dtype", "reduce_dtype", "buffer_dtype"))
    assert composed(EXPERIMENT, tmp_path).rollout.server_args.dtype == "bfloat16"
    with pytest.raises(UnsupportedSettingError, match="rl2 cannot run this experiment: training.precision="):
        overrides(parse_experiment('[training]\nprecision = "float32"\n'))
    script = render(EXPERIMENT)
    assert script_precision(script, {"GEM_PRECISION": "bf16"}) == {"ROLLOUT_DTYPE": "bfloat16"}
    with pytest.raises(RuntimeError, match="training.precision auto is float32 on this machine, which rl2 cannot train in"):
        script_precision(script, {"GEM_PRECISION": "float32"})


class _Rows(list):
    """A dataset with RL2's collate function attribute (RL2's ``get_dataloader`` reads ``dataset.collate_fn``)."""

    @staticmethod
    def collate_fn(batch):
        return list(batch)


@pytest.mark.parametrize("shuffle, in_order", [(False, True), (True, False), (None, False)])
def test_the_training_rows_play_in_order_where_the_config_says_so(shuffle, in_order):
    """RL2's own ``get_dataloader`` (``shuffle=True``, no switch) under the plugin's patch of
    ``PPOTrainer.get_dataloader``: with ``train_data.shuffle=false`` (the experiment's) the batches are the rows in
    order; with true or without the key they are RL2's shuffle; the test loader is RL2's, shuffled, either way."""
    import torch
    from omegaconf import OmegaConf
    from RL2.datasets import get_dataloader

    from gem_integrations.rl2.data_order import make_get_dataloader

    rows = _Rows(range(12))

    def rl2s(self, train):  # PPOTrainer.get_dataloader's last line, on a list of rows
        return get_dataloader(rows, 4 if train else len(rows))

    train_data = {"prompts_per_rollout": 4, **({} if shuffle is None else {"shuffle": shuffle})}
    trainer = type("PPOTrainerStandIn", (), {"config": OmegaConf.create({"train_data": train_data})})()
    patched = make_get_dataloader(rl2s)
    torch.manual_seed(0)
    batches = [batch for batch in patched(trainer, True)]
    assert sorted(x for batch in batches for x in batch) == list(rows) and [len(batch) for batch in batches] == [4, 4, 4]
    assert ([x for batch in batches for x in batch] == list(rows)) is in_order
    test_loaders = []
    for get in (patched, rl2s):  # the test loader untouched: the same shuffle under the same seed
        torch.manual_seed(0)
        test_loaders.append(next(iter(get(trainer, False))))
    assert test_loaders[0] == test_loaders[1] != list(rows)
    with pytest.raises(ValueError, match="train_data.shuffle must be true or false"):
        patched(type("T", (), {"config": OmegaConf.create({"train_data": {"shuffle": "no"}})})(), True)


def test_a_shuffle_value_that_is_not_a_boolean_is_one_line_before_rl2_starts(capsys):
    from gem_integrations.rl2.train import EXIT_USAGE, main

    assert main(["+train_data.shuffle=no", "train_data.path=rows.jsonl"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gem-core rl2 train: error: train_data.shuffle must be true or false, got 'no'"]
