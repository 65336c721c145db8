"""The stand-in engine (gem_core.testing.vllm_engine) checked against the real vLLM on the same inputs.

Every plugin test that runs on the stand-in relies on these rules; a stand-in kinder than vLLM hides
defects (DESIGN.md contract 7). The stand-in's model replays exactly the tokens the real model writes
for each prompt (greedy, past its end-of-turn token), so any difference below is a difference of the
engine's rules: where it stops, what the text holds, finish and stop reasons, max_tokens, logprobs."""

from __future__ import annotations

import itertools

import pytest

from gem_core.rollout import is_context_refusal
from gem_core.testing.vllm_engine import EngineError, VLLMFaithfulEngine, VLLMFaithfulLLM, VLLMSamplingParams

from conftest import MAX_MODEL_LEN

vllm = pytest.importorskip("vllm")

MESSAGES = [
    "Guess a number between 1 and 10. Answer with \\boxed{N}.",
    "Say hello in one word.",
    "What is 2 + 3? Put the answer in \\boxed{}.",
]
RUN_ON = 64  # tokens of each real continuation the replay model knows (past its end-of-turn token)


def one_at_a_time(llm, prompts, params):
    """The real engine's answers, a prompt per ``generate``: vLLM's engine process starts a batch while the
    rest of a call's requests are still arriving, so under load the same call can batch differently, and a
    greedy token at a near tie can differ between two runs (seen in CI). A batch of one is always the same."""
    return [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0] for p in prompts]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=False) for m in MESSAGES]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


class ReplayModel:
    """The stand-in's model: for each prompt, the real model's greedy tokens (ignore_eos), then EOS forever."""

    def __init__(self, tokenizer, continuations):
        self.tokenizer = tokenizer
        self.end_of_turn_id = tokenizer.eos_token_id
        self.continuations = continuations

    def stream(self, prompt_token_ids):
        return itertools.chain(self.continuations[tuple(prompt_token_ids)], itertools.repeat(self.end_of_turn_id))


@pytest.fixture(scope="module")
def standin(llm, tokenizer, prompts):
    run_on = vllm.SamplingParams(temperature=0.0, max_tokens=RUN_ON, ignore_eos=True)
    outputs = one_at_a_time(llm, prompts, run_on)
    continuations = {tuple(p): list(o.outputs[0].token_ids) for p, o in zip(prompts, outputs)}
    for ids in continuations.values():  # the replay is a real turn: the model ends it with its EOS
        assert tokenizer.eos_token_id in ids
    return VLLMFaithfulLLM(VLLMFaithfulEngine(ReplayModel(tokenizer, continuations), max_model_len=MAX_MODEL_LEN))


CASES = {
    "defaults (stop at EOS; stop token in ids, not in text)": {"max_tokens": 48},
    "max_tokens cuts: length": {"max_tokens": 3},
    "max_tokens 1": {"max_tokens": 1},
    "keep special tokens in the text": {"max_tokens": 48, "skip_special_tokens": False},
    "stop string in output": {"max_tokens": 48, "include_stop_str_in_output": True},
    "both": {"max_tokens": 48, "skip_special_tokens": False, "include_stop_str_in_output": True},
    "logprobs of the sampled token": {"max_tokens": 48, "logprobs": 0},
    "ignore_eos runs to max_tokens": {"max_tokens": 40, "ignore_eos": True},
    "max_tokens None: up to the EOS": {"max_tokens": None},
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_standin_answers_as_vllm_does(llm, standin, prompts, case):
    values = CASES[case]
    real = one_at_a_time(llm, prompts, vllm.SamplingParams(temperature=0.0, **values))
    fake = standin.generate([{"prompt_token_ids": p} for p in prompts], VLLMSamplingParams(temperature=0.0, **values))
    for r, f in zip(real, fake):
        r, f = r.outputs[0], f.outputs[0]
        assert list(f.token_ids) == list(r.token_ids), case
        assert f.text == r.text, case
        assert f.finish_reason == r.finish_reason, case
        assert f.stop_reason == r.stop_reason, case
        if values.get("logprobs") is None:
            assert r.logprobs is None and f.logprobs is None
        else:  # one record per token, keyed by token id, the sampled token present
            assert len(r.logprobs) == len(f.logprobs) == len(r.token_ids)
            for token, real_record, fake_record in zip(r.token_ids, r.logprobs, f.logprobs):
                assert token in real_record and token in fake_record
                assert isinstance(real_record[token].logprob, float) and isinstance(fake_record[token].logprob, float)


def test_an_extra_stop_token_stops_both_with_it_as_the_stop_reason(llm, standin, prompts):
    probe = llm.generate([{"prompt_token_ids": prompts[0]}], vllm.SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    stop_id = int(probe[0].outputs[0].token_ids[1])
    values = {"max_tokens": 48, "stop_token_ids": [stop_id]}
    real = llm.generate([{"prompt_token_ids": prompts[0]}], vllm.SamplingParams(temperature=0.0, **values), use_tqdm=False)[0].outputs[0]
    fake = standin.generate([{"prompt_token_ids": prompts[0]}], VLLMSamplingParams(temperature=0.0, **values))[0].outputs[0]
    assert list(real.token_ids)[-1] == stop_id and real.stop_reason == stop_id
    assert (list(fake.token_ids), fake.text, fake.finish_reason, fake.stop_reason) == (list(real.token_ids), real.text, real.finish_reason, real.stop_reason)


def test_a_prompt_over_the_context_is_refused_by_both(llm, standin, tokenizer):
    long_prompt = [tokenizer.eos_token_id - 1 if tokenizer.eos_token_id > 0 else 5] * (MAX_MODEL_LEN + 4)
    with pytest.raises(Exception) as real_error:
        llm.generate([{"prompt_token_ids": long_prompt}], vllm.SamplingParams(max_tokens=4), use_tqdm=False)
    with pytest.raises(EngineError) as fake_error:
        standin.generate([{"prompt_token_ids": long_prompt}], VLLMSamplingParams(max_tokens=4))
    words = f"maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt contains {len(long_prompt)} input tokens"
    assert words in str(real_error.value) and words in str(fake_error.value)  # vLLM 0.32's words, in both
    assert is_context_refusal(real_error.value) and is_context_refusal(fake_error.value)  # what the runner ends as context_limit


def test_one_prompt_over_the_context_refuses_the_whole_batch_in_both(llm, standin, prompts, tokenizer):
    """vLLM checks every prompt of a call before it runs any: a batch with one prompt that leaves no room is
    refused whole (why batching policies refuse that request alone: gem_core.rollout.answer_each)."""
    full = [tokenizer.eos_token_id - 1 if tokenizer.eos_token_id > 0 else 5] * MAX_MODEL_LEN  # exactly the window
    batch = [{"prompt_token_ids": prompts[0]}, {"prompt_token_ids": full}]
    with pytest.raises(Exception) as real_error:
        llm.generate(batch, vllm.SamplingParams(max_tokens=4), use_tqdm=False)
    calls = len(standin.calls)
    with pytest.raises(EngineError) as fake_error:
        standin.generate(batch, VLLMSamplingParams(max_tokens=4))
    assert len(standin.calls) == calls  # nothing ran
    assert is_context_refusal(real_error.value) and is_context_refusal(fake_error.value)
    assert str(fake_error.value).split(" Make sure")[0] in str(real_error.value)


def test_a_response_past_the_context_is_cut_alike(llm, standin, prompts):
    """A prompt near the end of the window with max_tokens past it: what each engine does."""
    values = {"max_tokens": 200, "ignore_eos": True}
    prompt = (prompts[1] * 100)[: MAX_MODEL_LEN - 20]
    try:
        real = llm.generate([{"prompt_token_ids": prompt}], vllm.SamplingParams(temperature=0.0, **values), use_tqdm=False)[0].outputs[0]
    except Exception:  # vLLM refuses the request instead of cutting it
        with pytest.raises(EngineError):
            standin.generate([{"prompt_token_ids": prompt}], VLLMSamplingParams(temperature=0.0, **values))
        return
    fake_model = standin.engine.model
    fake_model.continuations[tuple(prompt)] = list(real.token_ids) + [0] * 300
    fake = standin.generate([{"prompt_token_ids": prompt}], VLLMSamplingParams(temperature=0.0, **values))[0].outputs[0]
    assert len(fake.token_ids) == len(real.token_ids) and fake.finish_reason == real.finish_reason
