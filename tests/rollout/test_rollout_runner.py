"""The episode runner: limits and truncation, concurrency, vector envs, groups, reproducibility."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from rollout_envs import ScriptedRewardEnv

import gem_core
from gem_core.rollout import (
    RunConfig,
    ContextLimitExceeded,
    EpisodeSpec,
    Generation,
    RandomPolicy,
    SamplingParams,
    ScriptedPolicy,
    episode_of,
    is_context_refusal,
    run_episode,
    run_episodes,
)
from gem_core.testing.golden import golden_respond


_CONFIG_FIELDS = ("params", "max_turns", "max_context_tokens", "min_turn_tokens", "step_in_thread", "executor")


def _play(env, policy, formatter, **kwargs):
    config = RunConfig(**{k: kwargs.pop(k) for k in _CONFIG_FIELDS if k in kwargs})
    return asyncio.run(run_episode(env, policy, formatter, config, **kwargs))


class Recording:
    """Wraps a policy; records every request (prompt length, params, request id)."""

    def __init__(self, inner):
        self.inner = inner
        self.requests: list[tuple[int, SamplingParams, str]] = []

    async def generate(self, prompt_ids, params, *, request_id=""):
        self.requests.append((len(prompt_ids), params, request_id))
        return await self.inner.generate(prompt_ids, params, request_id=request_id)


@pytest.fixture
def short_policy(tokenizer):
    return ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")


# -- limits and truncation --------------------------------------------------------------------------


def test_context_limit_ends_the_episode_and_keeps_the_reward(tokenizer, formatter, short_policy):
    free = _play(ScriptedRewardEnv([0.3, 0.7, 1.0], obs_chars=100), short_policy, formatter, seed=0)
    first = free.turns[0]
    limit = first.context_len + len(first.response_ids) + len(first.obs_delta_ids)  # the delta fits, no room to answer
    env = ScriptedRewardEnv([0.3, 0.7, 1.0], obs_chars=100)
    trajectory = _play(env, short_policy, formatter, seed=0, max_context_tokens=limit)
    assert trajectory.truncated and not trajectory.terminated
    assert trajectory.truncation_reason == "context_limit"
    assert trajectory.rewards == [0.3] and env.turn == 1  # the env was stepped once, its reward is there
    last = trajectory.turns[-1]
    assert last.truncated and last.info["truncation_reason"] == "context_limit"
    assert last.obs_delta_ids == []  # the observation that did not fit is not in the context
    assert len(trajectory.full_ids()) <= limit
    assert trajectory.as_sequence().token_rewards()[-1] == 0.3


def test_turn_budget_shrinks_to_the_context_left(tokenizer, formatter):
    policy = Recording(ScriptedPolicy(tokenizer, lambda context: "a long answer " * 20 + "\\boxed{1}"))
    prompt_len = len(formatter.prompt_ids(ScriptedRewardEnv([0.0]).reset(seed=0)[0]))
    limit = prompt_len + 30
    trajectory = _play(ScriptedRewardEnv([0.5, 1.0]), policy, formatter, seed=0, max_context_tokens=limit, params=SamplingParams(max_tokens=100))
    assert policy.requests[0][1].max_tokens == 30
    assert trajectory.turns[0].finish_reason == "length" and len(trajectory.turns[0].response_ids) == 30
    assert trajectory.rewards == [0.5]  # stepped with the cut text, then no room for the next turn
    assert trajectory.truncation_reason == "context_limit"
    assert len(trajectory.full_ids()) <= limit


def test_prompt_longer_than_the_context_is_truncated_before_any_step(formatter, short_policy):
    env = ScriptedRewardEnv([1.0], obs_chars=500)
    trajectory = _play(env, short_policy, formatter, seed=0, max_context_tokens=50)
    assert trajectory.num_turns == 0 and trajectory.truncation_reason == "context_limit"
    assert env.turn == 0 and short_policy.calls == 0


def test_runner_turn_limit_keeps_the_last_reward(formatter, short_policy):
    trajectory = _play(ScriptedRewardEnv([0.1, 0.2, 0.3, 0.4]), short_policy, formatter, seed=0, max_turns=2)
    assert trajectory.rewards == [0.1, 0.2]
    assert trajectory.truncation_reason == "max_turns" and trajectory.turns[-1].truncated
    assert trajectory.turns[-1].info["truncation_reason"] == "max_turns"


def test_env_turn_limit_is_marked(formatter, short_policy):
    trajectory = _play(ScriptedRewardEnv([0.0, 0.25], truncate_at_end=True), short_policy, formatter, seed=0)
    assert trajectory.truncated and trajectory.truncation_reason == "max_turns"
    assert trajectory.rewards == [0.0, 0.25]


def test_game_time_limit_keeps_the_closeness_reward(tokenizer, formatter):
    """GuessTheNumber's last-turn closeness reward survives the env's own truncation."""
    policy = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}" if "guessed 1," not in context else "\\boxed{2}")
    env = gem_core.make("game:GuessTheNumber-v0", min_number=1, max_number=50, max_turns=2)
    trajectory = _play(env, policy, formatter, seed=3)
    assert trajectory.truncated and trajectory.truncation_reason == "max_turns"
    assert trajectory.turns[-1].reward == pytest.approx(1.0 - abs(2 - env.target) / 49)


def test_abort_ends_without_stepping(tokenizer, formatter):
    inner = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")

    class AbortsSecondTurn:
        async def generate(self, prompt_ids, params, *, request_id=""):
            if request_id.endswith("turn-1"):
                return Generation([5, 6], None, "abort")
            return await inner.generate(prompt_ids, params, request_id=request_id)

    env = ScriptedRewardEnv([0.4, 1.0])
    trajectory = _play(env, AbortsSecondTurn(), formatter, seed=0)
    assert env.turn == 1 and trajectory.rewards == [0.4]
    assert trajectory.truncation_reason == "abort" and trajectory.turns[-1].truncated


def test_engine_context_error_becomes_a_truncation(tokenizer, formatter):
    inner = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")

    class Refuses:
        async def generate(self, prompt_ids, params, *, request_id=""):
            if request_id.endswith("turn-2"):
                raise ContextLimitExceeded("prompt too long")
            return await inner.generate(prompt_ids, params, request_id=request_id)

    trajectory = _play(ScriptedRewardEnv([0.1, 0.2, 0.3]), Refuses(), formatter, seed=0)
    assert trajectory.rewards == [0.1, 0.2] and trajectory.truncation_reason == "context_limit"


class _RemoteError(RuntimeError):
    """Ray's RayTaskError shape: its own text names the task, the remote error is ``cause``."""

    def __init__(self, cause: BaseException):
        super().__init__("ray::vLLMHttpServer.generate() failed")
        self.cause = cause


#: What engines say when a prompt does not fit the model's window (gem_core.rollout.CONTEXT_REFUSAL's sources).
ENGINE_REFUSALS = [
    ValueError("The decoder prompt (length 600) is longer than the maximum model length of 512."),  # vLLM 0.8 (oat's pin)
    RuntimeError(  # vLLM 0.29+ (VLLMValidationError is not a ValueError)
        "This model's maximum context length is 512 tokens. However, your prompt contains 600 input tokens, which exceeds this limit"
    ),
    RuntimeError("The decoder prompt (length 512) plus the number of requested output tokens (at least 1) is longer than the maximum model length of 512."),
    _RemoteError(ValueError("Prompt length (512) leaves no room to generate within the model's maximum context length (512); need at least 1")),  # verl
    ValueError("The input (600 tokens) is longer than the model's context length (512 tokens)."),  # SGLang
    ContextLimitExceeded("a prompt of 600 tokens for max_model_len 512"),
]


@pytest.mark.parametrize("refusal", ENGINE_REFUSALS, ids=lambda e: type(e).__name__ + ":" + str(e)[:30])
def test_an_engines_context_refusal_in_its_own_words_ends_that_episode_at_the_context_limit(tokenizer, formatter, refusal):
    inner = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")

    class Refuses:
        async def generate(self, prompt_ids, params, *, request_id=""):
            if request_id.endswith("turn-2"):
                raise refusal
            return await inner.generate(prompt_ids, params, request_id=request_id)

    assert is_context_refusal(refusal)
    trajectory = _play(ScriptedRewardEnv([0.1, 0.2, 0.3]), Refuses(), formatter, seed=0)
    assert trajectory.rewards == [0.1, 0.2] and trajectory.truncation_reason == "context_limit" and trajectory.truncated
    assert trajectory.infra_error is None  # the policy's context ran out: not an infrastructure failure


@pytest.mark.parametrize("error", [ValueError("max_tokens must be at least 1, got 0."), RuntimeError("Connection reset by peer"), _RemoteError(KeyError("x"))])
def test_other_engine_errors_still_fail_the_episode(tokenizer, formatter, error):
    class Fails:
        async def generate(self, prompt_ids, params, *, request_id=""):
            raise error

    assert not is_context_refusal(error)
    with pytest.raises(type(error)):
        _play(ScriptedRewardEnv([0.1]), Fails(), formatter, seed=0)


def test_a_policy_that_overruns_max_tokens_is_an_error(formatter):
    class Greedy:
        async def generate(self, prompt_ids, params, *, request_id=""):
            return Generation([5] * (params.max_tokens + 1), None, "length")

    with pytest.raises(ValueError, match="max_tokens"):
        _play(ScriptedRewardEnv([1.0]), Greedy(), formatter, seed=0, params=SamplingParams(max_tokens=4))


# -- request ids, starting states ------------------------------------------------------------------------


def test_request_ids_name_the_episode_and_turn(formatter, short_policy):
    policy = Recording(short_policy)
    _play(ScriptedRewardEnv([0.0, 0.0, 1.0]), policy, formatter, seed=0, episode_id="abc")
    assert [r[2] for r in policy.requests] == ["abc/turn-0", "abc/turn-1", "abc/turn-2"]
    assert {episode_of(r[2]) for r in policy.requests} == {"abc"}


def test_episode_from_a_cloned_state(tokenizer, formatter):
    env = gem_core.make("game:GuessTheNumber-v0-easy")
    observation, info = env.reset(seed=11)
    clones = env.spawn(2)
    policy = ScriptedPolicy(tokenizer, golden_respond)
    a = _play(clones[0], policy, formatter, observation=observation, reset_info=info, episode_id="a")
    b = _play(env, policy, formatter, seed=11, episode_id="a")
    assert a.to_dict() | {"seed": None} == b.to_dict() | {"seed": None}


# -- concurrency -------------------------------------------------------------------------------------------------


def test_env_steps_do_not_block_other_episodes_generation(tokenizer, formatter):
    running = {"steps": 0, "max_seen_by_generate": 0, "max_steps_at_once": 0}
    lock = threading.Lock()

    class SlowEnv(ScriptedRewardEnv):
        def step(self, action):
            with lock:
                running["steps"] += 1
                running["max_steps_at_once"] = max(running["max_steps_at_once"], running["steps"])
            time.sleep(0.15)
            with lock:
                running["steps"] -= 1
            return super().step(action)

    inner = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")

    class Watching:
        async def generate(self, prompt_ids, params, *, request_id=""):
            running["max_seen_by_generate"] = max(running["max_seen_by_generate"], running["steps"])
            await asyncio.sleep(0.01)
            return await inner.generate(prompt_ids, params, request_id=request_id)

    envs = [SlowEnv([0.0, 1.0]) for _ in range(8)]
    trajectories = asyncio.run(run_episodes(envs, Watching(), formatter, seeds=list(range(8))))
    assert all(t.rewards == [0.0, 1.0] for t in trajectories)
    assert running["max_seen_by_generate"] >= 1  # some generation ran while another episode's step was running
    assert running["max_steps_at_once"] >= 2  # steps of different episodes overlapped (serial steps never do)


# -- batches: pools, vector envs, specs, groups, reproducibility -------------------------------------------


IDS = ["game:GuessTheNumber-v0-easy", "game:Mastermind-v0-easy", "game:GuessTheNumber-v0"]


def _dicts(trajectories):
    return [t.to_dict() for t in trajectories]


def test_same_seeds_same_trajectories_across_sync_async_specs_and_reruns(tokenizer, formatter):
    policy = ScriptedPolicy(tokenizer, golden_respond)
    seeds = [3, 4, 5]
    params = SamplingParams(max_tokens=48)

    def batch(envs):
        return asyncio.run(run_episodes(envs, policy, formatter, RunConfig(params=params), seeds=seeds))

    sync_env = gem_core.make_vec(IDS, vectorization_mode="sync")
    async_env = gem_core.make_vec(IDS, vectorization_mode="async", vector_kwargs={"num_workers": 2})
    try:
        from_sync = batch(sync_env)
        from_async = batch(async_env)
        rerun_async = batch(async_env)  # the same vector env again: explicit resets, no leftover state
    finally:
        sync_env.close()
        async_env.close()
    from_specs = batch([EpisodeSpec(i) for i in IDS])
    from_pool = batch([gem_core.make(i) for i in IDS])
    again = batch([EpisodeSpec(i) for i in IDS])
    reference = _dicts(from_specs)
    assert [t.env_id for t in from_specs] == IDS
    assert all(t.done for t in from_specs) and sum(t.num_turns for t in from_specs) >= 6
    for other in (from_sync, from_async, rerun_async, from_pool, again):
        assert _dicts(other) == reference


def test_random_policy_is_reproducible_whatever_the_scheduling(tokenizer, formatter):
    policy = RandomPolicy(len(tokenizer), seed=1, stop_probability=0.2)
    params = SamplingParams(max_tokens=12)
    envs = [EpisodeSpec("game:Mastermind-v0-easy", seed=s) for s in range(6)]
    wide = asyncio.run(run_episodes(envs, policy, formatter, RunConfig(params=params)))
    narrow = asyncio.run(run_episodes(envs, policy, formatter, RunConfig(params=params), max_concurrency=1))
    assert _dicts(wide) == _dicts(narrow)
    assert len({tuple(t.turns[0].response_ids) for t in wide}) == 6  # different streams per episode


def test_groups_start_from_one_state(tokenizer, formatter):
    policy = RandomPolicy(len(tokenizer), seed=0, stop_probability=0.3)
    vector = gem_core.make_vec("game:GuessTheNumber-v0-random", 4, vectorization_mode="sync")
    try:
        trajectories = asyncio.run(run_episodes(vector, policy, formatter, RunConfig(params=SamplingParams(max_tokens=8)), seeds=[7, 8, None], group_size=2))
    finally:
        vector.close()
    assert [t.episode_id for t in trajectories] == ["ep0-0", "ep0-1", "ep1-0", "ep1-1", "ep2-0", "ep2-1"]
    assert [t.group_id for t in trajectories] == ["ep0", "ep0", "ep1", "ep1", "ep2", "ep2"]
    groups = [trajectories[0:2], trajectories[2:4], trajectories[4:6]]
    for group in groups:
        assert group[0].seed is not None and group[0].seed == group[1].seed  # an unseeded group shares a drawn seed
        assert group[0].initial_observation == group[1].initial_observation  # the range drawn at reset
    assert [g[0].seed for g in groups[:2]] == [7, 8]
    assert groups[0][0].initial_observation != groups[1][0].initial_observation
    assert trajectories[0].turns[0].response_ids != trajectories[1].turns[0].response_ids  # members sample differently


def test_vector_env_errors_truncate_the_episode(tokenizer, formatter):
    class ExplodingEnv(ScriptedRewardEnv):
        def step(self, action):
            if self.turn == 1:
                raise RuntimeError("boom")
            return super().step(action)

    from gem_core.vector import SyncVectorEnv

    vector = SyncVectorEnv([lambda: ExplodingEnv([0.2, 1.0])], on_error="truncate")
    policy = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")
    try:
        (trajectory,) = asyncio.run(run_episodes(vector, policy, formatter, seeds=[0]))
    finally:
        vector.close()
    assert trajectory.rewards == [0.2, 0.0] and trajectory.truncation_reason == "env_error"
    assert "boom" in trajectory.turns[-1].info["error"]


def test_random_policy_fuzz_keeps_the_invariants(tokenizer, formatter):
    """Garbage responses across games: masks, lengths and limits hold for every trajectory."""
    policy = RandomPolicy(len(tokenizer), seed=3, stop_probability=0.02)
    ids = ["game:GuessTheNumber-v0-hard", "game:Mastermind-v0-hard", "game:Wordle-v0-easy", "game:Sudoku-v0-easy"]
    limit = 600
    trajectories = asyncio.run(
        run_episodes(
            [EpisodeSpec(i, seed=s) for i in ids for s in range(3)],
            policy,
            formatter,
            RunConfig(params=SamplingParams(max_tokens=64), max_context_tokens=limit),
        )
    )
    for trajectory in trajectories:
        sequence = trajectory.as_sequence()
        assert len(sequence.input_ids) <= limit
        assert sum(sequence.loss_mask) == sum(len(t.response_ids) for t in trajectory.turns)
        assert trajectory.done
        for turn in trajectory.turns:
            assert turn.finish_reason in ("stop", "length")
            assert (turn.finish_reason == "stop") == (turn.response_ids[-1] == formatter.end_of_turn_id)
    finishes = {turn.finish_reason for t in trajectories for turn in t.turns}
    assert finishes == {"stop", "length"}


def test_vector_env_gets_one_call_per_round_of_steps(tokenizer, formatter):
    """Steps of episodes that are ready together go to the vector env as one subset step."""
    from gem_core.vector import SyncVectorEnv

    class CountingVector(SyncVectorEnv):
        step_calls = 0
        reset_calls = 0

        def step(self, actions):
            CountingVector.step_calls += 1
            return super().step(actions)

        def reset(self, seed=None, options=None):
            CountingVector.reset_calls += 1
            return super().reset(seed=seed, options=options)

    vector = CountingVector([lambda: ScriptedRewardEnv([0.0, 0.0, 1.0]) for _ in range(4)])
    policy = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")
    try:
        trajectories = asyncio.run(run_episodes(vector, policy, formatter, seeds=[0, 1, 2, 3]))
    finally:
        vector.close()
    assert all(t.rewards == [0.0, 0.0, 1.0] for t in trajectories)
    assert [t.reset_info["seed"] for t in trajectories] == [0, 1, 2, 3]
    assert CountingVector.reset_calls == 1 and CountingVector.step_calls == 3  # 12 steps in 3 calls


def test_auto_mode_runs_fast_steps_inline_and_slow_ones_in_threads(tokenizer, formatter, monkeypatch):
    from gem_core.rollout import async_env

    main_thread = threading.get_ident()
    # each step's time is what the env says it took, on a clock of the test's: a busy machine's must not decide it
    now = [0.0]
    monkeypatch.setattr(async_env, "_clock", lambda: now[0])

    class FastEnv(ScriptedRewardEnv):
        seconds = async_env.INLINE_STEP_SECONDS / 10

        def step(self, action):
            self.threads.append(threading.get_ident())
            now[0] += self.seconds
            return super().step(action)

    class SlowEnv(FastEnv):
        seconds = async_env.INLINE_STEP_SECONDS * 8  # 2 ms

    policy = ScriptedPolicy(tokenizer, lambda context: "\\boxed{1}")
    for cls, expected_inline in ((FastEnv, 12), (SlowEnv, 0)):
        env = cls([0.0] * 19 + [1.0])
        env.threads = []
        trajectory = _play(env, policy, formatter, seed=0)
        assert trajectory.rewards[-1] == 1.0 and len(env.threads) == 20
        assert all(t != main_thread for t in env.threads[:8])  # no history yet: in a thread
        # fast: inline from the 9th step on, all 12 of them; slow: never
        assert sum(t == main_thread for t in env.threads[8:]) == expected_inline
