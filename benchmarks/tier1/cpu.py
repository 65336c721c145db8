"""What every trainer's CPU run in the Tier 1 check shares: a one-process gloo group and CUDA's device calls
answered for the CPU (the trainers' update code asks for a device and synchronises; no GPU is here)."""

from __future__ import annotations

import contextlib
import socket
from typing import Any


@contextlib.contextmanager
def one_process_group() -> Any:
    """A one-process gloo group (opened here unless one is open, and closed afterwards), with
    ``torch.cuda.current_device`` answering ``"cpu"`` and ``synchronize``/``empty_cache`` doing nothing; all put
    back afterwards."""
    import torch
    import torch.distributed as dist

    names = ("current_device", "synchronize", "empty_cache")
    saved = {name: getattr(torch.cuda, name) for name in names}
    started = False
    if not dist.is_initialized():
        with socket.socket() as probe:  # a free port for the group's one rank
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        started = True
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.empty_cache = lambda: None
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)
        if started:
            dist.destroy_process_group()
