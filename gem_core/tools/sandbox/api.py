"""What callers use: :class:`PythonSandbox`, a handle with per-call limits on a pool of workers.

``PythonSandbox()`` borrows this process's shared pool (see ``pool.py``): making one is cheap and
starts nothing, so every env can have its own. ``PythonSandbox(workers=n)`` gets a pool of its own
with ``n`` workers (tests, benchmarks). Every limit is per call: two handles with different limits
share the same workers.

* :meth:`PythonSandbox.run` runs a snippet (optionally with stdin) and returns an
  :class:`ExecutionResult`;
* :meth:`PythonSandbox.run_tests` runs a program against several test cases in one sandbox call,
  each in its own process with its own stdin and time limit, and returns a :class:`TestRun` that
  says which case failed and how (expected outputs never enter the sandbox);
* :meth:`PythonSandbox.arun` and :meth:`PythonSandbox.arun_tests` are the same for asyncio.
"""

from __future__ import annotations

import asyncio
import json
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gem_core.tools.sandbox import protocol
from gem_core.tools.sandbox.host import RawReply, WorkerSpec
from gem_core.tools.sandbox.policy import MIB, require_bwrap
from gem_core.tools.sandbox.pool import SandboxError, SandboxPool, shared_pool


Isolation = Literal["bwrap", "none"]

DEFAULT_PRELOAD = (
    "math", "cmath", "re", "json", "string", "random", "itertools", "functools", "collections",
    "fractions", "decimal", "statistics", "heapq", "bisect", "datetime",
)  # fmt: skip
# Not preloaded by default: a process with numpy imported makes every call's fork, page faults and
# exit dearer; pass preload=(*DEFAULT_PRELOAD, "numpy") where most snippets import it.
TRUNCATION_MARKER = "\n[... output truncated: more than {limit} bytes ...]"
MAX_CPU_SECONDS = 2**31 - 1  # the request carries CPU seconds in 4 bytes
CASE_OVERHEAD_S = 0.5  # per test case, on top of its time limit: its fork, exit and report
CALL_OVERHEAD_S = 1.0  # per tests call, on top of its cases: the harness starting and reporting


@dataclass
class ExecutionResult:
    """The outcome of running one snippet."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None  # None when the snippet was killed by a signal (or never ran)
    signal: int | None = None
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0  # seconds from handing the code over to the end (time queued not included)
    error: str | None = None  # a failure of the sandbox itself (worker died, queue timeout), not of the snippet
    info: dict[str, Any] = field(default_factory=dict)  # queued_s: seconds spent waiting for a worker

    @property
    def ok(self) -> bool:
        """True when the snippet ran to completion with exit code 0 and nothing was cut."""
        return self.exit_code == 0 and not self.timed_out and not self.truncated and self.error is None

    def output(self, max_bytes: int | None = None) -> str:
        """stdout then stderr, as the model sees them, with the truncation marker when cut."""
        text = self.stdout + self.stderr
        if self.truncated:
            text += TRUNCATION_MARKER.format(limit=max_bytes if max_bytes is not None else "the")
        return text


@dataclass
class CaseResult:
    """One test case of :meth:`PythonSandbox.run_tests`."""

    index: int
    passed: bool
    stdout: str = ""
    stderr: str = ""
    expected: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0
    ran: bool = True  # False: the call ended before this case ran (see TestRun.error)

    @property
    def verdict(self) -> str:
        """``passed``, ``wrong answer``, ``time limit``, ``runtime error``, ``output limit``,
        ``killed by signal N`` or ``not run``."""
        if not self.ran:
            return "not run"
        if self.passed:
            return "passed"
        if self.timed_out:
            return "time limit"
        if self.truncated:
            return "output limit"
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        if self.exit_code != 0:
            return "runtime error"
        return "wrong answer"


@dataclass
class TestRun:
    """All cases of one :meth:`PythonSandbox.run_tests` call."""

    __test__ = False  # not a pytest class

    cases: list[CaseResult]
    error: str | None = None  # the sandbox failed (worker lost, queue timeout): cases may not have run
    duration: float = 0.0
    # True when ``error`` is the pool's own failure (infrastructure); False when the harness stopped early,
    # which the code under test can cause itself
    sandbox_failed: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.error is None and all(case.passed for case in self.cases)

    @property
    def first_failure(self) -> int | None:
        """Index of the first case that did not pass, or None."""
        return next((case.index for case in self.cases if not case.passed), None)

    @property
    def pass_rate(self) -> float:
        return sum(case.passed for case in self.cases) / len(self.cases) if self.cases else 0.0


def outputs_match(actual: str, expected: str) -> bool:
    """The usual judge rule: equal after trailing whitespace is removed from each line and trailing
    blank lines are dropped."""
    return _normalise(actual) == _normalise(expected)


def _normalise(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


class PythonSandbox:
    """Runs untrusted Python in warm bubblewrap workers; thread-safe, usable from asyncio.

    Limits (defaults for every call; ``run``/``run_tests`` take some per call): ``timeout`` (wall
    clock seconds, positive and finite, counted from when a worker takes the call, never while it
    waits in the queue), ``cpu_seconds`` (whole seconds, rounded up; default the timeout rounded up
    plus one), ``memory_mb`` (address space of each process), ``max_processes`` (the snippet and
    all it forks, threads included), ``max_file_mb``, ``max_open_files``, ``max_output_bytes``
    (stdout and stderr together; the rest is cut with a marker). ``queue_timeout``: how long a call
    may wait for a free worker (None: as long as it takes; the result says when it ran out).

    Workers: ``workers=None`` (the default) shares this process's pool with every other handle made
    with the same ``isolation``, ``preload`` and ``tmpfs_mb``; an int gives this handle a pool of its
    own of that size. ``preload`` names the modules each worker imports once, ahead of every call.
    ``isolation="none"`` runs the workers without bubblewrap (rlimits and timeout only), and warns.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        isolation: Isolation = "bwrap",
        timeout: float = 5.0,
        memory_mb: int | None = 1024,
        cpu_seconds: float | None = None,
        max_processes: int = 8,
        max_file_mb: int = 16,
        max_open_files: int = 256,
        max_output_bytes: int = 16384,
        tmpfs_mb: int = 64,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        start_timeout: float = 60.0,
        queue_timeout: float | None = None,
    ):
        if isolation not in ("bwrap", "none"):
            raise ValueError(f"isolation must be 'bwrap' or 'none', got {isolation!r}")
        if isinstance(preload, str):
            raise TypeError(f"preload must be a sequence of module names, got the string {preload!r}")
        if isolation == "bwrap":
            require_bwrap()
        else:
            message = (
                "PythonSandbox(isolation='none'): model-written code will run WITHOUT isolation -- it can "
                "read and write your files, reach the network and read your environment. Only rlimits and "
                "the timeout apply. Install bubblewrap and use isolation='bwrap' for anything untrusted."
            )
            # One channel only: the warnings module prints it once per calling line (logging's last-resort
            # handler would print it a second time).
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        _check_timeout(timeout)
        if cpu_seconds is not None and cpu_seconds <= 0:
            raise ValueError(f"cpu_seconds must be positive, got {cpu_seconds}")
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if queue_timeout is not None and not queue_timeout >= 0:
            raise ValueError(f"queue_timeout must be None or >= 0 seconds, got {queue_timeout}")
        self.isolation: Isolation = isolation
        self.timeout = float(timeout)
        self.memory_mb = memory_mb
        self.cpu_seconds = math.ceil(cpu_seconds) if cpu_seconds is not None else None  # RLIMIT_CPU counts whole seconds
        self.max_processes = max_processes
        self.max_file_mb = max_file_mb
        self.max_open_files = max_open_files
        self.max_output_bytes = max_output_bytes
        self.queue_timeout = queue_timeout
        spec = WorkerSpec(isolation, tuple(preload), tmpfs_mb, start_timeout)
        self.shared = workers is None
        # The shared pool may be a remote one (gem_core.ray.services.SandboxService): same interface.
        self.pool: SandboxPool = shared_pool(spec) if self.shared else SandboxPool(spec, workers)
        self.pool.acquire()
        self._closed = False

    # -- lifecycle
    @property
    def workers(self) -> int:
        """The bound on the pool's workers."""
        return self.pool.size

    @property
    def replaced(self) -> int:
        """Workers the pool threw away and replaced (died, unclean, or late)."""
        return self.pool.replaced

    def start(self) -> PythonSandbox:
        """Start all the pool's workers now (in parallel) instead of on demand."""
        self._check_open()
        self.pool.start()
        return self

    def close(self) -> None:
        """Stop using the pool; the last handle of a pool closes it (kills its workers). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self.shared:
            self.pool.release()
        else:
            self.pool.close()

    def __enter__(self) -> PythonSandbox:  # noqa: PYI034 - start() returns self
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("this PythonSandbox is closed")

    # -- running
    def run(self, code: str, timeout: float | None = None, *, stdin: str | None = None, queue_timeout: float | None = None) -> ExecutionResult:
        """Run ``code`` as a fresh ``python`` would (``stdin`` on its standard input); returns within
        ``timeout`` (plus a little) once a worker has taken it."""
        self._check_open()
        timeout = self.timeout if timeout is None else _check_timeout(float(timeout))
        request = protocol.encode_request(
            protocol.MODE_RUN, code, (stdin or "").encode("utf-8", "surrogatepass"), self._cpu(timeout),
            *self._fixed_limits(), self.max_output_bytes,
        )  # fmt: skip
        reply, error = self._call(request, timeout, self.max_output_bytes, queue_timeout)
        return ExecutionResult(
            stdout=reply.stdout.decode("utf-8", "replace"),
            stderr=reply.stderr.decode("utf-8", "replace") + (error + "\n" if error else ""),
            exit_code=reply.exit_code,
            signal=reply.signal,
            timed_out=reply.timed_out,
            truncated=reply.truncated,
            duration=reply.duration,
            error=error,
            info=reply.info,
        )

    def run_tests(
        self,
        code: str,
        cases: Sequence[tuple[str, str | None]],
        *,
        time_limit_s: float = 2.0,
        memory_mb: int | None = None,
        compare: Callable[[str, str], bool] = outputs_match,
        queue_timeout: float | None = None,
    ) -> TestRun:
        """Run the program ``code`` once per ``(stdin, expected_stdout)`` case, in one sandbox call.

        Each case runs in its own process with ``time_limit_s`` (wall clock, and CPU rounded up
        plus one) and ``memory_mb`` (default: the sandbox's); it passes when it exits with 0 within
        its limit and ``compare(stdout, expected)`` holds (``expected=None``: exit 0 is enough).
        """
        self._check_open()
        _check_timeout(time_limit_s)
        if not cases:
            raise ValueError("run_tests needs at least one case")
        stdins = [stdin for stdin, _ in cases]
        memory = self.memory_mb if memory_mb is None else memory_mb
        total_s = len(cases) * (time_limit_s + CASE_OVERHEAD_S) + CALL_OVERHEAD_S
        fixed = self._fixed_limits(memory)
        request = protocol.encode_request(
            protocol.MODE_TESTS, code, json.dumps(stdins).encode(), self._cpu(total_s), *fixed,
            self.max_output_bytes, math.ceil(time_limit_s * 1000),
        )  # fmt: skip
        cap = len(cases) * (protocol.CASE_REPORT.size + self.max_output_bytes)
        reply, error = self._call(request, total_s, cap, queue_timeout)
        sandbox_failed = error is not None
        reports = protocol.decode_cases(reply.stdout)
        if error is None and len(reports) < len(cases):
            why = "timed out" if reply.timed_out else f"exit code {reply.exit_code}, signal {reply.signal}"
            error = f"the test harness stopped after {len(reports)} of {len(cases)} cases ({why})"
            detail = reply.stderr.decode("utf-8", "replace").strip()
            if detail:
                error += f": {detail[-500:]}"
        results = []
        for index, (_, expected) in enumerate(cases):
            if index >= len(reports):
                results.append(CaseResult(index, passed=False, expected=expected, ran=False))
                continue
            r = reports[index]
            stdout = r["stdout"].decode("utf-8", "replace")
            clean = r["exit_code"] == 0 and not r["timed_out"] and not r["truncated"]
            passed = clean and (expected is None or compare(stdout, expected))
            results.append(
                CaseResult(
                    index,
                    passed,
                    stdout,
                    r["stderr"].decode("utf-8", "replace"),
                    expected,
                    r["exit_code"],
                    r["signal"],
                    r["timed_out"],
                    r["truncated"],
                    r["duration"],
                )  # fmt: skip
            )
        return TestRun(results, error=error, duration=reply.duration, info=reply.info, sandbox_failed=sandbox_failed)

    async def arun(self, code: str, timeout: float | None = None, **kwargs: Any) -> ExecutionResult:
        """:meth:`run` for asyncio: the call waits in a thread, the event loop does not."""
        return await asyncio.to_thread(self.run, code, timeout, **kwargs)

    async def arun_tests(self, code: str, cases: Sequence[tuple[str, str | None]], **kwargs: Any) -> TestRun:
        """:meth:`run_tests` for asyncio."""
        return await asyncio.to_thread(self.run_tests, code, cases, **kwargs)

    def _cpu(self, timeout: float) -> int:
        return min(self.cpu_seconds or math.ceil(timeout) + 1, MAX_CPU_SECONDS)

    def _fixed_limits(self, memory_mb: int | None = None) -> tuple[int, int, int, int]:
        memory = self.memory_mb if memory_mb is None else memory_mb
        return (memory or 0) * MIB, self.max_file_mb * MIB, self.max_processes, self.max_open_files

    def _call(self, request: bytes, timeout: float, cap: int, queue_timeout: float | None) -> tuple[RawReply, str | None]:
        """One request on a pooled worker: the reply, and an error message when the sandbox failed."""
        return self.pool.call(request, timeout, cap, self.queue_timeout if queue_timeout is None else queue_timeout)

    def __repr__(self) -> str:
        kind = "shared" if self.shared else "own"
        return f"PythonSandbox(workers={self.workers} ({kind}), isolation={self.isolation!r}, timeout={self.timeout})"


def _check_timeout(timeout: float) -> float:
    if not 0 < timeout < math.inf:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    return timeout
