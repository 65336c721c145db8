"""A benchmark env whose step burns CPU: a stand-in for an env with a real checker (tests, graders)."""

from __future__ import annotations

import time
from typing import Any

from gem_core.core import Env


class CpuBound(Env[str, str]):
    """Each step spends ``work_ms`` of this process's CPU time in pure Python; episodes last ``max_turns``."""

    def __init__(self, work_ms: float = 1.0, max_turns: int = 10):
        self.work_ms = work_ms
        self.max_turns = max_turns
        self.turn = 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.turn = 0
        return "start", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        deadline = time.process_time() + self.work_ms / 1000.0
        x = 0
        while time.process_time() < deadline:
            for i in range(200):
                x += i * i
        self.turn += 1
        return f"turn {self.turn}", 0.0, False, self.turn >= self.max_turns, {}

    def sample_random_action(self) -> str:
        return "\\boxed{0}"
