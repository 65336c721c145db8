"""Helpers of tests/serve: scripted moves and the in-process episode an OpenEnv client must see again."""

from __future__ import annotations

from typing import Any

from gem_core.serve.environment import json_safe
from gem_core.tasks import make_task_env


def guesses(seed: int, n: int = 6) -> list[str]:
    """A fixed, seed-dependent list of GuessTheNumber moves (a bad one included), so that a step crossed
    between sessions shows up as a different episode."""
    moves = [f"\\boxed{{{(seed * 7 + 3 * k) % 20 + 1}}}" for k in range(n)]
    moves.insert(2, "no move here")
    return moves


def play_local(env_id: str, seed: int, actions: list[str], *, env_kwargs: Any = None, tools: Any = None) -> list[dict[str, Any]]:
    """The episode in-process, as the records an OpenEnv client sees (info made JSON-safe the same way)."""
    env = make_task_env(env_id, env_kwargs, tools)
    try:
        obs, info = env.reset(seed=seed)
        records = [{"observation": obs, "info": json_safe(info), "reward": 0.0, "terminated": False, "truncated": False}]
        for action in actions:
            obs, reward, terminated, truncated, info = env.step(action)
            records.append({"observation": obs, "info": json_safe(info), "reward": float(reward), "terminated": terminated, "truncated": truncated})
            if terminated or truncated:
                break
        return records
    finally:
        env.close()


def record(result: Any) -> dict[str, Any]:
    """An OpenEnv StepResult (GenericEnvClient's) as the same record; done must agree with the flags."""
    obs = result.observation
    assert result.done == (obs["terminated"] or obs["truncated"])
    return {"observation": obs["observation"], "info": obs["info"], "reward": result.reward, "terminated": obs["terminated"], "truncated": obs["truncated"]}
