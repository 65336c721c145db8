"""The golden scenario through the TRL plugin: GemRollout (TRL's vLLM server path, vLLM-faithful engine) and
GemGRPOTrainer's real `_generate_and_score_completions` give the core reference's token ids, masks,
logprobs and per-token ReBN advantages; with ReBN off, everything equals plain GRPOTrainer's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import FakeVLLMGeneration, faithful_client, golden_rows, grpo_config
from datasets import Dataset
from trl import GRPOTrainer

from gem_core.testing import build_tiny_model
from gem_integrations.trl import GemGRPOTrainer, GemRollout, episode_return


def _trainer(cls, tokenizer, golden, tmp_path, **kwargs):
    rows = golden_rows(golden)
    n = len(rows)
    model = build_tiny_model(len(tokenizer), seed=0, hidden_size=32)
    model.config.pad_token_id = tokenizer.pad_token_id
    args = grpo_config(tmp_path, per_device_train_batch_size=n, num_generations=n, max_completion_length=1024)
    trainer = cls(model, episode_return, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer, rollout_func=GemRollout(), **kwargs)
    # TRL's vLLM server mode, with the stand-in client (conftest): what GRPOTrainer's __init__ sets when use_vllm
    generation = FakeVLLMGeneration(faithful_client(tokenizer))
    trainer.use_vllm, trainer.vllm_generation, trainer._last_loaded_step = True, generation, -1
    return trainer, rows, generation


def _score(trainer, rows):
    trainer.model.train()
    inputs = [dict(row) for row in rows]
    return trainer._generate_and_score_completions(inputs), inputs


def test_golden_through_rollout_and_rebn_subclass(tokenizer, golden, tmp_path):
    assert any("python" in e.tools for e in golden.episodes), "the tool-env episode is part of the scenario"
    trainer, rows, generation = _trainer(GemGRPOTrainer, tokenizer, golden, tmp_path, gamma=golden.gamma, eps=golden.eps, ddof=golden.ddof)
    out, inputs = _score(trainer, rows)
    assert generation.synced == 1  # TRL synced the weights before calling the rollout function
    assert out["advantages"].shape == out["completion_ids"].shape
    for i, (sequence, trajectory) in enumerate(zip(golden.sequences, golden.trajectories)):
        p, n = len(sequence.prompt_ids), len(sequence.response_ids)
        prompt = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
        assert prompt == sequence.prompt_ids, trajectory.episode_id
        assert out["completion_ids"][i, :n].tolist() == sequence.response_ids, trajectory.episode_id
        assert out["completion_mask"][i, :n].tolist() == [1] * n and not out["completion_mask"][i, n:].any()
        assert out["tool_mask"][i, :n].tolist() == golden.loss_masks[i], trajectory.episode_id
        assert out["sampling_per_token_logps"][i, :n].tolist() == pytest.approx(sequence.logprobs, abs=0), trajectory.episode_id
        np.testing.assert_allclose(out["advantages"][i, :n].numpy(), golden.token_advantages[i], atol=1e-6, rtol=0)
        assert not out["advantages"][i, n:].any()
        assert inputs[i]["gem_turn_rewards"] == trajectory.rewards
        assert inputs[i]["gem_turn_ids"] == sequence.turn_ids
        assert inputs[i]["gem_return"] == pytest.approx(sum(trajectory.rewards))
        assert p > 0
    # every turn was one request with the golden per-turn budget (or less: the context limit) and the chat
    # template's end-of-turn token as a stop token, which vLLM keeps in token_ids
    calls = generation.vllm_client.calls
    assert sum(len(c["prompts"]) for c in calls) == sum(len(t.turns) for t in golden.trajectories)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert all(c["max_tokens"] <= golden.params.max_tokens and im_end in c["stop_token_ids"] and c["logprobs"] == 0 for c in calls)


def test_unpatched_path_equals_plain_grpo_trainer(tokenizer, golden, tmp_path):
    """Everything but the advantages is TRL's own; with estimator="trl" the advantages are TRL's too."""
    plain, rows, _ = _trainer(GRPOTrainer, tokenizer, golden, tmp_path)
    expected, _ = _score(plain, rows)
    for estimator in ("rebn", "trl"):
        gem, rows, _ = _trainer(GemGRPOTrainer, tokenizer, golden, tmp_path, estimator=estimator)
        got, _ = _score(gem, rows)
        assert set(got) == set(expected)
        for key, value in expected.items():
            if key == "advantages" and estimator == "rebn":
                assert got[key].shape == got["completion_ids"].shape and value.dim() == 1
                continue
            if isinstance(value, torch.Tensor):
                assert torch.equal(got[key], value), (estimator, key)
            else:
                assert got[key] == value, (estimator, key)


def test_rows_that_stop_at_the_move_send_the_brace_stops_through_trl(tokenizer, golden, tmp_path):
    # rollout.stop_after_box rides in the row's task spec (make-dataset trl --stop-after-box): every request TRL's
    # generation sends carries the closing-brace stop ids, after the end of turn
    from gem_core.rollout.policy import closing_brace_ids
    from gem_core.tasks import TaskSpec
    from gem_core.testing.golden import GOLDEN_MAX_CONTEXT_TOKENS, GOLDEN_PARAMS
    from gem_integrations.trl.dataset import prompt_of

    trainer, _, generation = _trainer(GemGRPOTrainer, tokenizer, golden, tmp_path)
    fields = {"max_turn_tokens": GOLDEN_PARAMS.max_tokens, "max_context_tokens": GOLDEN_MAX_CONTEXT_TOKENS, "stop_after_box": True}
    rows = [{"prompt": prompt_of(TaskSpec(e.env_id, seed=e.seed, env_kwargs=e.env_kwargs, tools=e.tools, **fields))} for e in golden.episodes]
    out, _ = _score(trainer, rows)
    braces, im_end = set(closing_brace_ids(tokenizer)), tokenizer.convert_tokens_to_ids("<|im_end|>")
    calls = generation.vllm_client.calls
    assert calls and all(braces <= set(c["stop_token_ids"]) and c["stop_token_ids"][0] == im_end for c in calls)
    assert out["completion_ids"].shape[0] == len(rows)
