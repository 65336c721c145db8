"""Small envs for the rollout tests: exact control over rewards, lengths and endings."""

from __future__ import annotations

from typing import Any

from gem_core.core import Env


class ScriptedRewardEnv(Env[str, str]):
    """Gives ``rewards[t]`` at turn ``t`` and ends after the last one (terminated, or truncated when
    ``truncate_at_end``). Observations are ``obs_chars`` characters long (plus the turn number)."""

    def __init__(self, rewards: list[float], obs_chars: int = 20, truncate_at_end: bool = False, use_tool: bool = False):
        self.rewards = list(rewards)
        self.obs_chars = obs_chars
        self.truncate_at_end = truncate_at_end
        self.use_tool = use_tool
        self.turn = 0
        self.actions: list[str] = []

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.turn = 0
        self.actions = []
        return f"Start (seed {seed}). " + "x" * self.obs_chars, {"seed": seed}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.actions.append(action)
        reward = self.rewards[self.turn]
        self.turn += 1
        last = self.turn >= len(self.rewards)
        info = {"turn": self.turn, "use_tool": self.use_tool}
        return (f"Turn {self.turn} done. " + "y" * self.obs_chars, reward, last and not self.truncate_at_end, last and self.truncate_at_end, info)
