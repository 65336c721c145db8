"""A gem-core env as an OpenEnv ``Environment``: the class OpenEnv's own server (``create_app``) serves.

One :class:`GemEnvironment` per OpenEnv session, wrapping one gem-core env (built by
:func:`gem_core.tasks.make_task_env`, tools included, exactly as a training row builds it). The wire
format is OpenEnv's: an action is ``{"action": "<the model's text>"}``; an observation carries the env's
``observation``, ``message`` (what the model sees next: :func:`gem_core.model_message`), ``info``,
``terminated`` and ``truncated``, with OpenEnv's own ``reward`` and ``done``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

try:  # without the openenv extra: one line naming it, not a ModuleNotFoundError from inside an import
    from openenv.core.env_server import Action, Environment, Observation, State
    from pydantic import Field
except ImportError:
    from gem_core.serve import require_openenv

    require_openenv()
    raise

from gem_core.core import Env, model_message
from gem_core.errors import GemError, InvalidArgumentTypeError, ResetNeeded, UnknownKwargError
from gem_core.params import Param

#: What a reset takes besides OpenEnv's own ``seed`` and ``episode_id``.
RESET_KWARGS = ("seed", "episode_id", "options")
_SEED = Param(int, low=0, none="a fresh random episode")


class SessionClosed(GemError, RuntimeError):
    """A request reached a session whose env is closed (idle timeout, or the server is stopping)."""


class GemAction(Action):
    """One move: the model's text, as ``gem_core.Env.step`` takes it."""

    action: str = Field(..., description="the model's text for this turn (a move, an answer, a tool call)")


class GemObservation(Observation):
    """What a reset or a step returns; ``reward`` and ``done`` are OpenEnv's (``done`` = terminated or truncated)."""

    observation: Any = Field(default="", description="the env's observation (text; a dict for multi-modal or multi-agent envs)")
    message: Optional[str] = Field(default=None, description="what the model is shown next: the observation, then info['suffix']")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info dict (JSON-safe)")
    terminated: bool = Field(default=False, description="the episode ended in the env")
    truncated: bool = Field(default=False, description="the episode was cut by a time or turn limit")


class GemState(State):
    """The session's state: OpenEnv's episode id and step count, plus the env id and the last reset seed."""

    env_id: str = ""
    seed: Optional[int] = None
    done: bool = False


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON types (numpy scalars and arrays to Python, tuples and sets to lists, non-finite
    floats and other objects to their text), so an env's ``info`` always crosses the wire."""
    if depth > 32:
        return repr(value)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else repr(value)
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalars and arrays
        return json_safe(value.tolist(), depth + 1)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v, depth + 1) for v in value]
    return repr(value)


class GemEnvironment(Environment[GemAction, GemObservation, GemState]):
    """One session's env. ``make_env`` builds the gem-core env; ``on_close`` hears when it is released.

    Each session has its own env, so sessions are independent (``SUPPORTS_CONCURRENT_SESSIONS``); OpenEnv
    runs each session's calls on that session's own thread. Bad input raises a :class:`GemError` whose one
    line OpenEnv's server sends back as the error message.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        make_env: Callable[[], Env],
        env_id: str,
        *,
        idle_timeout: float | None = None,
        on_close: Callable[[GemEnvironment], None] | None = None,
    ):
        super().__init__()
        self.env_id = env_id
        self._env = make_env()
        self._idle_timeout = idle_timeout
        self._on_close = on_close
        self._closed_reason: str | None = None
        self._lock = threading.Lock()
        self._state = GemState(env_id=env_id)
        self._started = False
        self._last_request = time.monotonic()
        #: Set by the server before it stops, so that a request still in flight hears why.
        self.stopping = False

    # -- OpenEnv's interface ---------------------------------------------------------------------
    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, options: Optional[dict] = None, **kwargs: Any) -> GemObservation:
        """Start an episode: ``seed`` (a non-negative integer) and ``options`` go to the env's reset."""
        self._check_open()
        if kwargs:
            raise UnknownKwargError(
                f"{self.env_id}: reset does not take {', '.join(map(repr, sorted(kwargs)))}; it takes {', '.join(RESET_KWARGS)}",
                name=sorted(kwargs)[0],
                value=kwargs[sorted(kwargs)[0]],
                allowed=", ".join(RESET_KWARGS),
            )
        _SEED.check("seed", seed, f"{self.env_id}: reset")
        if options is not None and not isinstance(options, dict):
            raise InvalidArgumentTypeError(f"{self.env_id}: reset options must be a JSON object, got {type(options).__name__}", name="options", value=options)
        obs, info = self._env.reset(seed=seed, options=options)
        self._state = GemState(env_id=self.env_id, seed=seed, episode_id=episode_id, step_count=0)
        self._started = True
        return self._observation(obs, 0.0, False, False, info)

    def step(self, action: GemAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GemObservation:
        """One turn: the action's text goes to the env's step."""
        self._check_open()
        if not self._started or self._state.done:
            raise ResetNeeded(
                f"{self.env_id}: step before reset (each WebSocket session, /ws, has its own env; an HTTP /step has none{self._idle_note()})"
                if not self._started
                else f"{self.env_id}: the episode has ended; reset to start another"
            )
        obs, reward, terminated, truncated, info = self._env.step(action.action)
        self._state.step_count += 1
        self._state.done = bool(terminated or truncated)
        return self._observation(obs, float(reward), bool(terminated), bool(truncated), info)

    @property
    def state(self) -> GemState:
        return self._state

    def close(self) -> None:
        """Release the env once (OpenEnv calls this when a session ends, times out or the server stops)."""
        with self._lock:
            if self._closed_reason is not None:
                return
            idle = time.monotonic() - self._last_request
            if self.stopping:
                self._closed_reason = "the server is shutting down"
            elif self._idle_timeout is not None and idle >= self._idle_timeout:
                self._closed_reason = f"idle for {idle:.0f} s, more than the server's idle timeout of {self._idle_timeout:g} s"
            else:
                self._closed_reason = "the session ended"
        try:
            self._env.close()
        finally:
            if self._on_close is not None:
                self._on_close(self)

    # -- helpers ---------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    def _idle_note(self) -> str:
        if self._idle_timeout is None:
            return ""
        return f"; a connection with no message for {self._idle_timeout:g} s is closed, and a client that reconnects gets a new session"

    def _check_open(self) -> None:
        self._last_request = time.monotonic()
        if self._closed_reason is not None:
            raise SessionClosed(f"{self.env_id}: this session's env is closed ({self._closed_reason}); open a new session")

    def _observation(self, obs: Any, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> GemObservation:
        message = model_message(obs, info) if isinstance(obs, str) else None
        return GemObservation(
            observation=json_safe(obs),
            message=message,
            info=json_safe(info),
            terminated=terminated,
            truncated=truncated,
            reward=reward,
            done=terminated or truncated,
        )
