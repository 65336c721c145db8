"""gem_core.model_message: the one rule for what the model is shown of an observation."""

from __future__ import annotations

import pytest

import gem_core
from gem_core import model_message
from gem_core.wrappers import HistoryWrapper


def test_suffix_follows_the_observation_after_a_blank_line():
    assert model_message("You moved.\n", {"suffix": "\nBoard:\n1 2\nYour move.\n"}) == "You moved.\n\nBoard:\n1 2\nYour move."


@pytest.mark.parametrize("info", [None, {}, {"suffix": None}, {"suffix": ""}, {"suffix": " \n "}])
def test_no_suffix_leaves_the_observation_alone(info):
    assert model_message("  as is \n", info) == "  as is \n"


def test_a_suffix_already_shown_is_not_repeated():
    assert model_message("Task\n\nYour move.", {"suffix": "Your move."}) == "Task\n\nYour move."


def test_empty_observation_gives_the_suffix():
    assert model_message("", {"suffix": "Board"}) == "Board"


def test_bad_types_are_clear_errors():
    with pytest.raises(TypeError, match="text observation"):
        model_message(["not", "text"], {})
    with pytest.raises(TypeError, match="suffix"):
        model_message("ok", {"suffix": 3})


def test_history_wrapper_output_gets_no_second_suffix():
    env = gem_core.make("game:Sudoku-v0-easy", wrappers=[HistoryWrapper])
    obs, info = env.reset(seed=1)
    assert model_message(obs, info) == obs and obs.count(info["suffix"].strip()) == 1
    obs, _, terminated, truncated, info = env.step(env.sample_random_action())
    if not (terminated or truncated):
        assert model_message(obs, info) == obs


def test_sudoku_board_reaches_the_message():
    env = gem_core.make("game:Sudoku-v0-easy")
    obs, info = env.reset(seed=0)
    assert env.unwrapped.render_board() not in obs
    assert env.unwrapped.render_board() in model_message(obs, info)
