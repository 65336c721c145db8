"""gem-core for ROLL (alibaba/ROLL; not on PyPI, and PyPI's ``roll`` is an unrelated package).

* :mod:`.rollout`: :class:`~gem_integrations.roll.rollout.GemCoreEnv`, any gem-core env id behind gem-llm's
  ``Env`` interface as ROLL's env managers call it, registered as ``env_type: gem-core`` in the ``gem``
  registry (gem-llm 0.0.4, ROLL's pin); the module docstring says why registration and what ROLL reads.
* :mod:`.env_manager`: the ``env_manager_cls`` to name in ROLL's YAML: importing it registers the env
  in ROLL's env workers; its classes are ROLL's own managers.
* :mod:`.group_filter`: the ``group_filter_cls`` that keeps episodes the infrastructure failed
  (gem-core's ``info["infra_error"]``) out of ROLL's batch, and counts them.
* :mod:`.llm_proxy`: the ``llm_proxy`` ``gem_core_policy``, ROLL's ``PolicyProxy`` keeping the stop token's
  logprob when the pad token is the stop token (:func:`padding_stop_ids`; imports ROLL).
* :mod:`.pipeline`: the ``pipeline_cls``, ROLL's ``AgenticPipeline`` with a ``batch_adjust_mode: delete``
  that runs at ROLL 8eb27cc (imports ROLL).
* :data:`ROLL_REBN`: the core :func:`gem_core.algo.rebn` settings that reproduce ROLL's
  ``step_reinforce`` with ``reward_normalization: {grouping: batch, method: mean_std}``
  (``examples/roll/``).

Nothing here but :mod:`.pipeline` and :mod:`.llm_proxy` imports ROLL; :mod:`.rollout` imports ``gem`` (gem-llm).
"""

from __future__ import annotations

from typing import Any

# ROLL's agentic_reward_norm (roll/pipeline/agentic/utils.py) with grouping batch and mean_std:
# torch.std (sample std, ddof 1), (x - mean) / (std + 1e-6), and zeros when n <= 1 or std <= 1e-6.
ROLL_REBN: dict[str, Any] = {"ddof": 1, "eps": 1e-6, "min_std": 1e-6}


def rebn_settings(step_reward_gamma: float) -> dict[str, Any]:
    """``gem_core.algo.rebn`` keyword arguments equal to ROLL's ``step_reinforce`` with ``step_reward_gamma``
    and batch ``mean_std`` normalisation (whole batch, no grouping)."""
    return {"gamma": float(step_reward_gamma), "group_by": None, **ROLL_REBN}


def padding_stop_ids(eos_token_id: Any, pad_token_id: int | None) -> Any:
    """The stop ids to hand ROLL's ``postprocess_generate``: the pad id alone when every stop id is the pad id.

    ROLL's router gives ``[eos, pad]``; ``get_pad_mask`` keeps a response's first pad token (its stop token) only when
    ``eos_token == pad_token``, which a list never is. Any other stop ids are returned as they came."""
    ids = list(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
    if pad_token_id is not None and ids and all(i == pad_token_id for i in ids):
        return pad_token_id
    return eos_token_id


__all__ = ["ROLL_REBN", "padding_stop_ids", "rebn_settings"]
