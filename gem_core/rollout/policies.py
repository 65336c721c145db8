"""Policies: scripted (tests), random (fuzzing), a local transformers model, and an OpenAI-compatible
chat endpoint (evaluation). Trainer plugins bring their own (see :class:`~gem_core.rollout.policy.Policy`).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from gem_core.rollout.http import ModelRequestError, Retry, post_json
from gem_core.rollout.policy import ContextLimitExceeded, Generation, SamplingParams, derive_seed, resolve_in_thread


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
# A local transformers model.
# ------------------------------------------------------------------------------------------------


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    request_id: str
    future: asyncio.Future


class HFPolicy:
    """A local transformers causal LM, sampling with its own seeded stream per request.

    Requests that arrive while the model is busy are batched (up to ``max_batch_size``, left-padded)
    into one forward pass per token; generation runs in a worker thread so the event loop keeps serving
    the other episodes. Each request samples from ``torch.Generator`` seeded by ``(seed, params.seed,
    request_id)``. ``logprobs`` are log-probabilities of the chosen tokens under ``softmax(logits /
    temperature)`` (the distribution a trainer recomputes at that temperature; raw logits when greedy),
    before top-k/top-p filtering. With ``max_batch_size=1`` a rerun is identical token for token;
    batching can change the last bits of the logits (padding changes the kernels' shapes), which very
    rarely flips a sampled token. With ``share_prefix`` (default), the batch's common prompt prefix (at
    least :data:`MIN_SHARED_PREFIX` tokens) is run once and its cache shared by every request: the same
    numbers within float rounding (tested), the prefill of a batch of episodes on one instruction once.
    """

    def __init__(
        self,
        model: Any,
        *,
        seed: int = 0,
        device: Any = None,
        max_batch_size: int = 8,
        pad_token_id: int | None = None,
        stop_token_ids: Sequence[int] = (),
        share_prefix: bool = True,
    ):
        import torch

        self.torch = torch
        self.model = model.eval()
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        if next(model.parameters()).device != self.device:
            self.model.to(self.device)
        self.seed = seed
        self.max_batch_size = max_batch_size
        config_pad = getattr(model.config, "pad_token_id", None)
        self.pad_token_id = pad_token_id if pad_token_id is not None else (config_pad if config_pad is not None else 0)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self._queue: list[_Request] = []
        self._server: asyncio.Task | None = None
        self._model_lock = threading.Lock()
        self._keeps_logits = takes_logits_to_keep(self.model)
        self._cache_name = cache_keyword(self.model)
        # sharing a prefix needs the model's cache to be a transformers Cache (batch_repeat_interleave)
        self._shares_prefix = self._keeps_logits and share_prefix

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, device: Any = "cpu", dtype: Any = None, seed: int = 0, **kwargs: Any) -> HFPolicy:
        """Load a model with ``AutoModelForCausalLM.from_pretrained`` (local path or hub cache)."""
        from transformers import AutoModelForCausalLM

        model_kwargs = {} if dtype is None else {"dtype": dtype}
        model = AutoModelForCausalLM.from_pretrained(name_or_path, **model_kwargs)
        return cls(model, device=device, seed=seed, **kwargs)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "") -> Generation:
        if not prompt_ids:
            raise ValueError("HFPolicy needs a non-empty prompt")
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), params, request_id, loop.create_future())
        self._queue.append(request)
        if self._server is None or self._server.done() or self._server.get_loop() is not loop:
            self._server = loop.create_task(self._serve())
        return await request.future

    async def _serve(self) -> None:
        """Run queued requests in batches until the queue is empty."""
        while self._queue:
            await asyncio.sleep(0)  # let episodes that are about to ask join this batch
            batch, self._queue = self._queue[: self.max_batch_size], self._queue[self.max_batch_size :]
            batch = [r for r in batch if not r.future.done()]  # cancelled episodes
            if not batch:
                continue
            await resolve_in_thread([r.future for r in batch], lambda batch=batch: self._generate_batch(batch))

    def generate_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams, request_ids: Sequence[str]) -> list[Generation]:
        """Synchronous batched generation (the same maths as ``generate``)."""
        return self._generate_batch([_Request(list(p), params, rid, None) for p, rid in zip(prompts, request_ids)])  # type: ignore[arg-type]

    def _generate_batch(self, batch: list[_Request]) -> list[Generation]:
        torch = self.torch
        size = len(batch)
        # The prompts' common prefix (the instruction every episode starts from) is run once and its cache
        # shared; each prompt's own rest follows it, left-padded: [prefix][pad..][rest], positions counted
        # over the real tokens, so every token sees what it sees in a batch of its own.
        prefix = shared_prefix_length([r.prompt_ids for r in batch]) if self._shares_prefix else 0
        if prefix < MIN_SHARED_PREFIX:
            prefix = 0
        lengths = [len(r.prompt_ids) - prefix for r in batch]
        width = max(lengths)
        input_ids = torch.full((size, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((size, prefix + width), dtype=torch.long)
        attention[:, :prefix] = 1
        for b, request in enumerate(batch):
            input_ids[b, width - lengths[b] :] = torch.tensor(request.prompt_ids[prefix:], dtype=torch.long)
            attention[b, prefix + width - lengths[b] :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, prefix:]
        generators = []
        for request in batch:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(derive_seed(self.seed, request.params.seed, request.request_id))
            generators.append(generator)
        stops = [set(r.params.stop_token_ids) | set(self.stop_token_ids) for r in batch]
        tokens: list[list[int]] = [[] for _ in batch]
        logprobs: list[list[float]] = [[] for _ in batch]
        finish: list[str | None] = [None] * size
        past = None
        if prefix:
            with self._model_lock, torch.inference_mode():
                shared = torch.tensor([batch[0].prompt_ids[:prefix]], dtype=torch.long, device=self.device)
                past = getattr(self.model(input_ids=shared, use_cache=True, logits_to_keep=1), self._cache_name)
                past.batch_repeat_interleave(size)
        step_ids, step_positions = input_ids, positions
        # Only the last position's logits are sampled from: a model that can skip the others (transformers'
        # ``logits_to_keep``) saves the prompt's full-vocabulary projection, a fifth of a small model's prefill.
        keep_last = {"logits_to_keep": 1} if self._keeps_logits else {}
        with self._model_lock, torch.inference_mode():
            for _ in range(max(r.params.max_tokens for r in batch)):
                out = self.model(
                    input_ids=step_ids, attention_mask=attention, position_ids=step_positions, use_cache=True, **{self._cache_name: past}, **keep_last
                )
                past = getattr(out, self._cache_name)
                logits = out.logits[:, -1, :].float()
                next_ids = torch.full((size,), self.pad_token_id, dtype=torch.long, device=self.device)
                for b, request in enumerate(batch):
                    if finish[b] is not None:
                        continue
                    token, logprob = _sample(torch, logits[b], request.params, generators[b])
                    tokens[b].append(token)
                    logprobs[b].append(logprob)
                    next_ids[b] = token
                    if token in stops[b]:
                        finish[b] = "stop"
                    elif len(tokens[b]) >= request.params.max_tokens:
                        finish[b] = "length"
                if all(f is not None for f in finish):
                    break
                step_ids = next_ids[:, None]
                step_positions = step_positions[:, -1:] + 1
                attention = torch.cat([attention, torch.ones((size, 1), dtype=attention.dtype, device=self.device)], dim=1)
        return [Generation(tokens[b], logprobs[b], finish[b] or "length") for b in range(size)]  # type: ignore[arg-type]


def cache_keyword(model: Any) -> str:
    """The name of the KV cache in the model's forward and its outputs: ``cache`` since transformers 5.2x
    (where ``past_key_values``, still accepted, warns), ``past_key_values`` before."""
    try:
        return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    except (AttributeError, TypeError, ValueError):
        return "past_key_values"


def takes_logits_to_keep(model: Any) -> bool:
    """Whether the model's forward takes transformers' ``logits_to_keep`` (logits at some positions only)."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (AttributeError, TypeError, ValueError):
        return False


#: A common prefix shorter than this is not worth its own forward pass.
MIN_SHARED_PREFIX = 16


def shared_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """The tokens every sequence starts with, leaving each at least its last token of its own (whose
    output every sequence needs separately); 0 for fewer than two sequences or an empty one. The
    episodes of a batch start from the same instruction, so most of a batch's tokens are often this
    prefix: run once and shared, it need not be run once per sequence."""
    if len(sequences) < 2 or min(len(s) for s in sequences) == 0:
        return 0
    limit = min(len(s) for s in sequences) - 1
    first = sequences[0]
    for position in range(limit):
        token = first[position]
        if any(s[position] != token for s in sequences[1:]):
            return position
    return limit


def _sample(torch: Any, logits: Any, params: SamplingParams, generator: Any) -> tuple[int, float]:
    """One token from one row of logits, and its log-probability (see :class:`HFPolicy`)."""
    if params.temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
        return token, float(logp[token])
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    filtered = logp
    if params.top_k and params.top_k < filtered.shape[-1]:
        kth = torch.topk(filtered, params.top_k).values[-1]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logp, order = torch.sort(filtered, descending=True)
        cumulative = sorted_logp.exp().cumsum(-1)
        drop_sorted = (cumulative - sorted_logp.exp()) > params.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        filtered = filtered.masked_fill(drop, float("-inf"))
    probs = torch.softmax(filtered, dim=-1)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logp[token])


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
