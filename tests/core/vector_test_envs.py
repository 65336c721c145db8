"""Small envs for the vector env tests, in an importable module so that spawned workers can load them.

Worker processes unpickle the env factories that ``gem_core.make_vec`` builds; the factory carries the
spec (entry point ``"vector_test_envs:CounterEnv"``), so a worker needs only this module on
``sys.path``, which spawned workers inherit from the test process (test_vector.py puts this folder
there). Special actions make an env misbehave on purpose, so a test can aim at one env.
"""

from __future__ import annotations

import os
import time
from typing import Any

import gem_core
from gem_core.core import Env

COUNTER_ID = "test:VectorCounter-v0"


class CounterEnv(Env[str, str]):
    """Count up to a target drawn at reset. Action ``"+k"`` adds k; every step also draws a noise
    value, so observations depend on the env's RNG stream. ``max_steps`` truncates.

    Misbehaviour on demand: ``"raise"`` raises, ``"sleep S"`` sleeps S seconds, ``"exit C"`` kills the
    process with ``os._exit(C)``; ``reset(options={"exit": C})`` does the same in reset.
    """

    def __init__(self, max_steps: int = 6, work: int = 0):
        self.max_steps = max_steps
        self.work = work  # iterations of pure-Python busy work per step (a CPU-bound env)
        self.target = self.count = self.steps = 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if options and "exit" in options:
            os._exit(int(options["exit"]))
        self.target = int(self.np_random.integers(3, 10))
        self.count = self.steps = 0
        return f"count=0 target={self.target}", {"target": self.target}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action == "raise":
            raise RuntimeError("counter exploded on purpose")
        if action.startswith("sleep "):
            time.sleep(float(action.split()[1]))
        elif action.startswith("exit "):
            os._exit(int(action.split()[1]))
        total = 0
        for n in range(self.work):  # deterministic CPU work, no sleeping
            total += n * n % 7
        increment = int(action.lstrip("+")) if action.lstrip("+").isdigit() else 0
        self.count += increment
        self.steps += 1
        noise = float(self.np_random.random())
        terminated = self.count >= self.target
        truncated = not terminated and self.steps >= self.max_steps
        reward = 1.0 if terminated else 0.1 * increment
        return f"count={self.count} noise={noise:.6f}", reward, terminated, truncated, {"count": self.count, "busy": total}

    def sample_random_action(self) -> str:
        return f"+{int(self.np_random.integers(1, 4))}"


def register_test_envs() -> None:
    """Register the test ids (idempotent)."""
    gem_core.register(COUNTER_ID, "vector_test_envs:CounterEnv", override=True)
