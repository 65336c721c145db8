"""The agent file through OpenRLHF's own loader, MultiTurnAgentExecutor and response->Experience code,
over a vLLM-faithful engine; compared with the core reference (gem_core.testing.golden)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from conftest import (
    UNCAPPED,
    faithful_engine,
    label_of,
    openrlhf_params,
    run_executor,
    samples_generator,
)
from openrlhf.utils.agent import AgentExecutorBase, MultiTurnAgentExecutor

from gem_core.tasks import TaskSpec
from gem_core.rollout import run_episode
from gem_core.testing.golden import (
    GOLDEN_EPISODES,
    GOLDEN_MAX_CONTEXT_TOKENS,
    GOLDEN_PARAMS,
    golden_config,
    golden_formatter,
    golden_policy,
    make_golden_env,
)

IM_END = "<|im_end|>"


def expected_ranges(trajectory):
    return [(turn.context_len, turn.context_len + len(turn.response_ids)) for turn in trajectory.turns]


def assert_matches_reference(reference, responses):
    """Token ids, action ranges, logprobs, rewards and OpenRLHF's masks equal the core reference."""
    generator = samples_generator()
    for trajectory, sequence, response in zip(reference.trajectories, reference.sequences, responses):
        name = trajectory.episode_id
        assert response["observation_tokens"] == sequence.prompt_ids + sequence.response_ids, name
        assert [tuple(r) for r in response["action_ranges"]] == expected_ranges(trajectory), name
        assert response["rollout_log_probs"] == pytest.approx([0.0] * len(sequence.prompt_ids) + sequence.logprobs, abs=1e-12)
        assert response["reward"] == pytest.approx(sum(trajectory.rewards))
        cut = trajectory.turns[-1].finish_reason == "length" or trajectory.truncation_reason == "context_limit"
        assert response["truncated"] == cut, name
        experience = generator._process_response_into_experience(response, max_len=reference.max_context_tokens)
        full_mask = [0] * len(sequence.prompt_ids) + sequence.loss_mask
        assert experience.sequences[0].tolist() == sequence.prompt_ids + sequence.response_ids
        assert experience.action_mask[0].tolist() == full_mask[1:]  # OpenRLHF's action mask is shifted by one
        assert experience.rewards.tolist() == pytest.approx([sum(trajectory.rewards)])


def assert_one_end_of_turn_per_turn(tokenizer, response, trajectory):
    end = tokenizer.convert_tokens_to_ids(IM_END)
    tokens = response["observation_tokens"]
    assert not any(a == b == end for a, b in zip(tokens, tokens[1:])), "a doubled end-of-turn token"
    for (start, stop), turn in zip(response["action_ranges"], trajectory.turns):
        assert (tokens[stop - 1] == end) == (turn.finish_reason == "stop")
        if stop < len(tokens):  # the env's delta follows: it closes the turn only if the model did not
            assert tokens[stop] != end or turn.finish_reason == "length"


def test_openrlhf_loader_loads_the_agent_file(executor):
    assert isinstance(executor, AgentExecutorBase)
    assert isinstance(executor, MultiTurnAgentExecutor)
    assert type(executor).__module__ == "agent_module"  # loaded by path, as OpenRLHF does


def test_scenario_covers_the_interesting_cases(golden, golden_uncapped):
    reasons = {t.truncation_reason for t in golden.trajectories}
    finishes = {turn.finish_reason for t in golden.trajectories for turn in t.turns}
    assert "context_limit" in reasons and "length" in finishes and len(golden.trajectories) == 7
    assert any(turn.info.get("tool_turn") for t in golden.trajectories for turn in t.turns)
    assert "context_limit" in {t.truncation_reason for t in golden_uncapped.trajectories}


def test_capped_episodes_equal_the_core_reference(golden, responses, tokenizer):
    assert_matches_reference(golden, responses)
    for trajectory, response in zip(golden.trajectories, responses):
        assert_one_end_of_turn_per_turn(tokenizer, response, trajectory)


def test_uncapped_episodes_equal_the_core_reference(executor, tokenizer, golden_uncapped):
    responses, engines = zip(*(run_executor(executor, tokenizer, e) for e in golden_uncapped.episodes))
    assert_matches_reference(golden_uncapped, responses)
    for trajectory, response, engine in zip(golden_uncapped.trajectories, responses, engines):
        assert_one_end_of_turn_per_turn(tokenizer, response, trajectory)
        for prompt, params in engine.requests:  # every turn asks for what is left of max_len, as OpenRLHF does
            assert params.max_tokens == GOLDEN_MAX_CONTEXT_TOKENS - len(prompt)


def test_a_model_whose_eos_is_not_the_end_of_turn_token_is_stopped_by_the_agents_stop_tokens(executor, tokenizer, golden):
    # Qwen base models: EOS is <|endoftext|>; the model ends its turn with <|im_end|> and, unstopped,
    # writes on. Only the stop tokens the agent sets on its own copy of the params stop it.
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    responses = [
        run_executor(executor, tokenizer, e, engine=faithful_engine(tokenizer, eos_token_id=eos), max_turn_tokens=GOLDEN_PARAMS.max_tokens)[0]
        for e in golden.episodes
    ]
    assert_matches_reference(golden, responses)


def test_vllms_default_text_settings_change_nothing(executor, tokenizer, golden, responses):
    # vLLM drops the stop token from `text` and, by default, special tokens too: the agent reads token ids.
    params = openrlhf_params(skip_special_tokens=True)
    again = [run_executor(executor, tokenizer, e, params=params, max_turn_tokens=GOLDEN_PARAMS.max_tokens)[0] for e in golden.episodes]
    assert [r["observation_tokens"] for r in again] == [r["observation_tokens"] for r in responses]


def test_openrlhfs_sampling_params_are_not_changed(executor, tokenizer, golden):
    params = openrlhf_params()
    before = dataclasses.replace(params)
    _, engine = run_executor(executor, tokenizer, golden.episodes[0], params=params)
    assert params == before  # OpenRLHF's object, shared by every sample of the prompt
    for _, sent in engine.requests:
        assert sent is not params and sent.stop_token_ids and sent.max_tokens is not None
        assert (sent.logprobs, sent.min_tokens, sent.top_k) == (1, 1, -1)


@pytest.mark.parametrize("source", ["label", "env", "max_new_tokens"])
def test_per_turn_cap_options(executor, tokenizer, golden, responses, monkeypatch, source):
    cap = GOLDEN_PARAMS.max_tokens
    fields, params = {}, openrlhf_params()
    if source == "label":
        fields["max_turn_tokens"] = cap
    elif source == "env":
        monkeypatch.setenv("GEM_OPENRLHF_MAX_TURN_TOKENS", str(cap))
    else:
        params = openrlhf_params(max_tokens=cap)  # --rollout.max_new_tokens, applied per turn
    for episode, expected in zip(golden.episodes, responses):
        response, engine = run_executor(executor, tokenizer, episode, params=params, **fields)
        assert response["observation_tokens"] == expected["observation_tokens"]
        assert all(sent.max_tokens <= cap for _, sent in engine.requests)


def test_label_limits_lower_openrlhfs(executor, tokenizer, golden):
    episode = golden.episodes[1]
    response, _ = run_executor(executor, tokenizer, episode, max_length=4000, max_context_tokens=200, max_turns=2)
    assert len(response["observation_tokens"]) <= 200 and len(response["action_ranges"]) <= 2
    assert response["extra_logs"]["gem_truncated"] == 1.0


class CloseCounter:
    """Counts env closes by wrapping TaskSpec.make_env (what the agent builds each sample's env with)."""

    def __init__(self, monkeypatch, break_step_at: int | None = None):
        self.made = self.closed = 0
        original = TaskSpec.make_env
        counter = self

        def make_env(spec):
            env = original(spec)
            counter.made += 1
            close, step = env.close, env.step
            steps = [0]

            def counted_close():
                counter.closed += 1
                close()

            def maybe_broken_step(action):
                steps[0] += 1
                if break_step_at is not None and steps[0] == break_step_at:
                    raise RuntimeError("the env broke")
                return step(action)

            env.close, env.step = counted_close, maybe_broken_step
            return env

        monkeypatch.setattr(TaskSpec, "make_env", make_env)


SWEEP = list(range(60, 470, 9))


def reference_trajectory(tokenizer, episode, max_context_tokens):
    """The core runner's episode with no per-turn cap within ``max_context_tokens``."""
    env = make_golden_env(episode)
    try:
        coroutine = run_episode(env, golden_policy(tokenizer), golden_formatter(tokenizer), golden_config(UNCAPPED, max_context_tokens), seed=episode.seed)
        return asyncio.run(coroutine)
    finally:
        env.close()


def test_max_len_sweep_never_overruns_and_closes_every_env(executor, tokenizer, monkeypatch):
    episodes = (GOLDEN_EPISODES[1], GOLDEN_EPISODES[5])  # long GuessTheNumber and Mastermind episodes
    counter = CloseCounter(monkeypatch)
    runs, reasons = 0, set()
    for max_len in SWEEP:
        for episode in episodes:
            trajectory = reference_trajectory(tokenizer, episode, max_len)
            reasons.add(trajectory.truncation_reason)
            response, engine = run_executor(executor, tokenizer, episode, max_length=max_len)
            runs += 1
            tokens = response["observation_tokens"]
            assert len(tokens) <= max_len, (max_len, episode.episode_id)
            for prompt, sent in engine.requests:
                assert len(prompt) + sent.max_tokens <= max_len
            expected = trajectory.prompt_ids + trajectory.as_sequence().response_ids
            assert tokens == (expected if trajectory.turns else expected[:max_len])  # no turn: the first message, cut
            context_limit = trajectory.truncation_reason == "context_limit"
            assert response["extra_logs"]["gem_context_limit"] == float(context_limit)
            assert response["extra_logs"]["gem_truncated"] == float(trajectory.truncated)
            if context_limit:
                assert response["truncated"] is True
    assert counter.made == counter.closed == runs
    assert "context_limit" in reasons and None in reasons  # the sweep reached both outcomes


def test_an_env_that_raises_is_closed(executor, tokenizer, golden, monkeypatch):
    counter = CloseCounter(monkeypatch, break_step_at=2)
    with pytest.raises(RuntimeError, match="the env broke"):
        run_executor(executor, tokenizer, golden.episodes[1])
    assert counter.made == counter.closed == 1


def test_an_engine_that_raises_is_closed(executor, tokenizer, golden, monkeypatch):
    counter = CloseCounter(monkeypatch)

    class Broken:
        async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
            raise RuntimeError("the engine broke")

    with pytest.raises(RuntimeError, match="the engine broke"):
        run_executor(executor, tokenizer, golden.episodes[1], engine=Broken(), max_length=2000)
    assert counter.made == counter.closed == 1


def test_an_engine_context_refusal_ends_that_episode_at_the_context_limit(executor, tokenizer, golden, monkeypatch):
    """vLLM's window smaller than OpenRLHF's max_len: vLLM refuses the prompt that leaves it no room (in its
    words); the episode ends as the runner's context limit (truncated, its turns trained on, not an infra
    failure) instead of failing the sample."""
    from gem_integrations.openrlhf.rollout import INFRA_FAILED_KEY

    counter = CloseCounter(monkeypatch)
    engine = faithful_engine(tokenizer, max_model_len=120)  # the episode's contexts: 83, 160, ...
    response, _ = run_executor(executor, tokenizer, golden.episodes[1], engine=engine, max_length=2000)
    assert response["extra_logs"]["gem_context_limit"] == 1.0 and response["extra_logs"]["gem_truncated"] == 1.0
    assert response["extra_logs"][INFRA_FAILED_KEY] == 0.0
    assert response["truncated"] is True and len(response["action_ranges"]) == 1  # the answered first turn, kept
    sent = [len(prompt) for prompt, _ in engine.requests]
    assert sent[-1] >= 120 > max(sent[:-1])  # the last request was the refused one, the first over the window
    assert counter.made == counter.closed == 1


def test_a_cancelled_episode_closes_its_env(executor, tokenizer, golden, monkeypatch):
    counter = CloseCounter(monkeypatch)

    class Hanging:
        async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
            await asyncio.Event().wait()

    async def main():
        task = asyncio.ensure_future(executor.execute("p", label_of(golden.episodes[0]), openrlhf_params(), 400, tokenizer, Hanging()))
        while counter.made == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert counter.made == counter.closed == 1


def test_extra_logs_have_turn_info_and_the_same_keys(golden, responses):
    keys = {frozenset(r["extra_logs"]) for r in responses}
    expected = {"gem_episode_length", "gem_success", "gem_truncated", "gem_context_limit", "gem_infra_failed", "gem_turn_rewards", "gem_turn_spans"}
    assert keys == {frozenset(expected)}
    for trajectory, response in zip(golden.trajectories, responses):
        logs = response["extra_logs"]
        assert logs["gem_turn_rewards"] == pytest.approx(trajectory.rewards)
        assert logs["gem_turn_spans"] == [p for span in expected_ranges(trajectory) for p in span]
        assert logs["gem_episode_length"] == trajectory.num_turns
        assert logs["gem_context_limit"] == float(trajectory.truncation_reason == "context_limit")
        assert logs["gem_success"] == float(bool(trajectory.turns[-1].info.get("success")))


def test_turn_info_is_off_without_the_switch(executor, tokenizer, golden, monkeypatch):
    monkeypatch.delenv("GEM_OPENRLHF_TURNS")
    response, _ = run_executor(executor, tokenizer, golden.episodes[0])
    assert not {"gem_turn_rewards", "gem_turn_spans"} & set(response["extra_logs"])


def test_experience_info_carries_the_turns(golden, responses):
    generator = samples_generator()
    for trajectory, response in zip(golden.trajectories, responses):
        experience = generator._process_response_into_experience(response, max_len=GOLDEN_MAX_CONTEXT_TOKENS)
        assert experience.info["gem_turn_rewards"].tolist() == [pytest.approx(trajectory.rewards)]
        assert experience.info["gem_turn_spans"].tolist() == [[p for span in expected_ranges(trajectory) for p in span]]


def test_group_of_one_prompt_starts_from_one_state(executor, tokenizer, golden):
    a, b = (run_executor(executor, tokenizer, golden.episodes[0])[0] for _ in range(2))
    assert a["observation_tokens"] == b["observation_tokens"]


def test_a_first_message_longer_than_max_len_gives_an_empty_sample(executor, tokenizer, golden, monkeypatch):
    counter = CloseCounter(monkeypatch)
    response, engine = run_executor(executor, tokenizer, golden.episodes[0], max_length=20)
    assert engine.requests == [] and response["action_ranges"] == [] and len(response["observation_tokens"]) == 20
    assert response["truncated"] is True and counter.closed == 1


def test_bad_label_fails_clearly(executor, tokenizer):
    with pytest.raises(ValueError, match="env_id"):
        asyncio.run(executor.execute("p", '{"answer": 3}', openrlhf_params(), 400, tokenizer, faithful_engine(tokenizer)))


# -- infrastructure failures (DESIGN.md contract 8) ----------------------------------------------------


def assert_out_of_training(response):
    """OpenRLHF's own response->Experience turns an infra-failed episode into a row with no loss token,
    reward 0 and no turn for the rebn patch."""
    assert response["action_ranges"] == [] and response["reward"] == 0.0 and response["scores"] == 0.0
    logs = response["extra_logs"]
    assert logs["gem_infra_failed"] == 1.0 and logs["gem_turn_rewards"] == [] and logs["gem_turn_spans"] == []
    experience = samples_generator()._process_response_into_experience(response, max_len=GOLDEN_MAX_CONTEXT_TOKENS)
    assert int(experience.action_mask.sum()) == 0 and experience.rewards.tolist() == [0.0]
    assert experience.info["gem_infra_failed"].tolist() == [1.0]


def test_an_engine_abort_keeps_the_episode_out_of_training(executor, tokenizer, golden, monkeypatch):
    counter = CloseCounter(monkeypatch)
    engine = faithful_engine(tokenizer)
    engine.aborted = {"req-2"}  # vLLM aborts the second turn's request (e.g. the engine was paused/killed)
    response, _ = run_executor(executor, tokenizer, golden.episodes[1], engine=engine, max_turn_tokens=GOLDEN_PARAMS.max_tokens)
    assert len(engine.requests) == 2  # the episode ended at the abort: no third request
    assert_out_of_training(response)
    assert counter.made == counter.closed == 1


def test_a_step_reporting_an_infra_error_keeps_the_episode_out_of_training(executor, tokenizer, golden, monkeypatch):
    from gem_core.errors import INFRA_ERROR

    original = TaskSpec.make_env

    def make_env(spec):
        env = original(spec)
        step, steps = env.step, [0]

        def failing_step(action):
            steps[0] += 1
            observation, reward, terminated, truncated, info = step(action)
            if steps[0] == 2:  # what a tool wrapper reports when its sandbox worker died
                info = {**info, INFRA_ERROR: "the sandbox worker died"}
            return observation, reward, terminated, truncated, info

        env.step = failing_step
        return env

    monkeypatch.setattr(TaskSpec, "make_env", make_env)
    response, engine = run_executor(executor, tokenizer, golden.episodes[1], max_turn_tokens=GOLDEN_PARAMS.max_tokens)
    assert len(engine.requests) == 2
    assert_out_of_training(response)


def test_healthy_episodes_report_no_infra_failure(responses):
    assert all(r["extra_logs"]["gem_infra_failed"] == 0.0 and r["action_ranges"] for r in responses)


def test_a_label_that_stops_at_the_move_stops_each_response_at_its_closing_brace(executor, tokenizer, golden):
    # rollout.stop_after_box reaches OpenRLHF through the row's label (make-dataset --stop-after-box): every request
    # the agent sends stops at a token holding "}" besides the end of turn, and a response ends at its move
    from gem_core.rollout.policy import closing_brace_ids

    braces = set(closing_brace_ids(tokenizer))
    episode = next(e for e in golden.episodes if e.env_id.startswith("game:GuessTheNumber"))
    response, engine = run_executor(executor, tokenizer, episode, stop_after_box=True)
    assert engine.requests and all(braces <= set(sent.stop_token_ids) for _, sent in engine.requests)
    tokens = response["observation_tokens"]
    ends = [tokens[stop - 1] for _, stop in response["action_ranges"]]
    assert ends and all(end in braces for end in ends), tokenizer.convert_ids_to_tokens(ends)
    _, plain = run_executor(executor, tokenizer, episode)
    assert not any(braces & set(sent.stop_token_ids) for _, sent in plain.requests)
