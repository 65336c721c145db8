"""``gem-core make-dataset verl`` writes a parquet that verl's real RLHFDataset loads, with agent_name
and the env columns the gem_env agent loop reads."""

from __future__ import annotations

import json

import pytest

import gem_core
from gem_core.cli import main


def test_cli_writes_parquet_verl_reads(tmp_path, model_dir):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    out = tmp_path / "train.parquet"
    code = main(["make-dataset", "verl", "--env", "game:Sudoku-v0-easy", "--n", "5", "--out", str(out), "--seed-start", "10"])
    assert code == 0 and out.exists()
    tokenizer = AutoTokenizer.from_pretrained(f"{model_dir}/tokenizer")
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 512, "filter_overlong_prompts": False, "return_raw_chat": True})
    dataset = RLHFDataset(data_files=[str(out)], tokenizer=tokenizer, config=config)
    assert len(dataset) == 5
    row = dataset[2]
    assert row["agent_name"] == "gem_env"
    assert row["env_id"] == "game:Sudoku-v0-easy" and row["env_seed"] == 12
    assert json.loads(row["env_kwargs"]) == {}
    assert row["index"] == 2
    observation, info = gem_core.make("game:Sudoku-v0-easy").reset(seed=12)
    # the model's real first message: the observation and its suffix (Sudoku keeps the grid in the suffix)
    assert row["raw_prompt"][0]["content"] == gem_core.model_message(observation, info)
    assert info["suffix"] and info["suffix"] in row["raw_prompt"][0]["content"]
    assert row["max_context_tokens"] == 0 and row["system_prompt"] == ""  # TaskSpec.to_columns: unset


def test_cli_rejects_bad_input(tmp_path, capsys):
    assert main(["make-dataset", "verl", "--env", "game:NoSuchGame-v0", "--n", "2", "--out", str(tmp_path / "x.parquet")]) != 0
    assert main(["make-dataset", "verl", "--env", "game:Sudoku-v0-easy", "--n", "2", "--out", str(tmp_path / "y.parquet"), "--env-kwargs", "[1]"]) == 2
    assert "JSON object" in capsys.readouterr().err


def test_rows_carry_options():
    from gem_integrations.verl.dataset import dataset_rows

    rows = dataset_rows("game:GuessTheNumber-v0-easy", 3, tools=["python"], max_turns=4, max_turn_tokens=64, env_kwargs={})
    assert [r["env_seed"] for r in rows] == [0, 1, 2]
    assert {r["env_tools"] for r in rows} == {"python"} and {r["max_turns"] for r in rows} == {4}
    with pytest.raises(ValueError):
        dataset_rows("game:GuessTheNumber-v0-easy", 0)


def test_rows_are_task_specs_the_agent_loop_reads_back():
    from gem_core.tasks import TaskSpec
    from gem_integrations.verl.dataset import dataset_rows

    rows = dataset_rows("game:GuessTheNumber-v0-easy", 2, max_turns=3, max_turn_tokens=32, system_prompt="Play well.")
    spec = TaskSpec.from_columns(rows[1])
    assert spec == TaskSpec("game:GuessTheNumber-v0-easy", seed=1, max_turns=3, max_turn_tokens=32, system_prompt="Play well.")
    assert rows[1]["prompt"][0] == {"role": "system", "content": "Play well."}
    assert rows[1]["prompt"][1]["content"] == spec.first_message()
