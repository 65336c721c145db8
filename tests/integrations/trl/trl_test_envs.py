"""An env for the TRL plugin's tests whose episode length does not depend on the model, registered on import.

The two-process test needs ranks whose episodes take different numbers of turns whatever a random tiny
model writes (a game ends at its first malformed move); the infra-failure tests need a step that reports
:data:`gem_core.errors.INFRA_ERROR` as a dead sandbox worker's tool does. In a module, not a test file, so
that the processes the two-process test starts can import it (and so register the id) too.
"""

from __future__ import annotations

from typing import Any

import gem_core
from gem_core.core import Env
from gem_core.errors import INFRA_ERROR

TURNS_ID = "test:TRLTurns-v0"


class FixedTurns(Env[str, str]):
    """Exactly ``turns`` steps, whatever the action (None: ``1 + seed % 4``, so a dataset's rows differ).
    Reward of a step: ``(sum of the action's code points % 5) / 4``, so it varies with what the model
    writes. ``infra_at``: that step (1-based) reports an infrastructure failure in ``info[INFRA_ERROR]``
    (reward 0, not terminated), as a tool whose sandbox worker died does."""

    def __init__(self, turns: int | None = None, infra_at: int | None = None):
        self._turns_arg = turns
        self.turns = 1 if turns is None else turns
        self.infra_at = infra_at
        self.t = 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.turns = self._turns_arg if self._turns_arg is not None else 1 + (seed or 0) % 4
        return f"Say anything, {self.turns} times (seed {seed}).", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.t += 1
        if self.t == self.infra_at:
            return "", 0.0, False, False, {INFRA_ERROR: "sandbox worker died (test)"}
        reward = (sum(map(ord, action)) % 5) / 4
        return f"Turn {self.t} of {self.turns} done.", reward, self.t >= self.turns, False, {"success": self.t >= self.turns}

    def sample_random_action(self) -> str:
        return "hello"


gem_core.register(TURNS_ID, FixedTurns, override=True)
