"""Datasets for GRPOTrainer from task specs: the prompt carries the spec; make-dataset trl writes JSONL."""

from __future__ import annotations

import json

import pytest
from datasets import load_dataset

from gem_core.cli import main as cli_main
from gem_core.tasks import TaskSpec
from gem_integrations.trl import make_dataset, task_of
from gem_integrations.trl.dataset import TASK_KEY, prompt_of


def test_rows_carry_the_spec_and_the_first_message():
    dataset = make_dataset("game:GuessTheNumber-v0-easy", 3, seed_start=5, max_turns=3, system_prompt="Play well.")
    assert len(dataset) == 3
    for i, row in enumerate(dataset):
        spec = task_of(row["prompt"])
        assert spec == TaskSpec("game:GuessTheNumber-v0-easy", seed=5 + i, max_turns=3, system_prompt="Play well.")
        system, user = row["prompt"]
        assert system["role"] == "system" and system["content"] == "Play well." and system[TASK_KEY] is None
        assert user["role"] == "user" and user["content"] == spec.first_message()


def test_task_of_refuses_a_prompt_without_a_spec():
    with pytest.raises(ValueError, match="carries no gem-core task spec"):
        task_of([{"role": "user", "content": "hello"}])
    with pytest.raises(ValueError, match="carries no gem-core task spec"):
        task_of("a plain text prompt")
    assert task_of(prompt_of(TaskSpec("game:Mastermind-v0-easy", seed=1))[0]).env_id == "game:Mastermind-v0-easy"


def test_unknown_env_fails_before_writing(tmp_path):
    with pytest.raises(Exception, match="NoSuchGame"):
        make_dataset("game:NoSuchGame-v0", 2)


def test_make_dataset_trl_command(tmp_path, capsys):
    out = tmp_path / "prompts.jsonl"
    assert cli_main(["make-dataset", "trl", "--env", "game:GuessTheNumber-v0-easy", "--n", "4", "--max-turn-tokens", "16", "--out", str(out)]) == 0
    assert "wrote 4 prompts" in capsys.readouterr().out
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [task_of(line["prompt"]).seed for line in lines] == [0, 1, 2, 3]
    dataset = load_dataset("json", data_files=str(out), split="train")
    assert task_of(dataset[2]["prompt"]) == TaskSpec("game:GuessTheNumber-v0-easy", seed=2, max_turn_tokens=16)
