"""The scripted players of ``benchmarks/hint_reading.py`` read the env's real messages and win what the
benchmark (and the README) say they win: if the env's wording changed, the benchmark would imitate
players that no longer read the hints, and its table would measure nothing."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

import gem_core

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("hint_reading", ROOT / "benchmarks" / "hint_reading.py")
hint_reading = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hint_reading)


def _success_rate(player: str, episodes: int) -> float:
    env = gem_core.make("game:GuessTheNumber-v0-easy")
    rng = random.Random(0)
    wins = 0
    for seed in range(episodes):
        context, _ = env.reset(seed=seed)
        while True:
            observation, _, terminated, truncated, info = env.step(hint_reading.move(player, context, rng))
            context += "\n" + observation
            if terminated or truncated:
                wins += bool(info.get("success"))
                break
    return wins / episodes


def test_allowed_narrows_the_range_by_every_hint_so_far():
    env = gem_core.make("game:GuessTheNumber-v0-easy")
    context, _ = env.reset(seed=0)
    assert hint_reading.allowed(context) == (1, 10)
    context += "\nAt turn 1, you guessed 5, and the target number is lower than 5."
    context += "\nAt turn 2, you guessed 2, and the target number is higher than 2."
    assert hint_reading.allowed(context) == (3, 4)


@pytest.mark.parametrize(("player", "expected", "tolerance"), [("random", 0.344, 0.04), ("consistent", 0.762, 0.04), ("bisect", 1.0, 0.0)])
def test_each_player_wins_what_the_benchmark_says(player, expected, tolerance):
    assert abs(_success_rate(player, 1000) - expected) <= tolerance
