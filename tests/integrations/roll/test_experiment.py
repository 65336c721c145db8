"""An experiment in ROLL (gem_integrations.roll.experiment): examples/experiments/turn_steps.toml written as ROLL's
agentic-pipeline YAML, and what ROLL cannot express refused in one line naming the key.

With ROLL_SRC (the roll_src session), ROLL's own code: the written file composed by Hydra and built into ROLL's
``AgenticConfig`` by dacite (its ``__post_init__`` and ``set_max_steps`` run), as ROLL's
``examples/start_agentic_pipeline.py`` does, and the values ROLL will use checked (lr and schedule, AdamW, the
estimator and its returns, batch sizes, gamma, clip, KL, entropy, epochs, sampling); the plugin's pipeline's
``adjust_batch`` and ROLL's ``DataProto.make_iterator`` (what ``ActorWorker.train_step`` iterates) taking one
optimizer step per ``turns_per_step`` turn samples whatever the turn count; ROLL's ``step_reinforce`` returns on the
golden episodes equal to the experiment's reinforce, and its ReBN (batch mean_std) the sample-std one that the
mapping refuses."""

from __future__ import annotations

import dataclasses
import inspect
import os
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gem_core.experiment import UnsupportedSettingError, load_experiment
from gem_integrations.roll.experiment import render, settings

FILE = Path(__file__).resolve().parents[3] / "examples" / "experiments" / "turn_steps.toml"
EXPERIMENT = load_experiment(FILE)
#: turn_steps.toml with other values in every key the mapping reads, so that no value passes by being a default
VARIED = dataclasses.replace(
    EXPERIMENT,
    episodes_per_update=12,
    group_size=3,
    temperature=0.7,
    gamma=0.8,
    clip_low=0.15,
    clip_high=0.28,
    kl_coef=0.05,
    entropy_coef=0.01,
    loss_aggregation="seq-mean-token-mean",
    lr=3e-6,
    betas=(0.85, 0.98),
    weight_decay=0.01,
    max_grad_norm=0.5,
    updates=7,
    ppo_epochs=2,
    turns_per_step=6,
    max_turn_tokens=24,
    max_context_tokens=640,
    max_turns=5,
    seed=11,
    gradient_checkpointing=True,
    precision="float32",
)
#: the golden episodes' per-turn rewards (DESIGN.md, "ReBN, exactly")
GOLDEN = [[0.0, 0.0, 1.0], [0.5, -0.1], [0.0]]


def test_the_file_is_written_and_every_other_trainer_refuses_it():
    """turn_steps.toml renders for ROLL; the trainers that count optimizer steps in episodes refuse it by name."""
    import importlib

    assert 'adv_estimator: "step_reinforce"' in render(EXPERIMENT)
    for trainer in ("verl", "openrlhf", "trl", "rl2", "oat"):
        module = importlib.import_module(f"gem_integrations.{trainer}.experiment")
        with pytest.raises(UnsupportedSettingError) as caught:
            module.render(EXPERIMENT)
        assert str(caught.value).startswith(f"{trainer} cannot run this experiment: training.mini_batches=0: "), trainer


REFUSED = [
    ({"mini_batches": 1, "turns_per_step": 0}, "training.mini_batches=1: ROLL's optimizer steps count turn samples"),
    ({"estimator": "rebn"}, "algorithm.estimator='rebn': ROLL's rebn (step_reinforce + batch mean_std) divides by torch.std, the sample std (ddof 1)"),
    ({"precision": "auto"}, "training.precision='auto'"),
    ({"temperature": 0.7, "logprob_temperature": 0.7}, "rollout.logprob_temperature=0.7"),
    ({"warmup_updates": 2}, "optimizer.warmup_updates=2"),
    ({"eps": 1e-6}, "optimizer.eps=1e-06"),
    ({"max_grad_norm": 0.0}, "optimizer.max_grad_norm=0.0"),
    ({"max_context_tokens": 0}, "env.max_context_tokens=0"),
    ({"kl_coef": 0.1, "kl_estimator": "k1"}, "algorithm.kl_estimator='k1'"),
    ({"warm_start_steps": 4}, "reference.warm_start_steps=4"),
]


@pytest.mark.parametrize(("change", "says"), REFUSED, ids=[s.split(":")[0] for _, s in REFUSED])
def test_what_roll_cannot_express_is_refused_in_one_line_naming_the_key(change, says):
    """turn_steps.toml with one setting ROLL cannot express: one line naming it (the file itself renders)."""
    with pytest.raises(UnsupportedSettingError) as caught:
        render(dataclasses.replace(EXPERIMENT, **change))
    message = str(caught.value)
    assert message.startswith(f"roll cannot run this experiment: {says}") and "\n" not in message


def test_the_mapping_says_every_value_the_experiment_sets():
    """The written settings (before ROLL reads them): the values ROLL's keys get from the varied experiment."""
    s = settings(VARIED)
    train = s["actor_train"]["training_args"]
    assert train["per_device_train_batch_size"] * train["gradient_accumulation_steps"] == VARIED.turns_per_step
    assert s["actor_train"]["infer_batch_size"] == s["reference"]["infer_batch_size"] == train["per_device_train_batch_size"]
    assert s["custom_envs"]["GemCore"]["env_config"] == {"env": "game:GuessTheNumber-v0-easy", "env_kwargs": {}, "suffix": "info", "max_turns": 5}


# -- ROLL's own code ------------------------------------------------------------------------------------

needs_roll = pytest.mark.skipif(not os.environ.get("ROLL_SRC"), reason="ROLL's own code needs a ROLL checkout: ROLL_SRC=path nox -s roll_src")


def roll_config(experiment, tmp_path, name="gem_core_experiment"):
    """ROLL's AgenticConfig of the written file, as start_agentic_pipeline.py builds it (Hydra compose, dacite),
    and the pipeline's set_max_steps (AgenticPipeline.__init__'s first call)."""
    sys.path.insert(0, os.path.abspath(os.environ["ROLL_SRC"]))
    import dacite
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    from roll.pipeline.agentic.agentic_config import AgenticConfig

    folder = tmp_path / "gem_core"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(render(experiment, source=str(FILE)))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        composed = compose(config_name=name)
    data = OmegaConf.to_container(composed, resolve=True)
    data["logging_dir"], data["output_dir"] = str(tmp_path / "logs"), str(tmp_path / "output")
    saved = random.getstate()
    random.seed(0)
    try:
        config = dacite.from_dict(data_class=AgenticConfig, data=data)
    finally:
        random.setstate(saved)
    config.set_max_steps(max_steps=config.max_steps)
    config.pipeline_cls = composed.get("pipeline_cls")
    return config


@needs_roll
@pytest.mark.parametrize("experiment", [EXPERIMENT, VARIED], ids=["turn_steps.toml", "varied"])
def test_roll_builds_the_written_file_into_its_config_with_the_experiments_values(experiment, tmp_path, monkeypatch):
    monkeypatch.setenv("MODEL", "/models/the-weights")
    e = experiment
    config = roll_config(e, tmp_path)
    train = config.actor_train.training_args
    # the model, the run's length, its seed
    assert config.pretrain == config.actor_train.model_args.model_name_or_path == config.actor_infer.model_args.model_name_or_path == "/models/the-weights"
    assert (config.max_steps, config.seed, train.seed, config.eval_steps) == (e.updates, e.seed, e.seed, 0)
    # the optimizer and its schedule: FSDP2's AdamW(lr, betas, weight_decay), get_scheduler(constant, warm-up 0)
    assert (train.learning_rate, train.adam_beta1, train.adam_beta2, train.weight_decay) == (e.lr, e.betas[0], e.betas[1], e.weight_decay)
    assert (train.lr_scheduler_type, train.get_warmup_steps(train.max_steps)) == ("constant", 0)
    assert config.actor_train.strategy_args.strategy_name == "fsdp2_train" and config.max_grad_norm == e.max_grad_norm
    from roll.distributed.strategy.fsdp2_strategy import FSDP2TrainStrategy

    adamw = inspect.getsource(FSDP2TrainStrategy.initialize).split("optim.AdamW(", 1)[1].split("self.scheduler", 1)[0]
    assert "adam_beta1" in adamw and "eps" not in adamw  # torch's AdamW eps, the experiment's 1e-8
    # an optimizer step per turns_per_step samples (dp 1), every epoch
    assert train.per_device_train_batch_size * train.gradient_accumulation_steps == e.turns_per_step and config.ppo_epochs == e.ppo_epochs
    # the estimator: step_reinforce's per-turn returns at gamma, not normalised, on every token of the turn
    assert (config.adv_estimator, config.step_reward_gamma, config.gamma) == ("step_reinforce", e.gamma, 1.0)
    assert (config.reward_normalization.norm_mean_type, config.reward_normalization.norm_std_type) == (None, None)
    assert not config.whiten_advantages and not config.whiten_rewards and config.advantage_clip is None and config.reward_clip is None
    assert config.batch_adjust_mode == "delete" and config.enable_old_logprobs_recompute
    from gem_integrations.roll.group_filter import check_group_filter

    check_group_filter(config)  # the plugin's pipeline_cls starts only with the infra-error group filter
    # the loss
    assert (config.use_pg_clip_range, config.pg_clip_low, config.pg_clip_high, config.dual_clip_loss) == (True, e.clip_low, e.clip_high, False)
    assert (config.loss_agg_mode, config.ratio_type, config.entropy_loss_coef) == (e.loss_aggregation, "token", e.entropy_coef)
    assert (config.use_kl_loss, config.kl_loss_coef, config.init_kl_coef, config.add_token_level_kl) == (e.kl_coef > 0, e.kl_coef, 0.0, False)
    assert config.enable_reference == (e.kl_coef > 0) and not config.train_infer_correction.is_weight.enabled
    # the rollout
    sampling = config.actor_infer.generating_args
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens) == (e.temperature, 1.0, -1, e.max_turn_tokens)
    assert config.train_env_manager.generating_args.temperature == e.temperature and sampling.num_return_sequences == 1
    manager = config.train_env_manager
    assert (config.rollout_batch_size, manager.num_env_groups, manager.group_size, manager.max_traj_per_env) == (
        e.episodes_per_update, e.groups_per_update, e.group_size, 1
    )  # fmt: skip
    assert config.sequence_length == e.max_context_tokens
    env = next(iter(next(iter(manager.env_configs.values())).values()))
    assert (env["env_type"], env["config"]["env"], env["max_steps"], env["max_tokens_per_step"]) == (
        "gem-core",
        e.env_ids[0],
        e.max_turns or 100,
        e.max_turn_tokens,
    )
    # the precision: FSDP2 loads float32 weights (no param_dtype for bf16) and computes in the precision's dtype
    strategy = config.actor_train.strategy_args.strategy_config
    assert strategy.get("param_dtype") == ("fp32" if e.precision == "float32" else None) and strategy["reduce_dtype"] == "fp32"
    assert config.actor_infer.model_args.dtype == ("fp32" if e.precision == "float32" else "bf16")
    assert config.actor_train.model_args.disable_gradient_checkpointing is (not e.gradient_checkpointing)


def pipeline_object(config):
    """The pipeline_cls the file names, without its __init__ (which starts Ray clusters): the config and the
    data-parallel size (1, as written) that adjust_batch reads; no reference cluster (the file's KL is 0)."""
    from roll.utils.import_utils import safe_import_class

    cls = safe_import_class(config.pipeline_cls)
    pipeline = cls.__new__(cls)
    pipeline.pipeline_config = config
    pipeline.actor_train = SimpleNamespace(dp_size=1)
    return pipeline


@needs_roll
def test_an_update_takes_an_optimizer_step_per_turns_per_step_turn_samples(tmp_path):
    """The plugin's adjust_batch (ROLL's divisor) then ROLL's DataProto.make_iterator as ActorWorker.train_step calls
    it: every update's turn samples, less a remainder, in steps of exactly turns_per_step, so the step count follows
    the turn count; an update with fewer turns than that is filled up to one step (ROLL's copy)."""
    import numpy as np
    import torch
    from roll.distributed.scheduler.protocol import DataProto

    experiment = dataclasses.replace(EXPERIMENT, ppo_epochs=2)
    config = roll_config(experiment, tmp_path)
    train = config.actor_train.training_args
    n = experiment.turns_per_step
    for turns in (20, 32, 70, 97):
        batch = DataProto.from_dict(
            tensors={"input_ids": torch.arange(turns).unsqueeze(1)}, non_tensors={"traj_id": np.array([f"t{i}" for i in range(turns)], dtype=object)}
        )
        batch.meta_info = {"metrics": {}}
        adjusted = pipeline_object(config).adjust_batch(batch, mode=config.batch_adjust_mode)
        kept = len(adjusted)
        assert kept == (turns - turns % n if turns >= n else n), turns
        if turns >= n:
            assert len(set(adjusted.batch["input_ids"].flatten().tolist())) == kept  # each turn once
        steps = list(adjusted.make_iterator(mini_batch_size=train.per_device_train_batch_size * train.gradient_accumulation_steps,
                                            epochs=config.ppo_epochs, seed=config.seed, dataloader_kwargs={"shuffle": True}))  # fmt: skip
        assert len(steps) == kept // n * experiment.ppo_epochs and all(len(step) == n for step in steps), turns


@needs_roll
def test_roll_s_returns_are_the_experiments_reinforce_and_its_rebn_the_sample_std(tmp_path):
    """ROLL's compute_discounted_returns and compute_response_level_rewards (step_reinforce) with the written
    reward_normalization give the experiment's reinforce advantages on the golden episodes; with ROLL's batch mean_std
    (its ReBN) they are the ddof 1 golden values, not the experiment's ReBN (ddof 0): why rebn is refused."""
    import numpy as np
    import torch
    from roll.distributed.scheduler.protocol import DataProto
    from roll.pipeline.agentic.agentic_config import RewardNormalizationConfig
    from roll.pipeline.agentic.utils import compute_discounted_returns, compute_response_level_rewards

    from gem_core import algo

    config = roll_config(EXPERIMENT, tmp_path)
    rewards = [r for episode in GOLDEN for r in episode]
    trajectories = [f"traj{e}" for e, episode in enumerate(GOLDEN) for _ in episode]
    steps = [t for episode in GOLDEN for t in range(len(episode))]

    def roll_advantages(normalization):
        batch = DataProto.from_dict(
            tensors={"input_ids": torch.zeros(len(rewards), 1, dtype=torch.long)},
            non_tensors={
                "traj_id": np.array(trajectories, dtype=object),
                "step": np.array(steps, dtype=object),
                "step_scores": np.array(rewards, dtype=object),
            },
        )
        batch = compute_discounted_returns(batch, config.adv_estimator, config.step_reward_gamma)
        batch, _ = compute_response_level_rewards(
            batch=batch, pipeline_config=SimpleNamespace(adv_estimator=config.adv_estimator, reward_normalization=normalization, reward_clip=None)
        )
        return batch.batch["response_level_rewards"].numpy().astype(np.float64)

    ours = np.asarray(algo.reinforce(GOLDEN, gamma=EXPERIMENT.gamma), dtype=np.float64)
    assert np.allclose(ours, [0.81, 0.9, 1.0, 0.41, -0.1, 0.0])
    assert np.abs(roll_advantages(config.reward_normalization) - ours).max() < 1e-6
    roll_rebn = roll_advantages(RewardNormalizationConfig(grouping="batch", method="mean_std"))
    assert np.abs(roll_rebn - [0.6468, 0.8366, 1.0475, -0.1968, -1.2724, -1.0615]).max() < 1e-4
    assert np.abs(roll_rebn - np.asarray(algo.rebn(GOLDEN, gamma=0.9, eps=1e-6, ddof=0))).max() > 0.05
