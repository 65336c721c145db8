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
    """A local Ray cluster of 2 CPUs for one test module, shut down after it; in a short temp folder of its own
    where the checkout's is too long for Ray's sockets (gem_core.ray.cluster.local_temp_dir)."""
    import shutil

    import vector_test_envs

    from gem_core.ray.cluster import local_temp_dir, ray_temp_dir_arg

    vector_test_envs.register_test_envs()
    temp_dir = local_temp_dir()
    ray.init(
        num_cpus=2,
        object_store_memory=100 * 1024**2,
        include_dashboard=False,
        runtime_env=RUNTIME_ENV,
        namespace="gem-tests",
        **ray_temp_dir_arg(temp_dir),
    )
    yield ray
    ray.shutdown()
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)


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


def run_processes(label: str) -> list[int]:
    """Living processes other than this one started by this test run (their environment holds its
    GEM_SANDBOX_LABEL, see tests/conftest.py): Ray's (raylets, GCS, workers, actors) and what they
    started, sandbox reapers of other owners included; this process's own reaper aside."""
    from gem_core.tools.sandbox import reaper

    wanted = f"{reaper.LABEL_VAR}={label}".encode() + b"\0"
    me = os.getpid()
    mine = {pid for pid, owner in reaper.find_reapers(label).items() if owner == me}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in mine or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                if b"\0" + wanted not in b"\0" + handle.read():
                    continue
            with open(f"/proc/{name}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(name))
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """Before tests/conftest.py's check of sandboxes: Ray shut down, and no process this run started
    (Ray's, the actors', the sandboxes' reapers) left once Ray had RAY_GRACE_S to stop them. Any left
    fails the run, and is killed."""
    import signal

    from gem_core.tools.sandbox import reaper

    if ray.is_initialized():
        ray.shutdown()
    label = os.environ.get(reaper.LABEL_VAR)
    if not label:
        return
    left = wait_until(lambda: run_processes(label) == [], RAY_GRACE_S, every=0.25) or run_processes(label)
    if left is True:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"FAILED the ray run left processes behind (label {label}):"] + [f"  process {pid}: {reaper.command_line(pid)}" for pid in left]
    for line in lines:
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# ray.shutdown() returns before every worker it stopped has exited (tests of this check shorten it)
RAY_GRACE_S = float(os.environ.get("GEM_TEST_RAY_GRACE_S", "30"))
