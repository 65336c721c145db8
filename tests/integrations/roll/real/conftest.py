"""ROLL's own env manager on the real model and the real vLLM (run by `ROLL_SRC=path nox -s roll_src_real`, with
``--confcutdir`` on this folder: the parent folder's conftest builds a tiny tokenizer; the real one here).

Collected only where ROLL_SRC names a ROLL checkout and vLLM is really installed; the `roll` and `roll_src` sessions
ignore this folder. Bounded for a 2-core, 24 GiB machine: one vLLM engine (a 1 GiB KV cache, 1024 tokens).
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

# ROLL's logger writes ./output/logs under the working directory unless ROLL_LOG_DIR names another: not into the checkout
os.environ.setdefault("ROLL_LOG_DIR", tempfile.mkdtemp(prefix="roll-logs-"))

HERE = os.path.dirname(os.path.abspath(__file__))
PARENT = os.path.dirname(HERE)
TESTS = os.path.dirname(os.path.dirname(PARENT))
if TESTS not in sys.path:  # tests/helpers: --confcutdir keeps tests/conftest.py, which puts tests/ there, out
    sys.path.append(TESTS)

from helpers.real import bound_cpu_engine, embedded_model_dir, really_installed  # noqa: E402

ROLL_SRC = os.environ.get("ROLL_SRC")

if not ROLL_SRC or not os.path.isdir(os.path.join(ROLL_SRC, "roll", "pipeline", "agentic")) or not really_installed("vllm"):
    collect_ignore_glob = ["test_*.py"]  # ROLL_SRC=path nox -s roll_src_real runs these
else:
    for path in (os.path.abspath(ROLL_SRC), PARENT):  # ROLL's package; roll_rules (parent)
        if path not in sys.path:
            sys.path.insert(0, path)

bound_cpu_engine()

MAX_MODEL_LEN = 1024


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The embedded real model's converted checkpoint (GEM_CORE_CACHE; converted here when not cached)."""
    return embedded_model_dir()


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def llm(model_dir):
    """The real vLLM engine over the real model (float32 on CPU, greedy requests)."""
    import vllm

    engine = vllm.LLM(model=model_dir, max_model_len=MAX_MODEL_LEN, dtype="float32", seed=0, enforce_eager=True)
    yield engine
    del engine


@pytest.fixture(scope="session", autouse=True)
def local_ray():
    """ROLL's env manager puts its queue answers through Ray's object store: a local one-CPU Ray."""
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
