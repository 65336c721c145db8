"""One settings schema: every experiment key is one flag of ``gem-core train`` with its name, its default and its
check; every flag is a key or a where-it-runs option; the old names still work, saying the new one; runs saved
under the old names still read; settings that were refused before (clip_high, AdamW's betas, eps, weight decay)
reach the trainer."""

from __future__ import annotations

import argparse
import dataclasses
import json
import warnings

import pytest

from gem_core.cli import build_parser, main
from gem_core.experiment import KEYS, Experiment
from gem_core.train.cli import RENAMED_FLAGS, RENAMED_SWITCHES, RUN_FLAGS, config_from_args
from gem_core.train.config import RUN_OPTIONS, TrainConfig, key_flags


def train_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


def config_of(*argv: str) -> TrainConfig:
    return config_from_args(build_parser().parse_args(["train", *argv]))


def visible_actions() -> list[argparse.Action]:
    return [a for a in train_parser()._actions if a.help != argparse.SUPPRESS and a.option_strings != ["-h", "--help"]]


def test_every_key_has_exactly_one_flag_with_its_name_and_default():
    actions = visible_actions()
    defaults = TrainConfig()
    for name, key in KEYS.items():
        owning = [a for a in actions if f"--{key.path}" in a.option_strings]
        assert len(owning) == 1, key.path
        action = owning[0]
        assert action.dest == name and set(key_flags(key.path)) <= set(action.option_strings)
        shown = getattr(defaults, name)
        shown = f"{shown:g}" if isinstance(shown, float) else ",".join(map(str, shown)) if isinstance(shown, tuple) else str(shown)
        shown = "the rollout's temperature" if name == "logprob_temperature" else shown or "none"
        assert f"(default {shown})" in " ".join(action.help.split()), key.path
        assert [a for a in actions if a.dest == name] == [action], f"{key.path} has a second flag"


def test_every_flag_is_a_key_or_a_where_it_runs_option():
    keys = {f"--{key.path}" for key in KEYS.values()}
    for action in visible_actions():
        assert keys & set(action.option_strings) or set(action.option_strings) & set(RUN_FLAGS), action.option_strings
    run_dests = {a.dest for a in visible_actions() if set(a.option_strings) & set(RUN_FLAGS)}
    assert set(RUN_OPTIONS) <= run_dests  # every where-it-runs field has its flag
    assert not set(RUN_OPTIONS) & set(KEYS)


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--optimizer.lr", "3e-4"], "lr", 3e-4),
        (["--lr", "3e-4"], "lr", 3e-4),
        (["--updates", "7"], "updates", 7),
        (["--training.epochs", "2"], "ppo_epochs", 2),
        (["--episodes-per-update", "8"], "episodes_per_update", 8),
        (["--env", "game:Sudoku-v0-easy"], "env_ids", ("game:Sudoku-v0-easy",)),
        (["--betas", "0.8", "0.99"], "betas", (0.8, 0.99)),
        (["--precision", "float32"], "precision", "float32"),
        (["--no-stop-after-box"], "stop_after_box", False),
        (["--warm-start-lr", "0.003"], "warm_start_lr", 0.003),
    ],
)
def test_a_flag_sets_its_key(argv, field, value):
    assert getattr(config_of(*argv), field) == value


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--lr", "0"], "expected a number > 0"),
        (["--updates", "-1"], "expected an integer in 0..10000000"),
        (["--estimator", "ppo"], "expected one of"),
        (["--precision", "fp8"], "expected one of 'auto', 'bf16', 'float32'"),
        (["--gamma", "1.5"], "expected a number in 0..1"),
        (["--tools", "bogus"], "--tools: unknown env tool(s) ['bogus']; known: python, search\n"),
        (["--env-kwargs", "[1]"], "--env-kwargs: env kwargs must be a JSON object, got list\n"),
    ],
)
def test_a_flag_is_checked_as_the_files_key_is(argv, says, capsys):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_a_rule_between_keys_is_one_line(capsys):
    assert main(["train", "--episodes-per-update", "6", "--mini-batches", "4"]) == 2
    err = capsys.readouterr().err
    assert "training.mini_batches=4 is not allowed: expected a divisor of rollout.episodes_per_update (6)" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "field", "value", "note"),
    [
        (["--steps", "7"], "updates", 7, "--steps is now --updates"),
        (["--batch-size", "8"], "episodes_per_update", 8, "--batch-size is now --episodes-per-update"),
        (["--max-tokens", "12"], "max_turn_tokens", 12, "--max-tokens is now --max-turn-tokens"),
        (["--warmup-steps", "3"], "warm_start_steps", 3, "--warmup-steps is now --warm-start-steps"),
        (["--train-layers", "4"], "trained_layers", 4, "--train-layers is now --trained-layers"),
        (["--no-bf16"], "precision", "float32", "--no-bf16 is now --precision float32"),
        (["--warmup-transcript"], "warm_start_transcript", True, "--warmup-transcript is now --warm-start-transcript"),
    ],
)
def test_an_old_flag_still_works_and_names_the_new_one(argv, field, value, note, capsys):
    assert getattr(config_of(*argv), field) == value
    err = capsys.readouterr().err
    assert err.strip() == f"gem-core train: {note}; the old name still works for now"


def test_the_old_clip_sets_both_clips(capsys):
    config = config_of("--clip", "0.3")
    assert (config.clip_low, config.clip_high) == (0.3, 0.3)
    assert "--clip is now --clip-low and --clip-high" in capsys.readouterr().err
    assert set(RENAMED_FLAGS) | set(RENAMED_SWITCHES) >= {"--steps", "--batch-size", "--bf16", "--no-bf16", "--clip"}


def test_a_run_saved_under_the_old_names_still_reads(tmp_path):
    """config.json of a run saved before the rename (the old field names) reads as the same run, with one warning."""
    from gem_core.train.run import saved_config

    old = {
        "env_id": "game:GuessTheNumber-v0-easy", "env_kwargs": {}, "tools": [], "model": None, "steps": 40, "episodes": 32,
        "group_size": 1, "estimator": "rebn", "gamma": 0.9, "view": "sequence", "lr": 2e-4, "lr_warmup": 2, "clip": 0.2,
        "epochs": 1, "mini_batches": 2, "kl_coef": 0.1, "kl_schedule": "linear", "entropy_coef": 0.0, "max_grad_norm": 1.0,
        "skip_zero_signal": True, "micro_batch_tokens": 1024, "logprob_chunk_tokens": 1024, "gradient_checkpointing": False,
        "train_layers": 10, "bf16": None, "rollout_engine": "auto", "temperature": 1.0, "max_tokens": 16, "stop_after_box": True,
        "max_turns": None, "max_context_tokens": 1024, "warmup_steps": 8, "warmup_batch": 32, "warmup_lr": 1e-4,
        "warmup_transcript": False, "eval_every": 0, "eval_episodes": 200, "eval_set": "heldout", "seed": 0, "device": "cpu",
        "out": "runs/gem-train", "resume": False, "checkpoint_every": 5, "tensorboard": False,
        "weights": {}, "evaluation": {},
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(old))
    with pytest.warns(FutureWarning, match=r"config.json: .*steps is now updates"):
        config = saved_config(str(tmp_path))
    assert config == dataclasses.replace(TrainConfig(), model="tiny", updates=40, replay_failed=0.0)  # its 40 updates and no replay (then), not the default now


def test_a_new_run_saves_the_experiments_names_and_reads_back_equal(tmp_path):
    from gem_core.train.config import config_dict

    config = dataclasses.replace(TrainConfig(), clip_high=0.28, betas=(0.8, 0.99), env_kwargs={"max_turns": 6})
    saved = json.loads(json.dumps(config_dict(config)))
    assert set(saved) == set(KEYS) | set(RUN_OPTIONS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no old name, no warning
        assert TrainConfig.from_dict(saved) == config
    assert TrainConfig.from_experiment(config.experiment, out=config.out) == config  # logprob_temperature None: the rollout's
    assert TrainConfig.from_experiment(dataclasses.replace(config.experiment, logprob_temperature=0.5)).recompute_temperature == 0.5
    assert isinstance(config.experiment, Experiment) and type(config.experiment) is Experiment


def test_the_logprobs_are_recomputed_at_the_rollouts_temperature_unless_told(tiny, tmp_path):
    """--temperature alone moves both (as before the schema); --logprob-temperature apart is what the loss uses."""
    import torch

    from gem_core.train import trainer as trainer_module
    from gem_core.train.loss import Rows

    assert config_of("--temperature", "0.7").recompute_temperature == 0.7
    assert config_of("--temperature", "0.7", "--logprob-temperature", "1.0").recompute_temperature == 1.0
    assert config_of("--temperature", "0.7").experiment.logprob_temperature == 0.7
    seen = []
    config = dataclasses.replace(TrainConfig(), model=tiny[0], temperature=0.7, logprob_temperature=0.9, out=str(tmp_path))
    trainer = trainer_module.Trainer(config, tiny[1], tiny[2], log=lambda _: None)
    original = trainer_module.token_logprobs
    try:
        trainer_module.token_logprobs = lambda model, rows, temperature, **kw: seen.append(temperature) or original(model, rows, temperature, **kw)
        ids = torch.tensor([[1, 2, 3, 4]])
        rows = Rows(
            input_ids=ids,
            attention=torch.ones_like(ids),
            targets=torch.tensor([[-100, 3, 4, -100]]),
            advantages=torch.zeros(1, 4),
            old_logprobs=torch.zeros(1, 4),
        )
        trainer.logprobs(trainer.model, rows)
    finally:
        trainer_module.token_logprobs = original
        trainer.close()
    assert seen == [0.9]


def test_clip_high_and_adamws_settings_reach_the_trainer(tiny, tmp_path):
    """algorithm.clip_high, optimizer.betas, eps and weight_decay (refused before) are what the trainer runs."""
    import torch

    from gem_core.train.loss import Rows, policy_loss
    from gem_core.train.trainer import Trainer

    config = dataclasses.replace(TrainConfig(), model=tiny[0], betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01, trained_layers=0, out=str(tmp_path))
    trainer = Trainer(config, tiny[1], tiny[2], log=lambda _: None)
    try:
        group = trainer.optimizer.param_groups[0]
        assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.8, 0.99), 1e-6, 0.01)
    finally:
        trainer.close()
    rows = Rows(
        input_ids=torch.zeros(1, 3, dtype=torch.long),
        attention=torch.ones(1, 3, dtype=torch.long),
        targets=torch.tensor([[1, 1, 1]]),
        old_logprobs=torch.zeros(1, 3),
        advantages=torch.ones(1, 3),
    )
    ratio = torch.tensor([[1.1, 1.25, 1.4]]).log()  # the ratio 1.1, 1.25, 1.4 on positive advantages
    symmetric, _ = policy_loss(ratio, rows, clip=0.2)
    higher, stats = policy_loss(ratio, rows, clip=0.2, clip_high=0.28)
    assert float(symmetric) == pytest.approx(-(1.1 + 1.2 + 1.2) / 3)
    assert float(higher) == pytest.approx(-(1.1 + 1.25 + 1.28) / 3)
    assert stats["clip_fraction"] == pytest.approx(1 / 3)
