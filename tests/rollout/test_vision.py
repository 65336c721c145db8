"""Vision-language rollouts: observations with images, the VL chat formatter, vLLM's multimodal prompt through
VLLMPolicy into the stand-in engine, which runs a tiny LLaVA model built here with the images' pixel_values."""

from __future__ import annotations

import asyncio
import io

import pytest

pytest.importorskip("PIL")
pytest.importorskip("transformers")
pytest.importorskip("torch")

from PIL import Image  # noqa: E402

import gem_core  # noqa: E402
from gem_core.core import model_message  # noqa: E402
from gem_core.multimodal import MAX_IMAGE_SIDE, InvalidImageError, MultimodalObservation, image_png_bytes  # noqa: E402
from gem_core.core import Env  # noqa: E402
from gem_core.rollout import (  # noqa: E402
    ChatFormatter,
    Generation,
    RunConfig,
    SamplingParams,
    ScriptedPolicy,
    VLChatFormatter,
    VLLMPolicy,
    collapse_image_tokens,
    run_episode,
)
from gem_core.testing.vision import IMAGE_TOKENS, save_tiny_vl  # noqa: E402
from gem_core.testing.vllm_engine import (  # noqa: E402
    EngineError,
    HFVisionModel,
    ScriptedModel,
    VLLMFaithfulEngine,
    VLLMFaithfulLLM,
    VLLMSamplingParams,
)


@pytest.fixture(scope="module")
def tiny_vl(tmp_path_factory):
    """The tiny model saved and loaded back as a user would (from_pretrained)."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    path = save_tiny_vl(tmp_path_factory.mktemp("tiny-vl"))
    return LlavaForConditionalGeneration.from_pretrained(path), AutoProcessor.from_pretrained(path)


@pytest.fixture(scope="module")
def vl_formatter(tiny_vl):
    return VLChatFormatter(tiny_vl[1])


def _image(color: str = "red", size: tuple[int, int] = (40, 30)) -> Image.Image:
    return Image.new("RGB", size, color)


# -- the observation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "images, match",
    [
        (["not an image"], "expected a PIL image or an image file's bytes, got str"),
        ([b"\x89PNG\r\n\x1a\nnot really"], "bytes that are not an image file"),
        ([Image.new("L", (MAX_IMAGE_SIDE + 1, 2))], "pixels; at most"),
        ([_image()] * 9, "at most 8 images"),
    ],
)
def test_a_wrong_image_is_one_clear_line(images, match):
    with pytest.raises(InvalidImageError, match=match) as err:
        MultimodalObservation("<image>" * len(images), tuple(images))
    assert "\n" not in str(err.value) and len(str(err.value)) < 200


def test_a_corrupt_and_a_huge_file_are_refused_before_decoding():
    png = image_png_bytes(_image(size=(64, 64)))
    with pytest.raises(InvalidImageError, match="cannot be decoded"):
        MultimodalObservation("<image>", (png[: len(png) // 2],))
    buffer = io.BytesIO()
    Image.new("1", (MAX_IMAGE_SIDE + 1, 8)).save(buffer, format="PNG")  # a few bytes, too wide: refused from the header
    with pytest.raises(InvalidImageError, match=f"{MAX_IMAGE_SIDE + 1}x8 pixels"):
        MultimodalObservation("<image>", (buffer.getvalue(),))
    assert MultimodalObservation("x", (png,)).images[0].size == (64, 64)  # good bytes decode


def test_placeholders_must_match_and_model_message_keeps_the_images():
    with pytest.raises(InvalidImageError, match="2 <image> placeholders for 1 images"):
        MultimodalObservation("<image> and <image>", (_image(),))
    obs = MultimodalObservation("What colour?", (_image(),))
    assert obs.text == "<image>\nWhat colour?"  # no placeholder: the image goes first
    shown = model_message(obs, {"suffix": "Answer in one word."})
    assert shown.images == obs.images and shown.text == "<image>\nWhat colour?\n\nAnswer in one word."
    assert model_message("plain", {"suffix": "s"}) == "plain\n\ns"  # text unchanged


# -- the chat formatter ---------------------------------------------------------------------------------


def test_prompt_ids_are_the_processors(tiny_vl, vl_formatter):
    _, processor = tiny_vl
    obs = MultimodalObservation("Here: <image> and there: <image>. Which is red?", (_image(), _image("blue", (20, 50))))
    ids = vl_formatter.prompt_ids(obs)
    text = vl_formatter.prompt_text(obs)
    expected = processor(text=[text], images=list(obs.images), add_special_tokens=False)["input_ids"][0]
    assert ids == list(expected) and ids.count(vl_formatter.image_token_id) == 2 * IMAGE_TOKENS
    assert vl_formatter.image_token_count(obs.images[0]) == IMAGE_TOKENS
    # a text observation, or a model's echoed "<image>", never becomes an image token
    assert vl_formatter.prompt_ids("text with <image> typed").count(vl_formatter.image_token_id) == 0
    delta = vl_formatter.observation_ids("echo: <image>", [vl_formatter.end_of_turn_id])
    assert vl_formatter.image_token_id not in delta


# -- the stand-in engine: vLLM's input form ---------------------------------------------------------------


def _engine(tiny_vl) -> tuple[VLLMFaithfulEngine, HFVisionModel]:
    model = HFVisionModel(*tiny_vl)
    return VLLMFaithfulEngine(model, max_model_len=2048), model


def test_the_stand_in_expands_each_image_token_and_passes_pixel_values(tiny_vl, vl_formatter):
    engine, model = _engine(tiny_vl)
    llm = VLLMFaithfulLLM(engine)
    token = vl_formatter.image_token_id
    prompt = vl_formatter.encode("<|im_start|>user\n") + [token] + vl_formatter.encode("What?<|im_end|>\n<|im_start|>assistant\n")
    [out] = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": _image()}}], VLLMSamplingParams(max_tokens=3, temperature=0))
    assert out.prompt_token_ids.count(token) == IMAGE_TOKENS and len(out.outputs[0].token_ids) == 3
    assert model.calls == [(IMAGE_TOKENS, (1, 3, 32, 32))]


@pytest.mark.parametrize(
    "prompt, match",
    [
        ({"prompt_token_ids": [1, 2], "multimodal_data": {"image": []}}, "unknown TokensPrompt keys \\['multimodal_data'\\]"),
        ({"prompt_token_ids": [1, 2], "multi_modal_data": ["x"]}, "must be a dict of modality"),
        ({"prompt_token_ids": [1, 2], "multi_modal_data": {"images": []}}, "Unsupported modality: images"),
        ({"prompt_token_ids": [1, 2], "multi_modal_data": {"audio": [0.0]}}, "serves images only"),
        ({"prompt_token_ids": [1, 2], "multi_modal_data": {"image": [b"png"]}}, "must be a PIL image, got bytes"),
        ({"prompt_token_ids": [1, 2], "multi_modal_data": {"image": _image()}}, "Expected there to be 1 prompt updates"),
        ({"prompt_token_ids": "1 2"}, "Token prompt should be a list of integers"),
    ],
)
def test_the_stand_in_refuses_malformed_multimodal_input(tiny_vl, prompt, match):
    llm = VLLMFaithfulLLM(_engine(tiny_vl)[0])
    with pytest.raises(EngineError, match=match) as err:
        llm.generate([prompt], VLLMSamplingParams(max_tokens=2))
    assert "\n" not in str(err.value)


def test_a_text_model_refuses_images(tokenizer):
    engine = VLLMFaithfulEngine(ScriptedModel(tokenizer, lambda _: "hi"))
    with pytest.raises(EngineError, match="not a multimodal model"):
        asyncio.run(engine.generate([1, 2, 3], VLLMSamplingParams(), multi_modal_data={"image": [_image()]}))


# -- the runner -----------------------------------------------------------------------------------------


def test_the_runner_plays_geometry_with_the_tiny_vl_model(tiny_vl, vl_formatter):
    engine, model = _engine(tiny_vl)
    policy = VLLMPolicy(VLLMFaithfulLLM(engine), sampling_params_cls=VLLMSamplingParams, image_token_id=vl_formatter.image_token_id)
    env = gem_core.make("vision:Geometry-v0-retry", image_size=96)
    config = RunConfig(params=SamplingParams(max_tokens=6, temperature=0))
    trajectory = asyncio.run(run_episode(env, policy, vl_formatter, config, seed=5, episode_id="vl"))
    assert trajectory.num_turns == 3 and len(trajectory.images) == 1 and trajectory.initial_message.startswith("<image>")
    image = trajectory.images[0]
    # the prompt is what the processor makes of the rendered conversation
    expected = tiny_vl[1](text=[vl_formatter.prompt_text(model_message(*env.reset(seed=5)))], images=[image], add_special_tokens=False)
    assert trajectory.prompt_ids == list(expected["input_ids"][0])
    token = vl_formatter.image_token_id
    for t, (sent, _params) in enumerate(engine.requests):
        context = trajectory.context_ids(t)
        assert sent.count(token) == 1  # vLLM's form: one image token per image, it expands them itself
        assert engine._expand_images(sent, [image]) == context  # ... back to exactly the runner's context
        assert context.count(token) == IMAGE_TOKENS and trajectory.context_images(t) == [image]
    assert model.calls == [(IMAGE_TOKENS, (1, 3, 32, 32))] * 3  # the pixels reached the model every turn
    assert all(turn.obs_images == 0 for turn in trajectory.turns)


def test_the_runner_says_what_is_missing_for_images(tokenizer, chatml_tokenizer, vl_formatter):
    env = gem_core.make("vision:Geometry-v0")
    scripted = ScriptedPolicy(chatml_tokenizer, lambda _: "\\boxed{1}")
    with pytest.raises(TypeError, match="shows images: use gem_core.rollout.VLChatFormatter"):
        asyncio.run(run_episode(env, scripted, ChatFormatter(chatml_tokenizer), seed=0))
    with pytest.raises(TypeError, match="ScriptedPolicy.generate takes no multi_modal_data"):
        asyncio.run(run_episode(env, scripted, vl_formatter, seed=0))


def test_a_chat_policy_gets_images_as_openai_image_parts():
    seen = []

    class Chat:
        async def chat(self, messages, params, *, request_id=""):
            seen.append(messages)
            return Generation([], None, "stop", text="\\boxed{3}")

    trajectory = asyncio.run(run_episode(gem_core.make("vision:Geometry-v0"), Chat(), seed=1))
    [[message]] = seen
    kinds = [part["type"] for part in message["content"]]
    assert kinds[0] == "image_url" and "text" in kinds
    assert message["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert trajectory.num_turns == 1 and len(trajectory.images) == 1


# -- images side by side; processor kwargs ----------------------------------------------------------------


class _TwoPictures(Env):
    """Two pictures with nothing between their placeholders: the template renders them side by side."""

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return MultimodalObservation("<image><image>\nWhich one is red?", (_image("red"), _image("blue", (30, 50)))), {}

    def step(self, action):
        return "Thanks.", 0.0, True, False, {}


def test_placeholders_put_in_front_are_one_line_each():
    obs = MultimodalObservation("Which one is red?", (_image("red"), _image("blue")))
    assert obs.text == "<image>\n<image>\nWhich one is red?"


def test_images_side_by_side_reach_the_engine_as_one_token_each(tiny_vl, vl_formatter):
    token = vl_formatter.image_token_id
    engine, model = _engine(tiny_vl)
    policy = VLLMPolicy(
        VLLMFaithfulLLM(engine), sampling_params_cls=VLLMSamplingParams, image_token_id=token, image_token_counts=vl_formatter.image_token_counts
    )
    config = RunConfig(params=SamplingParams(max_tokens=4, temperature=0))
    trajectory = asyncio.run(run_episode(_TwoPictures(), policy, vl_formatter, config, seed=0, episode_id="two"))
    context = trajectory.prompt_ids
    start = context.index(token)
    assert context[start : start + 2 * IMAGE_TOKENS] == [token] * (2 * IMAGE_TOKENS)  # one run of 32 tokens for two images
    [(sent, _params)] = engine.requests
    assert sent.count(token) == 2  # cut by each image's count, not by runs
    assert engine._expand_images(sent, trajectory.images) == context
    assert model.calls == [(2 * IMAGE_TOKENS, (2, 3, 32, 32))]
    assert vl_formatter.image_token_counts(trajectory.images) == [IMAGE_TOKENS, IMAGE_TOKENS]
    # cut by runs they would merge: without the counts the policy refuses in one line, before the engine
    bare = VLLMPolicy(VLLMFaithfulLLM(engine), sampling_params_cls=VLLMSamplingParams, image_token_id=token)
    with pytest.raises(ValueError, match="2 images, but the prompt's image tokens make 1 runs") as err:
        asyncio.run(run_episode(_TwoPictures(), bare, vl_formatter, config, seed=0))
    assert "\n" not in str(err.value) and len(engine.requests) == 1


def test_collapse_by_counts_checks_the_counts():
    t = 9
    prompt = [1, t, t, t, t, t, 2]
    assert collapse_image_tokens(prompt, t, [2, 3]) == [1, t, t, 2]
    assert collapse_image_tokens(prompt, t) == [1, t, 2]  # by runs: the two images merge
    for counts, match in [
        ([2, 2], "past its 2 images"),
        ([3, 3], "image 1 has 3 tokens, but the prompt holds a run of 2"),
        ([2, 3, 1], "of 2 images, not of its 3"),
    ]:
        with pytest.raises(ValueError, match=match):
            collapse_image_tokens(prompt, t, counts)


def test_mm_processor_kwargs_expand_every_image_and_reach_the_engine(tmp_path):
    """A processor whose defaults give 64 tokens an image (64x64 pixels) where the deployment's setting
    gives 16 (32x32, what the model reads), as Qwen-VL's defaults against a max_pixels cap: the formatter's
    expansion, the engine's and the model's pixels all follow the setting, in the first turn and in the
    turn that shows a second figure."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    path = save_tiny_vl(tmp_path, processor_image_size=64)
    processor = AutoProcessor.from_pretrained(path)
    kwargs = {"size": {"height": 32, "width": 32}}
    assert VLChatFormatter(processor).image_token_count(_image()) == 64  # the processor's defaults
    formatter = VLChatFormatter(processor, mm_processor_kwargs=kwargs)
    token = formatter.image_token_id
    model = HFVisionModel(LlavaForConditionalGeneration.from_pretrained(path), processor)
    engine = VLLMFaithfulEngine(model, max_model_len=2048)
    policy = VLLMPolicy(
        VLLMFaithfulLLM(engine),
        sampling_params_cls=VLLMSamplingParams,
        image_token_id=token,
        image_token_counts=formatter.image_token_counts,
        mm_processor_kwargs=formatter.mm_processor_kwargs,
    )
    env = gem_core.make("vision:Geometry-v0-followup", image_size=96)
    config = RunConfig(params=SamplingParams(max_tokens=6, temperature=0))
    trajectory = asyncio.run(run_episode(env, policy, formatter, config, seed=5, episode_id="kw"))
    assert trajectory.num_turns == 2 and len(trajectory.images) == 2 and trajectory.turns[0].obs_images == 1
    for t, (sent, _params) in enumerate(engine.requests):
        context, images = trajectory.context_ids(t), trajectory.context_images(t)
        assert context.count(token) == IMAGE_TOKENS * len(images) and sent.count(token) == len(images)
        assert engine._expand_images(sent, images, kwargs) == context
    assert model.calls == [(IMAGE_TOKENS, (1, 3, 32, 32)), (2 * IMAGE_TOKENS, (2, 3, 32, 32))]
