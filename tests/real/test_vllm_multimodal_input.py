"""The stand-in's multimodal input checked against the real vLLM's own input types and parsers (no VL model
is loaded: these are vLLM's schema and the functions its engine runs on a request before the model).

The request VLLMPolicy builds for images is a ``vllm.inputs.TokensPrompt``; vLLM's prompt parser keeps it
as it is and its multimodal parser reads the images from it; the stand-in accepts exactly vLLM's prompt keys
and modalities, and refuses what vLLM refuses with vLLM's message."""

from __future__ import annotations

import asyncio

import pytest

vllm = pytest.importorskip("vllm")
Image = pytest.importorskip("PIL.Image")

from gem_core.rollout.engine import VLLMPolicy, collapse_image_tokens  # noqa: E402
from gem_core.testing.vllm_engine import TOKENS_PROMPT_KEYS, VLLM_MODALITIES, EngineError, read_multi_modal_data, read_tokens_prompt  # noqa: E402

IMAGE_TOKEN = 7


def _vllm_prompt_keys() -> set[str]:
    from vllm.inputs import TokensPrompt

    return set(TokensPrompt.__required_keys__) | set(TokensPrompt.__optional_keys__)


def test_the_stand_ins_prompt_keys_and_modalities_are_vllms():
    from vllm.inputs import MultiModalDataBuiltins
    from vllm.multimodal.parse import MultiModalDataParser

    assert set(TOKENS_PROMPT_KEYS) == _vllm_prompt_keys()
    assert set(VLLM_MODALITIES) == set(MultiModalDataBuiltins.__optional_keys__) == set(MultiModalDataParser()._get_subparsers())


class _Recorder:
    """vLLM's offline ``LLM.generate`` call shape; keeps the prompts it got."""

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, params, use_tqdm=False):
        self.prompts.extend(prompts)
        return [type("Out", (), {"outputs": [type("C", (), {"token_ids": [2], "logprobs": None, "finish_reason": "stop"})()]})() for _ in prompts]


def test_vllm_policy_sends_a_tokens_prompt_vllm_parses():
    from vllm.multimodal.parse import MultiModalDataParser
    from vllm.renderers.inputs.preprocess import parse_dec_only_prompt

    llm = _Recorder()
    policy = VLLMPolicy(llm, image_token_id=IMAGE_TOKEN)
    images = [Image.new("RGB", (40, 30), "red"), Image.new("L", (20, 20), 128)]
    expanded = [1, *[IMAGE_TOKEN] * 16, 5, *[IMAGE_TOKEN] * 16, 6]
    from gem_core.rollout import SamplingParams

    asyncio.run(policy.generate(expanded, SamplingParams(max_tokens=4), request_id="e/turn-0", multi_modal_data={"image": images}))
    [prompt] = llm.prompts
    assert set(prompt) <= _vllm_prompt_keys()
    assert prompt["prompt_token_ids"] == collapse_image_tokens(expanded, IMAGE_TOKEN) == [1, IMAGE_TOKEN, 5, IMAGE_TOKEN, 6]
    assert parse_dec_only_prompt(prompt) is prompt  # a dict with prompt_token_ids: vLLM takes it as a TokensPrompt
    items = MultiModalDataParser().parse_mm_data(prompt["multi_modal_data"])
    assert items.get_all_counts() == {"image": 2}
    ours, _ = read_tokens_prompt(prompt)
    assert ours == prompt["prompt_token_ids"]
    theirs = items["image"].get_all()
    mine = read_multi_modal_data(prompt["multi_modal_data"])
    assert [i.mode for i in theirs] == [i.mode for i in mine] == ["RGB", "RGB"]  # both convert to RGB
    assert [i.tobytes() for i in theirs] == [i.tobytes() for i in mine]


def test_a_single_image_and_an_unknown_modality_read_alike():
    from vllm.multimodal.parse import MultiModalDataParser

    image = Image.new("RGB", (8, 8))
    assert MultiModalDataParser().parse_mm_data({"image": image}).get_all_counts() == {"image": 1} and len(read_multi_modal_data({"image": image})) == 1
    with pytest.raises(ValueError, match="Unsupported modality: images") as theirs:
        MultiModalDataParser().parse_mm_data({"images": [image]})
    with pytest.raises(EngineError) as ours:
        read_multi_modal_data({"images": [image]})
    assert str(ours.value) == str(theirs.value)
