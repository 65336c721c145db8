"""The Ray backend's tests: one small local Ray cluster per module (2 CPUs, 100 MB object store, no
dashboard). The test envs of tests/core (and these modules) are importable in the actors through the
runtime env's PYTHONPATH."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray backend's tests need the ray extra (nox -s ray)")

CORE_TESTS = str(Path(__file__).parents[1] / "core")
TOOL_TESTS = str(Path(__file__).parents[1] / "tools")
sys.path[:0] = [CORE_TESTS, TOOL_TESTS]

import ray  # noqa: E402

RAY_TESTS = str(Path(__file__).parent)
RUNTIME_ENV = {"env_vars": {"PYTHONPATH": os.pathsep.join([CORE_TESTS, RAY_TESTS, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}}


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for one test module, shut down after it."""
    import vector_test_envs

    vector_test_envs.register_test_envs()
    ray.init(num_cpus=2, object_store_memory=100 * 1024**2, include_dashboard=False, runtime_env=RUNTIME_ENV, namespace="gem-tests")
    yield ray
    ray.shutdown()


def actor_states() -> dict[str, str]:
    """Every actor of the cluster and its state (the GCS's table; the state API needs the dashboard)."""
    return {actor_id: info["State"] for actor_id, info in ray._private.state.actors().items()}


def wait_until(predicate, timeout: float = 15.0, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def alive(pids) -> list[int]:
    living = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        try:  # a zombie is dead: its parent has not reaped it yet
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        living.append(pid)
    return living
