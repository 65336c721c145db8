"""``gem-core train --experiment FILE``: the default file is the default run; the file's settings reach the
TrainConfig (those without an option too); an option the file sets is refused beside it, the others apply;
what the reference trainer cannot express is refused by name; the weights' sha256 is checked."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gem_core.cli import build_parser
from gem_core.experiment import ESTIMATORS, EVAL_SEED_START, Experiment, load_experiment
from gem_core.train import trainer as trainer_module
from gem_core.train.cli import config_from_args
from gem_core.train.trainer import TrainConfig

DEFAULT = Path(__file__).resolve().parents[2] / "examples" / "experiments" / "default.toml"


def config_of(*argv: str) -> TrainConfig:
    return config_from_args(build_parser().parse_args(["train", *argv]))


PORTABLE = DEFAULT.with_name("portable.toml")
#: the default run's tuning for gem-core train (default.toml); an experiment file that leaves these keys out keeps
#: the run every trainer takes (Experiment()'s defaults)
UNTUNED = dict(lr=1e-4, updates=30, mini_batches=1, kl_coef=0.0, kl_schedule="constant")


def test_the_experiments_defaults_are_the_default_run():
    """default.toml is the default run; Experiment()'s defaults are too, but for the [reference] phases, off."""
    assert TrainConfig().experiment == load_experiment(DEFAULT)
    portable = dataclasses.replace(
        TrainConfig(), warm_start_steps=0, trained_layers=0, stop_after_box=False, skip_zero_signal=False, replay_failed=0.0, **UNTUNED
    )
    assert portable.experiment == Experiment()
    assert (dataclasses.replace(portable, group_size=2, warmup_updates=0)).experiment == load_experiment(PORTABLE)  # see portable.toml
    assert ESTIMATORS == trainer_module.ESTIMATORS and EVAL_SEED_START == trainer_module.EVAL_SEED_BASE


def test_the_default_file_runs_the_default_run():
    assert config_of("--experiment", str(DEFAULT)) == TrainConfig() == config_of()
    portable = config_of("--experiment", str(PORTABLE))
    assert portable == dataclasses.replace(
        TrainConfig(),
        warm_start_steps=0,
        trained_layers=0,
        stop_after_box=False,
        skip_zero_signal=False,
        replay_failed=0.0,
        group_size=2,
        warmup_updates=0,
        **UNTUNED,
    )
    with pytest.raises(ValueError, match="--stop-after-box, --trained-layers: set by the experiment file"):
        config_of("--experiment", str(PORTABLE), "--trained-layers", "4", "--no-stop-after-box")


def test_the_files_settings_reach_the_run_those_without_an_option_too(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        '[model]\nid = "tiny"\n[env]\nids = ["game:Sudoku-v0-easy"]\nkwargs = {max_turns = 6}\nmax_turns = 4\nmax_turn_tokens = 8\n'
        "max_context_tokens = 512\n[optimizer]\nlr = 3e-4\nwarmup_updates = 5\n[algorithm]\nclip_low = 0.3\nclip_high = 0.3\n"
        "[rollout]\ngroup_size = 4\n[training]\nmini_batches = 4\n"
    )
    config = config_of("--experiment", str(path))
    want = dataclasses.replace(
        TrainConfig(),
        model="tiny",
        env_ids=("game:Sudoku-v0-easy",),
        env_kwargs={"max_turns": 6},
        max_turns=4,
        max_turn_tokens=8,
        max_context_tokens=512,
        warmup_updates=5,
        clip_low=0.3,
        clip_high=0.3,
        group_size=4,
        warm_start_steps=0,  # [reference] left out: off
        trained_layers=0,
        stop_after_box=False,
        skip_zero_signal=False,  # the zero-gradient step every trainer takes
        replay_failed=0.0,  # every start state fresh
        **{**UNTUNED, "lr": 3e-4, "mini_batches": 4},  # the rest of UNTUNED left out: the run every trainer takes
    )
    assert config == want
    assert config.experiment == load_experiment(path)


def test_an_option_the_file_sets_is_refused_beside_it_and_the_others_apply():
    with pytest.raises(ValueError) as caught:
        config_of("--experiment", str(DEFAULT), "--lr", "1e-4", "--episodes-per-update", "8", "--gradient-checkpointing")
    message = str(caught.value)
    assert message.startswith("--episodes-per-update, --lr, --gradient-checkpointing: set by the experiment file") and "\n" not in message
    config = config_of("--experiment", str(DEFAULT), "--out", "/tmp/elsewhere", "--micro-batch-tokens", "512", "--device", "cpu")
    assert (config.out, config.micro_batch_tokens) == ("/tmp/elsewhere", 512)
    assert dataclasses.replace(config, out=TrainConfig.out, micro_batch_tokens=TrainConfig.micro_batch_tokens) == TrainConfig()


def test_without_a_file_the_options_keep_their_defaults_and_values():
    assert config_of("--lr", "3e-4", "--episodes-per-update", "8").lr == 3e-4
    assert config_of().lr == TrainConfig.lr


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[algorithm]\nloss_aggregation = "seq-mean-token-mean"\n', "algorithm.loss_aggregation='seq-mean-token-mean'"),
        ('[algorithm]\nview = "turn"\n[training]\nmini_batches = 0\nturns_per_step = 8\n', "training.mini_batches=0"),  # steps counted in turns (ROLL's)
        ("[seeds]\neval_start = 5000\n", "seeds.eval_start=5000"),
        ('[algorithm]\nkl_coef = 0.1\nkl_estimator = "k1"\n', "algorithm.kl_estimator='k1'"),
        ('[env]\nids = ["game:Sudoku-v0-easy", "game:GuessTheNumber-v0-easy"]\n', "env.ids="),
    ],
)
def test_what_gem_core_train_cannot_express_is_refused_by_name(tmp_path, text, says):
    path = tmp_path / "run.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as caught:
        config_of("--experiment", str(path))
    assert str(caught.value).startswith(f"gem-core train cannot run this experiment: {says}")


def test_the_weights_sha256_is_checked_and_the_checked_weights_are_trained(tmp_path):
    from gem_core.experiment import weights_sha256

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    path = tmp_path / "run.toml"
    path.write_text(f'[model]\nid = "{model}"\nsha256 = "{weights_sha256(model)}"\n')
    assert config_of("--experiment", str(path)).model == str(model)
    path.write_text(f'[model]\nid = "{model}"\nsha256 = "{"0" * 64}"\n')
    with pytest.raises(ValueError, match="model.sha256=.*have sha256 "):
        config_of("--experiment", str(path))
    path.write_text(f'[model]\nid = "org/not-local"\nsha256 = "{"0" * 64}"\n')
    with pytest.raises(ValueError, match="not a local path"):
        config_of("--experiment", str(path))


def test_the_cli_says_a_bad_file_in_one_line(tmp_path, capsys):
    from gem_core.cli import main

    path = tmp_path / "run.toml"
    path.write_text("[training]\nupdates = -1\n")
    assert main(["train", "--experiment", str(path)]) == 2
    err = capsys.readouterr().err
    assert "training.updates=-1 is not allowed" in err and err.count("\n") == 1
    assert main(["train", "--experiment", str(DEFAULT), "--updates", "3"]) == 2
    assert "--updates: set by the experiment file" in capsys.readouterr().err


@pytest.mark.parametrize("precision", ["auto", "bf16", "float32"])
def test_the_precision_is_the_precision_option_and_refused_beside_it(precision, tmp_path):
    """training.precision is gem-core train's --precision (the old --bf16/--no-bf16 set it too), so either beside
    the file is refused like every key the file sets."""
    path = tmp_path / "run.toml"
    path.write_text(f'[training]\nprecision = "{precision}"\n')
    config = config_of("--experiment", str(path))
    assert config.precision == precision and config.experiment.precision == precision
    assert config_of("--precision", precision).precision == precision
    for flags in (["--precision", "float32"], ["--no-bf16"]):
        with pytest.raises(ValueError, match="--precision: set by the experiment file"):
            config_of("--experiment", str(path), *flags)
