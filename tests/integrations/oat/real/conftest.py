"""The oat plugin on the real model and the real vLLM (run by `nox -s oat_real`, Python 3.10, with
``--confcutdir`` on this folder: the parent folder's conftest builds a tiny tokenizer for the stand-in tests).

Collected only where vLLM and oat are really installed; in the `oat` session (vLLM an import stub) this folder
is skipped. deepspeed, launchpad and pyarrow.plasma stay import stubs (../oat_stubs.py): GPU-only or removed,
and not called by the code under test. Bounded for a 2-core, 24 GiB machine: one vLLM engine, 1 GiB of KV cache.
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PARENT = os.path.dirname(HERE)
TESTS = os.path.dirname(os.path.dirname(PARENT))
if TESTS not in sys.path:  # tests/helpers: --confcutdir keeps tests/conftest.py, which puts tests/ there, out
    sys.path.append(TESTS)

from helpers.real import bound_cpu_engine, embedded_model_dir, really_installed  # noqa: E402


if not really_installed("vllm", "oat"):
    collect_ignore_glob = ["test_*.py"]  # nox -s oat_real runs these
else:
    if PARENT not in sys.path:
        sys.path.insert(0, PARENT)  # oat_stubs, test_oat_whole_step's helpers
    import oat_stubs  # noqa: E402,F401  (IMPORT STUB: deepspeed, launchpad, pyarrow.plasma; vllm is real here)

bound_cpu_engine()


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The embedded real model's converted checkpoint (GEM_CORE_CACHE; converted here when not cached)."""
    return embedded_model_dir()


@pytest.fixture(scope="session", autouse=True)
def process_group():
    """gloo with world size 1: oat's learner all-reduces its whitening statistics."""
    import torch.distributed as dist

    if not dist.is_initialized():
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
