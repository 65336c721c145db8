"""Every registered env passes the env checker: its API contract, and that the state the next move needs
reaches the model's context after reset and after every step (the runner, the chat template and
``gem_core.model_message`` together)."""

from __future__ import annotations

import pytest

import gem_core
from gem_core.multimodal import MultimodalObservation, observation_text
from gem_core.testing.env_checker import EnvCheckError, check_env, check_model_context
from gem_core.testing.task_data import generic_test_ids

pytest.importorskip("transformers", reason="the model-context check uses the local test tokenizer")

ENV_IDS = generic_test_ids(sorted(gem_core.list_envs()))  # rg:* sampled: one class, each played in test_reasoning_gym.py


@pytest.fixture(scope="module")
def tokenizer():
    from gem_core.testing import build_test_tokenizer

    return build_test_tokenizer("qwen3")


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_contract(env_id):
    env = gem_core.make(env_id)
    try:
        check_env(env, seed=3)
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_model_sees_the_state(env_id, tokenizer):
    env = gem_core.make(env_id)
    formatter = None
    if env_id.startswith("vision:"):  # pictures: the tiny VL model's processor renders them
        from gem_core.rollout import VLChatFormatter
        from gem_core.testing.vision import build_tiny_vl_processor

        formatter = VLChatFormatter(build_tiny_vl_processor())
    try:
        turns = check_model_context(env, tokenizer, seeds=(0, 1), max_turns=6, formatter=formatter)
    finally:
        env.close()
    assert turns >= 2


class _HiddenBoard(gem_core.Env):
    """A game that keeps its board in info['suffix'] and reports it as its state text."""

    def __init__(self, show_suffix: bool = True):
        self.show_suffix = show_suffix
        self.board = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.board = 0
        return "Rules.", {"suffix": f"Board {self.board}" if self.show_suffix else ""}

    def step(self, action):
        self.board += 1
        return "Moved.", 0.0, self.board >= 3, False, {"suffix": f"Board {self.board}" if self.show_suffix else ""}

    def state_text(self):
        return f"Board {self.board}"

    def sample_random_action(self):
        return "\\boxed{1}"


def test_checker_catches_a_board_the_model_never_sees(tokenizer):
    with pytest.raises(EnvCheckError, match="not in the model's newest message"):
        check_model_context(_HiddenBoard(show_suffix=False), tokenizer)
    assert check_model_context(_HiddenBoard(), tokenizer) == 3


def test_checker_catches_an_env_that_raises_on_bad_input():
    class Fragile(_HiddenBoard):
        def step(self, action):
            if "boxed" not in action:
                raise ValueError("no box")
            return super().step(action)

    with pytest.raises(EnvCheckError, match="raised ValueError"):
        check_env(Fragile())


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_the_first_dataset_prompt_shows_the_state(env_id):
    """make-dataset writes TaskSpec.first_message as a row's prompt: it holds the board too."""
    from gem_core.tasks import TaskSpec

    spec = TaskSpec(env_id, seed=5)
    env = spec.make_env()
    try:
        observation, info = env.reset(seed=5)
        state = env.state_text()
    finally:
        env.close()
    first = spec.first_observation()
    if isinstance(observation, MultimodalObservation):  # a vision env: the row's text part, and the same images
        assert first.images == observation.images
        observation = observation.text
    else:
        assert spec.first_message() == first
    message = observation_text(first)
    assert observation in message
    if state is not None:
        assert state in message
