"""Policies: scripted (tests), random (fuzzing), a local transformers model, and an OpenAI-compatible
chat endpoint (evaluation). Trainer plugins bring their own (see :class:`~gem_core.rollout.policy.Policy`).

The local transformers model (:class:`~gem_core.rollout.hf_policy.HFPolicy`, with its :class:`Cohort`) lives in
:mod:`gem_core.rollout.hf_policy` and the KV-cache helpers it shares with the trainer in
:mod:`gem_core.rollout.kv_cache`; they are importable from here too, where they have always been imported from.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from gem_core.rollout.hf_policy import Cohort, HFPolicy
from gem_core.rollout.http import ModelRequestError, Retry, post_json
from gem_core.rollout.kv_cache import MIN_SHARED_PREFIX, cache_keyword, growing_cache, shared_prefix_length, takes_logits_to_keep
from gem_core.rollout.policy import ContextLimitExceeded, Generation, SamplingParams, derive_seed

__all__ = [
    "MIN_SHARED_PREFIX",
    "Cohort",
    "HFPolicy",
    "OpenAIPolicy",
    "RandomPolicy",
    "ScriptedPolicy",
    "cache_keyword",
    "growing_cache",
    "scripted_logprob",
    "shared_prefix_length",
    "takes_logits_to_keep",
]


def scripted_logprob(token_id: int, position: int) -> float:
    """The made-up log-probability ScriptedPolicy reports: a multiple of 1/8 (exact in float32 and
    bfloat16, so trainers that cast it compare exactly) that changes with token and position."""
    return -(1 + (int(token_id) + position) % 17) / 8.0


class ScriptedPolicy:
    """A deterministic policy for tests: ``respond(decoded_context) -> response text``.

    The context is decoded with special tokens kept, so ``respond`` sees the chat template as the model
    would. The response text is tokenised and the first stop token of the request (the chat template's
    end-of-turn token, added by the runner) is appended, as a model that stops would. A response longer
    than ``max_tokens`` is cut to ``max_tokens`` tokens with ``finish_reason="length"``. Log-probabilities
    are :func:`scripted_logprob` values. ``calls`` counts generate calls.
    """

    def __init__(self, tokenizer: Any, respond: Callable[[str], str], *, end_token_id: int | None = None):
        self.tokenizer = tokenizer
        self.respond = respond
        self.end_token_id = end_token_id
        self.calls = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "") -> Generation:
        self.calls += 1
        context = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        text = self.respond(context)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        end = self.end_token_id
        if end is None:
            end = params.stop_token_ids[0] if params.stop_token_ids else getattr(self.tokenizer, "eos_token_id", None)
        if end is not None:
            ids.append(int(end))
        finish = "stop"
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"
        return Generation(ids, [scripted_logprob(t, i) for i, t in enumerate(ids)], finish)


class RandomPolicy:
    """Uniformly random tokens, for fuzzing the runner and the envs' handling of garbage.

    Each response draws from its own stream, seeded by ``(seed, params.seed, request_id)``, so a rerun
    with the same episode ids is identical whatever the scheduling. After at least ``min_tokens`` tokens,
    each step ends the response with the first stop token with probability ``stop_probability``.
    ``token_ids``: the tokens to draw from (default: ``range(vocab_size)`` minus the stop tokens).
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        *,
        token_ids: Sequence[int] | None = None,
        seed: int = 0,
        stop_probability: float = 0.1,
        min_tokens: int = 1,
    ):
        if token_ids is None and vocab_size is None:
            raise ValueError("RandomPolicy needs vocab_size or token_ids")
        self.vocab_size = vocab_size
        self.token_ids = None if token_ids is None else np.asarray(token_ids, dtype=np.int64)
        self.seed = seed
        self.stop_probability = stop_probability
        self.min_tokens = min_tokens

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "") -> Generation:
        rng = np.random.default_rng(derive_seed(self.seed, params.seed, request_id))
        pool = self.token_ids
        if pool is None:
            pool = np.setdiff1d(np.arange(self.vocab_size, dtype=np.int64), np.asarray(params.stop_token_ids, dtype=np.int64))
        logprob = -math.log(len(pool))
        ids: list[int] = []
        stop = params.stop_token_ids[0] if params.stop_token_ids else None
        while len(ids) < params.max_tokens:
            if stop is not None and len(ids) >= self.min_tokens and rng.random() < self.stop_probability:
                ids.append(stop)
                return Generation(ids, [logprob] * len(ids), "stop")
            ids.append(int(pool[rng.integers(len(pool))]))
        return Generation(ids, [logprob] * len(ids), "length")


# ------------------------------------------------------------------------------------------------
# An OpenAI-compatible chat endpoint.
# ------------------------------------------------------------------------------------------------


class OpenAIPolicy:
    """Text in, text out against any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, SGLang,
    a hosted API), for evaluation. No token ids: its trajectories carry text and rewards only.

    ``base_url`` ends before ``/chat/completions`` (e.g. ``http://127.0.0.1:8000/v1``). ``api_key``
    defaults to ``$OPENAI_API_KEY``. ``max_concurrency`` bounds requests in flight. ``extra_body`` is
    merged into every request (e.g. ``{"chat_template_kwargs": {"enable_thinking": False}}`` for vLLM).
    A 400 answer that mentions the context length raises :class:`ContextLimitExceeded`, which the runner
    turns into a ``context_limit`` truncation. 429s, 5xx answers, timeouts (``timeout`` seconds per
    attempt), dropped connections and answers that are not JSON are retried with backoff (``retry``, a
    :class:`~gem_core.rollout.http.Retry`); then, and on other errors (a 401, a 404, an answer without
    ``choices``), :class:`~gem_core.rollout.http.ModelRequestError`. The endpoint's ``usage`` comes back
    as the generation's ``prompt_tokens``/``completion_tokens``. Uses only the standard library:
    requests run in the policy's own pool of ``max_concurrency`` threads (asyncio's default pool has
    only a few threads per core, which would cap the requests in flight far below ``max_concurrency``);
    ``close()`` ends them.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        max_concurrency: int = 64,
        extra_body: dict[str, Any] | None = None,
        retry: Retry | None = None,
    ):
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout = timeout
        self.max_concurrency = max_concurrency
        self.extra_body = dict(extra_body or {})
        self.retry = Retry() if retry is None else retry
        self._semaphores: dict[Any, asyncio.Semaphore] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()

    def _threads(self) -> ThreadPoolExecutor:
        with self._executor_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="gem-openai")
            return self._executor

    def close(self) -> None:
        """End the request threads (a later request starts them again)."""
        with self._executor_lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    async def chat(self, messages: list[dict[str, str]], params: SamplingParams, *, request_id: str = "") -> Generation:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.top_k:
            body["top_k"] = params.top_k
        if params.seed is not None:
            body["seed"] = params.seed
        body.update(params.extra)
        body.update(self.extra_body)
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.setdefault(loop, asyncio.Semaphore(self.max_concurrency))
        async with semaphore:
            data = await loop.run_in_executor(self._threads(), self._post, "/chat/completions", body, request_id)
        try:
            choice = data["choices"][0]
            text = (choice.get("message") or {}).get("content") or ""
            reason = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise ModelRequestError(f"{self.base_url}/chat/completions answered without a choice: {str(data)[:300]!r}") from None
        finish = "length" if reason == "length" else ("abort" if reason in ("abort", "error", "cancelled") else "stop")
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        return Generation(
            [], None, finish, text=text, prompt_tokens=_count(usage.get("prompt_tokens")), completion_tokens=_count(usage.get("completion_tokens"))
        )

    def _post(self, path: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        headers = {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if request_id:
            headers["X-Request-Id"] = request_id
        try:
            return post_json(self.base_url + path, body, headers, timeout=self.timeout, retry=self.retry)
        except ModelRequestError as exc:
            detail = exc.detail.lower()
            if exc.status == 400 and "context" in detail and ("length" in detail or "window" in detail):
                raise ContextLimitExceeded(exc.detail) from exc
            raise


def _count(value: Any) -> int | None:
    """A token count from a ``usage`` field (``None`` when missing or not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
