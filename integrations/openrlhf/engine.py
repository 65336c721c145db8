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

from typing import Any

from gem_core.plugins import EnginePolicy, copy_params, sampling_from_vllm
from gem_core.rollout import SamplingParams


gem_params = sampling_from_vllm  # gem_core sampling params from OpenRLHF's vllm.SamplingParams (gem_core.plugins)
own_params = copy_params  # the trainer's vllm.SamplingParams copied per turn (gem_core.plugins)


class OpenRLHFEnginePolicy(EnginePolicy):
    """A gem_core policy over OpenRLHF's ``llm_engine``; ``base_params``: the rollout's sampling params
    (kept as they are: logprobs, min_tokens, skip_special_tokens, ...; only the copy per turn changes)."""

    def __init__(self, engine: Any, base_params: Any):
        self.engine = engine
        self.base_params = base_params

    async def request(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> Any:
        turn_params = own_params(self.base_params, self.vllm_params(params))
        return await self.engine.generate(prompt_ids, turn_params, multi_modal_data=None)
