"""The OpenRLHF example script and the `.[openrlhf]` extra, from a fresh copy of the repository.

`examples/openrlhf/train_gtn_rebn.sh` runs, unchanged, in a temporary copy of the repository's tracked
files (a fresh clone: no `data/`, no `ckpt/`), up to the first point that needs a GPU. What runs for real:
the script's `gem-core make-dataset openrlhf` (the prompt file is written and read back), then
`gem-core openrlhf train` with the script's exact arguments: OpenRLHF's own parser with `rebn`, its checks,
Ray started with the plugin's runtime env, the launcher's check that the patch is armed in a Ray worker,
OpenRLHF's `train()` up to `get_strategy(args)`. It stops at OpenRLHF's `placement_group` call that
reserves the GPUs of the colocated actor, reference and vLLM engines (TEST SHIM `gpu_stop/sitecustomize.py`;
vllm/deepspeed/flash_attn are import stubs there), and the test asserts that this is where it stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import fresh_copy

from gem_core.tasks import TaskSpec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SCRIPT = "examples/openrlhf/train_gtn_rebn.sh"
SHIM = HERE / "gpu_stop"
STOP_STATUS = 97
MARK = "GEM-TEST-GPU-STOP "


def run_script(clone: Path, ray_dir: str, *extra: str, timeout: int = 400) -> subprocess.CompletedProcess:
    """The script in ``clone`` with the GPU-stop shim; Ray's session files go under ``ray_dir``."""
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),  # gem-core
        "PYTHONPATH": os.pathsep.join([str(SHIM), os.environ.get("PYTHONPATH", "")]),
        "GEM_TEST_GPU_STOP": "1",
        "RAY_DISABLE_USAGE_STATS": "1",
        "TMPDIR": ray_dir,  # nox points it into the venv, which Ray refuses
        "RAY_TMPDIR": ray_dir,
    }
    env.pop("GEM_OPENRLHF_TURNS", None)  # the launcher must set it itself
    return subprocess.run(["bash", SCRIPT, *extra], cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)


def stop_report(done: subprocess.CompletedProcess) -> dict:
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    assert done.returncode == STOP_STATUS and len(lines) == 1, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    return json.loads(lines[0][len(MARK) :])


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    clone = fresh_copy(tmp_path_factory.mktemp("fresh-clone"))
    assert not (clone / "data").exists() and not (clone / "ckpt").exists()
    ray_dir = tempfile.mkdtemp(prefix="ray-gem-", dir="/tmp" if os.path.isdir("/tmp") else None)  # short: Ray's socket paths
    try:
        done = run_script(clone, ray_dir)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    return clone, done


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_example_writes_its_prompt_file_in_a_fresh_clone(example_run):
    clone, done = example_run
    data = clone / "data" / "gtn_prompts.jsonl"
    assert data.is_file(), (done.returncode, done.stderr[-3000:])
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(rows) == 4096  # --n 4096
    specs = [TaskSpec.from_json(row["label"]) for row in rows]
    assert {(s.env_id, s.max_turn_tokens) for s in specs} == {("game:GuessTheNumber-v0-easy", 1024)}
    assert [s.seed for s in specs] == list(range(4096))
    assert all(row["prompt"].startswith("You are playing Guess The Number.") for row in rows)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_example_reaches_openrlhfs_gpu_placement_with_the_scripts_arguments(example_run):
    from gem_integrations.openrlhf import agent_path

    clone, done = example_run
    report = stop_report(done)
    # Where it stopped: OpenRLHF's own train() asking Ray for the 4 colocated GPUs, after its strategy.
    assert report["caller"] == "__main__.train" and report["caller_file"].endswith(os.path.join("openrlhf", "cli", "train_ppo_ray.py"))
    assert report["bundles"] == [{"GPU": 1, "CPU": 1}] * 4 and report["pg_strategy"] == "PACK"
    assert report["deepspeed_strategy"] == "DeepspeedStrategy" and report["ray_initialized"]
    assert report["rebn_choice_active"]  # OpenRLHF's module runs under the launcher's parser patch
    args = report["args"]
    assert args["advantage"]["estimator"] == "rebn"
    assert (args["advantage"]["gamma"], args["advantage"]["rebn_ddof"], args["advantage"]["rebn_eps"]) == (0.9, 0, 1e-6)
    assert args["kl_init_coef"] == 0.0 and args["colocate_all"] and args["n_samples_per_prompt"] == 4
    assert args["agent_func_path"] == agent_path() and Path(args["agent_func_path"]).is_file()
    assert args["remote_url"] == ["agent"]  # OpenRLHF's own rule for an agent file
    assert args["data"] == {"prompt_dataset": "./data/gtn_prompts.jsonl", "input_key": "prompt", "label_key": "label", "max_len": 4096}
    assert (clone / args["data"]["prompt_dataset"]).is_file()
    assert args["vllm"] == {"num_engines": 4, "tensor_parallel_size": 1}
    assert args["actor"] == {"model": "Qwen/Qwen3-1.7B", "num_nodes": 1, "num_gpus_per_node": 4}
    # The launcher checked the patch in a Ray worker before OpenRLHF's train() (else PatchNotActive, status 1).
    assert "PatchNotActive" not in done.stderr


def test_the_openrlhf_extra_brings_openrlhfs_vllm():
    """`.[openrlhf]` names OpenRLHF with its `vllm` extra at the tested version, and that extra exists in
    the installed OpenRLHF's metadata and pins the vLLM the README names."""
    import tomllib
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["openrlhf"]
    openrlhf = [Requirement(r) for r in extra if Requirement(r).name == "openrlhf"]
    assert len(openrlhf) == 1 and openrlhf[0].extras == {"vllm"} and str(openrlhf[0].specifier) == "==0.11.2"
    vllm = [Requirement(r) for r in requires("openrlhf") or [] if Requirement(r).name == "vllm"]
    pinned = {str(r.specifier) for r in vllm if r.marker is not None and r.marker.evaluate({"extra": "vllm"})}
    assert pinned == {"==0.29.0"}
