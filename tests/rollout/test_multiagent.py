"""Multi-agent episodes: run_multiagent_episode (one trajectory per agent, train_agents), the turn-aware
batch and ReBN over its trajectories, AgentView, and the three kinds of user simulator."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from gem_core.algo import rebn
from gem_core.batch import sequence_batch, turn_batch
from gem_core.envs.retail.env import STOP, RetailEnv, ScriptedUser
from gem_core.errors import GemError, ResetNeeded
from gem_core.multiagent import AgentView, CallableSimulator, MultiAgentEnv, Simulator
from gem_core.rollout import Generation, RunConfig, SamplingParams, ScriptedPolicy, run_episode
from gem_core.rollout.multiagent import PolicySimulator, endpoint_simulator, run_multiagent_episode, run_multiagent_episodes
from gem_core.testing.fake_server import FakeChatServer

CONFIG = RunConfig(params=SamplingParams(max_tokens=400))


def oracle_policy(tokenizer, env: RetailEnv) -> ScriptedPolicy:
    """The assistant: the env's own solution, token in and token out."""
    return ScriptedPolicy(tokenizer, lambda context: env.oracle_action())


def last_message(context: str) -> str:
    """The newest user message of a decoded ChatML context."""
    return context.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


class ScriptedUserPolicy:
    """The scripted customer as a token-level policy (what a model playing the user would be)."""

    def __init__(self, tokenizer, env: RetailEnv):
        self.env, self.user = env, ScriptedUser()
        self.policy = ScriptedPolicy(tokenizer, self._respond)

    def _respond(self, context: str) -> str:
        if self.user.sent == 0:
            self.user.reset("", {"user_task": self.env.task.user_view()})
            return self.user.act("")
        return self.user.act(last_message(context))

    async def generate(self, prompt_ids, params, *, request_id=""):
        return await self.policy.generate(prompt_ids, params, request_id=request_id)


def play(tokenizer, formatter, seed=1, **kwargs) -> tuple[RetailEnv, dict]:
    env = RetailEnv()
    policies = {"assistant": oracle_policy(tokenizer, env), "user": ScriptedUserPolicy(tokenizer, env)}
    trajectories = asyncio.run(run_multiagent_episode(env, policies, formatter, CONFIG, seed=seed, episode_id=f"ep{seed}", group_id="g", **kwargs))
    return env, trajectories


def test_one_trajectory_per_agent_with_its_own_turns_and_rewards(tokenizer, formatter):
    env, trajectories = play(tokenizer, formatter)
    assistant, user = trajectories["assistant"], trajectories["user"]
    assert assistant.num_turns == 5 and user.num_turns == 3  # ask, 3 tool calls, "done"; request, facts, stop
    assert assistant.rewards == [0, 0, 0, 0, 1.0] and user.rewards == [0, 0, 1.0]  # the final reward reaches both
    assert assistant.terminated and user.terminated and not assistant.truncated
    assert assistant.success and user.success  # the user's step ended it; the outcome reaches both
    assert (assistant.episode_id, user.episode_id, assistant.group_id) == ("ep1/assistant", "ep1/user", "g/assistant")
    # each context holds only its own agent's stream, and stays consistent turn by turn
    for trajectory in (assistant, user):
        for index in range(trajectory.num_turns):
            trajectory.context_ids(index)
    user_text = tokenizer.decode(user.full_ids())
    assistant_text = tokenizer.decode(assistant.full_ids())
    assert "<tool_response>" not in user_text and "find_user_id_by_name_zip" not in user_text
    assert "<tool_response>" in assistant_text and env.task.instruction()[:60] not in assistant_text
    assert user.turns[1].response_text in assistant_text and assistant.turns[0].response_text in user_text
    tool_turn = assistant.turns[1]  # a tool's result is shown in the template's tool role (Qwen3: <tool_response> in a user turn)
    assert tool_turn.is_tool_call and tool_turn.obs_delta_ids == formatter.observation_ids(tool_turn.message, tool_turn.response_ids, formatter.tool_role)
    assert tool_turn.obs_delta_ids != formatter.observation_ids(tool_turn.message, tool_turn.response_ids, "user")


def test_train_agents_picks_the_trajectories_but_every_agent_plays(tokenizer, formatter):
    env, trajectories = play(tokenizer, formatter, train_agents=["assistant"])
    assert list(trajectories) == ["assistant"] and trajectories["assistant"].rewards[-1] == 1.0  # the user played
    with pytest.raises(ValueError, match="not agents"):
        play(tokenizer, formatter, train_agents=["manager"])


def test_the_trajectories_go_through_the_turn_aware_batch_and_rebn(tokenizer, formatter):
    episodes = [play(tokenizer, formatter, seed=seed)[1] for seed in range(3)]
    wrong_env = RetailEnv(task_kind="cancel")
    policies = {"assistant": ScriptedPolicy(tokenizer, lambda c: "Your order has been cancelled."), "user": ScriptedUserPolicy(tokenizer, wrong_env)}
    episodes.append(asyncio.run(run_multiagent_episode(wrong_env, policies, formatter, CONFIG, seed=0, episode_id="bad")))
    trajectories = [t for episode in episodes for t in episode.values()]
    turns = sum(t.num_turns for t in trajectories)
    for batch in (turn_batch(trajectories), sequence_batch(trajectories)):
        assert len(batch.turn_slots()) == turns
        rewards, _ = batch.episode_rewards()
        assert rewards == [t.rewards for t in trajectories]
        advantages = batch.advantages(gamma=0.9)
        expected = batch.per_token(rebn([t.rewards for t in trajectories], gamma=0.9))
        np.testing.assert_allclose(advantages, expected, atol=1e-12)
        assert np.any(advantages != 0) and np.all(advantages[batch.loss_mask == 0] == 0)
    assert len(turn_batch(trajectories)) == turns


def test_the_user_can_be_a_simulator_and_its_turns_are_recorded_as_text(tokenizer, formatter):
    env = RetailEnv()
    policies = {"assistant": oracle_policy(tokenizer, env), "user": ScriptedUser()}
    trajectories = asyncio.run(run_multiagent_episode(env, policies, formatter, CONFIG, seed=2))
    user = trajectories["user"]
    assert not user.token_mode and user.num_turns == 3 and user.turns[0].action.startswith("Hi!") and STOP in user.turns[-1].action
    assert user.turns[0].message == trajectories["assistant"].turns[0].action  # what the user was shown next
    assert trajectories["assistant"].rewards[-1] == 1.0 == user.rewards[-1]


class Relay(MultiAgentEnv):
    """A toy env: "a" then "b" speak in turn; "b" is paid 1 for each of "a"'s turns; the third step by "a" ends
    it with 5 for "a". "a" gets 0.5 at reset time, before it ever acts (through b's first reward)."""

    agents = ("b", "a")
    max_turns = 50

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.turn, self.a_steps = "b", 0
        return {"a": "You are a.", "b": "You are b."}, {}

    @property
    def current_agent(self):
        return self.turn

    def step(self, action):
        if self.turn == "b":
            self.turn = "a"
            return {"a": f"b said {action}"}, {"a": 0.5 if self.a_steps == 0 else 0.0}, False, False, {}
        self.a_steps += 1
        self.turn = "b" if self.a_steps < 3 else None
        done = self.a_steps == 3
        return {"b": f"a said {action}"}, {"a": 5.0 if done else 0.0, "b": 1.0}, done, False, {}


def test_rewards_reach_each_agent_on_its_own_turns(tokenizer, formatter):
    policies = {"a": ScriptedPolicy(tokenizer, lambda c: "hi"), "b": CallableSimulator(lambda text: "yo")}
    trajectories = asyncio.run(run_multiagent_episode(Relay(), policies, formatter, CONFIG, seed=0))
    assert trajectories["a"].rewards == [0.5, 0.0, 5.0]  # 0.5 arrived before a's first turn
    assert trajectories["b"].rewards == [1.0, 1.0, 1.0]  # paid after each of its turns, on a's step
    assert "b said yo" in tokenizer.decode(trajectories["a"].prompt_ids)


def test_limits_end_the_episode_for_every_agent(tokenizer, formatter):
    policies = {"a": ScriptedPolicy(tokenizer, lambda c: "hi"), "b": ScriptedPolicy(tokenizer, lambda c: "yo")}
    limited = asyncio.run(run_multiagent_episode(Relay(), policies, formatter, {"a": CONFIG, "b": CONFIG.replace(max_turns=2)}))
    assert [t.truncation_reason for t in limited.values()] == ["max_turns", "max_turns"]
    assert limited["b"].num_turns == 2 and limited["a"].num_turns == 2
    tight = asyncio.run(run_multiagent_episode(Relay(), policies, formatter, CONFIG.replace(max_context_tokens=40)))
    assert all(t.truncation_reason == "context_limit" for t in tight.values())
    assert all(len(t.full_ids()) <= 40 for t in tight.values() if t.prompt_ids)

    class Aborting:
        async def generate(self, prompt_ids, params, *, request_id=""):
            return Generation([1], None, "abort")

    aborted = asyncio.run(run_multiagent_episode(Relay(), {"a": Aborting(), "b": policies["b"]}, formatter, CONFIG))
    assert all(t.infra_error and t.truncation_reason == "abort" for t in aborted.values())
    with pytest.raises(ValueError, match="no policy"):
        asyncio.run(run_multiagent_episode(Relay(), {"a": policies["a"]}, formatter, CONFIG))
    with pytest.raises(TypeError, match="needs a ChatFormatter"):
        asyncio.run(run_multiagent_episode(Relay(), policies, None, CONFIG))


def test_run_multiagent_episodes_plays_a_batch_of_groups(tokenizer, formatter):
    policies = {"a": ScriptedPolicy(tokenizer, lambda c: "hi"), "b": ScriptedPolicy(tokenizer, lambda c: "yo")}
    batch = asyncio.run(run_multiagent_episodes(Relay, policies, formatter, CONFIG, seeds=[0, 1, 2], train_agents=["a"]))
    assert [list(episode) for episode in batch] == [["a"]] * 3
    assert [episode["a"].episode_id for episode in batch] == ["ep0/a", "ep1/a", "ep2/a"]
    groups = asyncio.run(run_multiagent_episodes(Relay, policies, formatter, CONFIG, seeds=[7, 8], group_size=2))
    assert [(e["b"].episode_id, e["b"].group_id, e["b"].seed) for e in groups] == [
        ("ep0-0/b", "ep0/b", 7),
        ("ep0-1/b", "ep0/b", 7),
        ("ep1-0/b", "ep1/b", 8),
        ("ep1-1/b", "ep1/b", 8),
    ]
    with pytest.raises(ValueError, match="group_size"):
        asyncio.run(run_multiagent_episodes(Relay, policies, formatter, CONFIG, seeds=[0], group_size=0))


def test_a_chat_policy_can_play_an_agent_with_tool_messages():
    class OracleChat:
        def __init__(self, env):
            self.env, self.seen = env, []

        async def chat(self, messages, params, *, request_id=""):
            self.seen.append([m["role"] for m in messages])
            return Generation([], None, "stop", text=self.env.oracle_action())

    env = RetailEnv(task_kind="cancel")
    assistant = OracleChat(env)
    trajectories = asyncio.run(run_multiagent_episode(env, {"assistant": assistant, "user": ScriptedUser()}, None, CONFIG, seed=0))
    trajectory = trajectories["assistant"]
    assert not trajectory.token_mode and trajectory.rewards[-1] == 1.0 and trajectory.num_turns == 5
    assert [m["role"] for m in trajectory.messages] == ["user", "assistant", "user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant"]
    assert assistant.seen[-1] == [m["role"] for m in trajectory.messages[:-1]]


# -- AgentView and the simulators ------------------------------------------------------------------


def solve_with(user: Simulator, seed: int = 0) -> tuple[float, dict[str, Any], AgentView]:
    view = AgentView(RetailEnv(), "assistant", others={"user": user})
    view.reset(seed=seed)
    total, info = 0.0, {}
    for _ in range(view.max_turns):
        _, reward, terminated, truncated, info = view.step(view.oracle_action())
        total += reward
        if terminated or truncated:
            break
    return total, info, view


def scripted_reply(messages: list[dict[str, str]]) -> str:
    """The scripted customer's answer to a chat conversation whose first message is its instruction (the
    model behind the endpoint, the chat policy and the token policy in these tests)."""
    messages = [m for m in messages if m["role"] != "system"]
    instruction = messages[0]["content"]
    facts = {line.split(":", 1)[0][2:]: line.split(":", 1)[1].strip() for line in instruction.splitlines() if line.startswith("- ")}
    request = instruction.split("What you want: ", 1)[1].split("\n", 1)[0].replace("your ", "my ").replace("you ", "I ")
    user = ScriptedUser()
    user.reset("", {"user_task": {"facts": facts, "request": request}})
    reply = user.act("")
    for message in messages[1:]:
        if message["role"] == "user":
            reply = user.act(message["content"])
    return reply


def test_the_scripted_user_is_the_default_simulator():
    total, info, view = solve_with(ScriptedUser())
    assert total == 1.0 and info["success"]
    assert isinstance(AgentView(RetailEnv()).others["user"], ScriptedUser)


def test_any_token_level_policy_can_play_the_user(tokenizer, formatter):
    policy = ScriptedPolicy(tokenizer, lambda context: scripted_reply(_chatml_messages(context)))
    simulator = PolicySimulator(policy, formatter, give_up=STOP)
    total, info, _ = solve_with(simulator, seed=3)
    assert total == 1.0 and info["user_stopped"] and policy.calls == 3
    assert tokenizer.decode(simulator.context).count("<|im_start|>assistant") == 3  # one context, appended to


def _chatml_messages(context: str) -> list[dict[str, str]]:
    messages = []
    for block in context.split("<|im_start|>")[1:]:
        role, _, content = block.partition("\n")
        content = content.split("<|im_end|>", 1)[0]
        if role in ("user", "assistant", "system"):
            messages.append({"role": role, "content": content})
    return messages[:-1]  # the last block is the generation prompt


def test_a_chat_policy_can_play_the_user_and_its_failure_is_infrastructure(tokenizer, formatter):
    class Chat:
        async def chat(self, messages, params, *, request_id=""):
            return Generation([], None, "stop", text=scripted_reply(messages))

    total, info, view = solve_with(PolicySimulator(Chat()), seed=4)
    assert total == 1.0 and info["success"]

    class Down:
        async def chat(self, messages, params, *, request_id=""):
            raise GemError("the endpoint is down")

    view = AgentView(RetailEnv(), others={"user": PolicySimulator(Down())})
    obs, info = view.reset(seed=0)
    assert "the user simulator failed: the endpoint is down" in info["infra_error"]
    _, reward, terminated, truncated, info = view.step("hello")  # the first step reports the end
    assert truncated and not terminated and reward == 0.0 and info["truncation_reason"] == "infra_error"
    with pytest.raises(ResetNeeded, match="finished episode"):
        view.step("hello")
    # through the runner: one turn, the episode kept out of training as an infrastructure failure
    trajectory = asyncio.run(run_episode(view, ScriptedPolicy(tokenizer, lambda c: "hello"), formatter, CONFIG, seed=0))
    assert trajectory.infra_error and trajectory.truncation_reason == "infra_error" and trajectory.num_turns == 1


def test_an_openai_compatible_endpoint_can_play_the_user():
    with FakeChatServer(scripted_reply) as server:
        simulator = endpoint_simulator(server.base_url, "fake-user", params=SamplingParams(max_tokens=1000), give_up=STOP)
        total, info, view = solve_with(simulator, seed=5)
        assert total == 1.0 and info["success"] and len(server.requests) == 3
        twin = view.clone()
        assert twin.others["user"].policy is simulator.policy and twin.others["user"].messages == simulator.messages
        assert twin.others["user"].messages is not simulator.messages
        simulator.policy.close()


def test_agent_view_gives_a_reward_earned_before_the_first_move_with_the_first_step():
    view = AgentView(Relay(), "a", others={"b": CallableSimulator(lambda text: "yo")})
    observation, info = view.reset(seed=0)
    assert observation == "You are a.\n\nb said yo" and info["agent_rewards"] == {"b": 0.0, "a": 0.5}
    rewards = [view.step("hi")[1] for _ in range(3)]
    assert rewards == [0.5, 0.0, 5.0]
    state = view.get_state()
    assert state["carry"] == 0.0 and state["others"]["b"] == {}


def test_agent_view_refuses_bad_construction():
    with pytest.raises(ValueError, match="not one of"):
        AgentView(RetailEnv(), "manager")
    with pytest.raises(ValueError, match="needs a simulator for \\['b'\\]"):
        AgentView(Relay(), "a")
    with pytest.raises(TypeError, match="no act"):
        AgentView(Relay(), "a", others={"b": object()})
    with pytest.raises(TypeError, match="MultiAgentEnv"):
        AgentView(object())


def test_agent_view_plays_through_the_single_agent_runner(tokenizer, formatter):
    view = AgentView(RetailEnv(task_kind="return"))
    trajectory = asyncio.run(run_episode(view, ScriptedPolicy(tokenizer, lambda c: view.oracle_action()), formatter, CONFIG, seed=0))
    assert trajectory.terminated and trajectory.rewards[-1] == 1.0 and trajectory.num_turns == 5
    assert "Hi! I would like to return" in trajectory.initial_message
