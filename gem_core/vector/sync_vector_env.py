"""SyncVectorEnv: every env in this process, stepped one after the other."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gem_core.params import invalid
from gem_core.vector.vector_env import AutoresetMode, VectorEnv, call_env, run_op


class SyncVectorEnv(VectorEnv):
    """Runs its envs in this process, in index order. Cheap to build, no IPC; best for fast envs.

    Same API and semantics as :class:`~gem_core.vector.AsyncVectorEnv` (same seeds give the same
    trajectories), except that a step cannot be interrupted in-process: ``step_timeout`` is rejected,
    and an env that hangs hangs the caller. Use ``AsyncVectorEnv`` for a time limit.
    """

    def __init__(
        self,
        env_fns: Iterable[Callable[[], Any]],
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        on_error: str = "raise",
        step_timeout: float | None = None,
    ):
        if step_timeout is not None:
            raise invalid(
                "step_timeout",
                step_timeout,
                "None: SyncVectorEnv cannot enforce step_timeout, since a step running in this process cannot be "
                "interrupted safely; use AsyncVectorEnv (vectorization_mode='async') for a time limit",
                type(self).__name__,
            )
        env_fns = list(env_fns)
        super().__init__(len(env_fns), autoreset_mode, on_error)
        self.envs = []
        try:
            for fn in env_fns:
                self.envs.append(fn())
        except BaseException:
            self.close()
            raise

    def _execute(self, ops: dict[int, tuple], what: str) -> dict[int, tuple]:
        envs = self.envs
        return {i: run_op(envs[i], op) for i, op in ops.items()}

    def _call(self, name: str, args: tuple, kwargs: dict, invoke: bool) -> list[tuple]:
        self._check_open()
        return [call_env(env, name, args, kwargs, invoke) for env in self.envs]

    def _close(self) -> None:
        for env in getattr(self, "envs", ()):
            try:
                env.close()
            except Exception:  # one env failing to close must not keep the others open
                pass
