"""TRL 1.16 plugin tests: TRL's own GRPOTrainer on CPU (run by `nox -s trl`), nothing stubbed in TRL.

The tokenizer and the tiny model are built locally (gem_core.testing). Where a test needs a vLLM server,
the stand-in is `FaithfulVLLMClient`: TRL's `VLLMClient.generate` call shape (its signature is pinned in
test_plugin.py) answered by gem_core's VLLMFaithfulEngine (vLLM's stop-token, max_tokens and finish rules)
over the golden scenario's scripted model, so nothing passes because a stand-in is kinder than vLLM.
"""

from __future__ import annotations

import asyncio
import os

import pytest

pytest.importorskip("trl", reason="the TRL tests run in their own virtualenv: nox -s trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from gem_core.tasks import TaskSpec  # noqa: E402
from gem_core.testing import build_test_tokenizer, build_tiny_model  # noqa: E402
from gem_core.testing.golden import GOLDEN_MAX_CONTEXT_TOKENS, GOLDEN_PARAMS, golden_respond, golden_scenario  # noqa: E402
from gem_core.testing.vllm_engine import ScriptedModel, VLLMFaithfulEngine  # noqa: E402


class FaithfulVLLMClient:
    """TRL's ``VLLMClient.generate`` (same signature, same sampling payload: the named settings, then
    ``generation_kwargs`` on top) over a vLLM-faithful engine; answers as the client parses the server's."""

    def __init__(self, engine: VLLMFaithfulEngine):
        self.engine = engine
        self.calls: list[dict] = []

    def generate(
        self,
        prompts,
        features=None,
        n=1,
        repetition_penalty=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        max_tokens=16,
        logprobs=0,
        structured_outputs_regex=None,
        generation_kwargs=None,
    ):
        sampling = {
            "n": n,
            "repetition_penalty": repetition_penalty,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "min_p": min_p,
            "max_tokens": max_tokens,
            "logprobs": logprobs,
        }
        sampling.update(generation_kwargs or {})
        self.calls.append({"prompts": [list(p) for p in prompts], **sampling})
        outputs = [asyncio.run(self.engine.generate(list(p), dict(sampling))).outputs[0] for p in prompts]
        return {
            "prompt_ids": [list(p) for p in prompts],
            "completion_ids": [list(o.token_ids) for o in outputs],
            "logprobs": None if logprobs is None else [[[d[t].logprob] for t, d in zip(o.token_ids, o.logprobs)] for o in outputs],
            "logprob_token_ids": None if logprobs is None else [[[t] for t in o.token_ids] for o in outputs],
        }


class FakeVLLMGeneration:
    """The attributes of TRL's ``VLLMGeneration`` the rollout reads (server mode), with the stand-in client."""

    mode = "server"
    repetition_penalty = 1.0
    min_p = 0.0
    generation_kwargs = None

    def __init__(self, client: FaithfulVLLMClient):
        self.vllm_client = client
        self.synced = 0

    def sync_weights(self) -> None:
        self.synced += 1


def faithful_client(tokenizer) -> FaithfulVLLMClient:
    return FaithfulVLLMClient(VLLMFaithfulEngine(ScriptedModel(tokenizer, golden_respond)))


def golden_rows(golden) -> list[dict]:
    """One TRL input row per golden episode (its task spec with the golden limits)."""
    from gem_integrations.trl.dataset import prompt_of

    rows = []
    for episode in golden.episodes:
        spec = TaskSpec(
            episode.env_id,
            seed=episode.seed,
            env_kwargs=episode.env_kwargs,
            tools=episode.tools,
            max_turn_tokens=GOLDEN_PARAMS.max_tokens,
            max_context_tokens=GOLDEN_MAX_CONTEXT_TOKENS,
        )
        rows.append({"prompt": prompt_of(spec)})
    return rows


def grpo_config(tmp_path, **overrides):
    from trl import GRPOConfig

    settings = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        seed=0,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=64,
        max_steps=1,
        logging_steps=1,
        temperature=GOLDEN_PARAMS.temperature,
    )
    settings.update(overrides)
    return GRPOConfig(**settings)


def capture_loss_inputs(trainer) -> list[dict]:
    """Wrap ``trainer._compute_loss`` so that each call's inputs (and the completion logprobs before the
    update) are recorded; ``trainer.original_compute_loss`` keeps TRL's method."""
    import torch

    seen: list[dict] = []
    original = trainer._compute_loss

    def compute_loss(model, inputs):
        with torch.no_grad():
            logps = completion_logps(trainer, model, inputs)
        seen.append({**{k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}, "logps_before": logps})
        return original(model, inputs)

    trainer._compute_loss = compute_loss
    trainer.original_compute_loss = original
    return seen


def completion_logps(trainer, model, inputs):
    """TRL's per-token logprobs of the completions in a loss batch (its own function)."""
    import torch

    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention, inputs["completion_ids"].size(1))
    return logps


def row_of(inputs, row: int, reference) -> int:
    """The row of ``reference`` (a gem_core TokenBatch) holding loss-batch row ``row`` (TRL shuffles rows):
    matched on the prompt and completion tokens."""
    prompt = tuple(inputs["prompt_ids"][row][inputs["prompt_mask"][row].bool()].tolist())
    n = int(inputs["completion_mask"][row].sum())
    completion = tuple(inputs["completion_ids"][row, :n].tolist())
    matches = [
        i
        for i in range(len(reference))
        if tuple(reference.prompt_ids[i]) == prompt and tuple(reference.response_ids[i, : reference.lengths[i]].tolist()) == completion
    ]
    assert matches, f"loss row {row} matches no trajectory"
    return matches[0]


@pytest.fixture(scope="session")
def tokenizer():
    return build_test_tokenizer("qwen3")


@pytest.fixture(scope="session")
def golden(tokenizer):
    return golden_scenario(tokenizer=tokenizer)


@pytest.fixture()
def tiny_model(tokenizer):
    model = build_tiny_model(len(tokenizer), seed=0, hidden_size=32)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model
