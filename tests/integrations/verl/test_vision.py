"""verl's multimodal path with a vision env: ``make-dataset verl`` rows read back by verl's own RLHFDataset with
the tiny LLaVA processor, and the gem_env loop run through verl's AgentLoopWorker (legacy and v1/TransferQueue)
with the tiny LLaVA model behind the vLLM-faithful server: the same tokens, masks and turns as gem_core's
runner on the same row, the images sent as verl's ``image_data`` and returned as ``multi_modal_data``, from
which verl builds ``multi_modal_inputs`` that the model reads back to the same greedy tokens.

verl 0.9.1's ``hf_processor`` takes Qwen-VL, GLM-4V, Mllama and Gemma4 processors only and gives None for
LLaVA, so the tests hand the worker the tiny model's processor, as verl hands a supported one."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

pytest.importorskip("PIL")

from conftest import PROMPT_LENGTH, compose_verl_config  # noqa: E402
from verl_server import FaithfulVerlServer, InProcessServerManager  # noqa: E402

from gem_core.batch import sequence_batch  # noqa: E402
from gem_core.multimodal import MultimodalObservation  # noqa: E402
from gem_core.rollout import RunConfig, SamplingParams, VLChatFormatter, VLLMPolicy, play_row  # noqa: E402
from gem_core.tasks import TaskSpec  # noqa: E402
from gem_core.testing.vision import IMAGE_TOKENS, save_tiny_vl  # noqa: E402
from gem_core.testing.vllm_engine import HFVisionModel, VLLMFaithfulEngine, VLLMFaithfulLLM, VLLMSamplingParams  # noqa: E402
from gem_integrations.verl.advantage import TURN_IDS_FIELD  # noqa: E402

ENV = "vision:Geometry-v0-retry"
ENV_KWARGS = '{"image_size": 96}'
RESPONSE_LENGTH = 256  # three turns of at most 16 tokens and the feedback between them
TURN_TOKENS = 16
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    """The tiny LLaVA model and processor saved as a model directory (tokenizer and processor beside the model)."""
    return save_tiny_vl(tmp_path_factory.mktemp("tiny-vl"))


@pytest.fixture(scope="module")
def vl(vl_dir):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    return LlavaForConditionalGeneration.from_pretrained(vl_dir).eval(), AutoProcessor.from_pretrained(vl_dir)


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    from gem_core.cli import main

    out = str(tmp_path_factory.mktemp("data") / "geometry.parquet")
    args = ["make-dataset", "verl", "--env", ENV, "--env-kwargs", ENV_KWARGS, "--n", "3", "--seed-start", "4"]
    assert main([*args, "--max-turn-tokens", str(TURN_TOKENS), "--out", out]) == 0
    return out


def _verl_dataset(parquet, processor):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    # filter_overlong_prompts needs qwen_vl_utils (verl's verl-core extra), not installed here
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": PROMPT_LENGTH, "filter_overlong_prompts": False, "return_raw_chat": True})
    return RLHFDataset(data_files=[parquet], tokenizer=processor.tokenizer, config=config, processor=processor)


def _first(row) -> MultimodalObservation:
    return TaskSpec.from_columns(row).first_observation()


def _pixels(image) -> list:
    return image.tobytes()


# -- the dataset ----------------------------------------------------------------------------------------


def test_rows_are_verl_multimodal_rows_its_dataset_reads(parquet, vl):
    import pyarrow.parquet as pq

    processor = vl[1]
    table = pq.read_table(parquet)
    assert "images" in table.column_names and table.num_rows == 3
    dataset = _verl_dataset(parquet, processor)
    assert len(dataset) == 3
    for i in range(3):
        row = dataset[i]
        first = _first(row)
        assert row["env_seed"] == 4 + i and "images" not in row  # verl moved the images into the prompt
        [message] = row["raw_prompt"]
        kinds = [part["type"] for part in message["content"]]
        assert kinds == ["image", "text"] and first.text.startswith("<image>")
        assert message["content"][1]["text"] == first.text[len("<image>") :]
        image = message["content"][0]["image"]
        assert image.size == (96, 96) and _pixels(image.convert("RGB")) == _pixels(first.images[0])  # PNG: lossless
        # the prompt verl's processor makes of its row is the one the gem_env loop plays from
        text = processor.apply_chat_template(row["raw_prompt"], tokenize=False, add_generation_prompt=True)
        ids = processor(text=[text], images=[image], add_special_tokens=False)["input_ids"][0]
        assert list(ids) == VLChatFormatter(processor).prompt_ids(first)
        assert list(ids).count(VLChatFormatter(processor).image_token_id) == IMAGE_TOKENS


def test_text_rows_have_no_images_column(tmp_path):
    import pyarrow.parquet as pq

    from gem_integrations.verl.dataset import make_dataset

    out = make_dataset("game:GuessTheNumber-v0-easy", 2, str(tmp_path / "t.parquet"))
    assert "images" not in pq.read_table(out).column_names


# -- the agent loop ---------------------------------------------------------------------------------------


def _server(vl_dir, vl, response_length=RESPONSE_LENGTH):
    model = HFVisionModel(*vl)
    return FaithfulVerlServer(vl_dir, prompt_length=PROMPT_LENGTH, response_length=response_length, model=model), model


def _vl_worker(cls, vl_dir, vl, *overrides):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    overrides = (f"actor_rollout_ref.model.tokenizer_path={vl_dir}", f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}", *overrides)
    config = compose_verl_config(vl_dir, *overrides)
    worker = cls.__new__(cls)
    with pytest.warns(UserWarning, match="Unsupported processor type: LlavaProcessor"):
        AgentLoopWorker.__init__(worker, config, llm_client=None)
    assert worker.processor is None  # verl 0.9.1 supports no LLaVA processor: hand it the tiny model's
    worker.processor = vl[1]
    return worker


def _rows(parquet, vl):
    """The rows as verl's dataset hands them to the worker (its non-tensor columns)."""
    dataset = _verl_dataset(parquet, vl[1])
    return [{k: v for k, v in dataset[i].items() if k != "dummy_tensor"} for i in range(len(dataset))]


def _reference(row, vl):
    """gem_core's runner on the same row: the tiny model behind the vLLM-faithful engine (VLLMPolicy)."""
    formatter = VLChatFormatter(vl[1])
    engine = VLLMFaithfulEngine(HFVisionModel(*vl), max_model_len=PROMPT_LENGTH + RESPONSE_LENGTH)
    policy = VLLMPolicy(VLLMFaithfulLLM(engine), sampling_params_cls=VLLMSamplingParams, image_token_id=formatter.image_token_id)
    config = RunConfig(params=SamplingParams(max_tokens=RESPONSE_LENGTH))
    return asyncio.run(play_row(TaskSpec.from_columns(row), policy, formatter, config, response_budget=RESPONSE_LENGTH))


def test_legacy_worker_plays_vision_rows_like_the_core_runner(vl_dir, vl, parquet):
    from tensordict import TensorDict
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = _vl_worker(AgentLoopWorker, vl_dir, vl)
    server, model = _server(vl_dir, vl)
    worker.llm_client = InProcessServerManager(server)
    rows = _rows(parquet, vl)
    n = len(rows)
    non_tensor = {key: np.array([row[key] for row in rows], dtype=object) for key in rows[0]}
    batch = DataProto(batch=TensorDict({"dummy_tensor": torch.zeros(n, 1, dtype=torch.uint8)}, batch_size=n), non_tensor_batch=non_tensor)

    output = asyncio.run(worker.generate_sequences(batch))

    token = VLChatFormatter(vl[1]).image_token_id
    width = output.batch["prompts"].shape[1]
    for i, row in enumerate(rows):
        reference = _reference(row, vl)
        view = sequence_batch([reference], pad_id=0)
        n_resp = view.lengths[0]
        assert reference.num_turns == 3 and len(reference.images) == 1  # two wrong answers get feedback: three turns
        attention = output.batch["attention_mask"][i]
        assert output.batch["prompts"][i][attention[:width].bool()].tolist() == reference.prompt_ids
        length = int(attention[width:].sum())
        assert length == n_resp
        assert output.batch["responses"][i, :length].tolist() == view.response_ids[0, :n_resp].tolist()
        assert output.batch["response_mask"][i, :length].tolist() == view.loss_mask[0, :n_resp].astype(int).tolist()
        # verl built the actor's inputs from our multi_modal_data: the env's image through the processor
        inputs = output.non_tensor_batch["multi_modal_inputs"][i]
        expected = vl[1].image_processor(reference.images, return_tensors="pt")["pixel_values"]
        assert torch.equal(inputs["pixel_values"], expected)
        # ... and the model reading them with the sequence predicts every model token the rollout sampled
        ids = output.batch["input_ids"][i][attention.bool()].unsqueeze(0)
        assert int((ids == token).sum()) == IMAGE_TOKENS
        with torch.inference_mode():
            logits = vl[0](input_ids=ids, pixel_values=inputs["pixel_values"]).logits[0]
        start = len(reference.prompt_ids)
        mask = view.loss_mask[0, :n_resp].astype(bool)
        predicted = logits[start - 1 : start - 1 + n_resp].argmax(-1).numpy()
        assert (predicted[mask] == view.response_ids[0, :n_resp][mask]).all()
    # every request carried the context's image as image_data, with one image token per image (vLLM's form)
    assert server.calls and all(len(call["image_data"]) == 1 and call["prompt_ids"].count(token) == 1 for call in server.calls)
    assert all(pixels == (1, 3, 32, 32) and count == IMAGE_TOKENS for count, pixels in model.calls)


def _tq_worker_class():
    from verl.trainer.ppo.v1 import agent_loop_tq

    modified = agent_loop_tq.AgentLoopWorkerTQ.__ray_metadata__.modified_class
    return next(c for c in modified.__mro__ if c.__name__ == "AgentLoopWorkerTQ" and "_modify_class" not in c.__qualname__)


def test_v1_worker_stores_multimodal_inputs_and_turn_ids(vl_dir, vl, parquet, monkeypatch):
    """verl's v1 (TransferQueue, the default trainer) worker: the stored row holds verl's multi_modal_inputs
    (not the raw images) and the runner's turn ids."""
    from verl.trainer.ppo.v1 import agent_loop_tq

    stored: dict[str, dict] = {}

    def capture(fields):
        fields = list(fields)
        original(fields)  # verl's own conversion must accept the rows
        return fields

    async def kv_batch_put(keys, fields, tags, partition_id):
        stored.update(zip(keys, fields))

    async def kv_put(key, partition_id, tag):
        pass

    original = agent_loop_tq.list_of_dict_to_tensordict
    monkeypatch.setattr(agent_loop_tq, "list_of_dict_to_tensordict", capture)
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", kv_batch_put)
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_put", kv_put)
    worker = _vl_worker(_tq_worker_class(), vl_dir, vl)
    worker.llm_client = InProcessServerManager(_server(vl_dir, vl)[0])
    worker.background_tasks = set()
    row = _rows(parquet, vl)[0]

    prompt = {**row, "uid": "u0", "global_steps": 1, "__rollout_n__": 1}
    asyncio.run(worker._run_prompt(prompt, dict(SAMPLING), {"step": 1, "sample_index": 0, "rollout_n": 0, "validate": False}))

    field = stored["u0_0_0"]
    reference = _reference(row, vl)
    view = sequence_batch([reference], pad_id=0)
    n = view.lengths[0]
    assert "multi_modal_data" not in field
    expected = vl[1].image_processor(reference.images, return_tensors="pt")["pixel_values"]
    assert torch.equal(field["multi_modal_inputs"]["pixel_values"], expected)
    assert field["prompts"].tolist() == reference.prompt_ids
    assert field["responses"].tolist() == view.response_ids[0, :n].tolist()
    assert field[TURN_IDS_FIELD].tolist() == view.turn_ids[0, :n].tolist()


def _loop(worker, manager):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from gem_integrations.verl.rollout import GemEnvAgentLoop

    return GemEnvAgentLoop(
        trainer_config=DictConfigWrap(worker.config),
        server_manager=manager,
        tokenizer=worker.tokenizer,
        processor=worker.processor,
        dataset_cls=worker.dataset_cls,
        data_config=DictConfigWrap(worker.config.data),
    )


def test_output_carries_the_envs_images_as_verls_multi_modal_data(vl_dir, vl, parquet):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = _vl_worker(AgentLoopWorker, vl_dir, vl)
    row = _rows(parquet, vl)[1]
    output = asyncio.run(_loop(worker, InProcessServerManager(_server(vl_dir, vl)[0])).run(dict(SAMPLING), **row))
    [image] = output.multi_modal_data["images"]
    assert _pixels(image) == _pixels(_first(row).images[0])
    assert set(output.multi_modal_data) == {"images"}  # verl's key, read by _compute_multi_modal_inputs


def test_a_text_model_with_a_vision_row_is_one_clear_error(verl_config, vl_dir, vl, parquet):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from conftest import faithful_server_manager

    worker = AgentLoopWorker.__new__(AgentLoopWorker)
    AgentLoopWorker.__init__(worker, verl_config, llm_client=None)  # the text model: no processor
    manager = faithful_server_manager(verl_config.actor_rollout_ref.model.tokenizer_path)
    row = _rows(parquet, vl)[0]
    with pytest.raises(ValueError, match="shows images, but verl gave the agent loop no multimodal processor") as err:
        asyncio.run(_loop(worker, manager).run(dict(SAMPLING), **row))
    assert "\n" not in str(err.value) and manager.calls == []


def test_an_overlong_multimodal_prompt_is_refused_not_cut(vl_dir, vl, parquet):
    """verl's rule: image tokens cannot be left-truncated (AgentLoopBase.ct_build_initial_tokens)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = _vl_worker(AgentLoopWorker, vl_dir, vl, "actor_rollout_ref.rollout.prompt_length=32")
    server = _server(vl_dir, vl)[0]
    with pytest.raises(ValueError, match="exceeds rollout.prompt_length=32; image tokens cannot be cut"):
        asyncio.run(_loop(worker, InProcessServerManager(server)).run(dict(SAMPLING), **_rows(parquet, vl)[0]))
    assert server.calls == []


def test_policy_without_image_token_refuses_images():
    from PIL import Image

    from gem_integrations.verl.rollout import VerlServerPolicy

    policy = VerlServerPolicy(None, {})
    with pytest.raises(ValueError, match="knows no image token"):
        asyncio.run(policy.generate([1, 2], SamplingParams(max_tokens=2), multi_modal_data={"image": [Image.new("RGB", (4, 4))]}))


# -- data.mm_processor_kwargs, a later turn's figure, images side by side ----------------------------------

FOLLOWUP = "vision:Geometry-v0-followup"
#: verl's data.mm_processor_kwargs: 32x32 pixels (16 tokens an image, what the model reads) where the
#: processor's defaults give 64x64 (64 tokens), as a max_pixels cap under Qwen-VL's defaults
MM_KWARGS = {"size": {"height": 32, "width": 32}}
MM_OVERRIDE = "+data.mm_processor_kwargs.size={height:32,width:32}"


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """The tiny model with a processor whose defaults (64x64) do not fit it without MM_KWARGS."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    path = save_tiny_vl(tmp_path_factory.mktemp("tiny-vl-64"), processor_image_size=64)
    return path, (LlavaForConditionalGeneration.from_pretrained(path).eval(), AutoProcessor.from_pretrained(path))


def _followup_images(row) -> list:
    """The env's two figures for a row: the first shown at reset, the second after the first answer."""
    env = TaskSpec.from_columns(row).make_env()
    first, _ = env.reset(seed=int(row["env_seed"]))
    second = env.step("no answer")[0]
    return [*first.images, *second.images]


def test_mm_processor_kwargs_and_a_later_turns_figure_reach_the_server_and_the_actor(capped, tmp_path):
    from gem_core.cli import main
    from tensordict import TensorDict
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    path, vl = capped
    out = str(tmp_path / "followup.parquet")
    args = ["make-dataset", "verl", "--env", FOLLOWUP, "--env-kwargs", ENV_KWARGS, "--n", "2", "--seed-start", "7"]
    assert main([*args, "--max-turn-tokens", str(TURN_TOKENS), "--out", out]) == 0
    worker = _vl_worker(AgentLoopWorker, path, vl, MM_OVERRIDE)
    server, model = _server(path, vl)
    worker.llm_client = InProcessServerManager(server)
    rows = _rows(out, vl)
    non_tensor = {key: np.array([row[key] for row in rows], dtype=object) for key in rows[0]}
    batch = DataProto(batch=TensorDict({"dummy_tensor": torch.zeros(2, 1, dtype=torch.uint8)}, batch_size=2), non_tensor_batch=non_tensor)

    output = asyncio.run(worker.generate_sequences(batch))

    token = VLChatFormatter(vl[1]).image_token_id
    width = output.batch["prompts"].shape[1]
    for i, row in enumerate(rows):
        images = _followup_images(row)
        attention = output.batch["attention_mask"][i]
        ids = output.batch["input_ids"][i][attention.bool()].unsqueeze(0)
        assert int((ids == token).sum()) == 2 * IMAGE_TOKENS  # 16 per image, as the kwargs give, not 64
        assert int((output.batch["prompts"][i][attention[:width].bool()] == token).sum()) == IMAGE_TOKENS  # the second: a later turn
        inputs = output.non_tensor_batch["multi_modal_inputs"][i]
        expected = vl[1].image_processor(images, return_tensors="pt", **MM_KWARGS)["pixel_values"]
        assert torch.equal(inputs["pixel_values"], expected)  # verl rebuilt the features with the same kwargs
        # the actor's forward over the sequence and those features predicts every token the rollout sampled
        with torch.inference_mode():
            logits = vl[0](input_ids=ids, pixel_values=inputs["pixel_values"]).logits[0]
        start = int(attention[:width].sum())
        mask = output.batch["response_mask"][i][: ids.shape[1] - start].bool()
        response = output.batch["responses"][i][: ids.shape[1] - start]
        assert (logits[start - 1 : ids.shape[1] - 1].argmax(-1)[mask] == response[mask]).all()
    # each episode (the two run side by side): the first request with one image, the second with both; the
    # kwargs with every one, and the model got 32x32 pixels
    assert sorted(len(call["image_data"]) for call in server.calls) == [1, 1, 2, 2]
    assert all(call["prompt_ids"].count(token) == len(call["image_data"]) and call["mm_processor_kwargs"] == MM_KWARGS for call in server.calls)
    assert sorted(model.calls) == sorted([(IMAGE_TOKENS, (1, 3, 32, 32)), (2 * IMAGE_TOKENS, (2, 3, 32, 32))] * 2)


def test_images_side_by_side_are_sent_as_one_token_each(vl_dir, vl):
    """A template with nothing between two images renders one run of 32 tokens: cut by each image's count."""
    from PIL import Image

    from gem_integrations.verl.rollout import VerlServerPolicy

    formatter = VLChatFormatter(vl[1])
    server = _server(vl_dir, vl)[0]
    observation = MultimodalObservation("<image><image>\nWhich one is red?", (Image.new("RGB", (40, 30), "red"), Image.new("RGB", (30, 50), "blue")))
    prompt = formatter.prompt_ids(observation)
    policy = VerlServerPolicy(InProcessServerManager(server), dict(SAMPLING), formatter.image_token_id, image_token_counts=formatter.image_token_counts)
    generation = asyncio.run(policy.generate(prompt, SamplingParams(max_tokens=3), request_id="e-0", multi_modal_data={"image": list(observation.images)}))
    [call] = server.calls
    assert call["prompt_ids"].count(formatter.image_token_id) == 2 and len(generation.token_ids) == 3
