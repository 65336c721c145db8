"""Errors raised by gem_core. Each one says what was wrong and what would be right."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class GemError(Exception):
    """Base class of gem_core's own errors."""


class UnknownEnvError(GemError, KeyError):
    """``make``/``spec`` got an id that is neither registered nor an alias."""

    def __str__(self) -> str:  # KeyError would quote the message; we want it readable
        return str(self.args[0]) if self.args else ""


class InvalidArgumentError(GemError, ValueError):
    """An argument (an env's ``make`` kwarg, a vector env option, a tool option) is outside what is
    allowed. The message names the argument, the value given and what is allowed; ``name``,
    ``value`` and ``allowed`` carry the same, for code. Also a ``ValueError``."""

    def __init__(self, message: str, *, name: str | None = None, value: object = None, allowed: str | None = None):
        super().__init__(message)
        self.name = name
        self.value = value
        self.allowed = allowed


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type (``max_turns="5"``). Both a ``ValueError`` and a ``TypeError``."""


class UnknownKwargError(InvalidArgumentTypeError):
    """``make`` got a keyword argument that the env's constructor does not take."""


class RegistrationError(GemError, ValueError):
    """A bad ``register`` call: duplicate id, malformed id or entry point."""


class ResetNeeded(GemError, RuntimeError):
    """``step`` was called before ``reset`` or after the episode ended."""


class ModelRequestError(GemError, RuntimeError):
    """A request to a model server failed for good (after its retries, or with an answer that a retry
    would not change): one line naming the URL and the cause. ``status``: the HTTP status, when there
    was one. Raised by :class:`~gem_core.rollout.OpenAIPolicy` (:mod:`gem_core.rollout.http`)."""

    def __init__(self, message: str, *, status: int | None = None, detail: str = ""):
        super().__init__(message)
        self.status = status
        self.detail = detail


#: The one ``info`` key that marks a failure of the infrastructure, not of the policy: a sandbox worker
#: that died, a pool that was shut down, an env worker that crashed or timed out, an engine that aborted
#: the request. Its value is a one-line reason. The runner ends such an episode
#: (``Trajectory.infra_error``); plugins and the reference trainer keep it out of the loss and out of the
#: advantage statistics, and count it (DESIGN.md contract 8).
INFRA_ERROR = "infra_error"


def infra_error(info: object) -> str | None:
    """The infrastructure failure an ``info`` dict reports (:data:`INFRA_ERROR`), or None."""
    if not isinstance(info, dict):
        return None
    reason = info.get(INFRA_ERROR)
    return None if reason in (None, False, "") else str(reason)


def suggest(word: str, choices: Iterable[str], n: int = 3) -> str:
    """' Did you mean: a, b?' for the closest matches, or '' when nothing is close."""
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=n, cutoff=0.6)
    if not close:
        lowered = word.lower()
        close = [c for c in choices if lowered in c.lower()][:n]
    return f" Did you mean: {', '.join(close)}?" if close else ""
