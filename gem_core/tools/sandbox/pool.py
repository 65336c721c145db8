"""The pool: a bounded set of warm workers that every caller in the process shares.

* **One per process** (per :class:`~gem_core.tools.sandbox.host.WorkerSpec`): :func:`shared_pool`.
  Every env, tool and grader that runs code borrows from it, so 64 envs or 6,400 start the same few
  workers. Its size: :func:`configure_shared_pool`, else ``GEM_SANDBOX_WORKERS``, else
  :func:`default_size` (fitted to the machine's cores).
* **Lazy**: a worker starts when a caller finds none idle, or finds the idle one still cleaning up
  after its last call, and the pool is below its size.
* **Fair**: callers beyond capacity wait in one FIFO queue; a worker coming free goes to the
  longest-waiting caller. Each waits at most its own ``queue_timeout``; the snippet's own timeout
  starts only once it has a worker.
* **Recovering**: a worker that dies or cannot prove itself clean is thrown away; a new one is
  started when a caller needs it. If none can be started, waiting callers get the error.
* **Closed** when its last user releases it, and at interpreter exit: :meth:`SandboxPool.close` ends
  every worker, idle, busy or still starting, and returns once their processes are gone. If the
  owner process dies instead, bwrap's ``--die-with-parent`` and the process's reaper end them
  (``host.py``, ``reaper.py``). **Fork-safe**: in a forked child every pool forgets the parent's
  workers (closing its copies of their descriptors, never killing them) and starts its own on demand.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from gem_core.errors import GemError
from gem_core.tools.sandbox.host import KILL_WAIT_S, RawReply, WorkerLost, WorkerProcess, WorkerSpec
from gem_core.utils.cores import usable_cores

logger = logging.getLogger(__name__)

WORKERS_VAR = "GEM_SANDBOX_WORKERS"
MAX_DEFAULT_WORKERS = 32
WORKERS_PER_CORE = 2  # one runs a snippet while the other cleans up after its last one
READY_TIMEOUT_S = 30.0  # how long a worker may take to clean up after a call


class SandboxError(GemError, RuntimeError):
    """A sandbox call could not be made: the pool is closed, or no worker can be started."""


class QueueTimeout(SandboxError):
    """No worker came free within the caller's ``queue_timeout``."""


def default_size() -> int:
    """``GEM_SANDBOX_WORKERS`` if set, else two workers per core (at most MAX_DEFAULT_WORKERS)."""
    value = os.environ.get(WORKERS_VAR, "").strip()
    if value:
        try:
            size = int(value)
        except ValueError:
            raise ValueError(f"{WORKERS_VAR} must be a positive integer, got {value!r}") from None
        if size < 1:
            raise ValueError(f"{WORKERS_VAR} must be a positive integer, got {value!r}")
        return size
    return max(2, min(MAX_DEFAULT_WORKERS, WORKERS_PER_CORE * usable_cores()))


class _Waiter:
    """A caller in the queue; the pool hands it a worker (or an error) and wakes it."""

    __slots__ = ("event", "worker", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.worker: WorkerProcess | None = None
        self.error: BaseException | None = None


class SandboxPool:
    """At most ``size`` warm workers of one spec, lent to one caller at a time. Thread-safe."""

    def __init__(self, spec: WorkerSpec, size: int | None = None):
        size = default_size() if size is None else size
        if size < 1:
            raise ValueError(f"a sandbox pool needs at least one worker, got {size}")
        self.spec = spec
        self.size = size
        self.replaced = 0  # workers thrown away (died, unclean, late)
        self.started = 0  # workers started, replacements included
        self._reset()
        _live_pools.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[WorkerProcess] = []  # in the order they came back
        self._busy: set[WorkerProcess] = set()
        self._starting: set[WorkerProcess] = set()  # processes started, greeting not yet in
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._booting = 0
        self._users = 0
        self._closed = False
        self._last_boot_error: BaseException | None = None
        self._pid = os.getpid()

    # -- users
    def acquire(self) -> None:
        """One more user (a PythonSandbox handle); the pool reopens if its last user had closed it."""
        with self._lock:
            self._users += 1
            self._closed = False

    def release(self) -> None:
        """One user fewer; the last one closes the pool (it reopens on the next acquire)."""
        with self._lock:
            self._users = max(0, self._users - 1)
            last = self._users == 0
        if last:
            self.close()

    @property
    def workers(self) -> int:
        """Workers alive now (idle, busy), not counting those starting."""
        with self._lock:
            return len(self._idle) + len(self._busy)

    def live_workers(self) -> list[WorkerProcess]:
        """The workers alive now, idle and busy (for diagnostics and tests)."""
        with self._lock:
            return [*self._idle, *self._busy]

    def resize(self, size: int) -> None:
        """Change the bound; extra workers retire as they come free."""
        if size < 1:
            raise ValueError(f"a sandbox pool needs at least one worker, got {size}")
        with self._lock:
            self.size = size
            extra = self._idle[: max(0, len(self._idle) + len(self._busy) - size)]
            del self._idle[: len(extra)]
        for worker in extra:
            worker.kill()

    # -- lending
    @contextlib.contextmanager
    def worker(self, queue_timeout: float | None = None) -> Iterator[WorkerProcess]:
        """A worker with a clean child waiting, for one call; waits in FIFO order at most
        ``queue_timeout`` seconds (None: as long as it takes). A worker that raises WorkerLost
        inside the block is replaced; any other exception also throws it away (its state is unknown)."""
        worker = self._checkout(queue_timeout)
        try:
            yield worker
        except BaseException:
            self._discard(worker)
            raise
        self._checkin(worker)

    def call(self, request: bytes, timeout: float, cap: int, queue_timeout: float | None) -> tuple[RawReply, str | None]:
        """One encoded request on a worker of this pool (waiting at most ``queue_timeout`` for one): the
        reply, and an error message when the sandbox failed (worker lost, queue timeout)."""
        queued = time.monotonic()
        try:
            with self.worker(queue_timeout) as worker:
                queued_s = time.monotonic() - queued
                try:
                    reply = worker.call(request, timeout, cap)
                except WorkerLost as lost:
                    message = f"the sandbox worker was lost ({lost}); the call did not complete"
                    reply = RawReply(duration=time.monotonic() - queued - queued_s)
                    reply.info.update(queued_s=queued_s, worker_replaced=True)
                    raise _Lost(reply, message) from None
        except _Lost as lost:
            return lost.reply, lost.message
        except QueueTimeout as exc:
            return RawReply(info={"queued_s": time.monotonic() - queued, "queue_timeout": True}), str(exc)
        reply.info["queued_s"] = queued_s
        return reply, None

    def start(self) -> None:
        """Start every worker now, in parallel, instead of on demand."""
        self._check_fork()
        with self._lock:
            if self._closed:
                raise SandboxError("this sandbox pool is closed")
            missing = self.size - len(self._idle) - len(self._busy) - self._booting
            self._booting += max(0, missing)
        threads = [threading.Thread(target=self._boot, daemon=True) for _ in range(max(0, missing))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with self._lock:
            failed = not self._idle and not self._busy and self._last_boot_error is not None
            error = self._last_boot_error
        if failed and error is not None:
            raise error

    def _checkout(self, queue_timeout: float | None) -> WorkerProcess:
        self._check_fork()
        deadline = None if queue_timeout is None else time.monotonic() + queue_timeout
        while True:
            waiter = None
            with self._lock:
                if self._closed:
                    raise SandboxError("the sandbox is closed")
                if self._idle and not self._waiters:
                    worker = self._idle.pop(0)  # the longest idle: the likeliest to have cleaned up
                    self._busy.add(worker)
                else:
                    waiter = _Waiter()
                    self._waiters.append(waiter)
                    self._grow_locked()
            if waiter is not None:
                worker = self._wait(waiter, deadline, queue_timeout)
            try:
                if waiter is None and worker.cleaning_up():
                    # Calls come faster than this worker cleans up after each: one more worker (below
                    # the bound), so that a lone caller in a loop need not wait for each clean-up.
                    with self._lock:
                        self._grow_locked(for_cleanup=True)
                ready = worker.wait_ready(READY_TIMEOUT_S)
            except BaseException:  # e.g. KeyboardInterrupt: the worker must not stay lent out
                self._discard(worker)
                raise
            if ready:
                return worker
            self._discard(worker)  # and queue again, at the back (its turn was used)

    def _wait(self, waiter: _Waiter, deadline: float | None, queue_timeout: float | None) -> WorkerProcess:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        waiter.event.wait(remaining)
        with self._lock:
            if waiter.worker is not None:
                return waiter.worker  # handed over, even if just as the wait ran out
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
        if waiter.error is not None:
            raise waiter.error
        raise QueueTimeout(f"no sandbox worker came free within {queue_timeout:g} s ({self.size} workers, all busy)")

    def _checkin(self, worker: WorkerProcess) -> None:
        with self._lock:
            self._busy.discard(worker)
            if self._closed or len(self._idle) + len(self._busy) >= self.size:
                retire = True
            else:
                retire = False
                self._give_locked(worker)
        if retire:
            worker.kill()

    def _give_locked(self, worker: WorkerProcess) -> None:
        """Hand ``worker`` to the longest-waiting caller, or make it idle."""
        if self._waiters:
            waiter = self._waiters.popleft()
            waiter.worker = worker
            self._busy.add(worker)
            waiter.event.set()
        else:
            self._idle.append(worker)

    def _discard(self, worker: WorkerProcess) -> None:
        """Throw ``worker`` away; start a replacement if callers are waiting."""
        with self._lock:
            self._busy.discard(worker)
            self.replaced += 1
            self._grow_locked()
        worker.kill()

    def _grow_locked(self, for_cleanup: bool = False) -> None:
        """Start a worker in the background, below the bound, if callers wait for more than are
        starting (or, ``for_cleanup``, a caller waits for a worker's clean-up and none is starting)."""
        alive = len(self._idle) + len(self._busy) + self._booting
        wanted = self._booting == 0 if for_cleanup else len(self._waiters) > self._booting
        if not self._closed and alive < self.size and wanted:
            self._booting += 1
            threading.Thread(target=self._boot, name="gem-sandbox-boot", daemon=True).start()

    def _track_start(self, worker: WorkerProcess) -> None:
        """A worker's processes exist: close() must find it (and a closed pool does not start it)."""
        with self._lock:
            if self._closed or self._pid != os.getpid():
                raise SandboxError("the sandbox is closed")
            self._starting.add(worker)

    def _boot(self) -> None:
        spawned: list[WorkerProcess] = []

        def track(worker: WorkerProcess) -> None:
            spawned.append(worker)
            self._track_start(worker)

        try:
            worker = WorkerProcess(self.spec, on_spawn=track)
        except BaseException as exc:  # noqa: BLE001 - waiting callers get it; a pool that cannot refill must not hang them
            with self._lock:
                self._starting.difference_update(spawned)
                if self._closed:  # close() ended it while it started (or it never started): not a failure
                    self._booting -= 1
                    return
            logger.error("could not start a sandbox worker: %s", exc)
            with self._lock:
                self._booting -= 1
                self._last_boot_error = exc
                if not self._idle and not self._busy and self._booting == 0:
                    while self._waiters:
                        waiter = self._waiters.popleft()
                        waiter.error = SandboxError(f"the sandbox has no worker left and cannot start one: {exc}")
                        waiter.event.set()
            return
        with self._lock:
            self._starting.discard(worker)
            self._booting -= 1
            self.started += 1
            self._last_boot_error = None
            keep = not self._closed and self._pid == os.getpid()
            if keep:
                self._give_locked(worker)
        if not keep:
            worker.kill()

    # -- ending
    def close(self) -> None:
        """Kill every worker, idle, busy (its call ends now; its caller closes it) or still starting, and
        return once their processes and temporary directories are gone; callers still queued get a SandboxError.
        Safe to call twice."""
        with self._lock:
            self._closed = True
            idle, others = self._idle, [*self._busy, *self._starting]
            self._idle = []
            waiters = list(self._waiters)
            self._waiters.clear()
        for waiter in waiters:
            waiter.error = SandboxError("the sandbox is closed")
            waiter.event.set()
        for worker in idle:
            worker.stop()  # all at once; each kill() below then mostly waits
        for worker in others:
            worker.terminate()  # their threads are polling their descriptors and close them
        for worker in idle:
            worker.kill()
        deadline = time.monotonic() + KILL_WAIT_S
        for worker in others:
            if worker.wait_gone(max(0.0, deadline - time.monotonic())):
                # its caller also closes it, but maybe not before this process exits: nothing of it is left behind
                worker.remove_host_tmp()
            else:
                logger.warning("sandbox worker pid %d did not exit after SIGKILL", worker.proc.pid)

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self._after_fork_in_child()

    def _after_fork_in_child(self) -> None:
        """The workers are the parent's: close our copies of their descriptors, keep the users."""
        if self._pid == os.getpid():
            return
        users = self._users
        for worker in [*self._idle, *self._busy, *self._starting]:
            worker.forget()
        self._reset()
        self._users = users


class _Lost(Exception):
    """Carries a lost call's reply out of the pool's block (which then replaces the worker)."""

    def __init__(self, reply: RawReply, message: str):
        super().__init__(message)
        self.reply, self.message = reply, message


_live_pools: weakref.WeakSet[SandboxPool] = weakref.WeakSet()
_shared: dict[WorkerSpec, Any] = {}
_shared_lock = threading.Lock()
_configured_size: list[int] = []
_remote_pools: list[Callable[[WorkerSpec], Any]] = []  # set by route_shared_pools


def shared_pool(spec: WorkerSpec) -> SandboxPool:
    """This process's pool for ``spec`` (made on first use; sized as the module docstring says).

    When this process's shared pools are routed elsewhere (:func:`route_shared_pools`: a Ray sandbox
    service's ``install``), it is a pool with the same interface whose calls run there."""
    with _shared_lock:
        pool = _shared.get(spec)
        if pool is None:
            if _remote_pools:
                pool = _shared[spec] = _remote_pools[0](spec)
            else:
                pool = _shared[spec] = SandboxPool(spec, _configured_size[0] if _configured_size else None)
        return pool


def route_shared_pools(factory: Callable[[WorkerSpec], Any] | None) -> None:
    """Make this process's shared pools with ``factory(spec)`` from now on (``None``: local pools again).
    Pools made earlier are dropped from the table; the handles that hold them keep them."""
    with _shared_lock:
        _remote_pools[:] = [] if factory is None else [factory]
        _shared.clear()


def configure_shared_pool(workers: int) -> None:
    """Size this process's shared pools (those made later, and those already made)."""
    if workers < 1:
        raise ValueError(f"a sandbox pool needs at least one worker, got {workers}")
    with _shared_lock:
        _configured_size[:] = [workers]
        pools = list(_shared.values())
    for pool in pools:
        pool.resize(workers)


@atexit.register
def close_all_pools() -> None:
    """Kill every worker of this process (at interpreter exit)."""
    for pool in list(_live_pools):
        if pool._pid == os.getpid():
            pool.close()


def _after_fork_in_child() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()
    for pool in list(_live_pools):
        pool._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
