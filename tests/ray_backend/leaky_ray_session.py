"""Not collected by the suite (no test_ prefix): test_ray_sandbox_lifetime.py runs it as a pytest run of its
own, to see the ray session's end-of-run check (tests/ray_backend/conftest.py) fail a run that leaves a
process of its own behind (here one the test started and left running, deaf to SIGTERM)."""

import os
import subprocess
import sys
import time


def test_leaves_a_process_of_the_run_behind():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"], start_new_session=True
    )
    wanted = f"GEM_SANDBOX_LABEL={os.environ['GEM_SANDBOX_LABEL']}".encode()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # its environment shows a moment after its exec returned
        with open(f"/proc/{proc.pid}/environ", "rb") as handle:
            if wanted in handle.read():
                break
        time.sleep(0.01)
    print(f"LEFT {proc.pid}", flush=True)
