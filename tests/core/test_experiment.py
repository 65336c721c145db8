"""The experiment file (gem_core.experiment): reading it strictly, every bad input one line naming the key, and
each trainer's mapping refusing by name what the trainer cannot express (the mapping modules import without
their trainers; the values each trainer then uses are tested in its own session: tests/integrations/*/test_experiment.py)."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

from gem_core.errors import InvalidArgumentError, InvalidArgumentTypeError
from gem_core.experiment import (
    KEYS,
    Experiment,
    UnsupportedSettingError,
    load_experiment,
    parse_experiment,
    to_toml,
    train_rows,
    weights_sha256,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "examples" / "experiments" / "default.toml"
PORTABLE = ROOT / "examples" / "experiments" / "portable.toml"
LEARNING = ROOT / "examples" / "experiments" / "learning.toml"
TURN = ROOT / "examples" / "experiments" / "turn.toml"
TURN_STEPS = ROOT / "examples" / "experiments" / "turn_steps.toml"
TRAINERS = ("verl", "openrlhf", "trl", "rl2", "oat", "roll")
#: the default experiment as oat runs it (its learner's view and loss; no warm-up)
OAT_EXPERIMENT = '[algorithm]\nview = "turn"\nloss_aggregation = "seq-mean-token-mean"\n[optimizer]\nwarmup_updates = 0\n'
#: what ROLL needs of the default experiment: per-turn rows, steps of turn samples, reinforce, a pinned precision
ROLL_EXPERIMENT = '[algorithm]\nview = "turn"\nestimator = "reinforce"\n[optimizer]\nwarmup_updates = 0\n[training]\nmini_batches = 0\nturns_per_step = 8\nprecision = "bf16"\n'


def test_default_file_is_the_default_experiment_and_names_every_key():
    """default.toml is every default, the [reference] phases of the default run (left out, they are off) and its
    tuning (lr, updates, optimizer steps and KL chosen for gem-core train on the validation set; left out, a file
    keeps the run every trainer takes); portable.toml is the defaults, in groups of 2, without a warm-up, and runs
    in every trainer but oat and ROLL, learning.toml that run tuned to learn from the pinned warm start (the same trainers); turn.toml is that run as oat trains it (oat alone), turn_steps.toml ROLL's
    (ROLL alone)."""
    text = DEFAULT.read_text()
    reference = {"warm_start_steps": 8, "trained_layers": 10, "kl_schedule": "linear", "skip_zero_signal": True, "replay_failed": 0.25}
    tuned = {"lr": 2e-4, "updates": 50, "mini_batches": 2, "kl_coef": 0.1, "stop_after_box": True}
    assert load_experiment(DEFAULT) == dataclasses.replace(Experiment(), **reference, **tuned)
    assert load_experiment(PORTABLE) == dataclasses.replace(Experiment(), group_size=2, warmup_updates=0) and "\n[reference]" not in PORTABLE.read_text()
    for trainer in ("verl", "openrlhf", "trl", "rl2"):
        assert importlib.import_module(f"gem_integrations.{trainer}.experiment").render(load_experiment(PORTABLE))
    # learning.toml: portable.toml with the tuning chosen on the validation seeds for the pinned warm start
    # (benchmarks/results/portable_candidates/c5-lr7e-5-every-layer/), the model left to that warm start's builder
    learning_tuned = {"lr": 7e-5, "updates": 50, "mini_batches": 2, "kl_coef": 0.1, "stop_after_box": True}
    assert load_experiment(LEARNING) == dataclasses.replace(load_experiment(PORTABLE), **learning_tuned)
    candidate = load_experiment(ROOT / "benchmarks" / "results" / "portable_candidates" / "c5-lr7e-5-every-layer" / "experiment.toml")
    validated = {"model": "smollm2-135m-instruct", "model_sha256": "", "eval_episodes": load_experiment(PORTABLE).eval_episodes}
    assert load_experiment(LEARNING) == dataclasses.replace(candidate, **validated)  # the file validated, but the warm start's path and the evaluation's size
    for trainer in TRAINERS:
        module = importlib.import_module(f"gem_integrations.{trainer}.experiment")
        if trainer in ("oat", "roll"):
            with pytest.raises(UnsupportedSettingError, match=f"^{trainer} cannot run this experiment: "):
                module.render(load_experiment(LEARNING))
        else:
            assert module.render(load_experiment(LEARNING))
    assert (Experiment().warm_start_steps, Experiment().trained_layers, Experiment().stop_after_box) == (0, 0, False)
    turn = dataclasses.replace(Experiment(), view="turn", loss_aggregation="seq-mean-token-mean", warmup_updates=0)
    assert load_experiment(TURN) == turn
    turn_steps = dataclasses.replace(turn, loss_aggregation="token-mean", estimator="reinforce", mini_batches=0, turns_per_step=32, precision="bf16")
    assert load_experiment(TURN_STEPS) == turn_steps
    for path, runs in ((TURN, "oat"), (TURN_STEPS, "roll")):
        for trainer in TRAINERS:
            module = importlib.import_module(f"gem_integrations.{trainer}.experiment")
            if trainer == runs:
                assert module.render(load_experiment(path))
            else:
                with pytest.raises(UnsupportedSettingError, match=f"^{trainer} cannot run this experiment: "):
                    module.render(load_experiment(path))
    for key in KEYS.values():  # the shipped file spells out every key, so it documents them all
        assert f"\n{key.name} = " in text.split(f"[{key.section}]", 1)[1].split("\n[", 1)[0], key.path


@pytest.mark.parametrize("trainer", ("verl", "openrlhf", "trl", "rl2", "oat", "roll"))
@pytest.mark.parametrize(
    "reference",
    ["warm_start_steps = 8", "trained_layers = 10", 'kl_schedule = "linear"', "skip_zero_signal = true", "replay_failed = 0.25"],
)
def test_every_other_trainer_refuses_what_only_the_reference_trainer_runs(trainer, reference):
    """A warm start, frozen layers, the KL schedule, skipping zero-signal batches or replaying failed start states: each other trainer refuses it in
    one line naming the key (its run would silently be another), and runs the file with the key off."""
    module = importlib.import_module(f"gem_integrations.{trainer}.experiment")
    groups = {  # what else the trainer needs of the default experiment
        "trl": "[rollout]\ngroup_size = 2\n",
        "oat": '[algorithm]\nview = "turn"\nloss_aggregation = "seq-mean-token-mean"\n[optimizer]\nwarmup_updates = 0\n',
        "roll": ROLL_EXPERIMENT,
    }.get(trainer, "")
    experiment = parse_experiment(f"{groups}[reference]\n{reference}\n")
    with pytest.raises(UnsupportedSettingError, match=f"{trainer} cannot run this experiment: reference.{reference.split()[0]}="):
        module.render(experiment)
    assert module.render(parse_experiment(groups))


@pytest.mark.parametrize("trainer", ("verl", "openrlhf", "trl", "rl2", "oat", "roll"))
def test_the_stop_at_the_move_is_carried_by_the_rows_to_every_trainer_but_roll(trainer):
    """rollout.stop_after_box: the training and held-out rows carry it (make-dataset --stop-after-box) and every
    plugin's rollout stops there (gem_core.rollout.play_row); ROLL, whose env manager plays gem-llm's envs and not
    the rows, refuses it naming the key."""
    module = importlib.import_module(f"gem_integrations.{trainer}.experiment")
    groups = {
        "trl": "[rollout]\ngroup_size = 2\n",
        "oat": '[algorithm]\nview = "turn"\nloss_aggregation = "seq-mean-token-mean"\n[optimizer]\nwarmup_updates = 0\n',
        "roll": ROLL_EXPERIMENT,
    }.get(trainer, "")
    on = dataclasses.replace(parse_experiment(groups), stop_after_box=True)
    assert on.stop_after_box
    if trainer == "roll":
        with pytest.raises(UnsupportedSettingError, match="^roll cannot run this experiment: rollout.stop_after_box=True"):
            module.render(on)
        return
    script = module.render(on)
    datasets, evals = script.count("gem-core make-dataset"), script.count("--policy hf --model")
    # every dataset the script writes (training, held-out) and the held-out gem-core eval it prints
    assert datasets >= 1 and script.count("--stop-after-box") == datasets + evals
    assert "--stop-after-box" not in module.render(parse_experiment(groups))


def test_a_moved_key_still_reads_under_its_old_name_with_one_warning():
    with pytest.warns(FutureWarning, match=r"^x.toml: reference.stop_after_box is now rollout.stop_after_box"):
        old = parse_experiment("[reference]\nstop_after_box = true\n", "x.toml")
    assert old == parse_experiment("[rollout]\nstop_after_box = true\n") and old.stop_after_box


def test_keys_left_out_keep_their_defaults_and_given_ones_are_read():
    experiment = parse_experiment('[optimizer]\nlr = 3e-4\nbetas = [0.9, 0.95]\n[env]\nids = ["game:Sudoku-v0-easy"]\nkwargs = {max_turns = 6}\n')
    assert experiment.lr == 3e-4 and experiment.betas == (0.9, 0.95)
    assert experiment.env_ids == ("game:Sudoku-v0-easy",) and dict(experiment.env_kwargs) == {"max_turns": 6}
    assert experiment.updates == Experiment().updates
    assert parse_experiment("[training]\nupdates = 3\n").updates == 3


def test_written_back_it_reads_equal():
    experiment = parse_experiment('[env]\nkwargs = {max_turns = 6, "odd key" = "x"}\ntools = ["python"]\n[algorithm]\nclip_high = 0.28\n')
    assert parse_experiment(to_toml(experiment)) == experiment


BAD = [
    ("[reference]\ntrained_layers = -1\n", InvalidArgumentError, "reference.trained_layers=-1 is not allowed"),
    ('[rollout]\nstop_after_box = "yes"\n', InvalidArgumentTypeError, "rollout.stop_after_box='yes' is not allowed"),
    ("[reference]\nwarm_start = 8\n", InvalidArgumentError, "unknown key reference.warm_start"),
    ("[optimizer]\nlrr = 1e-4\n", InvalidArgumentError, "unknown key optimizer.lrr"),
    ("[optimiser]\nlr = 1e-4\n", InvalidArgumentError, "unknown section [optimiser]"),
    ("optimizer = 3\n", InvalidArgumentTypeError, "optimizer must be a section"),
    ("[optimizer]\nlr = -1\n", InvalidArgumentError, "optimizer.lr=-1.0 is not allowed"),
    ("[optimizer]\nlr = 0\n", InvalidArgumentError, "optimizer.lr=0.0 is not allowed"),
    ("[optimizer]\nlr = nan\n", InvalidArgumentError, "optimizer.lr=nan is not allowed"),
    ('[optimizer]\nlr = "1e-4"\n', InvalidArgumentTypeError, "optimizer.lr='1e-4' is not allowed"),
    ("[optimizer]\nbetas = [0.9]\n", InvalidArgumentTypeError, "optimizer.betas=(0.9,) is not allowed"),
    ("[optimizer]\nbetas = 0.9\n", InvalidArgumentTypeError, "optimizer.betas=0.9 is not allowed"),
    ('[optimizer]\nname = "sgd"\n', InvalidArgumentError, "optimizer.name='sgd' is not allowed: expected one of 'adamw'"),
    ('[training]\nepochs = "2"\n', InvalidArgumentTypeError, "training.epochs='2' is not allowed"),
    ("[training]\nepochs = 0\n", InvalidArgumentError, "training.epochs=0 is not allowed"),
    ("[training]\ngradient_checkpointing = 1\n", InvalidArgumentTypeError, "training.gradient_checkpointing=1 is not allowed"),
    ("[training]\nmini_batches = 5\n", InvalidArgumentError, "training.mini_batches=5 is not allowed: expected a divisor"),
    ("[training]\nmini_batches = 0\n", InvalidArgumentError, "training.mini_batches=0 is not allowed: expected 1 or more, or 0 with training.turns_per_step"),
    ("[training]\nturns_per_step = 8\n", InvalidArgumentError, "training.turns_per_step=8 is not allowed: expected 0 unless training.mini_batches = 0"),
    ("[training]\nmini_batches = 0\nturns_per_step = 8\n", InvalidArgumentError, "turns_per_step=8 is not allowed: expected set only with algorithm.view"),
    ('[env]\nids = "game:Sudoku-v0-easy"\n', InvalidArgumentTypeError, "env.ids='game:Sudoku-v0-easy' is not allowed"),
    ("[env]\nids = []\n", InvalidArgumentError, "env.ids=[] is not allowed"),
    ("[env]\nids = [3]\n", InvalidArgumentTypeError, "env.ids=(3,) is not allowed"),
    ("[env]\nkwargs = 3\n", InvalidArgumentTypeError, "env.kwargs=3 is not allowed"),
    ("[env]\nmax_context_tokens = 8\n", InvalidArgumentError, "env.max_context_tokens=8 is not allowed"),
    ("[rollout]\ngroup_size = 3\n", InvalidArgumentError, "rollout.episodes_per_update=32 is not allowed: expected a multiple of rollout.group_size (3)"),
    ("[rollout]\ntemperature = 0\n", InvalidArgumentError, "rollout.temperature=0.0 is not allowed"),
    ('[algorithm]\nestimator = "grpo"\n', InvalidArgumentError, "rollout.group_size=1 is not allowed: expected 2 or more"),
    ('[algorithm]\nestimator = "ppo"\n', InvalidArgumentError, "algorithm.estimator='ppo' is not allowed"),
    ('[algorithm]\nloss_aggregation = "sum"\n', InvalidArgumentError, "algorithm.loss_aggregation='sum' is not allowed"),
    ("[algorithm]\ngamma = 1.5\n", InvalidArgumentError, "algorithm.gamma=1.5 is not allowed"),
    ('[training]\nprecision = "fp16"\n', InvalidArgumentError, "training.precision='fp16' is not allowed"),
    ('[model]\nsha256 = "abc"\n', InvalidArgumentError, "model.sha256='abc' is not allowed"),
    ('[model]\nid = " "\n', InvalidArgumentError, "model.id=' ' is not allowed"),
    ("[optimizer\nlr = 1\n", InvalidArgumentError, "not valid TOML"),
    ("[optimizer]\nlr = 1\nlr = 2\n", InvalidArgumentError, "not valid TOML"),
]


@pytest.mark.parametrize(("text", "error", "says"), BAD, ids=[says for _, _, says in BAD])
def test_every_bad_input_is_one_line_naming_the_key(text, error, says):
    with pytest.raises(error) as caught:
        parse_experiment(text, "run.toml")
    message = str(caught.value)
    assert message.startswith("run.toml: ") and says in message
    assert "\n" not in message


def test_a_file_that_is_missing_or_unreadable_is_one_line(tmp_path):
    with pytest.raises(InvalidArgumentError, match="no such experiment file"):
        load_experiment(tmp_path / "missing.toml")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InvalidArgumentError, match="cannot read it"):
        load_experiment(binary)
    with pytest.raises(InvalidArgumentError, match="cannot read it"):
        load_experiment(tmp_path)


def test_weights_sha256_covers_the_weight_files_by_name_and_bytes(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "config.json").write_text("{}")
    first = weights_sha256(tmp_path)
    (tmp_path / "config.json").write_text('{"a": 1}')  # not weights: same hash
    assert weights_sha256(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"weightz")
    assert weights_sha256(tmp_path) != first
    with pytest.raises(InvalidArgumentError, match="no weight files"):
        weights_sha256(tmp_path / "..")


# -- each trainer's mapping (the config text; the trainers' own config code checks it in their sessions) --


@pytest.mark.parametrize("trainer", TRAINERS)
def test_each_mapping_imports_without_its_trainer(trainer):
    module = importlib.import_module(f"gem_integrations.{trainer}.experiment")
    assert callable(module.render)
    from gem_core.plugins import discover

    assert discover()[trainer].experiment == module.__name__


REFUSED = [
    ("verl", "[rollout]\nlogprob_temperature = 0.5\n", "rollout.logprob_temperature=0.5"),
    ("verl", "[optimizer]\neps = 1e-6\n", "optimizer.eps=1e-06"),
    ("verl", '[algorithm]\nview = "turn"\nloss_aggregation = "seq-mean-token-mean"\n', "algorithm.view='turn'"),
    ("verl", "[rollout]\ngroup_size = 4\n[training]\nmini_batches = 16\n", "training.mini_batches=16"),
    ("verl", '[env]\nids = ["game:Sudoku-v0-easy", "game:GuessTheNumber-v0-easy"]\n', "env.ids="),
    ("openrlhf", '[algorithm]\nestimator = "reinforce"\n', "algorithm.estimator='reinforce'"),
    ("openrlhf", '[algorithm]\nloss_aggregation = "seq-mean-token-sum"\n', "algorithm.loss_aggregation='seq-mean-token-sum'"),
    ("trl", "", "rollout.group_size=1"),
    ("trl", '[rollout]\ngroup_size = 2\n[algorithm]\nestimator = "rloo"\n', "algorithm.estimator='rloo'"),
    ("trl", '[rollout]\ngroup_size = 2\n[algorithm]\nkl_coef = 0.1\nkl_estimator = "k1"\n', "algorithm.kl_estimator='k1'"),
    ("rl2", "[algorithm]\nclip_high = 0.28\n", "algorithm.clip_high=0.28"),
    ("rl2", "[training]\nepochs = 2\n", "training.epochs=2"),
    ("rl2", "[optimizer]\nbetas = [0.9, 0.95]\n", "optimizer.betas=(0.9, 0.95)"),
    ("oat", "", "algorithm.loss_aggregation='token-mean'"),
    ("oat", '[algorithm]\nloss_aggregation = "seq-mean-token-mean"\n', "algorithm.view='sequence'"),
    ("oat", '[algorithm]\nloss_aggregation = "seq-mean-token-mean"\nview = "turn"\nentropy_coef = 0.01\n', "algorithm.entropy_coef=0.01"),
    ("roll", "", "training.mini_batches=1"),
    ("roll", ROLL_EXPERIMENT.replace('estimator = "reinforce"', 'estimator = "rebn"'), "algorithm.estimator='rebn'"),
    ("roll", ROLL_EXPERIMENT.replace('precision = "bf16"', 'precision = "auto"'), "training.precision='auto'"),
    ("verl", ROLL_EXPERIMENT, "training.mini_batches=0"),
    ("openrlhf", ROLL_EXPERIMENT, "training.mini_batches=0"),
    ("trl", ROLL_EXPERIMENT, "training.mini_batches=0"),
    ("rl2", ROLL_EXPERIMENT, "training.mini_batches=0"),
    ("openrlhf", '[training]\nprecision = "float32"\n', "training.precision='float32'"),
    ("rl2", '[training]\nprecision = "float32"\n', "training.precision='float32'"),
]


@pytest.mark.parametrize(("trainer", "text", "says"), REFUSED, ids=[f"{t}:{s}" for t, _, s in REFUSED])
def test_what_a_trainer_cannot_express_is_refused_in_one_line_naming_the_key(trainer, text, says):
    module = importlib.import_module(f"gem_integrations.{trainer}.experiment")
    with pytest.raises(UnsupportedSettingError) as caught:
        module.render(parse_experiment(text))
    message = str(caught.value)
    assert message.startswith(f"{trainer} cannot run this experiment: {says}") and "\n" not in message


def test_training_rows_are_the_run_seeds_start_states_below_the_held_out_seeds():
    experiment = parse_experiment("[rollout]\ngroup_size = 4\n[training]\nupdates = 15\n[seeds]\nseed = 7\n")
    assert train_rows(experiment) == 15 * 8
    from gem_integrations.verl.experiment import render

    script = render(experiment)
    assert "--n 120 \\\n  --run-seed 7 \\\n  --per-update 8 \\\n  --seeds-below 1000000" in script
    assert "--n 200 \\\n  --seed-start 1000000" in script and "run seed 7's" in script
    # a held-out set that starts low: the training start states are drawn below it
    assert "--seeds-below 100" in render(parse_experiment("[seeds]\neval_start = 100\n"))


# -- the command ------------------------------------------------------------------------------------


def run_cli(argv, capsys):
    from gem_core.cli import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_gem_core_experiment_writes_the_trainers_configuration(tmp_path, capsys):
    out = tmp_path / "verl.sh"
    code, _, err = run_cli(["experiment", str(PORTABLE), "--trainer", "verl", "--out", str(out)], capsys)
    assert code == 0 and "wrote verl's configuration" in err
    script = out.read_text()
    assert "python \\\n  -m verl.trainer.main_ppo" in script and "actor_rollout_ref.actor.optim.lr=0.0001" in script
    code, printed, _ = run_cli(["experiment", str(PORTABLE), "--trainer", "openrlhf"], capsys)
    assert code == 0 and "--actor.adam.lr 0.0001" in printed
    code, _, err = run_cli(["experiment", str(DEFAULT), "--trainer", "verl"], capsys)
    assert code == 2 and "verl cannot run this experiment: reference.warm_start_steps=8" in err and err.count("\n") == 1
    # the commands docs/experiments.md gives for oat and ROLL
    code, _, err = run_cli(["experiment", str(TURN), "--trainer", "oat", "--out", str(tmp_path / "run_oat.sh")], capsys)
    assert code == 0 and "--critic-type grpo" in (tmp_path / "run_oat.sh").read_text()
    code, _, err = run_cli(["experiment", str(TURN_STEPS), "--trainer", "roll", "--out", str(tmp_path / "gem_core_turn_steps.yaml")], capsys)
    written = (tmp_path / "gem_core_turn_steps.yaml").read_text()
    assert code == 0 and 'adv_estimator: "step_reinforce"' in written and "gradient_accumulation_steps: 8" in written


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--trainer", "roll"], "roll cannot run this experiment: reference.warm_start_steps=8"),
        (["--trainer", "oat"], "oat cannot run this experiment: reference.warm_start_steps=8"),
        (["--trainer", "verl", "--out", "/no/such/dir/x.sh"], "/no/such/dir"),
    ],
)
def test_gem_core_experiment_refuses_in_one_line(argv, says, capsys):
    code, _, err = run_cli(["experiment", str(DEFAULT), *argv], capsys)
    assert code == 2 and says in err and err.count("\n") == 1


def test_gem_core_experiment_names_an_unknown_env_id(tmp_path, capsys):
    path = tmp_path / "x.toml"
    path.write_text('[env]\nids = ["game:NoSuchGame-v0"]\n')
    code, _, err = run_cli(["experiment", str(path), "--trainer", "verl"], capsys)
    assert code == 2 and "game:NoSuchGame-v0" in err and err.count("\n") == 1


def test_every_trainer_with_a_mapping_is_a_choice(capsys):
    code, _, err = run_cli(["experiment", str(DEFAULT), "--trainer", "nope"], capsys)
    assert code == 2
    for trainer in TRAINERS:
        assert trainer in err


def test_the_written_script_is_valid_bash(tmp_path):
    import shutil
    import subprocess

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    for trainer in ("verl", "openrlhf", "rl2"):
        module = importlib.import_module(f"gem_integrations.{trainer}.experiment")
        script = tmp_path / f"{trainer}.sh"
        script.write_text(module.render(Experiment()))
        assert subprocess.run([bash, "-n", str(script)], capture_output=True).returncode == 0, trainer
    trl = importlib.import_module("gem_integrations.trl.experiment")
    script = tmp_path / "trl.sh"
    script.write_text(trl.render(parse_experiment("[rollout]\ngroup_size = 2\n")))
    assert subprocess.run([bash, "-n", str(script)], capture_output=True).returncode == 0


def test_every_trainer_is_held_out_on_the_seeds_gem_core_train_evaluates_on(tmp_path, capsys):
    """The held-out rows a script writes and the `gem-core eval` command in its comments play the seeds of
    gem-core train's held-out set (on GuessTheNumber every target equally often), not consecutive ones."""
    import json
    import shlex

    from gem_core.experiment_scripts import dataset_command, eval_command
    from gem_core.train.trainer import evaluation_seeds
    from gem_integrations.trl import task_of
    from gem_integrations.trl.experiment import render

    experiment = parse_experiment("[rollout]\ngroup_size = 2\n[seeds]\neval_episodes = 40\n")
    held_out = evaluation_seeds("game:GuessTheNumber-v0-easy", {}, 40)
    assert held_out != list(range(1_000_000, 1_000_040))  # consecutive seeds would not be the same set
    out = tmp_path / "held_out.jsonl"
    argv = dataset_command("trl", experiment, str(out), held_out=True)
    assert argv[:2] == ["gem-core", "make-dataset"] and "--balanced" in argv
    assert run_cli(argv[1:], capsys)[0] == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [task_of(row["prompt"]).seed for row in rows] == held_out
    command = eval_command(experiment)
    assert "--balanced" in command and command[command.index("--seed-start") + 1] == "1000000"
    assert "--balanced" in shlex.split(render(experiment).split("gem-core eval ", 1)[1].splitlines()[0])


#: the trainers whose script sets the precision in shell variables (TRL's sets it in its Python)
SHELL_PRECISION = ("verl", "openrlhf", "rl2", "oat")


@pytest.mark.parametrize("trainer", SHELL_PRECISION)
def test_an_auto_precision_is_decided_where_the_script_runs(trainer):
    """training.precision = "auto" (the default) is decided by the written script where it runs: this machine's
    precision (gem_core.precision), or $GEM_PRECISION where set; the trainer's values for it (its PRECISION), or one
    line where the trainer cannot train in it; anything else for $GEM_PRECISION is one line too."""
    from gem_core.precision import machine_precision
    from helpers.scripts import script_precision

    module = importlib.import_module(f"gem_integrations.{trainer}.experiment")
    experiment = parse_experiment(OAT_EXPERIMENT if trainer == "oat" else "[rollout]\ngroup_size = 2\n")
    script = module.render(experiment)
    for precision in ("bf16", "float32", None):
        env = {"GEM_PRECISION": precision} if precision else {}
        values = module.PRECISION[precision or machine_precision()]
        if isinstance(values, str):
            with pytest.raises(RuntimeError) as caught:
                script_precision(script, env)
            line = str(caught.value).split(": ", 1)[1]
            assert line == f"training.precision auto is float32 on this machine, which {trainer} cannot train in ({values}); set training.precision = bf16"
        else:
            assert script_precision(script, env) == values
    with pytest.raises(RuntimeError, match="GEM_PRECISION must be bf16 or float32, got 'fp16'"):
        script_precision(script, {"GEM_PRECISION": "fp16"})


@pytest.mark.parametrize("trainer", SHELL_PRECISION)
@pytest.mark.parametrize("precision", ["bf16", "float32"])
def test_a_pinned_precision_is_written_as_its_values(trainer, precision):
    """An explicit training.precision is written as the trainer's values, whatever the machine or $GEM_PRECISION;
    one the trainer cannot train in is refused when the script is written (REFUSED)."""
    from helpers.scripts import script_precision

    module = importlib.import_module(f"gem_integrations.{trainer}.experiment")
    values = module.PRECISION[precision]
    if isinstance(values, str):
        return
    base = OAT_EXPERIMENT if trainer == "oat" else "[rollout]\ngroup_size = 2\n"
    script = module.render(parse_experiment(f'{base}[training]\nprecision = "{precision}"\n'))
    other = "float32" if precision == "bf16" else "bf16"
    assert script_precision(script, {"GEM_PRECISION": other}) == values
    assert f'# training.precision = "{precision}"' in script and "gem_core.precision" not in script
