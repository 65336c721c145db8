"""PATCH (GPU weight sync) for the step test's two updates (test_openrlhf_real_step.py) and the benchmark's runs
(experiment_run.py): the weights an OpenRLHF update trained reach the running vLLM engine before the next rollout,
on CPU.

OpenRLHF 0.11.2's ``PolicyModelActor.broadcast_to_vllm`` sends each parameter to the engines by CUDA IPC or
NCCL, and its vLLM worker extension (``WorkerWrap.update_weight*``) hands it to the engine's
``model_runner.model.load_weights``; neither transport exists on this CPU. TEST MACHINERY, kept out of the
plugin (``integrations/``):

* :class:`ReloadingPolicyModelActor` (real_step_actors.py's float32 CPU policy actor): ``broadcast_to_vllm``
  writes the actor's current weights as a Hugging Face checkpoint (``save_pretrained``: safetensors, the
  checkpoint format vLLM loads) under ``--ckpt.path``/``SYNC_DIR``, and asks every engine to reload from it;
  it records, per call, the folder and the norm of the change since the weights the engine last had; the
  folder is removed once reloaded unless its update is kept (:func:`kept_updates`).
* :class:`ReloadingRolloutRayActor` (OpenRLHF's ``RolloutRayActor``, float32 as in real_step_actors.py) with
  one method more, :meth:`reload_weights_from`: vLLM's own in-place reload, ``Worker.reload_weights
  (weights_path=...)`` reached through ``AsyncLLM.collective_rpc`` (vLLM 0.29: ``GPUModelRunner.reload_weights``,
  which the CPU model runner inherits: the layerwise reload over ``model.load_weights``, then the CPU
  kernels' weight processing run again), then the tied LM head's processing redone (gem_core.testing.vllm_cpu_reload: a
  vLLM 0.29 CPU gap, measured). The prefix cache is reset after it, as OpenRLHF does when it is on.
* :class:`GreedyReloadingRolloutRayActor` (the step test's): the reloading actor whose engine reports raw
  log-probs where OpenRLHF asks for processed ones (see the class).

Everything else (when ``broadcast_to_vllm`` is called: after each update, before the next rollout) is
OpenRLHF's ``PPOTrainer.train_step``.
"""

from __future__ import annotations

import os
import shutil
import time

import ray
import ray_step_actors
import real_step_actors
import torch
from gem_core.testing.vllm_cpu_reload import kept_updates

SYNC_DIR = "gem-test-weight-sync"  # under --ckpt.path: one checkpoint folder per update, update-<n>


class _ReloadingRolloutRayActor(real_step_actors._Float32RolloutRayActor):
    """OpenRLHF's RolloutRayActor (float32 engine) that can reload its weights in place (see the module docstring)."""

    async def reload_weights_from(self, path: str) -> dict:
        """PATCH (GPU weight sync): vLLM's in-place reload from the checkpoint folder ``path``, then the tied LM
        head's processing redone (see gem_core.testing.vllm_cpu_reload); the number of reloads so far, and per worker whether
        the head was tied (re-processed)."""
        from gem_core.testing.vllm_cpu_reload import repack_tied_lm_head

        await self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        tied = await self.llm.collective_rpc(repack_tied_lm_head)
        if self.kwargs.get("enable_prefix_caching"):
            await self.llm.reset_prefix_cache()  # KV computed with the old weights (what OpenRLHF's sync does)
        self.reloads = getattr(self, "reloads", 0) + 1
        return {"reloads": self.reloads, "tied_lm_head_repacked": tied}


ReloadingRolloutRayActor = _ReloadingRolloutRayActor  # given to real_step_actors.recorded_vllm_engines


class _GreedyReloadingRolloutRayActor(_ReloadingRolloutRayActor):
    """The reloading RolloutRayActor; PATCH (greedy check): its engine in ``logprobs_mode=raw_logprobs`` where
    OpenRLHF asks for ``processed_logprobs`` (for its importance-sampling correction). The step test decodes greedily
    through a tiny ``--rollout.top_p`` (see test_openrlhf_real_step.py), and after top-p the processed log-prob of
    every token is 0; the raw one is the model's at temperature 1, what OpenRLHF's actor computes, and what the
    processed one is at OpenRLHF's default sampling (temperature 1, top_p 1)."""

    async def __init__(self, *args, **kwargs):
        self.requested_logprobs_mode = kwargs.get("logprobs_mode")
        if self.requested_logprobs_mode is not None:
            kwargs["logprobs_mode"] = "raw_logprobs"
        await super().__init__(*args, **kwargs)


GreedyReloadingRolloutRayActor = _GreedyReloadingRolloutRayActor  # given to real_step_actors.recorded_vllm_engines


def reloaded_engines(engines) -> list[int]:
    """How many times each engine reloaded its weights (driver side)."""
    return ray.get([engine.__ray_call__.remote(lambda actor: getattr(actor, "reloads", 0)) for engine in engines], timeout=120)


class _ReloadingPolicyModelActor(real_step_actors._Float32PolicyModelActor):
    """real_step_actors.py's float32 CPU policy actor whose weight sync reloads the engines (see the module docstring)."""

    def init_model_from_pretrained(self, strategy, pretrain, max_steps=None, vllm_engines=None):
        super().init_model_from_pretrained(strategy, pretrain, max_steps, vllm_engines)
        self.reloads: list[dict] = []
        self.synced = self._weights()  # what the engines hold: the model both started from

    def _weights(self) -> dict[str, torch.Tensor]:
        model = self.strategy._unwrap_model(self.actor)
        return {name: param.detach().clone() for name, param in model.named_parameters()}

    def broadcast_to_vllm(self):
        super().broadcast_to_vllm()  # counted
        # PATCH (GPU weight sync): the actor's weights -> a checkpoint folder -> vLLM's in-place reload
        path = os.path.join(self.strategy.args.ckpt.path, SYNC_DIR, f"update-{self.broadcasts}")
        self.strategy._unwrap_model(self.actor).save_pretrained(path)
        current = self._weights()
        change = sum(float((current[name] - self.synced[name]).double().pow(2).sum()) for name in current) ** 0.5
        self.synced = current
        engine_reloads = ray.get([engine.reload_weights_from.remote(path) for engine in self.vllm_engines], timeout=600)
        kept = self.broadcasts in kept_updates()
        if not kept:
            shutil.rmtree(path)  # the engines have reloaded it (about 0.5 GB)
        self.reloads.append({"path": path, "kept": kept, "weight_change_norm": change, "engine_reloads": engine_reloads})
        self._save_report()

    def _save_report(self) -> None:
        super()._save_report()
        path = os.path.join(self.strategy.args.ckpt.path, ray_step_actors.POLICY_REPORT)
        report = torch.load(path, weights_only=False)
        report["reloads"] = list(getattr(self, "reloads", []))
        torch.save(report, path)


ReloadingPolicyModelActor = ray.remote(num_gpus=1)(_ReloadingPolicyModelActor)


def remove_placement_groups(timeout: float = 60.0) -> int:
    """Remove every placement group left in the test's Ray cluster (driver side); how many were removed.

    OpenRLHF's ``train()`` (``--train.colocate_all``) creates a placement group and leaves it when it returns;
    it holds the cluster's one logical GPU, so a second ``train()`` in the same cluster would wait for its own
    placement group forever."""
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    left = [pg_id for pg_id, info in placement_group_table().items() if info["state"] != "REMOVED"]
    for pg_id in left:
        remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))
    deadline = time.monotonic() + timeout
    while any(placement_group_table()[pg_id]["state"] != "REMOVED" for pg_id in left):
        if time.monotonic() > deadline:
            raise TimeoutError(f"placement groups not removed in {timeout}s: {left}")
        time.sleep(0.2)
    return len(left)
