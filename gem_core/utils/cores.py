"""How many cores this process may run on, for the defaults that size worker pools by it."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's cpuset, ``taskset``, a batch scheduler's
    allocation), which can be far fewer than the machine's ``os.cpu_count()``; a pool sized by the machine's count on
    a node shared out by cores would start a process or a thread for every core of the node. At least 1."""
    if hasattr(os, "sched_getaffinity"):  # Linux; macOS and Windows have no affinity call
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
