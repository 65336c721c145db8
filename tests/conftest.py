"""Shared test settings: hypothesis profiles (CI runs the 'ci' profile: derandomised, more examples), and
the check at the end of every run that it left no sandbox process or temp dir behind."""

import os
import signal
import tempfile
import time

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Every sandbox this run starts, in this process or any it starts (subprocesses, Ray workers), carries
# this label in its processes' command lines and its temp dirs' names (gem_core.tools.sandbox.reaper):
# the check at the end finds what this run left behind, and nothing of other runs on the machine.
LABEL_VAR = "GEM_SANDBOX_LABEL"
os.environ.setdefault(LABEL_VAR, f"pytest-{os.getpid()}")
# What a killed owner's sandboxes (and its reaper) get to go (tests of this check shorten it).
LEFTOVER_GRACE_S = float(os.environ.get("GEM_TEST_LEFTOVER_GRACE_S", "15"))

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _task_data(tmp_path_factory):
    """Every task id (math:*, eval:*, ...) makes offline: small generated copies of their datasets under
    $GEM_DATA_DIR (gem_core.testing.task_data), read through the real loader."""
    from gem_core.testing.task_data import write_task_data

    root = tmp_path_factory.mktemp("gem_data")
    write_task_data(root)
    previous = os.environ.get("GEM_DATA_DIR")
    os.environ["GEM_DATA_DIR"] = str(root)
    yield root
    if previous is None:
        os.environ.pop("GEM_DATA_DIR", None)
    else:
        os.environ["GEM_DATA_DIR"] = previous


def sandbox_leftovers(label: str) -> list[str]:
    """What of this run's sandboxes is still there: processes (bwrap, a sandbox's init, workers, their
    children), reapers of other owners than this process (an owner that is gone takes its reaper along),
    host temp dirs of isolation="none" workers."""
    from gem_core.tools.sandbox import reaper

    me = os.getpid()
    found = [f"process {pid}: {reaper.command_line(pid)}" for pid in reaper.find_processes(f"{reaper.TAG}{label}/")]
    found += [f"reaper {pid} of owner {owner}" for pid, owner in reaper.find_reapers(label).items() if owner != me]
    found += [f"temp dir {path}" for path in reaper.find_temp_dirs(label)]
    return found


def fail_session(session, title: str, lines: list[str]) -> None:
    """Fail the run (exit status 1) with ``title`` and ``lines`` on the terminal."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"FAILED {title}:", red=True, bold=True)
        for line in lines:
            reporter.write_line(f"  {line}")
    else:
        print(f"FAILED {title}:", *(f"  {line}" for line in lines), sep="\n")
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_sessionfinish(session, exitstatus):
    """After the whole run: this process's pools closed and a Ray cluster it left up shut down, no sandbox
    process or temp dir of the run may be left (waiting LEFTOVER_GRACE_S for those whose owner was killed).
    Any left fails the run, and is removed."""
    import sys

    from gem_core.tools.sandbox import close_all_pools, reaper

    close_all_pools()
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        ray.shutdown()  # a Ray cluster the run left up: its workers may own sandboxes, and go with it
    label = os.environ[LABEL_VAR]
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := sandbox_leftovers(label)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        fail_session(session, f"the run left sandbox processes or temp dirs behind (label {label})", left)
        reaper.kill_tagged(f"{reaper.TAG}{label}/")
        for pid, owner in reaper.find_reapers(label).items():
            if owner != os.getpid():
                os.kill(pid, signal.SIGTERM)  # a reaper reaps on SIGTERM, then exits
        reaper.remove_temp_dirs(tempfile.gettempdir(), f"{reaper.TEMP_PREFIX}{label}-")
