"""Helpers of the gem-core eval tests: scripted chat players for GuessTheNumber (they read the
conversation, as a model would), the episodes' known targets, and reading results files."""

from __future__ import annotations

import json
import re
from typing import Any

import gem_core

EASY = "game:GuessTheNumber-v0-easy"  # 1..10 in 4 turns
HARD = "game:GuessTheNumber-v0-hard"  # 1..50 in 7 turns
RANGE = re.compile(r"between (\d+) and (\d+)")
HINT = re.compile(r"you guessed (\d+), and the target number is (higher|lower)")


def _user_text(messages: list[dict[str, str]]) -> str:
    return "\n".join(m["content"] for m in messages if m["role"] == "user")


def binary_search(messages: list[dict[str, str]]) -> str:
    """Halve the range the hints leave: wins easy (10 numbers, 4 turns) and hard (50, 7) every time."""
    text = _user_text(messages)
    low, high = map(int, RANGE.search(text).groups())
    for guess, hint in HINT.findall(text):
        if hint == "higher":
            low = max(low, int(guess) + 1)
        else:
            high = min(high, int(guess) - 1)
    return f"I guess \\boxed{{{(low + high) // 2}}}"


def linear_scan(messages: list[dict[str, str]]) -> str:
    """Guess low, low+1, low+2...: wins exactly when the target is within the first max_turns numbers."""
    low, _ = map(int, RANGE.search(_user_text(messages)).groups())
    return f"\\boxed{{{low + sum(m['role'] == 'assistant' for m in messages)}}}"


def targets(env_id: str, seeds: range) -> dict[int, int]:
    """The hidden number of each seed's episode, read off a fresh env."""
    env = gem_core.make(env_id)
    out = {}
    for seed in seeds:
        env.reset(seed=seed)
        out[seed] = env.unwrapped.target
    env.close()
    return out


def read_lines(path: Any) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def without_timing(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from gem_core.eval.results import TIMING_FIELDS

    return [{k: v for k, v in line.items() if k not in TIMING_FIELDS} for line in lines]


def episode_of(request_id: str) -> int:
    """The episode number in a request id ``"{env_id}/{episode}/turn-{t}"``."""
    return int(request_id.split("/")[1])


def turn_of(request_id: str) -> int:
    return int(request_id.rsplit("-", 1)[1])
