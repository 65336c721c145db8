"""The RL2 plugin on the real model and the real vLLM (run by `nox -s rl2_real`, with ``--confcutdir`` on
this folder: the parent folder's conftest stubs sglang/ring_flash_attn and builds a tiny tokenizer).

Collected only where vLLM and RL2 are really installed; in the `rl2` session (no vLLM) this folder is
skipped. The test process never imports RL2 or vLLM: the engine runs in one server process
(vllm_sglang_server.py), RL2 in the rank processes (rank_real.py). Bounded for a 2-core, 24 GiB
machine: one vLLM engine, a 1 GiB KV cache.
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


if not really_installed("vllm", "RL2"):
    collect_ignore_glob = ["test_*.py"]  # nox -s rl2_real runs these
else:
    for path in (HERE, PARENT):  # readme_command (parent)
        if path not in sys.path:
            sys.path.insert(0, path)

bound_cpu_engine()


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The embedded real model's converted checkpoint (GEM_CORE_CACHE; converted here when not cached)."""
    return embedded_model_dir()


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
