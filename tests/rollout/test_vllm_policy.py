"""VLLMPolicy over the vLLM-faithful offline LLM (the same call shape as vllm.LLM; the real engine runs it in
tests/real): concurrent episodes batched into one generate, per-request seeds, one over-long prompt refused
alone, bad options refused."""

from __future__ import annotations

import asyncio

import pytest

from gem_core.rollout import ChatFormatter, ContextLimitExceeded, RunConfig, SamplingParams, VLLMPolicy, run_episodes
from gem_core.testing.golden import golden_respond
from gem_core.testing.vllm_engine import ScriptedModel, VLLMFaithfulEngine, VLLMFaithfulLLM, VLLMSamplingParams


@pytest.fixture
def llm(tokenizer):
    return VLLMFaithfulLLM(VLLMFaithfulEngine(ScriptedModel(tokenizer, golden_respond), max_model_len=512))


def test_requests_waiting_together_go_to_the_engine_as_one_batch(llm):
    policy = VLLMPolicy(llm, sampling_params_cls=VLLMSamplingParams)

    async def four_at_once():
        return await asyncio.gather(*(policy.generate([5, 6, 7 + i], SamplingParams(max_tokens=4), request_id=f"e{i}/turn-0") for i in range(4)))

    outputs = asyncio.run(four_at_once())
    assert llm.calls == [4]  # the four requests in one generate
    assert len(outputs) == 4


def test_concurrent_episodes_run_through_the_batching_engine(llm, tokenizer):
    # when each episode's first request arrives depends on its env's reset in the executor, so how the
    # requests split into batches is timing; every request answered once, with its own seed, is not
    policy = VLLMPolicy(llm, sampling_params_cls=VLLMSamplingParams)
    config = RunConfig(params=SamplingParams(max_tokens=32), max_turns=2)
    trajectories = asyncio.run(run_episodes(["game:GuessTheNumber-v0-easy"] * 4, policy, ChatFormatter(tokenizer), config, seeds=[0, 1, 2, 3]))
    assert all(t.turns and len(t.turns[0].logprobs) == len(t.turns[0].response_ids) for t in trajectories)
    assert sum(llm.calls) == len(llm.engine.requests) == sum(len(t.turns) for t in trajectories)
    seeds = [params.seed for _, params in llm.engine.requests]
    assert len(set(seeds)) == len(seeds)  # each request its own seed (derived from its request id)


def test_an_over_long_prompt_is_refused_alone(llm):
    policy = VLLMPolicy(llm, sampling_params_cls=VLLMSamplingParams)
    assert policy.max_model_len == 512
    with pytest.raises(ContextLimitExceeded):
        asyncio.run(policy.generate([5] * 512, SamplingParams(max_tokens=4), request_id="e/turn-0"))
    assert llm.calls == []  # nothing reached the engine, so no batch was failed with it


def test_an_engine_that_does_not_say_its_window_still_refuses_one_prompt_alone(llm):
    """vLLM refuses a whole batch for one prompt over its window: the batch is split until the refusal is the
    refused request's alone (gem_core.rollout.answer_each); the other requests of the batch are answered."""
    policy = VLLMPolicy(llm, sampling_params_cls=VLLMSamplingParams)
    policy.max_model_len = None  # an engine whose config does not say its window: the request's check cannot see it

    async def four_at_once():
        prompts = [[5, 6, 7], [5, 6, 8], [5, 6, 9], [5] * 600]
        calls = (policy.generate(p, SamplingParams(max_tokens=4), request_id=f"e{i}/turn-0") for i, p in enumerate(prompts))
        return await asyncio.gather(*calls, return_exceptions=True)

    outputs = asyncio.run(four_at_once())
    assert [type(o).__name__ for o in outputs] == ["Generation", "Generation", "Generation", "ContextLimitExceeded"]
    assert "maximum context length is 512 tokens" in str(outputs[3])  # the engine's own words
    assert llm.calls == [2, 1]  # [a, b, c, long] refused, [a, b] answered, [c, long] refused, [c] answered, [long] refused


@pytest.mark.parametrize("bad", [0, -3])
def test_a_bad_batch_size_is_refused(llm, bad):
    with pytest.raises(ValueError, match="max_batch_size"):
        VLLMPolicy(llm, max_batch_size=bad, sampling_params_cls=VLLMSamplingParams)


def test_an_empty_prompt_is_refused(llm):
    with pytest.raises(ValueError, match="non-empty prompt"):
        asyncio.run(VLLMPolicy(llm, sampling_params_cls=VLLMSamplingParams).generate([], SamplingParams()))
