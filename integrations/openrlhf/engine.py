"""An OpenRLHF ``llm_engine`` backed by a gem_core :class:`~gem_core.rollout.Policy`.

OpenRLHF's agent executors call ``await llm_engine.generate(prompt_token_ids, sampling_params,
multi_modal_data=None)`` and read ``.outputs[0]`` like a vLLM ``RequestOutput`` (``token_ids``, ``text``,
``finish_reason``, ``logprobs``). :class:`PolicyEngine` answers that call with any gem_core policy
(``ScriptedPolicy`` in tests, ``HFPolicy`` for a CPU smoke run), so OpenRLHF's own executor code runs
unchanged without vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gem_core.rollout import ChatFormatter, Policy, SamplingParams


@dataclass
class Logprob:
    """vLLM's per-token logprob record (only ``logprob`` is read by OpenRLHF)."""

    logprob: float


@dataclass
class CompletionOutput:
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[dict[int, Logprob]] | None


@dataclass
class RequestOutput:
    outputs: list[CompletionOutput]


class PolicyEngine:
    """``generate`` as OpenRLHF's rollout actor exposes it, served by ``policy``.

    The chat template's stop tokens (``formatter.stop_token_ids``) are added to every request, as a vLLM
    engine stops on the model's end-of-turn token. ``max_tokens_per_turn`` caps each request below the
    budget the executor asks for (OpenRLHF's multi-turn executor asks for everything left in ``max_len``);
    ``None`` leaves the executor's budget alone. The text is decoded with the request's
    ``skip_special_tokens`` (OpenRLHF's default: keep them), as vLLM does.
    """

    def __init__(self, policy: Policy, formatter: ChatFormatter, *, max_tokens_per_turn: int | None = None):
        self.policy = policy
        self.formatter = formatter
        self.max_tokens_per_turn = max_tokens_per_turn
        self.requests: list[tuple[list[int], int]] = []  # (prompt ids, max_tokens) of every call

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None) -> RequestOutput:
        if multi_modal_data:
            raise ValueError("PolicyEngine serves text only")
        max_tokens = int(sampling_params.max_tokens)
        if self.max_tokens_per_turn is not None:
            max_tokens = min(max_tokens, self.max_tokens_per_turn)
        top_k = getattr(sampling_params, "top_k", 0) or 0
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=float(getattr(sampling_params, "temperature", 1.0)),
            top_p=float(getattr(sampling_params, "top_p", 1.0)),
            top_k=max(int(top_k), 0),  # vLLM's -1 is gem_core's 0: no top-k
            stop_token_ids=tuple(getattr(sampling_params, "stop_token_ids", None) or ()),
            seed=getattr(sampling_params, "seed", None),
        )
        params = self.formatter.sampling_params(params)
        self.requests.append((list(prompt_token_ids), max_tokens))
        generation = await self.policy.generate(list(prompt_token_ids), params, request_id=f"openrlhf-{len(self.requests)}")
        skip = bool(getattr(sampling_params, "skip_special_tokens", False))
        text = self.formatter.decode(generation.token_ids, skip_special_tokens=skip)
        logprobs = None
        if getattr(sampling_params, "logprobs", None) is not None:
            if generation.logprobs is None:
                raise ValueError(f"{type(self.policy).__name__} reports no logprobs, but the request asks for them")
            logprobs = [{int(t): Logprob(float(lp))} for t, lp in zip(generation.token_ids, generation.logprobs)]
        finish = "length" if generation.finish_reason == "length" else ("abort" if generation.finish_reason == "abort" else "stop")
        return RequestOutput([CompletionOutput(list(generation.token_ids), text, finish, logprobs)])
