"""A local transformers model as a :class:`~gem_core.rollout.policy.Policy`: :class:`HFPolicy`, which batches the
requests of concurrent episodes into one forward pass per token, keeps each episode's keys and values between its
turns, and under :func:`~gem_core.rollout.run_episodes` batches in rounds (:class:`Cohort`) so that a rerun is
identical whatever the thread timing.

Separate from :mod:`gem_core.rollout.policies` (the small policies: scripted, random, an OpenAI-compatible endpoint)
because it is most of the code of the policies and the only one that runs a model; the KV-cache helpers it shares
with the trainer are in :mod:`gem_core.rollout.kv_cache`. torch and transformers are imported when a policy is built.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gem_core.rollout.kv_cache import (
    MIN_SHARED_PREFIX,
    cache_keyword,
    cache_shape,
    cache_tensors,
    growing_cache,
    growing_layer_class,
    shared_prefix_length,
    takes_logits_to_keep,
)
from gem_core.rollout.policy import Generation, SamplingParams, derive_seed, episode_of, resolve_in_thread


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
        # Given as an index, not the count 1: an index gathers the last position into a contiguous tensor, the count
        # slices a strided view of it, and PyTorch's CPU bfloat16 linear on a strided 3-D input materializes the
        # output layer's weight once per row (2.2 s for a prefill of 30 rows, against 5 ms contiguous; measured).
        keep_last = {"logits_to_keep": torch.tensor([-1], device=self.device)} if self._keeps_logits else {}
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
