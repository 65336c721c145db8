"""EpisodeStatistics: a summary of each episode in the info of its last step; EpisodeTotals: what a set of
episodes did, from those summaries (the one place `gem-core play`, `gem-core eval` and the trainer count)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gem_core.core import Env, StepResult, Wrapper


class EpisodeStatistics(Wrapper):
    """When an episode ends (terminated or truncated), adds ``info["episode"]``::

        {"return": float,        # sum of the episode's rewards (undiscounted)
         "length": int,          # number of turns (steps) since reset
         "success": bool,        # info["success"] of the last step (False when absent)
         "time": float,          # seconds since reset (wall clock)
         "format_errors": int,   # steps whose info["format_error"] was true
         "invalid_actions": int, # steps whose info["invalid_action"] was true
         "truncated": bool}      # cut short (a time limit), not ended by the rules

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
            summary = self.episode_summary(success=bool(info.get("success", False)), truncated=bool(truncated) and not bool(terminated))
            info = {**info, "episode": summary}
        return obs, reward, terminated, truncated, info

    def episode_summary(self, success: bool = False, truncated: bool = False) -> dict[str, Any]:
        """The running totals of the current episode in the ``info["episode"]`` format."""
        started = self._started_at if self._started_at is not None else time.perf_counter()
        return {
            "return": self._return,
            "length": self._length,
            "success": success,
            "time": time.perf_counter() - started,
            "format_errors": self._format_errors,
            "invalid_actions": self._invalid_actions,
            "truncated": truncated,
        }


@dataclass(frozen=True)
class EpisodeTotals:
    """What a set of episodes did, from one summary per episode in the ``info["episode"]`` format
    (``return``, ``length``, ``success``; ``format_errors``, ``invalid_actions`` and ``truncated`` count
    as 0 when absent). The rates are shares of episodes, except the two ``*_turn_rate`` (shares of turns)."""

    episodes: int
    successes: int
    mean_return: float
    mean_length: float
    length_when_solved: float | None  # mean length of the successful episodes; None when there are none
    turns: int
    format_error_turns: int
    invalid_action_turns: int
    format_error_episodes: int  # episodes with at least one format error
    truncated_episodes: int

    @classmethod
    def of(cls, summaries: Iterable[Mapping[str, Any]]) -> EpisodeTotals:
        episodes = list(summaries)
        n = len(episodes)
        lengths = [int(e["length"]) for e in episodes]
        solved = [length for e, length in zip(episodes, lengths) if e["success"]]
        return cls(
            episodes=n,
            successes=len(solved),
            mean_return=sum(float(e["return"]) for e in episodes) / n if n else 0.0,
            mean_length=sum(lengths) / n if n else 0.0,
            length_when_solved=sum(solved) / len(solved) if solved else None,
            turns=sum(lengths),
            format_error_turns=sum(int(e.get("format_errors", 0)) for e in episodes),
            invalid_action_turns=sum(int(e.get("invalid_actions", 0)) for e in episodes),
            format_error_episodes=sum(int(e.get("format_errors", 0)) > 0 for e in episodes),
            truncated_episodes=sum(bool(e.get("truncated", False)) for e in episodes),
        )

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def format_error_rate(self) -> float:
        return self.format_error_episodes / self.episodes if self.episodes else 0.0

    @property
    def truncation_rate(self) -> float:
        return self.truncated_episodes / self.episodes if self.episodes else 0.0

    @property
    def format_error_turn_rate(self) -> float:
        return self.format_error_turns / self.turns if self.turns else 0.0

    @property
    def invalid_action_turn_rate(self) -> float:
        return self.invalid_action_turns / self.turns if self.turns else 0.0
