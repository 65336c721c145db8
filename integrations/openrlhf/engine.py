"""OpenRLHF's vLLM engine as a gem_core :class:`~gem_core.rollout.Policy` (the runner's side of the agent).

OpenRLHF hands its agent executor ``llm_engine`` (the ``RolloutRayActor``) and the rollout's
``vllm.SamplingParams``; the actor's ``generate(prompt_token_ids, sampling_params,
multi_modal_data=None)`` answers with a vLLM ``RequestOutput``. :class:`OpenRLHFEnginePolicy` makes
that a gem_core policy through :class:`gem_core.plugins.EnginePolicy`: each turn gets its **own copy**
of OpenRLHF's sampling params with gem_core's ``max_tokens`` and the chat template's stop tokens, and
the answer is read from its ``token_ids`` (which keep the stop token), never from its ``text`` (which
vLLM returns without it unless ``include_stop_str_in_output``, and without special tokens by default).
"""

from __future__ import annotations

import copy
from typing import Any

from gem_core.plugins import EnginePolicy
from gem_core.rollout import SamplingParams


def gem_params(openrlhf_params: Any, max_tokens: int) -> SamplingParams:
    """gem_core sampling params from OpenRLHF's ``vllm.SamplingParams`` (its temperature, top-p, top-k
    and seed) with ``max_tokens`` per turn (vLLM's ``top_k=-1`` is gem_core's 0: no top-k)."""
    def field(name: str, default: Any) -> Any:
        value = getattr(openrlhf_params, name, None)
        return default if value is None else value

    return SamplingParams(
        max_tokens=int(max_tokens),
        temperature=float(field("temperature", 1.0)),
        top_p=float(field("top_p", 1.0)),
        top_k=max(int(field("top_k", 0)), 0),
        stop_token_ids=tuple(getattr(openrlhf_params, "stop_token_ids", None) or ()),
        seed=getattr(openrlhf_params, "seed", None),
    )


def own_params(base: Any, changes: dict[str, Any]) -> Any:
    """A deep copy of ``base`` (a ``vllm.SamplingParams``) with ``changes`` set; OpenRLHF's object is
    never touched. vLLM derives ``_all_stop_token_ids`` from ``stop_token_ids`` when the params are
    built (it masks them before ``min_tokens``); the copy's set gets the new stop tokens too."""
    params = copy.deepcopy(base)
    for name, value in changes.items():
        setattr(params, name, value)
    derived = getattr(params, "_all_stop_token_ids", None)
    if isinstance(derived, set) and changes.get("stop_token_ids"):
        derived.update(changes["stop_token_ids"])
    return params


class OpenRLHFEnginePolicy(EnginePolicy):
    """A gem_core policy over OpenRLHF's ``llm_engine``; ``base_params``: the rollout's sampling params
    (kept as they are: logprobs, min_tokens, skip_special_tokens, ...; only the copy per turn changes)."""

    def __init__(self, engine: Any, base_params: Any):
        self.engine = engine
        self.base_params = base_params

    async def request(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> Any:
        turn_params = own_params(self.base_params, self.vllm_params(params))
        return await self.engine.generate(prompt_ids, turn_params, multi_modal_data=None)
