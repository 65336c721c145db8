"""``pipeline_cls`` for ROLL: ROLL's ``AgenticPipeline`` with a ``batch_adjust_mode: delete`` that runs.

    pipeline_cls: gem_integrations.roll.pipeline.AgenticPipeline

Why. ROLL's pipeline (``roll/pipeline/agentic/agentic_pipeline.py``, ``run``) calls ``adjust_batch`` after the
per-step returns and before the batch normalisation, to make the sample count divide its train and infer batch
sizes. ReBN needs ``delete``: ``copy`` duplicates random samples, which then train twice and enter the batch
mean and std. At ROLL 8eb27cc, ``delete`` indexes ``data.batch`` with a boolean mask, which ROLL's own
``BatchProxy.__getitem__`` (``remote_protocol.py``) refuses (``key in TensorDict`` with a tensor: "key must be a
NestedKey"), so it raises whenever the count does not divide.

At start-up it refuses, in one line, a train env manager without
:class:`~gem_integrations.roll.group_filter.InfraErrorGroupFilter` (:func:`~gem_integrations.roll.group_filter.check_group_filter`).

What changes: ``delete`` only, done with ``DataProto.select_idxs`` (what ROLL's own ``copy`` path uses) on a
random subset of the same size ROLL would keep; the size rule is ROLL's own, read by growing a one-sample batch
with ROLL's ``copy`` (it pads to exactly the divisor). ROLL's fallback to ``copy`` for a batch smaller than the
divisor, its metrics and every other mode are ROLL's. Everything else in the pipeline is ROLL's class as it is.
Importing this module imports ROLL (only ROLL's launcher imports it, from ``pipeline_cls``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from roll.pipeline.agentic.agentic_pipeline import AgenticPipeline as RollAgenticPipeline

from gem_integrations.roll.group_filter import check_group_filter


class AgenticPipeline(RollAgenticPipeline):
    """ROLL's ``AgenticPipeline``; ``adjust_batch(mode="delete")`` drops the remainder through ``select_idxs``."""

    def __init__(self, pipeline_config: Any, *args: Any, **kwargs: Any):
        check_group_filter(pipeline_config)  # before ROLL starts its clusters
        super().__init__(pipeline_config, *args, **kwargs)

    def adjust_batch(self, data: Any, mode: str = "copy") -> Any:
        """ROLL's ``adjust_batch``, except ``delete``: keeps a random ``len - len % divisor`` samples, each once."""
        if mode != "delete":
            return super().adjust_batch(data, mode=mode)
        size = len(data)
        probe = data.select_idxs(np.array([0]))
        probe.meta_info = {}  # select_idxs shares meta_info; ROLL's adjust_batch writes its metrics there
        divisor = len(super().adjust_batch(probe, mode="copy"))  # ROLL pads one sample to exactly its divisor
        remove = size % divisor
        if remove == 0:
            return data
        if remove >= size:  # ROLL's own rule: never delete every sample, copy instead
            return super().adjust_batch(data, mode="copy")
        keep = np.sort(np.random.choice(size, size - remove, replace=False))
        adjusted = data.select_idxs(keep)
        metrics = dict(data.meta_info.get("metrics", {}))
        metrics["system/batch_add_count"] = 0
        metrics["system/batch_remove_count"] = remove
        adjusted.meta_info = {**data.meta_info, "metrics": metrics}
        return adjusted


__all__ = ["AgenticPipeline"]
