"""play_row: the one way a trainer plugin plays a dataset row (a TaskSpec) on the runner."""

from __future__ import annotations

import asyncio

import pytest

import gem_core
from gem_core.rollout import ChatFormatter, RunConfig, SamplingParams, ScriptedPolicy, ThreadedEnv, play_row, row_config, run_episode
from gem_core.tasks import TaskSpec
from gem_core.testing.golden import golden_respond

GTN = "game:GuessTheNumber-v0-easy"


class Recording:
    """Wraps a policy; records each request's prompt length and sampling params."""

    def __init__(self, inner):
        self.inner = inner
        self.requests: list[tuple[int, SamplingParams]] = []

    async def generate(self, prompt_ids, params, *, request_id=""):
        self.requests.append((len(prompt_ids), params))
        return await self.inner.generate(prompt_ids, params, request_id=request_id)


class Closing:
    """Counts close() of the env a spec makes."""

    closed = 0

    def __init__(self, spec: TaskSpec):
        self.spec = spec
        for name in ("env_id", "seed", "max_turns", "max_turn_tokens", "max_context_tokens"):
            setattr(self, name, getattr(spec, name))

    def make_env(self):
        env = self.spec.make_env()
        close = env.close

        def counted():
            Closing.closed += 1
            close()

        env.close = counted
        return env


@pytest.fixture
def policy(tokenizer):
    return ScriptedPolicy(tokenizer, golden_respond)


def test_a_row_plays_as_the_runner_plays_its_env_by_hand(tokenizer, policy):
    spec = TaskSpec(GTN, seed=4, max_turns=3, max_turn_tokens=24, system_prompt="Play.")
    formatter = ChatFormatter(tokenizer, system_prompt=spec.system_prompt)
    config = RunConfig(params=SamplingParams(max_tokens=64))
    row = asyncio.run(play_row(spec, policy, formatter, config, episode_id="e"))
    by_hand = asyncio.run(
        run_episode(gem_core.make(GTN), policy, formatter, RunConfig(params=SamplingParams(max_tokens=24), max_turns=3), seed=4, episode_id="e")
    )
    assert row.env_id == GTN and row.seed == 4 and row.episode_id == "e"
    assert [t.response_ids for t in row.turns] == [t.response_ids for t in by_hand.turns]
    assert row.prompt_ids == by_hand.prompt_ids and row.rewards == by_hand.rewards and len(row.turns) <= 3


def test_the_rows_limits_win_over_the_trainers_defaults_and_the_budget_caps_both():
    defaults = RunConfig(params=SamplingParams(max_tokens=100), max_turns=9, max_context_tokens=5000)
    unset = TaskSpec(GTN)
    assert row_config(unset, defaults) == defaults
    own = row_config(TaskSpec(GTN, max_turns=2, max_turn_tokens=300, max_context_tokens=8000), defaults)
    assert (own.params.max_tokens, own.max_turns, own.max_context_tokens) == (300, 2, 8000)
    capped = row_config(TaskSpec(GTN, max_turn_tokens=300, max_context_tokens=8000), defaults, prompt_tokens=120, response_budget=256)
    assert (capped.params.max_tokens, capped.max_context_tokens) == (256, 120 + 256)  # within the budget after the prompt
    roomy = row_config(TaskSpec(GTN, max_context_tokens=200), defaults, prompt_tokens=120, response_budget=256)
    assert roomy.max_context_tokens == 200  # the row's own limit, when it is the tighter one
    with pytest.raises(ValueError, match="prompt_tokens"):
        row_config(unset, defaults, response_budget=10)


def test_the_response_budget_bounds_everything_after_the_first_prompt(tokenizer, policy):
    spec = TaskSpec(GTN, seed=1)
    formatter = ChatFormatter(tokenizer)
    recording = Recording(policy)
    trajectory = asyncio.run(play_row(spec, recording, formatter, RunConfig(params=SamplingParams(max_tokens=64)), response_budget=40))
    first_prompt = recording.requests[0][0]
    assert all(params.max_tokens <= 40 for _, params in recording.requests)
    assert all(length + params.max_tokens <= first_prompt + 40 for length, params in recording.requests)
    assert trajectory.turns and len(trajectory.as_sequence().response_ids) <= 40


def test_the_env_it_makes_is_closed_and_one_given_is_the_callers(tokenizer, policy):
    formatter = ChatFormatter(tokenizer)
    Closing.closed = 0
    asyncio.run(play_row(Closing(TaskSpec(GTN, seed=0)), policy, formatter))
    assert Closing.closed == 1

    class Broken:
        async def generate(self, prompt_ids, params, *, request_id=""):
            raise RuntimeError("engine down")

    with pytest.raises(RuntimeError, match="engine down"):
        asyncio.run(play_row(Closing(TaskSpec(GTN, seed=0)), Broken(), formatter))
    assert Closing.closed == 2  # closed on the way out of a failure too

    spec = Closing(TaskSpec(GTN, seed=2))
    given = spec.make_env()
    mine = asyncio.run(play_row(spec, policy, formatter, env=ThreadedEnv(given, in_thread=False)))
    assert mine.turns and Closing.closed == 2  # not closed: the caller made it, the caller closes it
    given.close()
    assert Closing.closed == 3


def test_a_row_whose_env_shows_no_text_is_one_clear_error(tokenizer, policy):
    class Picture(gem_core.Env):
        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return {"pixels": [0]}, {}

        def step(self, action):
            return "", 0.0, True, False, {}

    spec = TaskSpec(GTN, seed=0)
    with pytest.raises(TypeError, match="reset"):
        asyncio.run(play_row(spec, policy, ChatFormatter(tokenizer), env=Picture()))


@pytest.mark.parametrize("env_id", ["terminal:Tasks-v0", "multiagent:Retail-v0"])
def test_a_row_of_the_terminal_and_multi_agent_families_plays_to_success(tokenizer, env_id):
    """Every trainer plugin plays its rows with play_row: a terminal task (a shell in the sandbox) and the
    retail store (the scripted customer inside the env) play there like any env. The policy answers with
    the oracle of a twin env made from the same row and stepped with the same actions."""
    if env_id.startswith("terminal:"):
        from gem_core.tools.sandbox.policy import SandboxUnavailable, require_bwrap

        try:
            require_bwrap()
        except SandboxUnavailable as exc:
            pytest.skip(str(exc))
    spec = TaskSpec(env_id, seed=1, max_turn_tokens=512)
    twin = spec.make_env()
    twin.reset(seed=spec.seed)

    def respond(_context: str) -> str:
        action = twin.unwrapped.oracle_action()
        twin.step(action)
        return action

    try:
        config = RunConfig(params=SamplingParams(max_tokens=512))
        trajectory = asyncio.run(play_row(spec, ScriptedPolicy(tokenizer, respond), ChatFormatter(tokenizer), config, episode_id="e"))
    finally:
        twin.close()
    assert trajectory.env_id == env_id and trajectory.infra_error is None
    assert trajectory.terminated and trajectory.success and trajectory.rewards[-1] == 1.0
    assert trajectory.num_turns >= 2 and all(turn.response_ids for turn in trajectory.turns)
