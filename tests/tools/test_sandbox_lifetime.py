"""No sandbox process or temp dir outlives its pool's owner, however the owner ends it: the pool closed
(idle, busy and still-starting workers), or the owner killed with SIGKILL. Each test counts the processes
that carry its pool's marker (bwrap, the sandbox's init, the worker, its children) in /proc.

A bwrap whose start is held (sandbox_support.HELD_BWRAP) stands for the window that left a sandbox's
init alive for good in CI: bwrap armed --die-with-parent and cloned the init, which waits for bwrap's
go-ahead; an owner killed then takes bwrap with it and the init waits forever, reparented to init,
ignoring SIGTERM. The Ray ending (ray.kill of a SandboxService actor) is in tests/ray_backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from sandbox_support import held_bwrap_dir, kill_marked, marked_processes, require_bwrap, unique_marker, wait_for

from gem_core.tools.sandbox import PythonSandbox, reaper
from gem_core.tools.sandbox.host import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
OWNER = Path(__file__).with_name("sandbox_owner.py")


@pytest.fixture
def marker():
    require_bwrap()
    name = unique_marker()
    yield name
    kill_marked(name)  # a failed test leaves nothing either


def _held(marker: str) -> list[int]:
    """The processes of a held start: bwrap and the sandbox init it cloned (both carry bwrap's command line)."""
    return [p for p in marked_processes(marker) if b"--userns-block-fd" in Path(f"/proc/{p}/cmdline").read_bytes()]


def _busy(sandbox: PythonSandbox) -> threading.Thread:
    call = threading.Thread(target=sandbox.run, args=("import time\ntime.sleep(60)",), daemon=True)
    call.start()
    assert wait_for(lambda: any(w.calls for w in sandbox.pool.live_workers()), 30)
    return call


def test_close_ends_idle_busy_and_starting_workers_before_it_returns(marker, tmp_path, monkeypatch):
    sandbox = PythonSandbox(workers=2, preload=(marker,), timeout=60).start()
    call = _busy(sandbox)
    monkeypatch.setenv("PATH", f"{held_bwrap_dir(tmp_path / 'held')}{os.pathsep}{os.environ['PATH']}")
    sandbox.pool.resize(3)
    threading.Thread(target=sandbox.pool.start, daemon=True).start()
    assert wait_for(lambda: len(_held(marker)) == 2, 30), _held(marker)  # bwrap and its init, stuck in start-up
    assert len(marked_processes(marker)) >= 2 + 2 * 3  # and two started workers: bwrap, init, worker (+ child)
    started = time.monotonic()
    sandbox.close()
    assert marked_processes(marker) == []  # at once: close() returned after they were gone
    assert time.monotonic() - started < 30  # a hang guard with room for load
    call.join(timeout=30)
    assert not call.is_alive()  # the busy call ended with the pool


@pytest.mark.parametrize("caller", ["prompt", "late"])
def test_close_in_isolation_none_ends_a_busy_workers_child_and_removes_the_temp_dirs(marker, caller, monkeypatch):
    """close() returns with the busy worker's temp dir gone, whoever closes the worker first: its caller's thread
    also tears it down, but on a loaded machine that thread may run only after close() has returned (seen in a
    core-suite run beside a training run), or not before the process exits. ``late`` holds the caller back."""
    if caller == "late":
        kill = WorkerProcess.kill

        def held_kill(self):
            if threading.current_thread() is not threading.main_thread():  # the busy call's thread, not close()
                time.sleep(5)
            kill(self)

        monkeypatch.setattr(WorkerProcess, "kill", held_kill)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sandbox = PythonSandbox(workers=2, preload=(marker,), timeout=60, isolation="none").start()
    _busy(sandbox)
    dirs = [w.host_tmp for w in sandbox.pool.live_workers()]
    assert len(dirs) == 2 and all(os.path.isdir(d) for d in dirs)
    sandbox.close()
    # the busy worker's child (its own session, running the call) dies with its worker
    assert wait_for(lambda: marked_processes(marker) == [], 2), marked_processes(marker)
    assert [d for d in dirs if os.path.exists(d)] == []


def _owner(mode: str, marker: str, tmp_path: Path) -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "GEM_TEST_MARKER": marker, "GEM_TEST_HELD_BWRAP": str(held_bwrap_dir(tmp_path / "held"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.Popen([sys.executable, str(OWNER), mode], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line, f"the owner exited with {proc.wait()}"
    return proc, json.loads(line)


def test_sigkill_of_the_owner_leaves_no_process(marker, tmp_path):
    proc, _ = _owner("bwrap", marker, tmp_path)
    try:
        assert wait_for(lambda: len(_held(marker)) == 2, 30), _held(marker)
        assert len(marked_processes(marker)) >= 2 + 2 * 3
    finally:
        proc.kill()
        proc.wait()
    # --die-with-parent ends the two started sandboxes; the reaper ends the held one's init
    left = wait_for(lambda: marked_processes(marker) == [], 10) or marked_processes(marker)
    assert left is True, [Path(f"/proc/{p}/stat").read_text()[:60] for p in left if Path(f"/proc/{p}").exists()]
    assert wait_for(lambda: not [o for o in reaper.find_reapers().values() if o == proc.pid], 10)  # it went too


def test_sigkill_of_the_owner_leaves_no_isolation_none_temp_dir(marker, tmp_path):
    proc, report = _owner("none", marker, tmp_path)
    dirs = report["temp_dirs"]
    try:
        assert len(dirs) == 2 and all(os.path.isdir(d) for d in dirs)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert wait_for(lambda: marked_processes(marker) == [] and not any(os.path.exists(d) for d in dirs), 10), (
        marked_processes(marker),
        [d for d in dirs if os.path.exists(d)],
    )


def test_the_finders_see_what_a_dead_owner_would_leave(tmp_path):
    """What the test run's final check uses: processes and temp dirs by label, reapers by label."""
    label = unique_marker()[-12:]
    tag = reaper.owner_tag(label, 1, "feed")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"{tag}/0"])
    stray = tmp_path / (reaper.temp_prefix(label, 1, "feed") + "x")
    stray.mkdir()
    try:
        assert wait_for(lambda: reaper.find_processes(f"{reaper.TAG}{label}/") == [sleeper.pid], 5)
        assert reaper.find_temp_dirs(label, str(tmp_path)) == [str(stray)]
        assert reaper.find_temp_dirs("other", str(tmp_path)) == []
        assert reaper.kill_tagged(f"{tag}/") and sleeper.wait(5) == -signal.SIGKILL
        reaper.remove_temp_dirs(str(tmp_path), reaper.temp_prefix(label, 1, "feed"))
        assert not stray.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_bad_label_is_one_clear_error(monkeypatch):
    from gem_core.tools.sandbox.host import Owner

    monkeypatch.setenv(reaper.LABEL_VAR, "no spaces/or slashes")
    with pytest.raises(ValueError, match="GEM_SANDBOX_LABEL must be at most 64 of"):
        Owner().tag()


def test_the_run_fails_when_it_leaves_a_sandbox_process_behind(tmp_path):
    """tests/conftest.py's check after the whole run: a run whose test passed but left a process of its
    label behind exits 1 and names it; the check then kills it."""
    label = unique_marker()[-12:]
    env = {**os.environ, reaper.LABEL_VAR: label, "GEM_TEST_LEFTOVER_GRACE_S": "1"}
    log = tmp_path / "run.log"
    with open(log, "w") as out:  # a file, not a pipe: the process left behind cannot hold it open
        code = subprocess.call(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q", "tests/tools/leaky_session.py"],
            stdout=out, stderr=subprocess.STDOUT, timeout=300, env=env, cwd=ROOT,
        )  # fmt: skip
    text = log.read_text()
    pid = int(text.split("LEFT ", 1)[1].split()[0])
    try:
        assert code == 1, text[-3000:]
        assert "1 passed" in text and f"left sandbox processes or temp dirs behind (label {label})" in text, text[-3000:]
        assert f"process {pid}:" in text
        assert wait_for(lambda: reaper.find_processes(f"{reaper.TAG}{label}/") == [], 5)  # and it is gone
    finally:
        kill_marked(f"{reaper.TAG}{label}/")
