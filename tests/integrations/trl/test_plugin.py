"""What the plugin relies on in TRL 1.16, pinned so that a TRL change fails here, loudly: the version range,
the private method GemGRPOTrainer overrides, the (B, T) advantages the loss accepts, env_mask, and the
vLLM client's call shape the stand-in copies."""

from __future__ import annotations

import inspect

import pytest
import trl
from conftest import FaithfulVLLMClient
from trl import GRPOTrainer

from gem_core.plugins import PluginError, discover
from gem_integrations.trl import PLUGIN, GemGRPOTrainer


def test_installed_trl_is_supported_and_discovered():
    assert PLUGIN.check_version() == trl.__version__
    assert discover()["trl"] is PLUGIN
    assert PLUGIN.estimators == ("rebn",) and PLUGIN.dataset == "gem_integrations.trl.dataset"


def test_unsupported_version_is_refused_before_anything_is_built(monkeypatch, tiny_model):
    monkeypatch.setattr(type(PLUGIN), "installed_version", lambda self: "2.0.0")
    with pytest.raises(PluginError, match=r"trl 2\.0\.0 is not supported by this plugin \(tested: trl>=1.16,<2\)"):
        GemGRPOTrainer(tiny_model)


def test_bad_options_are_refused(tiny_model):
    for kwargs, message in (({"estimator": "gae"}, "estimator"), ({"group_by": "uid"}, "group_by"), ({"ddof": 2}, "ddof"), ({"gamma": 1.5}, "gamma")):
        with pytest.raises(ValueError, match=message):
            GemGRPOTrainer(tiny_model, **kwargs)


def test_private_api_the_override_relies_on():
    # the overridden method: its name and signature, and that it still returns the advantages the loss reads
    method = GRPOTrainer._generate_and_score_completions
    assert list(inspect.signature(method).parameters) == ["self", "inputs"]
    source = inspect.getsource(method)
    assert '"advantages": advantages' in source
    assert "inp[key] = values[i]" in source, "the rollout's extra fields are put on the input rows (read after super())"
    # the loss takes (B, T) advantages as they are
    assert "if advantages.dim() == 1:" in inspect.getsource(GRPOTrainer._compute_loss)
    # the rollout function: its parameter, the keys it must return, env_mask as the loss mask
    assert "rollout_func" in inspect.signature(GRPOTrainer.__init__).parameters
    generate = inspect.getsource(GRPOTrainer._generate)
    assert '{"prompt_ids", "completion_ids", "logprobs"}' in generate
    assert 'extra_fields.pop("env_mask", None)' in generate
    assert "self.rollout_func(prompts, self)" in generate


def test_generation_path_the_rollout_mirrors():
    """TRL's own HF-generate path, which GemRollout's generation copies: the model unwrapped by
    unwrap_model_for_generation, under no_grad and TRL's summon_full_params (FSDP 1); and transformers'
    generate takes synced_gpus, which the rounds pass with several processes."""
    from transformers import GenerationMixin

    source = inspect.getsource(GRPOTrainer._generate_single_turn)
    assert "unwrap_model_for_generation(" in source and "torch.no_grad()" in source
    assert "self._dist.summon_full_params(self.model_wrapped, recurse=False)" in source
    assert "synced_gpus" in inspect.signature(GenerationMixin.generate).parameters


def test_vllm_client_stand_in_has_trls_signature():
    from trl.generation.vllm_client import VLLMClient

    real = inspect.signature(VLLMClient.generate)
    fake = inspect.signature(FaithfulVLLMClient.generate)
    assert [(p.name, p.default) for p in real.parameters.values()] == [(p.name, p.default) for p in fake.parameters.values()]


def test_a_vllm_context_refusal_is_that_requests_alone(tokenizer):
    """TRL's vLLM server refuses a whole batch (a 400 in vLLM's words, raised by TRL's client) for one prompt
    over its window: TRLVLLMPolicy splits the call until the refusal is the one request's
    (ContextLimitExceeded, which the runner ends as that episode's context limit); the others are answered."""
    import asyncio

    from conftest import FakeVLLMGeneration

    from gem_core.rollout import ContextLimitExceeded, SamplingParams
    from gem_core.testing.golden import golden_respond
    from gem_core.testing.vllm_engine import ScriptedModel, VLLMFaithfulEngine
    from gem_integrations.trl.rollout import TRLVLLMPolicy

    client = FaithfulVLLMClient(VLLMFaithfulEngine(ScriptedModel(tokenizer, golden_respond), max_model_len=64))
    policy = TRLVLLMPolicy(FakeVLLMGeneration(client))
    prompt = tokenizer.encode("<|im_start|>user\nGuess a number.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)

    async def three_at_once():
        prompts = [prompt, prompt + prompt, [prompt[0]] * 64]
        requests = (policy.generate(p, SamplingParams(max_tokens=4), request_id=f"e{i}/turn-0") for i, p in enumerate(prompts))
        return await asyncio.gather(*requests, return_exceptions=True)

    answers = asyncio.run(three_at_once())
    assert [type(a).__name__ for a in answers] == ["Generation", "Generation", "ContextLimitExceeded"]
    assert isinstance(answers[2], ContextLimitExceeded) and "maximum model length of 64" in str(answers[2])
    assert [len(call["prompts"]) for call in client.calls] == [3, 1, 2, 1, 1]  # refused, answered, refused, answered, refused
