"""oat plugin tests: oat-llm 0.2.4's own actor and learner code on CPU (run by `nox -s oat`, Python 3.10).
The import stubs (deepspeed, vllm, launchpad, pyarrow.plasma) are in oat_stubs.py."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("oat", reason="the oat tests run in their own virtualenv: nox -s oat")
sys.path.insert(0, os.path.dirname(__file__))
import oat_stubs  # noqa: E402,F401  (IMPORT STUB: installs the placeholders before oat's modules load)


@pytest.fixture(scope="session")
def tokenizer():
    from gem_core.testing import build_test_tokenizer

    return build_test_tokenizer("qwen3")


@pytest.fixture(scope="session", autouse=True)
def process_group():
    """gloo with world size 1, as oat's learner runs on one device (the two-device test spawns its own)."""
    import socket

    import torch.distributed as dist

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
