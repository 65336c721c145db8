"""Not collected by the suite (no test_ prefix): test_sandbox_lifetime.py runs it as a pytest run of its
own, to see the end-of-run check (tests/conftest.py) fail a run that leaves a sandbox process behind."""

import os
import subprocess
import sys
import time

from gem_core.tools.sandbox import reaper


def test_leaves_a_tagged_process_behind():
    tag = reaper.owner_tag(os.environ[reaper.LABEL_VAR], 1, "feed")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", f"{tag}/0"])
    deadline = time.monotonic() + 10
    while reaper.find_processes(f"{tag}/") != [proc.pid] and time.monotonic() < deadline:
        time.sleep(0.01)  # its command line shows a moment after its exec returned
    print(f"LEFT {proc.pid}", flush=True)
