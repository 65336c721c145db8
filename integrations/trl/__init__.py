"""gem-core for Hugging Face TRL 1.16 (``pip install -e '.[trl]'``): GEM envs and ReBN in ``GRPOTrainer``.

    from trl import GRPOConfig
    from gem_integrations.trl import GemGRPOTrainer, make_dataset

    trainer = GemGRPOTrainer(model, args=GRPOConfig(num_generations=8, max_completion_length=256, ...),
                             train_dataset=make_dataset("game:GuessTheNumber-v0-easy", 1024),
                             gamma=0.9)             # rebn: eps=1e-6, ddof=0, group_by=None by default
    trainer.train()

* ``rollout``: :class:`GemRollout`, TRL's ``rollout_func``: each prompt's episode played by gem_core's
  runner with TRL's generation (the model's ``generate``, or TRL's vLLM client/colocated engine), returned
  as one completion with ``env_mask`` and per-token turn ids; :func:`episode_return`, the reward function.
* ``advantage``: :class:`GemGRPOTrainer`, ``GRPOTrainer`` with ReBN as (B, T) advantages.
* ``dataset``: :func:`make_dataset` (a ``datasets.Dataset``), ``gem-core make-dataset trl`` (JSONL).
* ``environment_factory``: a gem-core id as the env class of ``GRPOTrainer(environment_factory=...)``
  (typed tool methods), :func:`environment_dataset`, :func:`close_environments`.

Nothing here imports TRL until an attribute below is used.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "PLUGIN",
    "GemGRPOTrainer",
    "GemRollout",
    "TRLGeneratePolicy",
    "TRLVLLMPolicy",
    "close_environments",
    "environment_dataset",
    "environment_factory",
    "episode_return",
    "make_dataset",
    "rebn_advantages",
    "task_of",
]

_WHERE = {
    "PLUGIN": "plugin_spec",
    "GemGRPOTrainer": "advantage",
    "rebn_advantages": "advantage",
    "GemRollout": "rollout",
    "TRLGeneratePolicy": "rollout",
    "TRLVLLMPolicy": "rollout",
    "episode_return": "rollout",
    "make_dataset": "dataset",
    "task_of": "dataset",
    "environment_factory": "environment_factory",
    "environment_dataset": "environment_factory",
    "close_environments": "environment_factory",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
