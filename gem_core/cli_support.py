"""What every ``gem-core`` command shares: exit codes, the one-line user error, argparse number types and
output-file checks. It imports nothing of gem_core, so the command modules (``gem_core.cli``,
``gem_core.eval.cli``, ``gem_core.train.cli``) and the plugins' dataset writers all stand above it."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2  # bad arguments or unknown id, as argparse uses
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A user-facing error: printed as one line, exit code ``EXIT_USAGE``."""


def whole_number(low: int, high: int | None = None) -> Any:
    """An argparse type: a whole number in ``low..high`` (``high`` None: no upper bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            allowed = f"a number >= {low}" if high is None else f"a number in {low}..{high}"
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {value}")
        return value

    return parse


def real_number(low: float, high: float = math.inf, *, low_open: bool = False) -> Any:
    """An argparse type: a finite number in ``[low, high]`` (``(low, high]`` when ``low_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
            if high == math.inf:
                where = f"{'>' if low_open else '>='} {low:g}"
            else:
                where = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"expected a number {where}, got {text}")
        return value

    return parse


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == math.inf:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text}")
    return value


def check_out_file(path: str, option: str = "--out") -> None:
    """``path`` can be written as a new or replaced file: not a directory, in a directory that exists.
    A missing directory is an error, not something to create: the user may have mistyped it."""
    if os.path.isdir(path):
        raise CliError(f"{option} {path}: is a directory; name a file to write")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CliError(f"{option} {path}: directory {parent} does not exist (create it first, or name another file)")


def os_error_text(err: OSError) -> str:
    """One line for an OSError: the reason and the file (``Permission denied: /x/y``)."""
    name = getattr(err, "filename", None)
    return f"{err.strerror or err}: {name}" if name else str(err.strerror or err)
