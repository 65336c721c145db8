"""The oat plugin on the real model and the real vLLM (run by `nox -s oat_real`, Python 3.10, with
``--confcutdir`` on this folder: the parent folder's conftest builds a tiny tokenizer for the stand-in tests).

Collected only where vLLM and oat are really installed; in the `oat` session (vLLM an import stub) this folder
is skipped. deepspeed, launchpad and pyarrow.plasma stay import stubs (../oat_stubs.py): GPU-only or removed,
and not called by the code under test. Bounded for a 2-core, 24 GiB machine: one vLLM engine, 1 GiB of KV cache.
"""

from __future__ import annotations

import importlib.machinery
import os
import socket
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PARENT = os.path.dirname(HERE)


def _really_installed(name: str) -> bool:
    try:
        return importlib.machinery.PathFinder.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


if not (_really_installed("vllm") and _really_installed("oat")):
    collect_ignore_glob = ["test_*.py"]  # nox -s oat_real runs these
else:
    if PARENT not in sys.path:
        sys.path.insert(0, PARENT)  # oat_stubs, test_oat_whole_step's helpers
    import oat_stubs  # noqa: E402,F401  (IMPORT STUB: deepspeed, launchpad, pyarrow.plasma; vllm is real here)

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The embedded real model's converted checkpoint (GEM_CORE_CACHE; converted here when not cached)."""
    from gem_core.models import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL, prefer_hub=False)


@pytest.fixture(scope="session", autouse=True)
def process_group():
    """gloo with world size 1: oat's learner all-reduces its whitening statistics."""
    import torch.distributed as dist

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
