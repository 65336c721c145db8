"""Fixtures for the verl plugin tests: verl's real trainer config (hydra), a vLLM-faithful CPU server with
verl's server ``generate`` signature playing the golden policy (verl_server.py), and the golden reference.

These tests need verl installed (the `verl` nox session); elsewhere they are skipped.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("verl", reason="the verl plugin tests run in the `verl` nox session")

from verl_server import FaithfulVerlServer, InProcessServerManager  # noqa: E402

from gem_core.testing.golden import GOLDEN_MAX_CONTEXT_TOKENS, GOLDEN_PARAMS, golden_scenario  # noqa: E402

PROMPT_LENGTH = 512
RESPONSE_LENGTH = 1024


def faithful_server_manager(tokenizer_dir: str) -> InProcessServerManager:
    """verl's server-client call shape over a vLLM-faithful CPU server playing the golden policy."""
    return InProcessServerManager(FaithfulVerlServer(tokenizer_dir, prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH))


def compose_verl_config(model_dir: str, *overrides: str):
    """verl's own ppo_trainer.yaml composed by hydra, with the plugin's keys added."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                f"actor_rollout_ref.model.tokenizer_path={os.path.join(model_dir, 'tokenizer')}",
                "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.rollout.prompt_length={PROMPT_LENGTH}",
                f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
                "algorithm.adv_estimator=rebn",
                "+algorithm.rebn_gamma=0.9",
                "+algorithm.rebn_ddof=0",
                "+algorithm.rebn_eps=1e-6",
                *overrides,
            ],
        )


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A local model directory verl's HFModelConfig accepts: gem_core's test tokenizer and a tiny config."""
    from transformers import Qwen2Config

    from gem_core.testing import build_test_tokenizer, save_test_tokenizer

    # The tokenizer lives in its own folder: beside a qwen2 config.json, transformers 5 would load it
    # as a Qwen2Tokenizer (other pre-tokenisation) instead of the saved fast tokenizer.
    directory = str(tmp_path_factory.mktemp("model"))
    save_test_tokenizer(os.path.join(directory, "tokenizer"))
    Qwen2Config(
        vocab_size=len(build_test_tokenizer()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        architectures=["Qwen2ForCausalLM"],
    ).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def verl_config(model_dir):
    return compose_verl_config(model_dir)


@pytest.fixture(scope="session")
def golden():
    return golden_scenario()


def golden_rows(scenario) -> list[dict]:
    """The golden episodes as the non-tensor columns verl's RL dataset gives an agent loop."""
    assert GOLDEN_PARAMS.max_tokens == scenario.params.max_tokens
    rows = []
    for i, (episode, trajectory) in enumerate(zip(scenario.episodes, scenario.trajectories)):
        rows.append(
            {
                "agent_name": "gem_env",
                "raw_prompt": [{"role": "user", "content": trajectory.initial_observation}],
                "data_source": episode.env_id,
                "env_id": episode.env_id,
                "env_seed": episode.seed,
                "env_kwargs": json.dumps(episode.env_kwargs),
                "env_tools": ",".join(episode.tools),
                "max_turns": 0,
                "max_turn_tokens": scenario.params.max_tokens,
                "max_context_tokens": GOLDEN_MAX_CONTEXT_TOKENS,
                "episode_id": episode.episode_id,
                "index": i,
            }
        )
    return rows
