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
from gem_core.rollout.policy import ContextLimitExceeded, Generation, SamplingParams, derive_seed, episode_of, resolve_in_thread


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


@dataclass
class _EpisodeCache:
    """An episode's keys and values after its last turn: ``tokens`` (the context they cover) and ``kv``,
    ``[layers, 2, heads, len(tokens), head_dim]`` (keys then values)."""

    tokens: list[int]
    kv: Any


class Cohort:
    """The episodes of one :func:`~gem_core.rollout.run_episodes` call, as a policy that batches in rounds
    sees them (the runner opens it with ``policy.open_cohort(episodes, concurrency)`` when the policy has
    that method, calls :meth:`episode_finished` as each episode ends and :meth:`close` at the end).

    ``live``: the episodes in play now (at most ``concurrency``, never more than are left). A round is cut
    when every live episode has asked, so which requests share a batch is a function of the episodes alone,
    not of thread timing."""

    def __init__(self, policy: HFPolicy, episodes: int, concurrency: int):
        self.policy = policy
        self.remaining = int(episodes)
        self.concurrency = max(int(concurrency), 1)

    @property
    def live(self) -> int:
        return min(self.concurrency, self.remaining)

    def episode_finished(self, episode_id: str) -> None:
        """One episode ended (its cache is dropped; a round waiting for it goes on without it)."""
        self.remaining -= 1
        self.policy._episode_caches.pop(episode_id, None)
        self.policy._wake()

    def close(self) -> None:
        self.policy._close_cohort(self)


class HFPolicy:
    """A local transformers causal LM, sampling with its own seeded stream per request.

    Requests are batched (up to ``max_batch_size``, left-padded) into one forward pass per token;
    generation runs in a worker thread so the event loop keeps serving the other episodes. Each request
    samples from ``torch.Generator`` seeded by ``(seed, params.seed, request_id)``. ``logprobs`` are
    log-probabilities of the chosen tokens under ``softmax(logits / temperature)`` (the distribution a
    trainer recomputes at that temperature; raw logits when greedy), before top-k/top-p filtering.

    Under :func:`~gem_core.rollout.run_episodes` the policy batches in rounds (:class:`Cohort`): a round
    waits until every episode in play has asked, and its requests are served in request-id order, in
    batches of ``max_batch_size``. Which episodes share a batch, and so every number (padding changes a
    kernel's last bits), then depends on the episodes alone: a rerun is identical token for token and
    logprob for logprob, whatever the thread timing (tested). Requests from outside a cohort (a plugin's own
    ``generate`` calls) are batched as they arrive.

    ``reuse_cache`` (default, within a cohort): each episode's keys and values are kept between its turns, so
    a turn runs only the tokens its context gained (the last response's end and the observation), not the
    whole context again: the contexts are append-only (the runner's chat deltas); a context that is not an
    extension of the cached one is run whole. ``share_prefix`` (default): the common prompt prefix of a
    batch's new episodes (at least :data:`MIN_SHARED_PREFIX` tokens: the instruction every episode starts
    from) is run once and its cache shared. Both give the numbers of a plain forward within float rounding
    (tested). Both need a model whose forward takes transformers' cache (``logits_to_keep`` marks one).
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
        reuse_cache: bool = True,
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
        self._arrival: asyncio.Event | None = None
        self._cohorts: list[Cohort] = []
        self._episode_caches: dict[str, _EpisodeCache] = {}
        self._prefix: _EpisodeCache | None = None  # the new episodes' shared instruction, within a cohort
        self._arena: Any = None
        self._model_lock = threading.Lock()
        self._keeps_logits = takes_logits_to_keep(self.model)
        self._cache_name = cache_keyword(self.model)
        # sharing a prefix or an episode's cache needs the model's cache to be a transformers Cache
        self._shares_prefix = self._keeps_logits and share_prefix
        self._reuses_cache = self._keeps_logits and reuse_cache

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, device: Any = "cpu", dtype: Any = None, seed: int = 0, **kwargs: Any) -> HFPolicy:
        """Load a model with ``AutoModelForCausalLM.from_pretrained`` (local path or hub cache)."""
        from transformers import AutoModelForCausalLM

        model_kwargs = {} if dtype is None else {"dtype": dtype}
        model = AutoModelForCausalLM.from_pretrained(name_or_path, **model_kwargs)
        return cls(model, device=device, seed=seed, **kwargs)

    # -- rounds --------------------------------------------------------------------------------------------
    def open_cohort(self, episodes: int, concurrency: int) -> Cohort:
        """Batch the next ``episodes`` episodes (at most ``concurrency`` at once) in rounds (:class:`Cohort`)."""
        cohort = Cohort(self, episodes, concurrency)
        self._cohorts.append(cohort)
        return cohort

    def _close_cohort(self, cohort: Cohort) -> None:
        if cohort in self._cohorts:
            self._cohorts.remove(cohort)
        if not self._cohorts:
            self._episode_caches.clear()
            self._prefix = None
        self._wake()

    def _wake(self) -> None:
        if self._arrival is not None:
            self._arrival.set()

    def _round_ready(self) -> bool:
        return not self._cohorts or len(self._queue) >= sum(c.live for c in self._cohorts)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "") -> Generation:
        if not prompt_ids:
            raise ValueError("HFPolicy needs a non-empty prompt")
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), params, request_id, loop.create_future())
        self._queue.append(request)
        self._wake()
        if self._server is None or self._server.done() or self._server.get_loop() is not loop:
            self._server = loop.create_task(self._serve())
        return await request.future

    async def _serve(self) -> None:
        """Serve queued requests until the queue is empty: in rounds while a cohort is open, else as they come."""
        while self._queue:
            if self._cohorts:
                while not self._round_ready():  # every episode in play has asked, or ended
                    self._arrival = asyncio.Event()
                    await self._arrival.wait()
                requests, self._queue = sorted(self._queue, key=lambda r: r.request_id), []
            else:
                await asyncio.sleep(0)  # let episodes that are about to ask join this batch
                requests, self._queue = self._queue[: self.max_batch_size], self._queue[self.max_batch_size :]
            requests = [r for r in requests if not r.future.done()]  # cancelled episodes
            for begin in range(0, len(requests), self.max_batch_size):
                batch = requests[begin : begin + self.max_batch_size]
                await resolve_in_thread([r.future for r in batch], lambda batch=batch: self._generate_batch(batch))

    def generate_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams, request_ids: Sequence[str]) -> list[Generation]:
        """Synchronous batched generation (the same maths as ``generate``)."""
        return self._generate_batch([_Request(list(p), params, rid, None) for p, rid in zip(prompts, request_ids)])  # type: ignore[arg-type]

    # -- one batch -----------------------------------------------------------------------------------------
    def _pasts(self, batch: list[_Request]) -> tuple[list[int], list[Any]]:
        """Per request: how many of its prompt's tokens already have keys and values, and those
        (``[layers, 2, heads, length, head_dim]``): its episode's cache from its last turn, else the new
        episodes' shared prefix (run here, once), else none."""
        torch = self.torch
        lengths = [0] * len(batch)
        layers: list[Any] = [None] * len(batch)
        keep = self._reuses_cache and bool(self._cohorts)
        for b, request in enumerate(batch):
            cached = self._episode_caches.get(episode_of(request.request_id)) if keep else None
            n = 0 if cached is None else len(cached.tokens)
            if cached is not None and len(request.prompt_ids) > n and request.prompt_ids[:n] == cached.tokens:
                lengths[b], layers[b] = n, cached.kv
        if not self._shares_prefix:
            return lengths, layers
        # New episodes: the instruction they share, run once. Within a cohort it is kept for the episodes that
        # start in later rounds (one at a time, as others end), so none of them runs it again.
        stored = self._prefix if keep else None
        fresh = []
        for b in range(len(batch)):
            prompt = batch[b].prompt_ids
            if layers[b] is not None:
                continue
            if stored is not None and len(prompt) > len(stored.tokens) and prompt[: len(stored.tokens)] == stored.tokens:
                lengths[b], layers[b] = len(stored.tokens), stored.kv
            else:
                fresh.append(b)
        prefix = shared_prefix_length([batch[b].prompt_ids for b in fresh])
        if prefix >= MIN_SHARED_PREFIX:
            tokens = batch[fresh[0]].prompt_ids[:prefix]
            with self._model_lock, torch.inference_mode():
                shared = torch.tensor([tokens], dtype=torch.long, device=self.device)
                cache = getattr(self.model(input_ids=shared, use_cache=True, logits_to_keep=1), self._cache_name)
            kv = torch.stack([torch.stack([k[0], v[0]]) for k, v in cache_tensors(cache)])
            for b in fresh:
                lengths[b], layers[b] = prefix, kv
            if keep and stored is None:
                self._prefix = _EpisodeCache(list(tokens), kv)
        return lengths, layers

    def _generate_batch(self, batch: list[_Request]) -> list[Generation]:
        torch = self.torch
        size = len(batch)
        # Each row: [its past (cached keys and values), left-padded][its new tokens, left-padded], positions
        # counted over the real tokens, so every token sees what it would see in a batch of its own.
        past_lengths, past_layers = self._pasts(batch)
        width = max(past_lengths)
        news = [r.prompt_ids[n:] for r, n in zip(batch, past_lengths)]
        new_width = max(len(new) for new in news)
        input_ids = torch.full((size, new_width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((size, width + new_width), dtype=torch.long)
        for b, new in enumerate(news):
            input_ids[b, new_width - len(new) :] = torch.tensor(new, dtype=torch.long)
            attention[b, width - past_lengths[b] : width] = 1
            attention[b, width + new_width - len(new) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, width:]
        steps = max(r.params.max_tokens for r in batch)
        generators = []
        for request in batch:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(derive_seed(self.seed, request.params.seed, request.request_id))
            generators.append(generator)
        stops = [set(r.params.stop_token_ids) | set(self.stop_token_ids) for r in batch]
        tokens: list[list[int]] = [[] for _ in batch]
        logprobs: list[list[float]] = [[] for _ in batch]
        finish: list[str | None] = [None] * size
        step_ids, step_positions = input_ids, positions
        # Only the last position's logits are sampled from: a model that can skip the others (transformers'
        # ``logits_to_keep``) saves the prompt's full-vocabulary projection, a fifth of a small model's prefill.
        keep_last = {"logits_to_keep": 1} if self._keeps_logits else {}
        with self._model_lock, torch.inference_mode():
            past = self._batch_cache(past_layers, past_lengths, width, width + new_width + steps)
            for _ in range(steps):
                cache_kwargs = {} if past is None else {self._cache_name: past}
                out = self.model(input_ids=step_ids, attention_mask=attention, position_ids=step_positions, use_cache=True, **cache_kwargs, **keep_last)
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
                # a finished row is fed padding from here on, masked out: its cache stays its episode's tokens
                alive = torch.tensor([f is None for f in finish], dtype=attention.dtype, device=self.device)
                attention = torch.cat([attention, alive[:, None]], dim=1)
        if self._reuses_cache and self._cohorts and past is not None:
            self._keep_caches(batch, tokens, past, attention)
        return [Generation(tokens[b], logprobs[b], finish[b] or "length") for b in range(size)]  # type: ignore[arg-type]

    def _batch_cache(self, pasts: list[Any], lengths: list[int], width: int, capacity: int) -> Any:
        """The batch's transformers cache: each row's past (``[layers, 2, heads, length, dim]``) right-aligned
        in ``width`` positions (zeros, masked out, before it), with room for ``capacity`` positions in all,
        written in place as the batch runs (:func:`growing_cache`). None when there is no past and the cache
        cannot be laid out ahead."""
        torch = self.torch
        shape = cache_shape(self.model)
        template = next((past for past in pasts if past is not None), None)
        if shape is None or growing_layer_class() is None:  # a cache of another kind: transformers' own, grown by concatenation
            if template is None:
                return None
            from transformers import DynamicCache

            merged = template.new_zeros((template.shape[0], 2, len(pasts), template.shape[2], width, template.shape[-1]))
            for b, past in enumerate(pasts):
                if past is not None and lengths[b]:
                    merged[:, :, b, :, width - lengths[b] :] = past
            return DynamicCache(ddp_cache_data=[(layer[0], layer[1]) for layer in merged])
        count, heads, dim = shape
        dtype = next(self.model.parameters()).dtype if template is None else template.dtype
        size = count * 2 * len(pasts) * heads * capacity * dim
        # one arena, kept between batches: a fresh multi-MB tensor per layer and token (what concatenation
        # allocates) costs its page faults every time, most of a CPU decode step
        if self._arena is None or self._arena.numel() < size or self._arena.dtype != dtype:
            self._arena = torch.empty(size, dtype=dtype, device=self.device)
        buffers = self._arena[:size].view(count, 2, len(pasts), heads, capacity, dim)
        buffers[..., :width, :].zero_()  # the padding is masked out, but must hold finite numbers
        for b, past in enumerate(pasts):
            if past is not None and lengths[b]:
                buffers[:, :, b, :, width - lengths[b] : width] = past
        return growing_cache(buffers, width)

    def _keep_caches(self, batch: list[_Request], tokens: list[list[int]], past: Any, attention: Any) -> None:
        """Each episode's keys and values over its context and the response tokens fed back (all but the
        last), for its next turn."""
        torch = self.torch
        buffers = getattr(past, "buffers", None)
        if buffers is not None and not all(layer.buffers[0].numel() for layer in past.layers):
            buffers = None  # a layer outgrew its buffer: read the cache as transformers holds it
        layers = cache_tensors(past) if buffers is None else []
        for b, request in enumerate(batch):
            real = attention[b].nonzero()[:, 0]
            kept_tokens = [*request.prompt_ids, *tokens[b][:-1]]
            if len(real) != len(kept_tokens):  # not the layout this method was written for: keep nothing
                continue
            if buffers is not None:
                kv = buffers[:, :, b].index_select(3, real)
            else:
                kv = torch.stack([torch.stack([k[b], v[b]]) for k, v in layers]).index_select(3, real)
            self._episode_caches[episode_of(request.request_id)] = _EpisodeCache(kept_tokens, kv)


def cache_tensors(cache: Any) -> list[tuple[Any, Any]]:
    """``(keys, values)`` per layer of a transformers cache (``layers`` since 4.5x, ``key_cache``/``value_cache`` before)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return list(zip(cache.key_cache, cache.value_cache))


def cache_shape(model: Any) -> tuple[int, int, int] | None:
    """``(layers, key/value heads, head dim)`` of a decoder whose every layer keeps full keys and values (no
    sliding window, no other layer types); None otherwise."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return None
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return None
    layers, heads = getattr(config, "num_hidden_layers", None), getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(hidden, int)):
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    dim = getattr(config, "head_dim", None) or hidden // heads
    return layers, int(kv_heads), int(dim)


_GROWING_LAYER: list[Any] = []


def growing_layer_class() -> Any:
    """transformers' ``DynamicLayer`` written in place into a buffer laid out ahead (None where transformers
    has no ``DynamicLayer``). Built on first use: transformers is an optional dependency of the core."""
    if not _GROWING_LAYER:
        try:
            from transformers.cache_utils import DynamicLayer
        except ImportError:
            _GROWING_LAYER.append(None)
        else:

            class GrowingLayer(DynamicLayer):
                """One layer's keys and values in ``[batch, heads, capacity, dim]`` buffers; ``keys``/``values``
                are views of the positions filled so far; past the capacity it grows by concatenation."""

                def __init__(self, keys: Any, values: Any, filled: int):
                    super().__init__()
                    self.buffers = (keys, values)
                    self.filled = filled
                    self.device = keys.device
                    self.keys, self.values = keys[:, :, :filled], values[:, :, :filled]
                    self.is_initialized = True

                def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
                    end = self.filled + key_states.shape[-2]
                    keys, values = self.buffers
                    if end > keys.shape[-2]:
                        self.keys, self.values = keys[:, :, : self.filled], values[:, :, : self.filled]
                        self.buffers = (keys.new_empty(0), values.new_empty(0))
                        return super().update(key_states, value_states, *args, **kwargs)
                    keys[:, :, self.filled : end] = key_states
                    values[:, :, self.filled : end] = value_states
                    self.filled = end
                    self.keys, self.values = keys[:, :, :end], values[:, :, :end]
                    return self.keys, self.values

            _GROWING_LAYER.append(GrowingLayer)
    return _GROWING_LAYER[0]


def growing_cache(buffers: Any, filled: int) -> Any:
    """A transformers ``DynamicCache`` over ``buffers`` (``[layers, 2, batch, heads, capacity, dim]``) whose first
    ``filled`` positions hold the past: each new token is written in place, not concatenated."""
    from transformers import DynamicCache

    layer = growing_layer_class()
    cache = DynamicCache()
    cache.layers = [layer(buffers[index, 0], buffers[index, 1], filled) for index in range(buffers.shape[0])]
    cache.buffers = buffers  # read back by HFPolicy._keep_caches, one copy per row for every layer at once
    return cache


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
