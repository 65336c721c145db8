"""TimeLimit: end an episode after a number of turns, as truncation."""

from __future__ import annotations

from typing import Any

from gem_core.core import Env, StepResult, Wrapper
from gem_core.errors import ResetNeeded


class TimeLimit(Wrapper):
    """Truncates the episode once ``max_turns`` steps have been taken since ``reset``.

    On the step that reaches the limit, if the inner env did not terminate, the step returns
    ``truncated=True`` (``terminated`` stays ``False``) and ``info["time_limit"] = True``. A
    termination on that same step wins: the episode ended by itself, so nothing is changed.
    It composes with an env's own limit: whichever limit comes first ends the episode, and
    ``info["time_limit"]`` is set only when this wrapper's limit is reached. Stepping after this
    wrapper truncated raises :class:`~gem_core.errors.ResetNeeded`, as finished games do.
    """

    def __init__(self, env: Env, max_turns: int):
        super().__init__(env)
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"TimeLimit needs an integer max_turns >= 1, got {max_turns!r}")
        # Private names: a public ``max_turns`` would hide the inner game's own ``max_turns``.
        self._turn_limit = max_turns
        self._elapsed = 0
        self._truncated_here = False

    @property
    def turn_limit(self) -> int:
        """The number of turns after which this wrapper truncates."""
        return self._turn_limit

    @property
    def elapsed_turns(self) -> int:
        """Steps taken since the last ``reset``."""
        return self._elapsed

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset the inner env and the turn counter."""
        result = self.env.reset(seed=seed, options=options)
        self._elapsed = 0
        self._truncated_here = False
        return result

    def step(self, action: Any) -> StepResult:
        """Step the inner env; truncate when the limit is reached."""
        if self._truncated_here:
            raise ResetNeeded(f"TimeLimit: the episode was truncated after {self._turn_limit} turns; call reset() first")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._elapsed += 1
        if self._elapsed >= self._turn_limit and not terminated:
            self._truncated_here = True
            truncated = True
            info = {**info, "time_limit": True}
        return obs, reward, terminated, truncated, info
