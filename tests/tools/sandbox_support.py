"""Whether the bwrap sandbox can run here; tests that need it fail in CI and skip elsewhere."""

from __future__ import annotations

import os
import shutil

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
