"""The retail multi-agent episode with the real model (SmolLM2-135M-Instruct through the real vLLM) on both
sides: the assistant, and the customer (the same engine). Whatever the model says, the structure holds:
one trajectory per agent, turns that alternate, rewards in the allowed set, contexts within their bound."""

from __future__ import annotations

import asyncio

import pytest

from gem_core.batch import turn_batch
from gem_core.envs.retail.db import TOOLS
from gem_core.envs.retail.env import STOP, RetailEnv
from gem_core.multiagent import AgentView
from gem_core.rollout import ChatFormatter, RunConfig, SamplingParams, VLLMPolicy, run_episode
from gem_core.rollout.multiagent import PolicySimulator, run_multiagent_episodes

pytest.importorskip("vllm")

MAX_CONTEXT = 1000  # under the engine's max_model_len (1024, tests/real/conftest.py)
CONFIG = RunConfig(params=SamplingParams(max_tokens=32, temperature=0.0), max_context_tokens=MAX_CONTEXT)
PENALTY = -0.1
# per turn: 0, a format penalty, the final 0/1, or both (a malformed call on the turn the limit ends)
ASSISTANT_REWARDS = {0.0, PENALTY, 1.0, 1.0 + PENALTY}
USER_REWARDS = {0.0, 1.0}


@pytest.fixture(scope="module")
def policy(llm):
    import vllm

    return VLLMPolicy(llm, seed=0, sampling_params_cls=vllm.SamplingParams)


def test_the_real_model_plays_assistant_and_customer(policy, tokenizer):
    formatter = ChatFormatter(tokenizer)
    episodes = asyncio.run(
        run_multiagent_episodes(lambda: RetailEnv(max_turns=6, format_penalty=PENALTY), {"assistant": policy, "user": policy}, formatter, CONFIG, seeds=[0, 1])
    )
    trajectories = []
    for episode in episodes:
        assert set(episode) == {"assistant", "user"}
        assistant, user = episode["assistant"], episode["user"]
        assert user.num_turns >= 1 and assistant.done and user.done and assistant.infra_error is None
        # turns alternate between the agents: the customer speaks first, and each of its later messages
        # answers at least one assistant turn
        assert all(turn.info["agent"] == "user" for turn in user.turns)
        assert all(turn.info["agent"] == "assistant" for turn in assistant.turns)
        assert assistant.num_turns >= user.num_turns - 1
        assert user.num_turns + assistant.num_turns <= 6
        assert set(assistant.rewards) <= ASSISTANT_REWARDS and set(user.rewards) <= USER_REWARDS
        # both get the one final reward; the assistant also its penalties (malformed calls, unknown tools)
        penalised = sum(bool(t.info.get("format_error") or (t.info.get("invalid_action") and t.info.get("tool") not in TOOLS)) for t in assistant.turns)
        assert sum(assistant.rewards) == pytest.approx(sum(user.rewards) + PENALTY * penalised)
        assert assistant.success == user.success == (user.rewards[-1] == 1.0)
        for trajectory in (assistant, user):
            assert trajectory.token_mode and len(trajectory.full_ids()) <= MAX_CONTEXT
            for index, turn in enumerate(trajectory.turns):
                assert 0 < len(turn.response_ids) <= CONFIG.params.max_tokens and len(turn.logprobs) == len(turn.response_ids)
                trajectory.context_ids(index)  # each agent's context is consistent turn by turn
        assert "<tool_response>" not in tokenizer.decode(user.full_ids())  # tool results reach the assistant alone
        trajectories += [assistant, user]
    batch = turn_batch(trajectories)
    assert len(batch.turn_slots()) == sum(t.num_turns for t in trajectories)
    assert batch.advantages().shape == batch.loss_mask.shape


def test_the_real_model_as_the_user_simulator_inside_agent_view(llm, policy, tokenizer):
    import vllm

    formatter = ChatFormatter(tokenizer)
    # the simulator's own VLLMPolicy over the same engine: it batches on the simulators' event loop
    simulator = PolicySimulator(
        VLLMPolicy(llm, seed=1, sampling_params_cls=vllm.SamplingParams),
        formatter,
        params=SamplingParams(max_tokens=32, temperature=0.0),
        max_context_tokens=MAX_CONTEXT,
        give_up=STOP,
    )
    env = AgentView(RetailEnv(max_turns=6, format_penalty=PENALTY), "assistant", others={"user": simulator})
    trajectory = asyncio.run(run_episode(env, policy, formatter, CONFIG, seed=2))
    assert trajectory.done and trajectory.infra_error is None and trajectory.num_turns >= 1
    assert trajectory.initial_message.startswith("You are the customer-service agent")
    assert len(trajectory.full_ids()) <= MAX_CONTEXT and len(simulator.context) <= MAX_CONTEXT
    assert set(trajectory.rewards) <= ASSISTANT_REWARDS
    assert trajectory.turns[-1].info["agent_rewards"]["assistant"] == trajectory.rewards[-1]
