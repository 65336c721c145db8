"""Whether the bwrap sandbox can run here; tests that need it fail in CI and skip elsewhere."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")

_problem: list[str | None] = []


def bwrap_problem() -> str | None:
    """Why the bwrap sandbox cannot run here, or None when it can (probed once per process)."""
    if _problem:
        return _problem[0]
    problem = None
    if shutil.which("bwrap") is None:
        problem = "bubblewrap is not installed (Debian package 'bubblewrap': apt-get install -y bubblewrap)"
    else:
        from gem_core.tools.python import PythonSandbox, SandboxUnavailable

        try:
            with PythonSandbox(workers=1, preload=()) as probe:
                if probe.run("print(1)").stdout != "1\n":
                    problem = "the bwrap sandbox starts but does not run code"
        except SandboxUnavailable as exc:
            problem = f"bubblewrap cannot create its sandbox here: {exc}"
    _problem.append(problem)
    return problem


def require_bwrap() -> None:
    """Fail (when CI=true) or skip (elsewhere) unless the bwrap sandbox works on this machine."""
    problem = bwrap_problem()
    if problem is None:
        return
    if IN_CI:
        pytest.fail(f"CI must be able to run the Python sandbox: {problem}", pytrace=False)
    pytest.skip(problem)


def _proc_stats() -> list[tuple[int, str, int]]:
    """(pid, state, parent pid) of every process, from /proc (no psutil needed)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out.append((int(name), fields[0], int(fields[1])))
    return out


def descendants(root: int) -> set[int]:
    """Pids of every process below ``root``."""
    children: dict[int, list[int]] = {}
    for pid, _, parent in _proc_stats():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def zombie_children() -> list[int]:
    """This process's children that have exited and were not reaped."""
    me = os.getpid()
    return [pid for pid, state, parent in _proc_stats() if state == "Z" and parent == me]


# -- what a sandbox leaves behind ------------------------------------------------------------------


def unique_marker() -> str:
    """A module name no one has: as a pool's preload it is skipped by the worker but sits in the command
    line of every process of that pool's sandboxes (bwrap, its init, the worker, its children), so a test
    can count them, the code under test's own bookkeeping aside."""
    import uuid

    return f"gem_lifetime_marker_{uuid.uuid4().hex[:12]}"


def marked_processes(marker: str) -> list[int]:
    """Living (not zombie) processes, other than this one, whose command line holds ``marker``."""
    me, wanted, found = os.getpid(), marker.encode(), []
    for pid, state, _ in _proc_stats():
        if pid == me or state == "Z":
            continue
        try:
            if wanted in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def wait_for(predicate, timeout: float, every: float = 0.05):
    """``predicate()``'s first truthy value within ``timeout`` seconds, else its last value."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def kill_marked(marker: str) -> None:
    """Clean-up after a failed test: SIGKILL whatever still carries ``marker`` (SIGKILL reaches a namespace init)."""
    import signal

    for _ in range(50):
        pids = marked_processes(marker)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        import time

        time.sleep(0.05)


HELD_BWRAP = '''#!{python} -I
"""A bwrap that stops where an owner's death strands the sandbox's init: the real bwrap, told to wait
(--userns-block-fd, on a pipe no one writes) after it armed --die-with-parent and cloned the init, before
it lets the init go on. The init waits for that go-ahead. The same window, a few instructions wide, is
where a real bwrap is when its owner is killed at the wrong moment. Root runs keep bwrap's own user
namespace here (--userns-block-fd needs --unshare-user); everything else is the sandbox's command line."""
import os, sys
args = sys.argv[1:]
cut = args.index("--")
options, command = args[:cut], args[cut:]
kept, i = [], 0
while i < len(options):
    if options[i] == "--userns":
        i += 2
        continue
    if options[i] in ("--disable-userns", "--unshare-user"):
        i += 1
        continue
    kept.append(options[i])
    i += 1
block_r, block_w = os.pipe()  # bwrap keeps both ends: its read never returns
info = os.open(os.devnull, os.O_WRONLY)
for fd in (block_r, block_w, info):
    os.set_inheritable(fd, True)
extra = ["--unshare-user", "--userns-block-fd", str(block_r)]
if "--info-fd" not in kept:
    extra += ["--info-fd", str(info)]
os.execv({real!r}, [{real!r}, *kept, *extra, *command])
'''


def held_bwrap_dir(directory: Path) -> Path:
    """A directory holding a ``bwrap`` that holds its start as :data:`HELD_BWRAP` says (put it first on PATH)."""
    import shutil
    import stat
    import sys

    real = shutil.which("bwrap")
    assert real is not None and Path(real).parent != directory
    directory.mkdir(parents=True, exist_ok=True)
    fake = directory / "bwrap"
    fake.write_text(HELD_BWRAP.format(python=sys.executable, real=real))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory
