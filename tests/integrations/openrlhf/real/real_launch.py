"""How the real tier launches OpenRLHF 0.11.2 (driver side): the local Ray cluster its ``train(args)`` runs in,
and the exact arguments a script passes to ``gem-core openrlhf train``. Used by the tests' fixtures (conftest.py)
and by the cross-framework benchmark's driver (experiment_run.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from helpers import scripts

HERE = os.path.dirname(os.path.abspath(__file__))
PARENT = os.path.dirname(HERE)
ROOT = Path(HERE).parents[3]


def start_cluster(extra_env: dict[str, str] | None = None) -> str:
    """A local Ray cluster with the plugin's runtime env (its setup hook runs after the deepspeed/flash_attn
    stubs); returns its temp dir (:func:`stop_cluster` ends it). One logical GPU so that OpenRLHF's placement
    group and GPU actors are scheduled: the placement is OpenRLHF's own; nothing uses CUDA (vLLM is its CPU
    build). Needs ``VLLM_CPU_KVCACHE_SPACE`` set (tests/helpers/real.py: bound_cpu_engine); ``extra_env``: more
    environment for every worker."""
    import ray

    from gem_integrations.openrlhf.train_ppo_ray import SETUP_HOOK, runtime_env

    temp_dir = tempfile.mkdtemp(prefix="ray-gem-real-", dir="/tmp" if os.path.isdir("/tmp") else None)  # Ray refuses nox's TMPDIR
    extra = {
        "PYTHONPATH": os.pathsep.join([HERE, PARENT, os.environ.get("PYTHONPATH", "")]),
        "HF_DATASETS_CACHE": os.path.join(temp_dir, "hf-datasets"),
        "HF_HUB_OFFLINE": "1",
        "RAY_DISABLE_USAGE_STATS": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ["VLLM_CPU_KVCACHE_SPACE"],
        "TOKENIZERS_PARALLELISM": "false",
        **(extra_env or {}),
    }
    env = runtime_env(extra)
    assert env["worker_process_setup_hook"] == SETUP_HOOK
    env["worker_process_setup_hook"] = "real_stubs.install_then_arm"
    ray.init(num_cpus=8, num_gpus=1, include_dashboard=False, runtime_env=env, log_to_driver=False, _temp_dir=temp_dir)
    return temp_dir


def stop_cluster(temp_dir: str) -> None:
    import ray

    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


def script_arguments(script: str | Path, env: dict[str, str], extra: list[str], record: Path) -> list[str]:
    """Run ``script`` (an OpenRLHF launch script: its make-dataset for real, from the project root); return the
    exact arguments it passes to `gem-core openrlhf train`, which is recorded instead of run."""
    return scripts.script_arguments(script, ["openrlhf", "train"], env, extra, record, cwd=ROOT)
