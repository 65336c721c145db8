"""An owner process for the lifetime tests: it starts sandboxes, says so on stdout, then waits to be killed.

    python sandbox_owner.py bwrap   # two workers (one busy in a 60 s call), a third whose bwrap holds its start
    python sandbox_owner.py none    # isolation="none": two workers (one busy); prints their host temp dirs

The pool's marker (a preload name, see sandbox_support.unique_marker) comes in GEM_TEST_MARKER and the
held bwrap's directory in GEM_TEST_HELD_BWRAP, so that neither is in this process's own command line.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings

from gem_core.tools.sandbox import PythonSandbox


def busy(sandbox: PythonSandbox) -> None:
    """One call that runs a minute, in the background; returns once it is running."""
    threading.Thread(target=sandbox.run, args=("import time\ntime.sleep(60)",), daemon=True).start()
    deadline = time.monotonic() + 30
    while not any(w.calls for w in sandbox.pool.live_workers()) and time.monotonic() < deadline:
        time.sleep(0.02)


def main(mode: str) -> None:
    marker = os.environ["GEM_TEST_MARKER"]
    if mode == "bwrap":
        sandbox = PythonSandbox(workers=2, preload=(marker,), timeout=60).start()
        busy(sandbox)
        os.environ["PATH"] = os.environ["GEM_TEST_HELD_BWRAP"] + os.pathsep + os.environ["PATH"]
        sandbox.pool.resize(3)
        threading.Thread(target=sandbox.pool.start, daemon=True).start()  # never greets: its bwrap holds
        print(json.dumps({"ready": True}), flush=True)
    elif mode == "none":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # isolation="none" says it loudly
            sandbox = PythonSandbox(workers=2, preload=(marker,), timeout=60, isolation="none").start()
        busy(sandbox)
        print(json.dumps({"temp_dirs": [w.host_tmp for w in sandbox.pool.live_workers()]}), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1])
