"""Vision envs through OpenRLHF's multimodal path: prompt rows read by OpenRLHF's PromptDataset, the agent
file with a tiny LLaVA model behind OpenRLHF's own ``RolloutRayActor.generate`` (its image-token dedup;
vLLM is gem_core's vLLM-faithful stand-in), compared with the core runner on the same row, and the
response through OpenRLHF's response->Experience code and its VLM actor forward."""

from __future__ import annotations

import asyncio
import json
import uuid
from types import SimpleNamespace as NS

import pytest

pytest.importorskip("PIL", reason="vision envs need Pillow (the vision extra)")

from conftest import openrlhf_params, samples_generator  # noqa: E402
from ray_actors import _rollout_actor_class  # noqa: E402

from gem_core.core import Env  # noqa: E402
from gem_core.multimodal import MultimodalObservation  # noqa: E402
from gem_core.rollout import RunConfig, SamplingParams, VLChatFormatter, VLLMPolicy, play_row  # noqa: E402
from gem_core.tasks import TaskSpec  # noqa: E402
from gem_core.testing.vision import IMAGE_TOKENS, save_tiny_vl  # noqa: E402
from gem_core.testing.vllm_engine import HFVisionModel, VLLMFaithfulEngine, VLLMFaithfulLLM, VLLMSamplingParams, read_tokens_prompt  # noqa: E402
from gem_integrations.openrlhf.dataset import write_dataset  # noqa: E402

ENV = "vision:Geometry-v0-retry"  # three answers: a multi-turn episode over one image
ENV_KWARGS = {"image_size": 96}
TURN_TOKENS = 6
MAX_LEN = 400


@pytest.fixture(scope="module")
def tiny_vl_dir(tmp_path_factory):
    return save_tiny_vl(tmp_path_factory.mktemp("tiny-vl"))


@pytest.fixture(scope="module")
def tiny_vl(tiny_vl_dir):
    """(model, processor) loaded as OpenRLHF loads them: the processor by its get_tokenizer (a VLM's AutoProcessor)."""
    from openrlhf.utils.utils import get_tokenizer
    from transformers import LlavaForConditionalGeneration

    processor = get_tokenizer(tiny_vl_dir, None, "left", None)
    assert hasattr(processor, "image_processor")  # what OpenRLHF's executors test for
    return LlavaForConditionalGeneration.from_pretrained(tiny_vl_dir).eval(), processor


class _AsyncLLM:
    """vLLM's ``AsyncLLM.generate(prompt, params, request_id=...)`` (an async stream) over the stand-in engine."""

    def __init__(self, engine: VLLMFaithfulEngine):
        self.engine = engine

    async def generate(self, prompt, sampling_params, request_id):
        ids, _ = read_tokens_prompt(prompt)  # vLLM's TokensPrompt rules (unknown keys, non-int ids refused)
        yield await self.engine.generate(ids, sampling_params, multi_modal_data=prompt.get("multi_modal_data"), request_id=request_id)


class RolloutEngine:
    """OpenRLHF's own ``RolloutRayActor.generate`` (the method, not a copy) over the stand-in: with
    ``mm_pad_token_ids`` as ``create_vllm_engines`` computes them for ``--data.max_images_per_prompt > 0``
    (empty without it). ``sent``: the multimodal data of every call."""

    def __init__(self, model: HFVisionModel, processor, with_flag: bool = True):
        self.engine = VLLMFaithfulEngine(model, max_model_len=4096)
        self.llm = _AsyncLLM(self.engine)
        self._mm_pad_token_ids = {t for t in (getattr(processor, "image_token_id", None), getattr(processor, "video_token_id", None)) if t is not None}
        if not with_flag:
            self._mm_pad_token_ids = set()
        self.sent: list = []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        self.sent.append(multi_modal_data)
        return await _rollout_actor_class().generate(self, prompt_token_ids, sampling_params, multi_modal_data=multi_modal_data)


@pytest.fixture
def vllm_types(monkeypatch):
    """vLLM's TokensPrompt is a TypedDict (calling it makes a dict) and random_uuid a hex string: the two
    vLLM names OpenRLHF's generate calls, in place of the import stub's placeholders."""
    import openrlhf.trainer.ray.vllm_engine as module

    monkeypatch.setattr(module, "TokensPrompt", dict)
    monkeypatch.setattr(module, "random_uuid", lambda: uuid.uuid4().hex)


def label(seed: int, **fields) -> str:
    return TaskSpec(ENV, seed=seed, env_kwargs=ENV_KWARGS, **fields).to_json()


def run_agent(executor, processor, engine, seed: int, images=None, **fields):
    coroutine = executor.execute(
        prompt="(row prompt, unused)",
        label=label(seed, max_turn_tokens=TURN_TOKENS, **fields),
        sampling_params=openrlhf_params(),
        max_length=MAX_LEN,
        hf_tokenizer=processor,
        llm_engine=engine,
        images=images,
    )
    return asyncio.run(coroutine)


def core_reference(tiny_vl, seed: int):
    """The core runner on the same row: VLLMPolicy over the same stand-in and model."""
    model, processor = tiny_vl
    formatter = VLChatFormatter(processor)
    engine = VLLMFaithfulEngine(HFVisionModel(model, processor), max_model_len=4096)
    policy = VLLMPolicy(VLLMFaithfulLLM(engine), sampling_params_cls=VLLMSamplingParams, image_token_id=formatter.image_token_id)
    config = RunConfig(params=SamplingParams(max_tokens=TURN_TOKENS), max_context_tokens=MAX_LEN)
    return asyncio.run(play_row(TaskSpec(ENV, seed=seed, env_kwargs=ENV_KWARGS), policy, formatter, config, episode_id="ref"))


# -- the dataset ------------------------------------------------------------------------------------


def test_prompt_rows_carry_the_images_as_openrlhfs_prompt_dataset_reads_them(tmp_path, tiny_vl):
    from openrlhf.datasets.prompts_dataset import PromptDataset
    from openrlhf.utils.vlm_utils import load_images, process_prompt_with_images

    path = tmp_path / "prompts.jsonl"
    assert write_dataset(path, "vision:Geometry-v0", 4) == 4
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    args = NS(data=NS(input_key="prompt", label_key="label", apply_chat_template=False, image_key="images"))
    dataset = PromptDataset(rows, tiny_vl[1], NS(args=args, is_rank_0=lambda: False))
    assert len(dataset) == 4
    for i, row in enumerate(rows):
        _, prompt, row_label, images = dataset[i]
        first = TaskSpec.from_json(row_label).first_observation()
        assert prompt == first.text and prompt.count("<image>") == len(images) == 1
        [image] = load_images(images)  # OpenRLHF's loader decodes the data URLs ...
        assert image.size == first.images[0].size and image.convert("RGB").tobytes() == first.images[0].tobytes()  # ... to the env's pixels
        ids, mm, pil = process_prompt_with_images(tiny_vl[1], prompt, images)  # and its processor path takes the row
        assert ids.count(tiny_vl[1].image_token_id) == IMAGE_TOKENS and tuple(mm["pixel_values"].shape) == (1, 3, 32, 32)
    assert len({json.dumps(r["images"]) for r in rows}) == 4  # one figure per seed


def test_text_rows_are_unchanged(tmp_path):
    path = tmp_path / "text.jsonl"
    write_dataset(path, "game:GuessTheNumber-v0-easy", 2)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [sorted(r) for r in rows] == [["label", "prompt"]] * 2


# -- the agent -------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_flag", [True, False], ids=["max_images_per_prompt", "no_flag"])
def test_the_agent_plays_a_vision_row_like_the_core_runner(executor, tiny_vl, vllm_types, with_flag):
    model, processor = tiny_vl
    hf_model = HFVisionModel(model, processor)
    engine = RolloutEngine(hf_model, processor, with_flag)
    reference = core_reference(tiny_vl, seed=3)
    response = run_agent(executor, processor, engine, seed=3, images=["(the row's images, echoed)"])
    sequence = reference.as_sequence()
    assert reference.num_turns == 3 and len(reference.images) == 1
    assert response["observation_tokens"] == list(sequence.prompt_ids) + list(sequence.response_ids)
    assert [tuple(r) for r in response["action_ranges"]] == [(t.context_len, t.context_len + len(t.response_ids)) for t in reference.turns]
    assert response["reward"] == pytest.approx(sum(reference.rewards))
    # every turn: the env's image went as vLLM takes it (PIL, one image token left per image), and the
    # model got its pixels
    image = reference.images[0]
    assert [len(mm["image"]) for mm in engine.sent] == [1, 1, 1]
    assert all(mm["image"][0].tobytes() == image.tobytes() for mm in engine.sent)
    token = processor.image_token_id
    assert [prompt.count(token) for prompt, _ in engine.engine.requests] == [1, 1, 1]
    assert hf_model.calls == [(IMAGE_TOKENS, (1, 3, 32, 32))] * 3
    # the multimodal fields OpenRLHF's experience reads: as its own executor would make them
    assert response["images"] == ["(the row's images, echoed)"]
    expected = processor(text=[processor.image_token], images=[image], return_tensors="pt")
    assert sorted(response["mm_train_inputs"]) == ["pixel_values"]
    assert response["mm_train_inputs"]["pixel_values"].equal(expected["pixel_values"])


def test_the_experience_drives_openrlhfs_vlm_actor_forward(executor, tiny_vl, tiny_vl_dir, vllm_types, monkeypatch):
    """OpenRLHF's Actor (loaded from the model dir: it sees a VLM) on the Experience the response makes,
    with merge_mm_train_inputs' tensors: greedy decoding made the actions, so each action token is the
    forward's argmax; and the forward reads the pixels (other pixels, other logits). (In fp32, as the stand-in ran the model: OpenRLHF
    itself loads bf16/fp16 only, which would change the argmax of a random model.)"""
    import openrlhf.utils.utils
    import torch
    from openrlhf.models.actor import Actor
    from openrlhf.utils.vlm_utils import merge_mm_train_inputs

    monkeypatch.setattr(openrlhf.utils.utils, "convert_to_torch_dtype", lambda name: torch.float32)

    model, processor = tiny_vl
    response = run_agent(executor, processor, RolloutEngine(HFVisionModel(model, processor), processor), seed=4)
    experience = samples_generator()._process_response_into_experience(response, max_len=MAX_LEN)
    assert experience.sequences[0].tolist() == response["observation_tokens"]
    assert len(experience.mm_train_inputs) == 1 and experience.mm_train_inputs[0] is response["mm_train_inputs"]
    actor = Actor(tiny_vl_dir, attn_implementation="eager", param_dtype="fp32").eval()
    assert actor.is_vlm

    def logits(**mm):
        with torch.no_grad():
            _, output = actor(experience.sequences, experience.action_mask, experience.attention_mask, return_output=True, **mm)
        return output["logits"][0]

    mm = merge_mm_train_inputs(experience.mm_train_inputs, "cpu")
    seen = logits(**mm)
    tokens, predicted = response["observation_tokens"], seen.argmax(-1).tolist()
    actions = [i for start, end in response["action_ranges"] for i in range(start, end)]
    assert len(actions) == 3 * TURN_TOKENS and all(predicted[i - 1] == tokens[i] for i in actions)
    blank = logits(pixel_values=torch.zeros_like(mm["pixel_values"]))
    assert not torch.allclose(seen, blank, atol=1e-4)


def test_a_first_message_that_does_not_fit_carries_no_images(executor, tiny_vl, vllm_types):
    model, processor = tiny_vl
    engine = RolloutEngine(HFVisionModel(model, processor), processor)
    response = run_agent(executor, processor, engine, seed=0, max_context_tokens=20)
    assert response["action_ranges"] == [] and response["mm_train_inputs"] is None and engine.sent == []
    assert processor.image_token_id not in response["observation_tokens"] and 0 < len(response["observation_tokens"]) <= 20
    assert len(response["rollout_log_probs"]) == len(response["observation_tokens"])
    samples_generator()._process_response_into_experience(response, max_len=MAX_LEN)  # OpenRLHF takes it as is


def test_a_vision_row_with_a_text_model_is_one_clear_error(executor, tokenizer):
    with pytest.raises(ValueError, match="this row has images but OpenRLHF loaded a text tokenizer") as err:
        run_agent(executor, tokenizer, engine=None, seed=0, images=["data:image/png;base64,AAAA"])
    assert "\n" not in str(err.value)


# -- a later turn's figure; images side by side ----------------------------------------------------------


def test_a_later_turns_figure_goes_with_the_context_and_into_mm_train_inputs(executor, tiny_vl, vllm_types):
    """vision:Geometry-v0-followup: the second figure comes in the observation after the first answer."""
    model, processor = tiny_vl
    hf_model = HFVisionModel(model, processor)
    engine = RolloutEngine(hf_model, processor)
    spec = TaskSpec("vision:Geometry-v0-followup", seed=6, env_kwargs=ENV_KWARGS, max_turn_tokens=TURN_TOKENS)
    response = asyncio.run(
        executor.execute(
            prompt="(unused)",
            label=spec.to_json(),
            sampling_params=openrlhf_params(),
            max_length=MAX_LEN,
            hf_tokenizer=processor,
            llm_engine=engine,
            images=None,
        )
    )
    env = spec.make_env()
    first, _ = env.reset(seed=6)
    images = [*first.images, *env.step("no answer")[0].images]
    assert [len(mm["image"]) for mm in engine.sent] == [1, 2]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(engine.sent[1]["image"], images))
    token = processor.image_token_id
    assert [prompt.count(token) for prompt, _ in engine.engine.requests] == [1, 2]
    assert hf_model.calls == [(IMAGE_TOKENS, (1, 3, 32, 32)), (2 * IMAGE_TOKENS, (2, 3, 32, 32))]
    tokens = response["observation_tokens"]
    (_, end0), (start1, _) = response["action_ranges"]
    assert tokens[:end0].count(token) == IMAGE_TOKENS and tokens[end0:start1].count(token) == IMAGE_TOKENS  # in the observation
    expected = processor(text=[processor.image_token * 2], images=images, return_tensors="pt")["pixel_values"]
    assert response["mm_train_inputs"]["pixel_values"].equal(expected)


class _TwoPictures(Env):
    """Two pictures in one observation; ``text`` with or without its placeholders."""

    def __init__(self, text: str = "Which one is red?"):
        self.text = text

    def reset(self, seed=None, options=None):
        from PIL import Image

        super().reset(seed=seed)
        return MultimodalObservation(self.text, (Image.new("RGB", (40, 30), "red"), Image.new("RGB", (30, 50), "blue"))), {}

    def step(self, action):
        return "Thanks.", 0.0, True, False, {}


@pytest.fixture
def two_pictures():
    from gem_core import registry

    registry.register("test:TwoPictures-v0", _TwoPictures)
    registry.register("test:TwoPictures-v0-touching", _TwoPictures, text="<image><image>Which one is red?")
    yield
    for name in ("test:TwoPictures-v0", "test:TwoPictures-v0-touching"):
        registry.registry.pop(name, None)


def _play(executor, processor, engine, env_id):
    return asyncio.run(
        executor.execute(
            prompt="(unused)",
            label=TaskSpec(env_id, seed=0, max_turn_tokens=3).to_json(),
            sampling_params=openrlhf_params(),
            max_length=MAX_LEN,
            hf_tokenizer=processor,
            llm_engine=engine,
        )
    )


def test_two_images_without_placeholders_reach_vllm_as_two(executor, tiny_vl, vllm_types, two_pictures):
    """Placeholders put in front are one line each, so OpenRLHF's own dedup (with --data.max_images_per_prompt)
    leaves one image token per image; side by side it would merge them and vLLM would refuse the request."""
    model, processor = tiny_vl
    hf_model = HFVisionModel(model, processor)
    engine = RolloutEngine(hf_model, processor)
    response = _play(executor, processor, engine, "test:TwoPictures-v0")
    token = processor.image_token_id
    assert [prompt.count(token) for prompt, _ in engine.engine.requests] == [2]
    assert hf_model.calls == [(2 * IMAGE_TOKENS, (2, 3, 32, 32))] and len(response["action_ranges"]) == 1


def test_images_side_by_side_are_one_clear_error_under_openrlhfs_dedup(executor, tiny_vl, vllm_types, two_pictures):
    model, processor = tiny_vl
    engine = RolloutEngine(HFVisionModel(model, processor), processor)
    with pytest.raises(ValueError, match="two images side by side in the context") as err:
        _play(executor, processor, engine, "test:TwoPictures-v0-touching")
    assert "\n" not in str(err.value) and engine.sent == []
