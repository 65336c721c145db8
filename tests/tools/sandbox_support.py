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

