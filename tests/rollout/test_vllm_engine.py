"""The vLLM-faithful test engine follows vLLM's rules, not kinder ones (plugin tests rely on it)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("transformers", reason="the engine decodes with the local test tokenizer")

from gem_core.testing import build_test_tokenizer  # noqa: E402
from gem_core.rollout import is_context_refusal  # noqa: E402
from gem_core.testing.vllm_engine import EngineError, ScriptedModel, VLLMFaithfulEngine, VLLMSamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def setup():
    tokenizer = build_test_tokenizer("qwen3")
    engine = VLLMFaithfulEngine(ScriptedModel(tokenizer, lambda context: "I guess \\boxed{5}."), max_model_len=128)
    prompt = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    return tokenizer, engine, prompt, tokenizer.convert_tokens_to_ids("<|im_end|>")


def _out(engine, prompt, **params):
    return asyncio.run(engine.generate(prompt, VLLMSamplingParams(**params))).outputs[0]


def test_the_stop_token_is_in_token_ids_not_in_text(setup):
    tokenizer, engine, prompt, end = setup
    out = _out(engine, prompt, max_tokens=64, skip_special_tokens=False)
    assert out.token_ids[-1] == end and out.finish_reason == "stop" and out.stop_reason is None  # EOS
    assert out.text == "I guess \\boxed{5}." and "<|im_end|>" not in out.text
    kept = _out(engine, prompt, max_tokens=64, skip_special_tokens=False, include_stop_str_in_output=True)
    assert kept.text.endswith("<|im_end|>") and kept.token_ids == out.token_ids


def test_a_model_not_stopped_runs_on_past_its_end_token(setup):
    tokenizer, engine, prompt, end = setup
    out = _out(engine, prompt, max_tokens=30, ignore_eos=True)
    assert len(out.token_ids) == 30 and out.finish_reason == "length" and end in out.token_ids[:-1]
    stopped = _out(engine, prompt, max_tokens=30, ignore_eos=True, stop_token_ids=[end])
    assert stopped.finish_reason == "stop" and stopped.stop_reason == end


def test_max_tokens_as_given_and_the_context_window(setup):
    tokenizer, engine, prompt, end = setup
    assert len(_out(engine, prompt, max_tokens=3).token_ids) == 3
    rest = _out(engine, prompt, max_tokens=None, ignore_eos=True)
    assert len(prompt) + len(rest.token_ids) == 128 and rest.finish_reason == "length"
    assert (
        asyncio.run(engine.generate_tokens("r", prompt_ids=prompt, sampling_params={"ignore_eos": True})).outputs[0].token_ids.__len__() == 16
    )  # vLLM's default
    with pytest.raises(EngineError, match="longer than the maximum model length"):
        _out(engine, list(range(128)), max_tokens=1)
    with pytest.raises(EngineError, match="maximum context length is 128 tokens") as longer:  # vLLM 0.32's words
        _out(engine, list(range(130)), max_tokens=1)
    assert is_context_refusal(longer.value)


def test_min_tokens_and_logprobs(setup):
    tokenizer, engine, prompt, end = setup
    short = VLLMFaithfulEngine(ScriptedModel(tokenizer, lambda context: ""), max_model_len=128)
    assert _out(short, prompt, max_tokens=8).token_ids == [end]
    assert len(_out(short, prompt, max_tokens=8, min_tokens=1).token_ids) > 1
    out = _out(engine, prompt, max_tokens=64, logprobs=0)
    assert len(out.logprobs) == len(out.token_ids) and all(t in lp for t, lp in zip(out.token_ids, out.logprobs))
    assert _out(engine, prompt, max_tokens=64).logprobs is None
