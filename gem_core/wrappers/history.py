"""HistoryWrapper: the observation becomes the whole episode so far, as one string.

An LLM policy that sees only the latest observation ("the target is higher than 25") has lost the
rules and its earlier moves. This wrapper keeps them and renders a single text prompt. It works on
plain text; turning messages into chat-template tokens is the rollout runner's job.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Literal

from gem_core.core import Env, StepResult, Wrapper, model_message

HistoryMode = Literal["full", "last_k", "last"]
_MODES = ("full", "last_k", "last")


def _clean(text: str) -> str:
    """Drop blank lines at either end and trailing spaces; keep the first line's indentation
    (boards often start with aligned column headers)."""
    return text.strip("\n").rstrip()


class HistoryWrapper(Wrapper[str, str]):
    """Replaces each observation with the task, the turns so far and the ``suffix`` from info.

    Output format (pieces joined by one blank line, ``"\\n\\n"``; each piece has leading/trailing
    newlines and trailing whitespace removed)::

        {task}

        [Turns 1-2 omitted]        <- only when last_k/last dropped older turns ("[Turn 1 omitted]" for one)

        [Turn 3]
        Action: {action 3}         <- only with include_actions=True
        Observation: {observation 3}

        [Turn 4]
        Action: {action 4}
        Observation: {observation 4}

        {suffix}                   <- info["suffix"] of the latest reset/step, when present and non-empty,
                                      except on the episode's last step (no next move is asked for)

    * ``task`` is the first observation of the episode (what ``reset`` returned); an ``info["prefix"]``
      (GEM's name for task text; at reset or at any later step) replaces it.
    * ``mode="full"`` keeps every turn; ``"last_k"`` the latest ``k`` turns (``k >= 0``); ``"last"``
      only the latest turn (the same as ``last_k`` with ``k=1``). The task is always kept.
    * The action shown is ``info["parsed_action"]`` when the env reports one (GEM's convention, e.g.
      tool wrappers), else the action text as given to ``step``.
    * Right after ``reset`` there are no turns: the observation is ``"{task}\\n\\n{suffix}"``.

    ``reset`` clears the history. The history is wrapper state, so ``get_state``/``set_state`` and
    ``clone`` carry it. Observations must be strings.
    """

    def __init__(self, env: Env, mode: HistoryMode = "full", k: int | None = None, include_actions: bool = True):
        super().__init__(env)
        if mode not in _MODES:
            raise ValueError(f"HistoryWrapper mode must be one of {', '.join(map(repr, _MODES))}, got {mode!r}")
        if mode == "last_k":
            if k is None or isinstance(k, bool) or not isinstance(k, int) or k < 0:
                raise ValueError(f"HistoryWrapper(mode='last_k') needs an integer k >= 0, got k={k!r}")
        elif k is not None:
            raise ValueError(f"HistoryWrapper: k is only used with mode='last_k' (got mode={mode!r}, k={k!r})")
        self.mode: HistoryMode = mode
        self.k = k
        self.include_actions = include_actions
        keep = None if mode == "full" else (1 if mode == "last" else k)
        # Private names: public ones would shadow same-named attributes of the inner env.
        self._task = ""
        self._turns: deque[tuple[str, str]] = deque(maxlen=keep)  # (action, observation)
        self._turn_count = 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Reset the inner env and start a new history from its first observation."""
        obs, info = self.env.reset(seed=seed, options=options)
        _require_text(obs, "reset")
        self._task = info.get("prefix", obs)
        self._turns.clear()
        self._turn_count = 0
        return self.render(info.get("suffix", "")), info

    def step(self, action: str) -> StepResult:
        """Step the inner env and return the rendered history as the observation."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        _require_text(obs, "step")
        if "prefix" in info:
            self._task = info["prefix"]
        shown = info.get("parsed_action", action)
        self._turns.append((str(shown), obs))
        self._turn_count += 1
        # The suffix asks for the next move; on the episode's last step there is none.
        suffix = "" if terminated or truncated else info.get("suffix", "")
        return self.render(suffix), reward, terminated, truncated, info

    def render(self, suffix: str = "") -> str:
        """The history so far in the documented format, ending with ``suffix`` (if non-empty)."""
        pieces = [_clean(self._task)]
        first_shown = self._turn_count - len(self._turns) + 1
        if first_shown > 1:
            omitted = "Turn 1" if first_shown == 2 else f"Turns 1-{first_shown - 1}"
            pieces.append(f"[{omitted} omitted]")
        for number, (action, observation) in enumerate(self._turns, start=first_shown):
            if self.include_actions:
                pieces.append(f"[Turn {number}]\nAction: {_clean(action)}\nObservation: {_clean(observation)}")
            else:
                pieces.append(f"[Turn {number}]\nObservation: {_clean(observation)}")
        # The suffix goes on by gem_core's one rule for what the model sees (a blank line, then the suffix).
        return model_message("\n\n".join(pieces), {"suffix": _clean(suffix) if suffix else ""})


def _require_text(obs: Any, where: str) -> None:
    if not isinstance(obs, str):
        raise TypeError(f"HistoryWrapper needs string observations; {where}() returned {type(obs).__name__}")
