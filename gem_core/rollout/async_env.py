"""Envs as awaitables: what the runner needs of an env (:class:`AsyncEnv`, awaitable ``reset`` and ``step``), and
the adapters that make one of a gem_core :class:`~gem_core.core.Env` (:class:`ThreadedEnv`: its steps off the event
loop, or inline when they are fast) or of a :class:`~gem_core.vector.VectorEnv` (:class:`VectorEnvSlots`: the
steps of concurrent episodes gathered into one vector call).

Separate from :mod:`gem_core.rollout.runner` because it is a job of its own: how an env's step is run without
holding up the event loop. It knows nothing of policies, formatters or trajectories; the runner takes any env
through :func:`as_async_env`.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import time
from concurrent.futures import Executor
from typing import Any, Protocol, runtime_checkable

from gem_core.core import Env

StepResult = tuple[Any, float, bool, bool, dict[str, Any]]


@runtime_checkable
class AsyncEnv(Protocol):
    """What the runner needs of an env: awaitable ``reset`` and ``step``."""

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]: ...

    async def step(self, action: str) -> StepResult: ...


# "auto" runs a step inline once this many recent steps of the same kind of env all took less than
# INLINE_STEP_SECONDS: a thread hop costs ~50-500 us, more than such a step blocks the loop.
INLINE_STEP_SECONDS = 250e-6
_RECENT_STEPS = 8
_step_history: dict[Any, collections.deque] = {}
# what a step's time is read from (a test swaps in a clock of its own: a busy machine's must not decide a test)
_clock = time.perf_counter


class ThreadedEnv:
    """A gem_core :class:`Env` whose ``reset``/``step`` run off the event loop, in ``executor``'s threads
    (default: the loop's).

    ``in_thread``: ``True`` always uses a thread; ``False`` never does (for envs whose step takes
    microseconds); ``"auto"`` (default) runs a step inline only when the last 8 steps of this kind of env
    (its class and id) each took under :data:`INLINE_STEP_SECONDS`, and in a thread otherwise, so a slow
    env never holds up the other episodes and a fast one does not pay for a thread hop.
    """

    def __init__(self, env: Env, executor: Executor | None = None, in_thread: bool | str = "auto"):
        if in_thread not in (True, False, "auto"):
            raise ValueError(f"in_thread must be True, False or 'auto', got {in_thread!r}")
        self.env = env
        self.executor = executor
        self.in_thread = in_thread
        self._profile_key = (type(env.unwrapped), self.env_id)

    @property
    def env_id(self) -> str | None:
        spec = self.env.spec
        return spec.id if spec is not None else None

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if self.in_thread is False:
            return self.env.reset(seed=seed, options=options)
        return await asyncio.get_running_loop().run_in_executor(self.executor, lambda: self.env.reset(seed=seed, options=options))

    async def step(self, action: str) -> StepResult:
        if self.in_thread is False:
            return self.env.step(action)
        if self.in_thread is True:
            return await asyncio.get_running_loop().run_in_executor(self.executor, self.env.step, action)
        history = _step_history.get(self._profile_key)
        if history is None:
            history = _step_history[self._profile_key] = collections.deque(maxlen=_RECENT_STEPS)
        inline = len(history) == _RECENT_STEPS and max(history) < INLINE_STEP_SECONDS
        result, seconds = (
            _timed_step(self.env, action) if inline else await asyncio.get_running_loop().run_in_executor(self.executor, _timed_step, self.env, action)
        )
        history.append(seconds)
        return result


def _timed_step(env: Env, action: str) -> tuple[StepResult, float]:
    started = _clock()
    result = env.step(action)
    return result, _clock() - started


class VectorEnvSlots:
    """The envs of a :class:`~gem_core.vector.VectorEnv` as :class:`AsyncEnv` slots.

    Requests from concurrent episodes are gathered: every reset and step pending at the same moment go
    to the vector env as one call (``reset`` with a ``reset_mask``, ``step`` with an ``{index: action}``
    dict), run in a thread, so the event loop keeps generating meanwhile. Resets are explicit, so use the
    vector env's ``NEXT_STEP`` (default) or ``DISABLED`` autoreset mode. With ``on_error="truncate"`` an
    env that fails or whose worker dies ends its episode as truncated (reason ``"env_error"``).
    """

    def __init__(self, vector_env: Any, executor: Executor | None = None):
        self.vector_env = vector_env
        self.executor = executor
        self._resets: dict[int, tuple[int | None, dict[str, Any] | None, asyncio.Future]] = {}
        self._steps: dict[int, tuple[str, asyncio.Future]] = {}
        self._dispatcher: asyncio.Task | None = None
        try:
            specs = vector_env.get_attr("spec")
            self.env_ids = [spec.id if spec is not None else None for spec in specs]
        except Exception:
            self.env_ids = [None] * vector_env.num_envs
        self.slots = [_VectorSlot(self, i) for i in range(vector_env.num_envs)]

    def __len__(self) -> int:
        return len(self.slots)

    def _submit(self, table: dict, index: int, payload: tuple) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        if index in self._resets or index in self._steps:
            raise RuntimeError(f"vector env slot {index} already has a request in flight")
        future = loop.create_future()
        table[index] = (*payload, future)
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = loop.create_task(self._dispatch())
        return future

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._resets or self._steps:
            await asyncio.sleep(0)  # gather the requests of every episode that is ready this tick
            if self._resets:
                resets, self._resets = self._resets, {}
                by_options: dict[int, list[int]] = {}
                for index, (_, options, _) in resets.items():
                    by_options.setdefault(id(options) if options is not None else 0, []).append(index)
                for indices in by_options.values():
                    await self._run_resets(loop, {i: resets[i] for i in indices})
            if self._steps:
                steps, self._steps = self._steps, {}
                actions = {index: action for index, (action, _) in steps.items()}
                try:
                    obs, rewards, terminated, truncated, infos = await loop.run_in_executor(self.executor, self.vector_env.step, actions)
                except Exception as exc:
                    for _, future in steps.values():
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for k, (index, (_, future)) in enumerate(steps.items()):
                    if not future.done():
                        future.set_result((obs[k], float(rewards[k]), bool(terminated[k]), bool(truncated[k]), infos[k]))

    async def _run_resets(self, loop: asyncio.AbstractEventLoop, resets: dict) -> None:
        num_envs = self.vector_env.num_envs
        seeds: list[int | None] = [None] * num_envs
        mask = [False] * num_envs
        options = None
        for index, (seed, opts, _) in resets.items():
            seeds[index], mask[index], options = seed, True, opts
        call_options = {**(options or {}), "reset_mask": mask}
        try:
            obs, infos = await loop.run_in_executor(self.executor, lambda: self.vector_env.reset(seed=seeds, options=call_options))
        except Exception as exc:
            for _, _, future in resets.values():
                if not future.done():
                    future.set_exception(exc)
            return
        for index, (_, _, future) in resets.items():
            if not future.done():
                future.set_result((obs[index], infos[index] or {}))


class _VectorSlot:
    """One env of a :class:`VectorEnvSlots` as an :class:`AsyncEnv`."""

    def __init__(self, owner: VectorEnvSlots, index: int):
        self.owner = owner
        self.index = index

    @property
    def env_id(self) -> str | None:
        return self.owner.env_ids[self.index]

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        return await self.owner._submit(self.owner._resets, self.index, (seed, options))

    async def step(self, action: str) -> StepResult:
        return await self.owner._submit(self.owner._steps, self.index, (action,))


def as_async_env(env: Any, executor: Executor | None = None, step_in_thread: bool | str = "auto") -> Any:
    """An :class:`AsyncEnv` for a gem_core env (threaded) or anything that already has async reset/step."""
    if isinstance(env, Env):
        return ThreadedEnv(env, executor, step_in_thread)
    if inspect.iscoroutinefunction(getattr(env, "step", None)) and inspect.iscoroutinefunction(getattr(env, "reset", None)):
        return env
    raise TypeError(f"expected a gem_core Env or an object with async reset/step, got {type(env).__name__}")
