"""OpenRLHF 0.11.2 plugin tests: OpenRLHF's own classes on CPU (run by `nox -s openrlhf`).

vllm/deepspeed/flash_attn are import stubs (openrlhf_import_stubs.py); everything else is real. The
engine is gem_core's VLLMFaithfulEngine (vLLM's stop-token, max_tokens, finish-reason and text rules)
over the golden scenario's scripted model, so nothing passes because a stand-in is kinder than vLLM.
The whole golden scenario is replayed, its python-tool episode included (the label names the tools).
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

pytest.importorskip("openrlhf", reason="the OpenRLHF tests run in their own virtualenv: nox -s openrlhf")

sys.path.insert(0, os.path.dirname(__file__))
import openrlhf_import_stubs  # noqa: E402

openrlhf_import_stubs.install()
os.environ["GEM_OPENRLHF_TURNS"] = "1"  # what the launcher sets in every Ray worker

from gem_core.tasks import TaskSpec  # noqa: E402
from gem_core.testing import build_test_tokenizer  # noqa: E402
from gem_core.testing.golden import GOLDEN_MAX_CONTEXT_TOKENS, GOLDEN_PARAMS, golden_respond, golden_scenario  # noqa: E402
from gem_core.testing.vllm_engine import ScriptedModel, VLLMFaithfulEngine, VLLMSamplingParams  # noqa: E402

UNCAPPED = GOLDEN_PARAMS.replace(max_tokens=GOLDEN_MAX_CONTEXT_TOKENS)  # a response may take all that is left


def openrlhf_params(logprobs: int | None = 1, max_tokens: int | None = None, skip_special_tokens: bool = False) -> VLLMSamplingParams:
    """The vllm.SamplingParams OpenRLHF's samples generator builds (`_dispatch_prompts_to_vllm`): its
    defaults, --rollout.max_new_tokens unset (None), logprobs=1 with the default correction level."""
    return VLLMSamplingParams(
        temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, min_tokens=1, skip_special_tokens=skip_special_tokens, logprobs=logprobs
    )


def label_of(episode, **fields) -> str:
    """The prompt row's label for a golden episode (what `gem-core make-dataset openrlhf` writes)."""
    return TaskSpec(episode.env_id, seed=episode.seed, env_kwargs=episode.env_kwargs, tools=episode.tools, **fields).to_json()


def workers_answer(monkeypatch, answer) -> None:
    """Ray's remote task and ``ray.get`` replaced so that every worker the launcher asks answers ``answer`` (its
    checks that a patch is armed in the workers, without a cluster)."""
    import ray

    class Probe:
        def remote(self):
            return "ref"

    monkeypatch.setattr(ray, "remote", lambda **kw: lambda fn: Probe())
    monkeypatch.setattr(ray, "get", lambda ref: answer)


def faithful_engine(tokenizer, max_model_len: int = 4096, eos_token_id: int | None = None) -> VLLMFaithfulEngine:
    """A vLLM-faithful engine over the golden scenario's model (it writes past its end-of-turn token
    unless a stop token or EOS stops it). ``eos_token_id``: the model's EOS, if not the tokenizer's."""
    engine = VLLMFaithfulEngine(ScriptedModel(tokenizer, golden_respond), max_model_len=max_model_len)
    if eos_token_id is not None:
        engine.eos_token_id = eos_token_id
    return engine


def run_executor(executor, tokenizer, episode, *, engine=None, max_length=GOLDEN_MAX_CONTEXT_TOKENS, params=None, **label_fields):
    """One OpenRLHF sample through the agent file's executor; returns (response dict, engine)."""
    engine = faithful_engine(tokenizer) if engine is None else engine
    coroutine = executor.execute(
        prompt=f"(row prompt of {episode.episode_id}, unused)",
        label=label_of(episode, **label_fields),
        sampling_params=openrlhf_params() if params is None else params,
        max_length=max_length,
        hf_tokenizer=tokenizer,
        llm_engine=engine,
    )
    return asyncio.run(coroutine), engine


@pytest.fixture(scope="session")
def tokenizer():
    return build_test_tokenizer("qwen3")


@pytest.fixture(scope="session")
def golden(tokenizer):
    """The core reference with a per-turn cap of GOLDEN_PARAMS.max_tokens."""
    return golden_scenario(tokenizer=tokenizer)


@pytest.fixture(scope="session")
def golden_uncapped(tokenizer):
    """The core reference with no per-turn cap (each response may use the rest of the context)."""
    return golden_scenario(tokenizer=tokenizer, params=UNCAPPED)


@pytest.fixture(scope="session")
def executor():
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

    from gem_integrations.openrlhf import agent_path

    return _load_agent_executor(agent_path())


@pytest.fixture(scope="session")
def responses(executor, tokenizer, golden):
    """The golden episodes through the agent, capped per turn by the label's max_turn_tokens."""
    return [run_executor(executor, tokenizer, episode, max_turn_tokens=GOLDEN_PARAMS.max_tokens)[0] for episode in golden.episodes]


def samples_generator():
    """OpenRLHF's SamplesGenerator without its Ray engines (only its response->Experience method is used)."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    return object.__new__(SamplesGenerator)


@pytest.fixture(scope="session")
def cluster():
    """One local Ray cluster for the session, started with the plugin's runtime env (its worker setup
    hook), where the GPU packages are import stubs: the test's hook installs them, then runs gem-core's.
    It declares one (logical) GPU so that OpenRLHF's placement groups and GPU actors can be scheduled;
    nothing uses CUDA. HF datasets' cache and Ray's session files go to temp dirs removed at the end."""
    import shutil
    import tempfile

    import ray

    from gem_integrations.openrlhf.train_ppo_ray import SETUP_HOOK, runtime_env

    here = os.path.dirname(os.path.abspath(__file__))
    temp_dir = tempfile.mkdtemp(prefix="ray-gem-", dir="/tmp" if os.path.isdir("/tmp") else None)  # Ray refuses nox's TMPDIR
    extra = {
        "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
        "HF_DATASETS_CACHE": os.path.join(temp_dir, "hf-datasets"),
        "HF_HUB_OFFLINE": "1",
        "RAY_DISABLE_USAGE_STATS": "1",
    }
    env = runtime_env(extra)
    assert env["worker_process_setup_hook"] == SETUP_HOOK
    env["worker_process_setup_hook"] = "openrlhf_import_stubs.install_then_arm"
    ray.init(num_cpus=8, num_gpus=1, include_dashboard=False, runtime_env=env, log_to_driver=False, _temp_dir=temp_dir)
    yield temp_dir
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


def fresh_copy(destination):
    """The repository's tracked files (as they are in the work tree) copied to ``destination``: what a
    fresh clone holds (no data/, no ckpt/, nothing ignored)."""
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("needs a git checkout of the repository (the tracked files make the fresh copy)")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    destination = Path(destination)
    for name in filter(None, listed.decode().split("\0")):
        source = root / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination
