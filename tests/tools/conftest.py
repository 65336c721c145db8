"""Shared fixtures of the tool tests: a warm sandbox per module (bwrap needed: see sandbox_support)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the test modules import their helpers by name

from sandbox_support import require_bwrap


@pytest.fixture(scope="module")
def sandbox():
    """A started bwrap sandbox with two warm workers, shared by one test module."""
    require_bwrap()
    from gem_core.tools.python import PythonSandbox

    sb = PythonSandbox(workers=2, timeout=2.0).start()
    yield sb
    sb.close()
