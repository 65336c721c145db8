"""The RL2 plugin on the real model and the real vLLM (run by `nox -s rl2_real`, with ``--confcutdir`` on
this folder: the parent folder's conftest stubs sglang/ring_flash_attn and builds a tiny tokenizer).

Collected only where vLLM and RL2 are really installed; in the `rl2` session (no vLLM) this folder is
skipped. The test process never imports RL2 or vLLM: the engine runs in one server process
(vllm_sglang_server.py), RL2 in the rank processes (rank_real.py). Bounded for a 2-core, 24 GiB
machine: one vLLM engine, a 1 GiB KV cache.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PARENT = os.path.dirname(HERE)


def _really_installed(name: str) -> bool:
    try:
        return importlib.machinery.PathFinder.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


if not (_really_installed("vllm") and _really_installed("RL2")):
    collect_ignore_glob = ["test_*.py"]  # nox -s rl2_real runs these
else:
    for path in (HERE, PARENT):  # readme_command (parent)
        if path not in sys.path:
            sys.path.insert(0, path)

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The embedded real model's converted checkpoint (GEM_CORE_CACHE; converted here when not cached)."""
    from gem_core.models import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL, prefer_hub=False)


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
