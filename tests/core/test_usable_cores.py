"""Worker pools sized by default count the cores this process may run on (its CPU affinity: a container's
cpuset, ``taskset``, a batch job's allocation), not the machine's: a node shared out by cores would otherwise get
a worker process for every core of the node from each job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs the affinity call and two cores to tell one core of the machine's from all",
)

# in a process of its own (this one's affinity stays as it was), pinned to one core or left on all
PROBE = """
import json, os, sys
if sys.argv[1] == "one":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
import gem_core
from gem_core.grading.pool import MathGradingPool
from gem_core.tools.sandbox.pool import default_size
from gem_core.utils.cores import usable_cores

vec = gem_core.make_vec("game:GuessTheNumber-v0-easy", 3, vectorization_mode="async")
try:
    workers = vec.num_workers
finally:
    vec.close()
print(json.dumps({"cores": usable_cores(), "machine": os.cpu_count(), "async": workers,
                  "grading": MathGradingPool().size, "sandbox": default_size()}))
"""


def _probe(affinity: str) -> dict[str, int]:
    env = {key: value for key, value in os.environ.items() if key != "GEM_SANDBOX_WORKERS"}
    done = subprocess.run([sys.executable, "-c", PROBE, affinity], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_process_pinned_to_one_core_sizes_its_pools_for_one():
    pinned = _probe("one")
    assert pinned["cores"] == 1 and pinned["machine"] >= 2  # the machine still has every core
    assert (pinned["async"], pinned["grading"], pinned["sandbox"]) == (1, 1, 2)  # the sandbox keeps its floor of 2
    free = _probe("all")
    cores = len(os.sched_getaffinity(0))
    assert free["cores"] == cores
    assert (free["async"], free["grading"], free["sandbox"]) == (min(3, cores), min(4, cores), max(2, min(32, 2 * cores)))
