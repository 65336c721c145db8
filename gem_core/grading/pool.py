"""A bounded pool of math-grading worker processes, shared by every env of a process.

Grading an answer with math-verify (sympy underneath) can take seconds or forever on a pathological
answer (``\\boxed{9^{9^{9^{9}}}}``). math-verify's own timeouts use SIGALRM, which works only in the
main thread and interferes with the caller's signals, so gem_core never uses them: each answer is
sent to a worker process with its own time limit, and a worker that overruns it is killed and
replaced (the verdict is "not equivalent", and says it timed out). One pool per process
(:func:`shared_math_pool`), at most ``size`` workers, started on demand: a thousand envs in a
process share it; there is no pool per env.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gem_core.errors import GemError
from gem_core.utils.cores import usable_cores

WORKER_SCRIPT = str(Path(__file__).with_name("_math_worker.py"))
#: Seconds a new worker may take to import math-verify and say it is ready.
START_TIMEOUT_S = 60.0
#: The default time limit of one answer (seconds of the worker's wall clock).
DEFAULT_TIME_LIMIT_S = 2.0


class GradingUnavailable(GemError, RuntimeError):
    """The grading workers cannot start (math-verify is not installed, or the worker dies at start)."""


@dataclass(frozen=True)
class Verdict:
    """The outcome of one grading call: ``correct``, and why not when it could not be decided."""

    correct: bool
    timed_out: bool = False
    error: str | None = None


class _Worker:
    def __init__(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.stderr = tempfile.TemporaryFile()  # a file, not a pipe: a chatty worker never blocks on it
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-u", WORKER_SCRIPT],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env, bufsize=0,
        )  # fmt: skip
        self.ready = False
        self.buffer = b""

    def readline(self, deadline: float) -> bytes | None:
        """One line from the worker, or None when ``deadline`` passes or the worker is gone."""
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def wait_ready(self) -> None:
        if self.ready:
            return
        line = self.readline(time.monotonic() + START_TIMEOUT_S)
        if line != b"ready":
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.stderr.seek(0)
            err = self.stderr.read()[-2000:]
            self.kill()
            detail = err.decode("utf-8", "replace").strip().splitlines()
            hint = detail[-1] if detail else "no output"
            if "math_verify" in hint or "latex2sympy" in hint:
                hint += " -- install the math extra: pip install -e '.[math]'"
            raise GradingUnavailable(f"the math grading worker did not start: {hint}")
        self.ready = True

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout, self.stderr):
            try:
                stream.close()  # type: ignore[union-attr]
            except Exception:
                pass


class MathGradingPool:
    """At most ``size`` math-verify worker processes; thread-safe. ``grade`` blocks until a worker is free."""

    def __init__(self, size: int | None = None):
        self.size = size if size is not None else min(4, usable_cores())
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._slots = threading.Semaphore(self.size)
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self._pid = os.getpid()
        self.replaced = 0
        self.timeouts = 0

    def _checkout(self) -> _Worker:
        self._slots.acquire()
        try:
            worker = self._idle.get_nowait()
        except queue.Empty:
            worker = _Worker()
            with self._lock:
                self._all.add(worker)
        try:
            worker.wait_ready()
        except BaseException:
            with self._lock:
                self._all.discard(worker)
            self._slots.release()
            raise
        return worker

    def _checkin(self, worker: _Worker | None) -> None:
        if worker is not None:
            self._idle.put(worker)
        self._slots.release()

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)
        self.replaced += 1

    def grade(self, golds: list[str], answer: str, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> Verdict:
        """Whether ``answer`` is equivalent to one of ``golds`` (math-verify), within ``time_limit_s``."""
        if os.getpid() != self._pid:  # forked: the parent's workers are not ours
            self.__init__(self.size)  # type: ignore[misc]
        request = json.dumps({"g": list(golds), "a": answer}).encode() + b"\n"
        worker = self._checkout()
        keep: _Worker | None = worker
        try:
            try:
                worker.proc.stdin.write(request)  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                self._discard(worker)
                keep = None
                return Verdict(False, error="the grading worker died")
            line = worker.readline(time.monotonic() + time_limit_s)
            if line is None:
                self._discard(worker)
                keep = None
                if worker.proc.returncode not in (None, -9):
                    return Verdict(False, error=f"the grading worker died (exit {worker.proc.returncode})")
                self.timeouts += 1
                return Verdict(False, timed_out=True)
            if line.startswith(b"e "):
                return Verdict(False, error=line[2:].decode("utf-8", "replace"))
            return Verdict(line == b"1")
        finally:
            self._checkin(keep)

    def close(self) -> None:
        """Kill every worker (a later ``grade`` starts new ones)."""
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()
        while True:
            try:
                self._idle.get_nowait()
            except queue.Empty:
                break


_shared: MathGradingPool | None = None
_shared_lock = threading.Lock()


def shared_math_pool() -> MathGradingPool:
    """This process's math grading pool (made on first use; ``GEM_GRADING_WORKERS`` sets its size)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared._pid != os.getpid():
            size = os.environ.get("GEM_GRADING_WORKERS")
            _shared = MathGradingPool(int(size) if size else None)
        return _shared


@atexit.register
def _close_shared() -> None:
    if _shared is not None and _shared._pid == os.getpid():
        _shared.close()
