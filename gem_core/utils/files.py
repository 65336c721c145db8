"""Files that appear whole or not at all: what a run, a dataset or a checkpoint leaves behind when it is
stopped while writing (a kill, a full disk) is the previous file or none, never half of one."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def write_whole(path: str | os.PathLike, write: Callable[[str], T]) -> T:
    """``write(temporary)`` into a hidden file beside ``path``, then moved over it; the temporary file is removed
    whatever happens. Returns what ``write`` returns. ``path``'s directory must exist."""
    target = Path(path)
    temporary = str(target.with_name(f".{target.name}.{os.getpid()}.tmp"))
    try:
        result = write(temporary)
        os.replace(temporary, target)
        return result
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
