"""PATCH (GPU weight sync) for the two-update test (test_oat_two_updates.py): the weights an oat update trained
reach the actor's running vLLM engine before the next rollout, on CPU.

oat 0.2.4's ``LearnerBase.sync_params_to_actors`` (what ``LearnerBase.run`` calls after each ``learn``) calls
``_broadcast_to_vllm``: the learner announces each parameter to the actors (``ActorBase.update_weight``, oat's
``WorkerWrap`` in the engine) and sends it by an NCCL ``dist.broadcast``, GPU only. TEST MACHINERY, kept out of the
plugin (``integrations/oat``): :class:`CheckpointReload` takes ``_broadcast_to_vllm``'s place on the learner. It
writes the learner's current weights as a Hugging Face checkpoint (``save_pretrained``: float32, the learner's dtype;
safetensors, the format vLLM loads) under ``SYNC_DIR``, and the actor's engine (the ``vllm.LLM`` oat's
``ActorBase.init`` built) reloads them in place with vLLM's own ``Worker.reload_weights(weights_path=...)``
through ``LLM.collective_rpc``, then redoes its tied LM head's weight processing (``repack_tied_lm_head``, a vLLM 0.29
CPU gap: the reload leaves the head's packed copy of the embedding stale). The prefix cache is reset after it when it
is on, with oat's own ``ActorBase.reset_prefix_cache``, as ``_broadcast_to_vllm`` does. Each call records the folder,
the norm of the change since the weights the engine last had, and the engine's answer. The learner's ``LLM.model`` is
DeepSpeed's engine (here ../oat_harness.py's ``EngineStandIn``), which wraps the Hugging Face model as ``module``:
:func:`hf_model` unwraps it, so that the parameter names are the checkpoint's.
"""

from __future__ import annotations

from pathlib import Path

import torch

SYNC_DIR = "gem-test-weight-sync"  # one checkpoint folder per update, update-<n>


def hf_model(learner) -> torch.nn.Module:
    """The learner's Hugging Face model: ``oat.model.LLM.model`` is DeepSpeed's engine (its stand-in), the model its
    ``module``."""
    engine = learner.model.model
    return getattr(engine, "module", engine)


class CheckpointReload:
    """oat's ``_broadcast_to_vllm`` for one learner and one actor on CPU (see the module docstring)."""

    def __init__(self, learner, actor, root: Path):
        self.learner, self.actor, self.sync_dir = learner, actor, Path(root) / SYNC_DIR
        self.synced = self._weights()  # what the engine holds: the checkpoint both started from
        self.reloads: list[dict] = []

    def _weights(self) -> dict[str, torch.Tensor]:
        return {name: param.detach().clone() for name, param in hf_model(self.learner).named_parameters()}

    def __call__(self) -> None:
        from gem_core.testing.vllm_cpu_reload import repack_tied_lm_head

        model = hf_model(self.learner)  # oat.model.LLM's Hugging Face model, inside the engine
        path = self.sync_dir / f"update-{len(self.reloads) + 1}"
        model.save_pretrained(path)  # float32; a tied model writes the embedding only
        current = self._weights()
        change = sum(float((current[name] - self.synced[name]).double().pow(2).sum()) for name in current) ** 0.5
        self.synced = current
        llm = self.actor.llm
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
        tied = llm.collective_rpc(repack_tied_lm_head)
        if self.learner.args.enable_prefix_caching:
            self.actor.reset_prefix_cache()  # KV computed with the old weights
        dtypes = {str(param.dtype) for param in current.values()}
        self.reloads.append({"path": str(path), "weight_change_norm": change, "tied_lm_head_repacked": list(tied), "dtypes": sorted(dtypes)})
