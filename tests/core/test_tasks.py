"""Task rows -> envs: the one place every trainer plugin builds its env from a dataset row."""

from __future__ import annotations

import numpy as np
import pytest

import gem_core
from gem_core.tasks import make_task_env, parse_env_kwargs
from gem_core.tools.factory import parse_tools


def test_parse_tools_accepts_the_shapes_datasets_store():
    assert parse_tools(None) == []
    assert parse_tools("") == []
    assert parse_tools("python, search") == ["python", "search"]
    assert parse_tools(["python"]) == ["python"]
    assert parse_tools(np.array(["search"])) == ["search"]


def test_parse_tools_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown env tool"):
        parse_tools("python,shell")


def test_parse_env_kwargs():
    assert parse_env_kwargs(None) == {} and parse_env_kwargs("  ") == {}
    assert parse_env_kwargs('{"max_turns": 3}') == {"max_turns": 3}
    assert parse_env_kwargs({"a": 1}) == {"a": 1}
    with pytest.raises(ValueError, match="JSON object"):
        parse_env_kwargs("[1, 2]")


def test_make_task_env_builds_the_same_env_as_make():
    env = make_task_env("game:GuessTheNumber-v0-easy", '{"max_turns": 3}')
    ref = gem_core.make("game:GuessTheNumber-v0-easy", max_turns=3)
    assert env.reset(seed=4)[0] == ref.reset(seed=4)[0]
    with pytest.raises(gem_core.UnknownKwargError):
        make_task_env("game:GuessTheNumber-v0-easy", {"max_turn": 3})


def test_make_task_env_wraps_tools(tmp_path, monkeypatch):
    from gem_core.wrappers import ToolEnvWrapper

    monkeypatch.delenv("GEM_SEARCH_URL", raising=False)
    monkeypatch.delenv("GEM_SEARCH_CORPUS", raising=False)
    with pytest.raises(ValueError, match="GEM_SEARCH_URL"):
        make_task_env("game:GuessTheNumber-v0-easy", None, ["search"])
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        '{"id": "1", "title": "Paris", "text": "Paris is the capital of France."}\n{"id": "2", "title": "Rome", "text": "Rome is the capital of Italy."}\n'
    )
    monkeypatch.setenv("GEM_SEARCH_CORPUS", str(corpus))
    env = make_task_env("game:GuessTheNumber-v0-easy", None, ["search"])
    try:
        assert isinstance(env, ToolEnvWrapper)
        obs, _ = env.reset(seed=0)
        obs, *_ = env.step("<search>capital of Italy</search>")
        assert "Rome" in obs
    finally:
        env.close()


def test_shared_dataset_arguments_parse_and_validate():
    import argparse

    from gem_core.dataset_rows import add_task_arguments, task_arguments

    parser = argparse.ArgumentParser()
    add_task_arguments(parser)
    args = parser.parse_args(["--env", "game:Sudoku-v0-easy", "--n", "3", "--env-kwargs", '{"max_turns": 9}', "--tools", "python"])
    assert task_arguments(args) == ({"max_turns": 9}, ["python"])
    bad = parser.parse_args(["--env", "x:y", "--n", "1", "--env-kwargs", "{not json"])
    with pytest.raises(ValueError, match="not JSON"):
        task_arguments(bad)


def test_task_spec_round_trips_and_validates():
    from gem_core.tasks import TaskSpec

    spec = TaskSpec("game:Sudoku-v0-easy", seed=3, env_kwargs='{"max_turns": 9}', tools="python", max_turn_tokens=64)
    assert spec.env_kwargs == {"max_turns": 9} and spec.tools == ("python",)
    assert TaskSpec.from_json(spec.to_json()) == spec
    assert TaskSpec.from_columns(spec.to_columns()) == spec
    assert TaskSpec.from_columns({**spec.to_columns(), "env_seed": np.int64(3), "max_turns": np.int64(0)}) == spec
    for kwargs, match in [
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"max_turns": 0}, "max_turns"),
        ({"max_turn_tokens": True}, "max_turn_tokens"),
        ({"tools": "shell"}, "unknown env tool"),
        ({"env_kwargs": "[1]"}, "JSON object"),
    ]:
        with pytest.raises(ValueError, match=match):
            TaskSpec("game:Sudoku-v0-easy", **kwargs)
    with pytest.raises(ValueError, match="env_id"):
        TaskSpec("")
    with pytest.raises(ValueError, match="unknown task spec field"):
        TaskSpec.from_json('{"env_id": "game:Sudoku-v0-easy", "sead": 1}')
    with pytest.raises(ValueError, match="not JSON"):
        TaskSpec.from_json("{nope")
    with pytest.raises(ValueError, match="no 'env_id' column"):
        TaskSpec.from_columns({"prompt": "x"})


def test_first_message_is_what_the_runner_shows():
    import asyncio

    from gem_core.rollout import RunConfig, ScriptedPolicy, run_episode
    from gem_core.tasks import TaskSpec
    from gem_core.testing import build_test_tokenizer
    from gem_core.rollout import ChatFormatter

    tokenizer = build_test_tokenizer()
    spec = TaskSpec("game:Minesweeper-v0-easy", seed=2)
    trajectory = asyncio.run(
        run_episode(spec.make_env(), ScriptedPolicy(tokenizer, lambda c: "\\boxed{r 0 0}"), ChatFormatter(tokenizer), RunConfig(max_turns=1), seed=2)
    )
    assert trajectory.initial_message == spec.first_message()


def test_a_text_only_jsonl_dataset_refuses_an_env_that_shows_images_in_one_line(tmp_path, capsys):
    """TRL, RL2 and oat play text envs only: their make-dataset refuses a vision env before writing a row
    (it would fail at the first rollout otherwise); a dataset whose rows carry images (OpenRLHF's) takes it."""
    pytest.importorskip("PIL")
    from gem_core.cli import main
    from gem_core.dataset_rows import JsonlDataset
    from gem_core.errors import InvalidArgumentError

    def dataset(images: bool) -> JsonlDataset:
        return JsonlDataset(lambda spec, env: {"seed": spec.seed}, "out", "turn", "context", lambda out: "", images=images)

    with pytest.raises(InvalidArgumentError, match="shows images, and this trainer's plugin plays text envs only"):
        list(dataset(False).rows("vision:Geometry-v0", 2))
    assert [row["seed"] for row in dataset(True).rows("vision:Geometry-v0", 2)] == [0, 1]
    assert [row["seed"] for row in dataset(False).rows("game:GuessTheNumber-v0-easy", 2)] == [0, 1]
    out = tmp_path / "rows.jsonl"
    assert main(["make-dataset", "rl2", "--env", "vision:Geometry-v0", "--n", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not out.exists()
