"""The Python sandbox: untrusted code in warm bubblewrap workers, one bounded pool per process.

Read it in this order, one job per module:

* ``api.py`` -- :class:`PythonSandbox`, what callers use: ``run`` (a snippet, optional stdin),
  ``run_tests`` (a program against several stdin/expected-stdout cases in one call), their
  asyncio twins, and the result types;
* ``pool.py`` -- the process's shared pool: bounded, lazy, FIFO queueing with per-caller queue
  timeouts, recovery of dead workers, closing at exit and on the last user's close, fork safety;
* ``host.py`` -- the host's end of one worker: start it, run one call on its waiting child;
* ``protocol.py`` -- the messages and frames between host, worker and child;
* ``worker.py`` -- the program inside the sandbox: fork a child per call, run, reap, clean;
* ``policy.py`` -- the isolation: the bubblewrap command line, namespaces, rlimits, what is visible;
* ``reaper.py`` -- each owner process's reaper: when the owner dies (SIGKILL, ``ray.kill``), it ends
  whatever of its sandboxes bwrap's ``--die-with-parent`` missed, and removes its temp dirs.

``isolation="none"`` runs the same workers without bubblewrap, for machines that cannot have it. It
keeps the rlimits and the timeout but gives **no** file, network or environment isolation, and it
says so loudly every time a sandbox is made that way.
"""

from gem_core.tools.sandbox.api import (
    DEFAULT_PRELOAD,
    TRUNCATION_MARKER,
    CaseResult,
    ExecutionResult,
    PythonSandbox,
    TestRun,
    outputs_match,
)
from gem_core.tools.sandbox.policy import BWRAP_PACKAGE, SandboxUnavailable, bwrap_path, require_bwrap
from gem_core.tools.sandbox.pool import (
    WORKERS_VAR,
    QueueTimeout,
    SandboxError,
    SandboxPool,
    close_all_pools,
    configure_shared_pool,
    default_size,
    shared_pool,
)

__all__ = [
    "BWRAP_PACKAGE",
    "DEFAULT_PRELOAD",
    "TRUNCATION_MARKER",
    "WORKERS_VAR",
    "CaseResult",
    "ExecutionResult",
    "PythonSandbox",
    "QueueTimeout",
    "SandboxError",
    "SandboxPool",
    "SandboxUnavailable",
    "TestRun",
    "bwrap_path",
    "close_all_pools",
    "configure_shared_pool",
    "default_size",
    "outputs_match",
    "require_bwrap",
    "shared_pool",
]
