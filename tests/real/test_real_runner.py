"""The core runner on the real model through the real vLLM (VLLMPolicy), against the same model in
transformers (HFPolicy, the reference trainer's policy): greedy trajectories, and the logprobs the engine
returned against the ones the trainer recomputes."""

from __future__ import annotations

import asyncio

import pytest
import torch
from helpers.real import assert_same_weights

from gem_core.rollout import ChatFormatter, HFPolicy, RunConfig, SamplingParams, VLLMPolicy, run_episodes
from gem_core.train.trainer import token_logprobs, training_rows

pytest.importorskip("vllm")

ENV = "game:GuessTheNumber-v0-easy"
SEEDS = [0, 1, 2, 3]
GREEDY = RunConfig(params=SamplingParams(max_tokens=24, temperature=0.0), max_turns=3)


@pytest.fixture(scope="module")
def formatter(tokenizer):
    return ChatFormatter(tokenizer)


@pytest.fixture(scope="module")
def vllm_trajectories(llm, formatter):
    import vllm

    policy = VLLMPolicy(llm, seed=0, sampling_params_cls=vllm.SamplingParams)
    return asyncio.run(run_episodes([ENV] * len(SEEDS), policy, formatter, GREEDY, seeds=SEEDS))


def test_vllm_policy_plays_whole_episodes_token_in_token_out(vllm_trajectories, tokenizer):
    for trajectory in vllm_trajectories:
        assert trajectory.turns and trajectory.done
        for turn in trajectory.turns:
            assert turn.response_ids and len(turn.logprobs) == len(turn.response_ids)
            assert len(turn.response_ids) <= GREEDY.params.max_tokens
            if turn.finish_reason == "stop":  # the engine's stop token stays in the ids (vLLM's rule)
                assert turn.response_ids[-1] == tokenizer.eos_token_id
        sequence = trajectory.as_sequence()
        assert len(sequence.loss_mask) == len(sequence.response_ids) == len(sequence.turn_ids)


def test_greedy_trajectories_equal_the_transformers_policy(vllm_trajectories, hf_model, formatter, tokenizer):
    policy = HFPolicy(hf_model, seed=0, max_batch_size=1, pad_token_id=tokenizer.pad_token_id or 0)
    reference = asyncio.run(run_episodes([ENV] * len(SEEDS), policy, formatter, GREEDY, seeds=SEEDS))
    for ours, theirs in zip(vllm_trajectories, reference):
        assert ours.prompt_ids == theirs.prompt_ids
        assert [t.response_ids for t in ours.turns] == [t.response_ids for t in theirs.turns]
        assert ours.rewards == theirs.rewards and ours.truncation_reason == theirs.truncation_reason


def test_engine_logprobs_agree_with_the_trainers_recomputed_ones(vllm_trajectories, hf_model, tokenizer):
    advantages = [[0.0] * t.num_turns for t in vllm_trajectories]
    rows = training_rows(vllm_trajectories, advantages, "sequence", tokenizer.pad_token_id or 0)
    with torch.no_grad():
        recomputed = token_logprobs(hf_model, rows)
    mask = rows.targets >= 0
    difference = (recomputed - rows.old_logprobs).abs()[mask]
    assert int(mask.sum()) > 20
    print(f"logprob agreement: max {float(difference.max()):.2e}, mean {float(difference.mean()):.2e} over {int(mask.sum())} tokens")
    # float32 on both sides: vLLM's CPU kernels and transformers' differ in summation order only (measured here:
    # max 2.2e-5, mean 3.4e-6 over 96 tokens)
    assert_same_weights(difference, "engine vs trainer")
