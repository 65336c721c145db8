"""A script of the repository (a benchmark under benchmarks/, not a package) loaded as a module in a test."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


@contextmanager
def script_module(path: str | Path) -> Iterator[ModuleType]:
    """The script at ``path`` as a module named after its file, registered in ``sys.modules`` while the
    block runs (its dataclasses and pickled functions look their module up by name), removed after it."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
