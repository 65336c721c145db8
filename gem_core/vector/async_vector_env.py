"""AsyncVectorEnv: envs sharded over worker processes, one message round-trip per worker per call.

Each worker process hosts a contiguous shard of the envs. A ``step`` sends every worker one message
holding the ops for its whole shard and reads one reply, so IPC costs a few messages per step however
many envs there are. Messages are pickled with protocol 5 over ``multiprocessing`` Pipes.

A worker that dies (killed, segfault, ``os._exit``) or overruns ``step_timeout`` is killed and
restarted with fresh envs, and the call still returns: the other workers' results are delivered
intact, and the lost episodes are reported as truncated (see :class:`AsyncVectorEnv`).
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util  # its atexit handler must be registered before ours (see below)
import os
import pickle
import signal
import time
import weakref
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_any
from multiprocessing.context import BaseContext
from typing import Any, ClassVar

from gem_core.params import Param, check_args
from gem_core.utils.cores import usable_cores

from gem_core.vector.sharded import ShardedVectorEnv, build_envs, close_envs, dumps, serve_request
from gem_core.vector.vector_env import AutoresetMode, VectorEnv, VectorEnvError

_CLOSE_GRACE_S = 2.0  # how long close() lets workers close their envs before killing them
_STARTUP_TIMEOUT_S = 300.0  # building the envs of a worker; generous, it only guards against a hang
_CLOSE = dumps(("close",))

_dumps = dumps


# ------------------------------------------------------------------------------------------------
# The worker process.
# ------------------------------------------------------------------------------------------------


def _worker_main(worker_index: int, conn: Connection, env_fns: list[Callable[[], Any]], env_indices: list[int]) -> None:
    """Build this worker's envs, then serve requests until told to close or the parent goes away."""
    # Ctrl-C reaches the whole process group; the parent handles it and closes us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    envs, error = build_envs(env_fns, env_indices)
    if error is not None:
        conn.send_bytes(_dumps(("init_error", error)))
        conn.close()
        return
    conn.send_bytes(_dumps(("ready", os.getpid())))
    try:
        while True:
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):
                break  # the parent is gone
            if message == _CLOSE:
                break
            conn.send_bytes(serve_request(envs, env_indices, message))
    finally:
        close_envs(envs)
        conn.close()


# ------------------------------------------------------------------------------------------------
# The parent side.
# ------------------------------------------------------------------------------------------------


class _Worker:
    """The parent's handle on one worker process."""

    __slots__ = ("conn", "env_indices", "index", "pid", "process", "ready")

    def __init__(self, index: int, env_indices: list[int]):
        self.index = index
        self.env_indices = env_indices
        self.process: Any = None
        self.conn: Connection | None = None
        self.pid: int | None = None
        self.ready = False  # has it built its envs? (its time limit starts then)


_OPEN_VECTOR_ENVS: weakref.WeakSet[AsyncVectorEnv] = weakref.WeakSet()


@atexit.register
def _close_open_vector_envs() -> None:
    # Workers are not daemonic (so envs may start processes of their own): close them before
    # multiprocessing's own exit handler joins them. atexit runs handlers last-in first-out, and
    # multiprocessing.util, imported above, registered its handler first.
    for vector_env in list(_OPEN_VECTOR_ENVS):
        try:
            vector_env.close()
        except Exception:
            pass


class AsyncVectorEnv(ShardedVectorEnv):
    """Runs its envs in worker processes, so CPU-bound steps run in parallel.

    ``env_fns``: picklable zero-argument callables returning an env (``gem_core.make_vec`` builds
    them; lambdas do not pickle). ``num_workers`` (default ``min(num_envs, usable_cores())``: the cores this process may run on) worker
    processes each host a contiguous shard of envs (see :attr:`shards`) and step it in one message.

    ``step_timeout`` (seconds, default none) bounds every request to a worker (``step``, ``reset``,
    ``call``, ``get_attr``), counted from when the worker has built its envs. A worker that overruns it,
    or dies (killed, segfault, ``os._exit``), is killed and restarted with fresh envs, and the call
    returns without it. In a ``step``, its envs that were stepped are reported as ``truncated=True``,
    reward 0, their last observation, ``info["error"]`` (e.g. ``"worker 1 died (exit code -9)"`` or
    ``"step timed out after 2.0s (worker 1 was killed)"``) and ``info["worker_restarted"] = True``;
    envs of that worker that were in an episode but not stepped in that call are reported the same
    way on their next step. Then each rebuilt env is reset on its next step, as in ``NEXT_STEP`` (the
    action is ignored, ``info["autoreset"] = True``), from a seed derived from its last seed and its
    restart count, so a rerun that crashes at the same point is identical. (Under ``DISABLED``, reset
    it with a mask instead.) In ``reset`` a lost worker is restarted and the reset retried once; in
    ``call``/``get_attr`` it raises :class:`VectorEnvError` after the restart. The other workers'
    results are always delivered intact.

    ``on_error``: an exception raised inside an env is handled by the policy of :class:`VectorEnv`
    (``"raise"``: :class:`VectorEnvError` with the worker's traceback text; ``"truncate"``: reported
    like a crash, with ``worker_restarted=False``, and the worker keeps running).

    ``context``: the multiprocessing start method (a name or a context object). The default is
    ``"spawn"`` on every platform: ``fork`` copies the parent with whatever threads and locks it holds
    (tokenizers, torch, Ray) and can deadlock; ``spawn`` starts a clean interpreter that sees the
    current ``sys.path`` and environment at every (re)start, unlike ``forkserver``, which snapshots
    them when its server first starts. The price is interpreter start-up per worker start (~0.5 s);
    pass ``context="forkserver"`` for faster restarts if that snapshot is fine for you. As with any
    spawn-based multiprocessing, a script that builds one needs the ``if __name__ == "__main__":`` guard.
    """

    params: ClassVar[dict[str, Param]] = {
        **VectorEnv.params,
        "num_workers": Param(int, low=1, none="one per env, at most one per CPU"),
        "step_timeout": Param(float, above=0, none="no time limit"),
    }

    def __init__(
        self,
        env_fns: Iterable[Callable[[], Any]],
        *,
        num_workers: int | None = None,
        step_timeout: float | None = None,
        context: str | Any | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        on_error: str = "raise",
    ):
        env_fns = list(env_fns)
        check_args(AsyncVectorEnv, {"num_workers": num_workers, "step_timeout": step_timeout}, type(self).__name__)
        if num_workers is None:
            num_workers = min(len(env_fns), usable_cores())
        super().__init__(len(env_fns), num_workers, autoreset_mode, on_error)
        self.num_workers = len(self._shard_envs)
        self.step_timeout = step_timeout
        self._ctx = context if isinstance(context, BaseContext) else multiprocessing.get_context(context or "spawn")
        self._env_fns = env_fns
        self._workers = [_Worker(w, indices) for w, indices in enumerate(self._shard_envs)]
        _OPEN_VECTOR_ENVS.add(self)
        try:
            for worker in self._workers:
                self._start(worker)
            self._wait_until_ready()
        except BaseException:
            self.close()
            raise

    # -- introspection -------------------------------------------------------------------------
    @property
    def worker_pids(self) -> list[int | None]:
        """The process id of each worker (changes when a worker is restarted)."""
        return [worker.pid for worker in self._workers]

    def worker_of(self, env_index: int) -> int:
        """The index of the worker hosting env ``env_index``."""
        return self._shard_of[env_index]

    # -- worker lifecycle --------------------------------------------------------------------------
    def _start(self, worker: _Worker) -> None:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_worker_main,
            args=(worker.index, child_conn, [self._env_fns[i] for i in worker.env_indices], worker.env_indices),
            name=f"gem-vector-worker-{worker.index}",
            daemon=False,
        )
        try:
            process.start()
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            parent_conn.close()
            child_conn.close()
            raise TypeError(
                "AsyncVectorEnv needs picklable env_fns (module-level functions, functools.partial, or "
                f"gem_core.make_vec's factories; not lambdas or local functions): {exc}"
            ) from exc
        child_conn.close()  # the child has its own copy; closing ours lets us see EOF when it dies
        worker.process, worker.conn, worker.pid, worker.ready = process, parent_conn, process.pid, False

    def _kill(self, worker: _Worker) -> None:
        process = worker.process
        if process is not None:
            if process.exitcode is None:
                process.kill()
            process.join(5.0)
            if process.exitcode is not None:
                process.close()
        if worker.conn is not None:
            worker.conn.close()
        worker.process = worker.conn = None
        worker.ready = False

    def _restart(self, worker: _Worker) -> None:
        self._kill(worker)
        self._start(worker)

    def _restart_shard(self, shard: int) -> None:
        self._restart(self._workers[shard])

    def _death_reason(self, worker: _Worker) -> str:
        worker.process.join(5.0)  # it is dead or dying: reap it for its exit code
        code = worker.process.exitcode
        return f"worker {worker.index} died (exit code {code if code is not None else 'unknown'})"

    def _receive(self, worker: _Worker) -> tuple | None:
        """The worker's next message, or ``None`` if it has died."""
        try:
            if not worker.conn.poll():
                return None  # only its process sentinel fired: it exited with nothing more to say
            return pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):
            return None

    def _wait_until_ready(self) -> None:
        waiting = {w.index: w for w in self._workers if not w.ready}
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while waiting:
            objects = {}
            for w, worker in waiting.items():
                objects[worker.conn] = w
                objects[worker.process.sentinel] = w
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise VectorEnvError(f"workers {sorted(waiting)} did not build their envs within {_STARTUP_TIMEOUT_S:g}s")
            for w in {objects[obj] for obj in wait_for_any(list(objects), remaining)}:
                worker = waiting.pop(w)
                message = self._receive(worker)
                if message is None:
                    raise VectorEnvError(
                        f"{self._death_reason(worker)} while building its envs (its stderr says why; often an "
                        "env module that a fresh interpreter cannot import, or a script without the "
                        "`if __name__ == '__main__':` guard)"
                    )
                if message[0] == "init_error":
                    raise VectorEnvError(f"worker {w} could not build its envs:\n{message[1]}", remote_traceback=message[1])
                worker.ready = True

    # -- one request to many workers ---------------------------------------------------------------
    def _exchange(self, messages: dict[int, bytes], what: str) -> tuple[dict[int, tuple], dict[int, str]]:
        """Send ``messages[w]`` to worker ``w`` and collect one reply from each.

        Returns ``(replies, failures)``: ``failures[w]`` says why worker ``w`` gave no reply (it died or
        timed out). An interrupt (Ctrl-C) restarts the workers still owing a reply, so the pipes stay in
        step for the next request.
        """
        timeout = self.step_timeout
        replies: dict[int, tuple] = {}
        failures: dict[int, str] = {}
        pending: dict[int, _Worker] = {}
        deadlines: dict[int, float] = {}
        sent_at = time.monotonic()
        for w, payload in messages.items():
            worker = self._workers[w]
            try:
                worker.conn.send_bytes(payload)
            except OSError:  # a broken pipe: it died since the last request
                failures[w] = self._death_reason(worker)
                continue
            pending[w] = worker
            if not worker.ready:  # restarted and still building its envs: only a generous start-up limit
                deadlines[w] = sent_at + _STARTUP_TIMEOUT_S
            elif timeout is not None:
                deadlines[w] = sent_at + timeout
        try:
            self._collect(pending, deadlines, replies, failures, what)
        except BaseException:
            # Interrupted (e.g. Ctrl-C) with replies outstanding: those would be read as the answer to
            # the next request. Replace those workers instead, so the pipes stay in step.
            for w in [*pending, *failures]:
                self._restart(self._workers[w])
                self._envs_rebuilt(self._workers[w].env_indices, f"worker {w} was restarted after an interrupted {what}", in_flight=())
            raise
        return replies, failures

    def _collect(self, pending: dict[int, _Worker], deadlines: dict[int, float], replies: dict, failures: dict, what: str) -> None:
        """Read one reply from each pending worker into ``replies``, or a reason into ``failures``."""
        timeout = self.step_timeout
        while pending:
            wait_s = None
            if deadlines:
                wait_s = max(0.0, min(deadlines.values()) - time.monotonic())
            objects = {}
            for w, worker in pending.items():
                objects[worker.conn] = w
                objects[worker.process.sentinel] = w
            for w in {objects[obj] for obj in wait_for_any(list(objects), wait_s)}:
                worker = pending[w]
                message = self._receive(worker)
                if message is None:
                    failures[w] = self._death_reason(worker)
                elif message[0] == "ready":  # a restarted worker has built its envs: its clock starts now
                    worker.ready = True
                    deadlines.pop(w)
                    if timeout is not None:
                        deadlines[w] = time.monotonic() + timeout
                    continue
                else:
                    replies[w] = message
                pending.pop(w)
                deadlines.pop(w, None)
            now = time.monotonic()
            for w in [w for w, deadline in deadlines.items() if now >= deadline]:
                if pending[w].ready:
                    failures[w] = f"{what} timed out after {timeout}s (worker {w} was killed)"
                else:
                    failures[w] = f"worker {w} did not rebuild its envs within {_STARTUP_TIMEOUT_S:g}s (it was killed)"
                pending.pop(w)
                deadlines.pop(w)

    # -- VectorEnv hooks ---------------------------------------------------------------------------
    def _close(self) -> None:
        _OPEN_VECTOR_ENVS.discard(self)
        workers = [w for w in getattr(self, "_workers", ()) if w.process is not None]
        for worker in workers:
            if worker.process.exitcode is None:
                try:
                    worker.conn.send_bytes(_dumps(("close",)))
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + _CLOSE_GRACE_S
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            self._kill(worker)  # a no-op kill for a worker that already exited; it reaps and closes
