"""One meaning of a run's seed (issue 64): ``gem-core train --seed S`` plays, update after update, the start
states :func:`gem_core.experiment.update_start_seeds` draws for S, and an experiment's training rows (the
``make-dataset`` command every plugin's script runs) are the same start states in the same order, so a trainer
that plays its rows in order plays the reference's episodes."""

from __future__ import annotations

import json
import types

import pytest

from gem_core.cli import main
from gem_core.experiment import parse_experiment, run_start_seeds, train_rows, update_start_seeds
from gem_core.experiment_scripts import dataset_command
from gem_core.tasks import TaskSpec, specs_for
from gem_core.train.config import TrainConfig
from gem_core.train.trainer import Trainer

GTN = "game:GuessTheNumber-v0-easy"


def reference_start_seeds(seed: int, episodes: int, group_size: int, updates: int) -> list[int]:
    """What the reference trainer plays: its own ``train_seeds``, update after update (on a stand-in ``self``
    holding only the config: the method reads nothing else)."""
    holder = types.SimpleNamespace(config=TrainConfig(seed=seed, episodes_per_update=episodes, group_size=group_size))
    return [s for step in range(updates) for s in Trainer.train_seeds(holder, step)]


def test_the_reference_trainer_plays_the_run_seeds_start_states():
    assert reference_start_seeds(3, 8, 2, 3) == run_start_seeds(3, 12, 4)
    assert reference_start_seeds(3, 8, 1, 1) == update_start_seeds(3, 0, 8)
    assert reference_start_seeds(4, 8, 2, 3) != reference_start_seeds(3, 8, 2, 3)  # another seed, other start states
    assert all(0 <= s < 1_000_000 for s in run_start_seeds(3, 500, 50))  # below the held-out seeds
    assert all(0 <= s < 10 for s in run_start_seeds(3, 50, 5, below=10))


def test_update_start_seeds_refuses_what_is_not_a_count():
    for bad in ({"run_seed": -1}, {"update": True}, {"groups": 0}, {"below": 0}, {"groups": 2.0}):
        arguments = {"run_seed": 0, "update": 0, "groups": 1, "below": 10, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            update_start_seeds(**arguments)
    with pytest.raises(ValueError, match="per_update"):
        specs_for(GTN, 2, run_seed=1)
    with pytest.raises(ValueError, match="without seed_start or balanced"):
        specs_for(GTN, 2, run_seed=1, per_update=1, balanced=True)


@pytest.mark.parametrize("trainer", ["rl2", "trl", "openrlhf", "oat"])
def test_an_experiments_training_rows_are_the_reference_runs_start_states_in_order(trainer, tmp_path, monkeypatch, capsys):
    """The experiment's own make-dataset command (as the plugin's script runs it) writes, row after row, the start
    states ``gem-core train --experiment FILE`` plays: seed 5, groups of 2, 3 updates of 4 episodes."""
    experiment = parse_experiment("[rollout]\nepisodes_per_update = 4\ngroup_size = 2\n[training]\nupdates = 3\n[seeds]\nseed = 5\n")
    monkeypatch.chdir(tmp_path)
    argv = dataset_command(trainer, experiment, str(tmp_path / "train.jsonl"))
    assert argv[:2] == ["gem-core", "make-dataset"] and main(argv[1:]) == 0
    capsys.readouterr()
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(rows) == train_rows(experiment) == 6
    played = [row_seed(trainer, row) for row in rows]
    assert played == reference_start_seeds(5, 4, 2, 3)


def test_the_verl_rows_are_the_same_start_states(tmp_path, monkeypatch, capsys):
    pyarrow = pytest.importorskip("pyarrow.parquet")
    experiment = parse_experiment("[rollout]\nepisodes_per_update = 6\ngroup_size = 2\n[training]\nupdates = 2\n[seeds]\nseed = 9\n")
    monkeypatch.chdir(tmp_path)
    argv = dataset_command("verl", experiment, str(tmp_path / "train.parquet"))
    assert main(argv[1:]) == 0
    capsys.readouterr()
    table = pyarrow.read_table(tmp_path / "train.parquet").to_pylist()
    assert [int(row["env_seed"]) for row in table] == reference_start_seeds(9, 6, 2, 2)


def row_seed(trainer: str, row: dict) -> int:
    """The reset seed a row of ``trainer``'s dataset names (each plugin's own format of the TaskSpec)."""
    if trainer == "rl2":
        return TaskSpec.from_json(row["extra_info"]["gem_task"]).seed
    if trainer == "oat":
        return TaskSpec.from_json(row["gem_task"]).seed
    if trainer == "openrlhf":
        return TaskSpec.from_json(row["label"]).seed
    return TaskSpec.from_json(row["prompt"][-1]["gem_task"]).seed  # trl: in the prompt's message
