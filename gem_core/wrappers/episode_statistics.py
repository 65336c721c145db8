"""EpisodeStatistics: a summary of each episode in the info of its last step."""

from __future__ import annotations

import time
from typing import Any

from gem_core.core import Env, StepResult, Wrapper


class EpisodeStatistics(Wrapper):
    """When an episode ends (terminated or truncated), adds ``info["episode"]``::

        {"return": float,        # sum of the episode's rewards (undiscounted)
         "length": int,          # number of turns (steps) since reset
         "success": bool,        # info["success"] of the last step (False when absent)
         "time": float,          # seconds since reset (wall clock)
         "format_errors": int,   # steps whose info["format_error"] was true
         "invalid_actions": int} # steps whose info["invalid_action"] was true

    The info dict is copied, not mutated. Steps before the end carry no ``"episode"`` key.
    """

    def __init__(self, env: Env):
        super().__init__(env)
        # Private names: public ones would shadow same-named attributes of the inner env.
        self._return = 0.0
        self._length = 0
        self._format_errors = 0
        self._invalid_actions = 0
        self._started_at: float | None = None

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset the inner env and the running totals."""
        result = self.env.reset(seed=seed, options=options)
        self._return = 0.0
        self._length = 0
        self._format_errors = 0
        self._invalid_actions = 0
        self._started_at = time.perf_counter()
        return result

    def step(self, action: Any) -> StepResult:
        """Step the inner env; on the episode's last step, attach ``info["episode"]``."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._started_at is None:  # stepped without our reset (e.g. reset before wrapping)
            self._started_at = time.perf_counter()
        self._return += float(reward)
        self._length += 1
        self._format_errors += bool(info.get("format_error", False))
        self._invalid_actions += bool(info.get("invalid_action", False))
        if terminated or truncated:
            info = {**info, "episode": self.episode_summary(success=bool(info.get("success", False)))}
        return obs, reward, terminated, truncated, info

    def episode_summary(self, success: bool = False) -> dict[str, Any]:
        """The running totals of the current episode in the ``info["episode"]`` format."""
        started = self._started_at if self._started_at is not None else time.perf_counter()
        return {
            "return": self._return,
            "length": self._length,
            "success": success,
            "time": time.perf_counter() - started,
            "format_errors": self._format_errors,
            "invalid_actions": self._invalid_actions,
        }
