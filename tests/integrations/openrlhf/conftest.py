"""OpenRLHF 0.11.2 plugin tests: OpenRLHF's own classes on CPU (run by `nox -s openrlhf`).

vllm/deepspeed/flash_attn are import stubs (openrlhf_import_stubs.py); everything else is real.
The whole golden scenario is replayed, its python-tool episode included (the label names the tools).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import types

import pytest

pytest.importorskip("openrlhf", reason="the OpenRLHF tests run in their own virtualenv: nox -s openrlhf")

sys.path.insert(0, os.path.dirname(__file__))
import openrlhf_import_stubs  # noqa: E402

openrlhf_import_stubs.install()
os.environ["GEM_OPENRLHF_TURN_REWARDS"] = "1"  # what the launcher sets in every Ray worker

from gem_core.testing.golden import (  # noqa: E402
    GOLDEN_MAX_CONTEXT_TOKENS,
    GOLDEN_PARAMS,
    golden_formatter,
    golden_policy,
    golden_scenario,
)
from gem_core.testing import build_test_tokenizer  # noqa: E402


def vllm_like_params(logprobs: int | None = 1) -> types.SimpleNamespace:
    """The fields of the vllm.SamplingParams OpenRLHF's samples generator builds (defaults as there)."""
    return types.SimpleNamespace(
        temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1, skip_special_tokens=False, logprobs=logprobs
    )


def label_of(episode) -> str:
    spec = {"env_id": episode.env_id, "seed": episode.seed, "env_kwargs": episode.env_kwargs}
    if episode.tools:
        spec["tools"] = list(episode.tools)
    return json.dumps(spec)


@pytest.fixture(scope="session")
def tokenizer():
    return build_test_tokenizer("qwen3")


@pytest.fixture(scope="session")
def golden(tokenizer):
    return golden_scenario(tokenizer=tokenizer)


@pytest.fixture(scope="session")
def executor():
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

    from gem_integrations.openrlhf import agent_path

    return _load_agent_executor(agent_path())


def run_executor(executor, tokenizer, episode, logprobs: int | None = 1):
    from gem_integrations.openrlhf.engine import PolicyEngine

    engine = PolicyEngine(golden_policy(tokenizer), golden_formatter(tokenizer), max_tokens_per_turn=GOLDEN_PARAMS.max_tokens)
    coroutine = executor.execute(
        prompt=f"(row prompt of {episode.episode_id}, unused)",
        label=label_of(episode),
        sampling_params=vllm_like_params(logprobs),
        max_length=GOLDEN_MAX_CONTEXT_TOKENS,
        hf_tokenizer=tokenizer,
        llm_engine=engine,
    )
    return asyncio.run(coroutine)


@pytest.fixture(scope="session")
def responses(executor, tokenizer, golden):
    return [run_executor(executor, tokenizer, episode) for episode in golden.episodes]


def samples_generator():
    """OpenRLHF's SamplesGenerator without its Ray engines (only its response->Experience method is used)."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    return object.__new__(SamplesGenerator)
