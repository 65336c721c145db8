"""Policies over an inference engine that answers in vLLM's terms, and vLLM itself.

* :class:`EnginePolicy`: the adapter every trainer plugin subclasses: gem_core's :class:`SamplingParams`
  in vLLM's names, and the engine's answer as a :class:`Generation` (token ids exactly as the engine
  returned them, the stop token included; logprobs; vLLM's finish reasons).
* :class:`VLLMPolicy`: the core runner's policy over vLLM's offline ``LLM`` (GPU or CPU build):
  requests of concurrent episodes that arrive together go to the engine as one batched ``generate``.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gem_core.rollout.policy import ContextLimitExceeded, Generation, SamplingParams, answer_each, derive_seed, resolve_in_thread


class EnginePolicy:
    """A gem_core :class:`~gem_core.rollout.Policy` over a trainer's inference engine.

    Subclasses implement :meth:`request`, the trainer's own call, and return what it returned; this
    class turns gem_core's :class:`SamplingParams` into vLLM's names (:meth:`vllm_params`) and the
    answer into a :class:`Generation` (:meth:`generation`), the same way for every trainer: the token
    ids as the engine returned them (with the stop token, as vLLM's ``token_ids`` have it: never
    re-derived from the text), logprobs, and vLLM's finish reason (``"length"`` also when the engine
    returned exactly ``max_tokens`` tokens without a stop token).
    """

    def vllm_params(self, params: SamplingParams, base: dict[str, Any] | None = None) -> dict[str, Any]:
        """vLLM sampling params for one turn: ``base`` (the trainer's own), then gem_core's fields."""
        out = dict(base or {})
        out.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k if params.top_k > 0 else -1, max_tokens=params.max_tokens)
        if params.stop_token_ids:
            out["stop_token_ids"] = list(dict.fromkeys([*(out.get("stop_token_ids") or ()), *params.stop_token_ids]))
        if params.seed is not None:
            out["seed"] = params.seed
        out.update(params.extra)
        return out

    async def request(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str = "", multi_modal_data: dict[str, Any] | None = None
    ) -> Generation:
        """``multi_modal_data`` (vLLM's ``{"image": [PIL images]}``, the context's images in order; the prompt
        holds each image's tokens as the model's processor expanded them) goes to :meth:`request` as a
        keyword, for subclasses whose ``request`` takes ``multi_modal_data``; others refuse images."""
        if not multi_modal_data:
            output = await self.request(list(prompt_ids), params, request_id)
        elif "multi_modal_data" in inspect.signature(self.request).parameters:
            output = await self.request(list(prompt_ids), params, request_id, multi_modal_data=multi_modal_data)
        else:
            raise TypeError(f"{type(self).__name__}.request takes no multi_modal_data: this engine policy serves text only")
        return self.generation(output, params)

    def generation(self, output: Any, params: SamplingParams) -> Generation:
        """A vLLM-like answer (``.token_ids``, ``.logprobs``/``.log_probs``, ``.finish_reason``/``.stop_reason``,
        or a ``RequestOutput`` with ``.outputs[0]``) as a :class:`Generation`."""
        if hasattr(output, "outputs"):
            output = output.outputs[0]
        ids = [int(t) for t in output.token_ids]
        logprobs = _logprobs(output, ids)
        return Generation(ids, logprobs, finish_reason(output, ids, params))


def sampling_from_vllm(vllm_params: Any, max_tokens: int) -> SamplingParams:
    """gem_core sampling params from a trainer's ``vllm.SamplingParams`` (its temperature, top-p, top-k
    and seed) with ``max_tokens`` per turn (vLLM's ``top_k=-1`` is gem_core's 0: no top-k)."""

    def field(name: str, default: Any) -> Any:
        value = getattr(vllm_params, name, None)
        return default if value is None else value

    return SamplingParams(
        max_tokens=int(max_tokens),
        temperature=float(field("temperature", 1.0)),
        top_p=float(field("top_p", 1.0)),
        top_k=max(int(field("top_k", 0)), 0),
        stop_token_ids=tuple(getattr(vllm_params, "stop_token_ids", None) or ()),
        seed=getattr(vllm_params, "seed", None),
    )


def copy_params(base: Any, changes: dict[str, Any]) -> Any:
    """A deep copy of ``base`` (a ``vllm.SamplingParams`` the trainer owns) with ``changes`` set; the
    trainer's object is never touched. vLLM derives ``_all_stop_token_ids`` from ``stop_token_ids`` when
    the params are built (it masks them before ``min_tokens``); the copy's set gets the new stop tokens too."""
    params = copy.deepcopy(base)
    for name, value in changes.items():
        setattr(params, name, value)
    derived = getattr(params, "_all_stop_token_ids", None)
    if isinstance(derived, set) and changes.get("stop_token_ids"):
        derived.update(changes["stop_token_ids"])
    return params


def finish_reason(output: Any, ids: Sequence[int], params: SamplingParams) -> str:
    """gem_core's finish reason from an engine's answer: vLLM's ``finish_reason`` when given
    (``"stop"``/``"length"``/``"abort"``), verl's ``stop_reason`` (``"aborted"``, ``"completed"``),
    and ``"length"`` whenever the answer used all of ``max_tokens`` without ending on a stop token
    (an engine that reports "completed" for a response it cut)."""
    reason = getattr(output, "finish_reason", None)
    stop = getattr(output, "stop_reason", None)
    if reason == "abort" or stop in ("aborted", "abort"):
        return "abort"
    if reason == "length":
        return "length"
    if len(ids) >= params.max_tokens and (not ids or int(ids[-1]) not in params.stop_token_ids):
        return "length"
    return "stop"


def _logprobs(output: Any, ids: Sequence[int]) -> list[float] | None:
    values = getattr(output, "log_probs", None)
    if values is not None:
        return [float(v) for v in values] or None
    records = getattr(output, "logprobs", None)
    if records is None:
        return None
    out = []
    for token, record in zip(ids, records):
        entry = record.get(token) if isinstance(record, dict) else record
        out.append(float(getattr(entry, "logprob", entry)))
    return out


@dataclass
class _Pending:
    prompt_ids: list[int]
    params: Any
    future: asyncio.Future
    multi_modal_data: dict[str, Any] | None = None


def collapse_image_tokens(prompt_ids: Sequence[int], image_token_id: int, image_token_counts: Sequence[int] | None = None) -> list[int]:
    """Each image's tokens cut to one ``image_token_id``: the prompt vLLM takes with ``multi_modal_data``
    (its multimodal processor expands each single image token again, to the count the model's processor
    gives).

    ``image_token_counts``: each image's number of image tokens, in order, as the processor expanded them
    (:meth:`~gem_core.rollout.VLChatFormatter.image_token_counts`). With them, two images side by side
    (one run of tokens: an observation whose text holds ``"<image><image>"``, or a template that drops the
    text between two images) are still two tokens. A prompt whose image tokens do not split into those
    counts is one :class:`ValueError` line. Without them each run of image tokens is cut to one token, so
    touching images merge into one: only for contexts known to hold text between their images.
    """
    if image_token_counts is None:
        out: list[int] = []
        for token in prompt_ids:
            if token == image_token_id and out and out[-1] == image_token_id:
                continue
            out.append(int(token))
        return out
    counts = [int(c) for c in image_token_counts]
    ids = [int(t) for t in prompt_ids]
    out, i, image = [], 0, 0
    while i < len(ids):
        if ids[i] != image_token_id:
            out.append(ids[i])
            i += 1
            continue
        if image >= len(counts):
            raise ValueError(f"the prompt has image tokens past its {len(counts)} images' {sum(counts)} (at position {i})")
        count = counts[image]
        run = next((j for j in range(i, min(i + count, len(ids))) if ids[j] != image_token_id), min(i + count, len(ids))) - i
        if count < 1 or run != count:
            raise ValueError(f"image {image} has {count} tokens, but the prompt holds a run of {run} image tokens at position {i}")
        out.append(image_token_id)
        i += count
        image += 1
    if image != len(counts):
        raise ValueError(f"the prompt holds the tokens of {image} images, not of its {len(counts)}")
    return out


def engine_image_prompt(
    prompt_ids: Sequence[int], images: Sequence[Any], image_token_id: int, image_token_counts: Callable[[Sequence[Any]], list[int]] | None = None
) -> list[int]:
    """The prompt for an engine that expands images itself (vLLM, and every trainer's server over it):
    each of ``images``' tokens cut to one (:func:`collapse_image_tokens`), by the counts
    ``image_token_counts(images)`` gives (a :class:`~gem_core.rollout.VLChatFormatter`'s
    ``image_token_counts``) when given. Without it, a prompt whose image-token runs are not one per image
    (images side by side) is one :class:`ValueError` line, never a request the engine fails on."""
    counts = image_token_counts(images) if image_token_counts is not None else None
    out = collapse_image_tokens(prompt_ids, image_token_id, counts)
    if counts is None and out.count(image_token_id) != len(images):
        raise ValueError(
            f"{len(images)} images, but the prompt's image tokens make {out.count(image_token_id)} runs (images side by side): "
            "pass image_token_counts= (the VLChatFormatter's) to cut each image's tokens by its count"
        )
    return out


class VLLMPolicy(EnginePolicy):
    """Token in, token out over vLLM's offline ``LLM`` (``vllm.LLM``, or anything with its
    ``generate(prompts, sampling_params, use_tqdm=...)``).

    Requests that arrive while the engine is busy are gathered (up to ``max_batch_size``) into one
    ``generate`` call, run in a thread so the event loop keeps stepping envs. Each request samples with
    its own seed, derived from ``(seed, params.seed, request_id)`` as :class:`~gem_core.rollout.HFPolicy`
    does, so a rerun with the same episode ids samples the same tokens. ``logprobs=True`` asks vLLM for
    the sampled token's logprob (``logprobs=0``). ``skip_special_tokens`` is left False: the runner never
    reads the engine's text, only its token ids.

    Images: ``image_token_id`` (else read from the engine's config) and ``image_token_counts`` (the
    :class:`~gem_core.rollout.VLChatFormatter`'s method of that name) cut each image's tokens to one
    (:func:`engine_image_prompt`); ``mm_processor_kwargs`` (the formatter's) go with every request that
    carries images, so vLLM expands each image as the formatter did.
    """

    def __init__(
        self,
        llm: Any,
        *,
        seed: int = 0,
        max_batch_size: int = 256,
        logprobs: bool = True,
        sampling_params_cls: Any = None,
        image_token_id: int | None = None,
        image_token_counts: Callable[[Sequence[Any]], list[int]] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.llm = llm
        self.seed = int(seed)
        self.max_batch_size = int(max_batch_size)
        self.logprobs = bool(logprobs)
        if sampling_params_cls is None:
            from vllm import SamplingParams as sampling_params_cls  # the real engine's class
        self.sampling_params_cls = sampling_params_cls
        self.max_model_len = engine_max_model_len(llm)
        # vision-language models: the image token the processor expands (else read from the engine's config)
        self.image_token_id = image_token_id if image_token_id is not None else _image_token_id(llm)
        self.image_token_counts = image_token_counts  # each image's token count (VLChatFormatter.image_token_counts)
        self.mm_processor_kwargs = dict(mm_processor_kwargs or {})
        self._queue: list[_Pending] = []
        self._server: asyncio.Task | None = None

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        *,
        seed: int = 0,
        max_model_len: int = 4096,
        dtype: str = "auto",
        in_process: bool = False,
        llm_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> VLLMPolicy:
        """Start ``vllm.LLM(model)`` (a path or hub id; see :func:`gem_core.models.resolve_model`).

        ``in_process``: the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` while
        it starts), so :meth:`load_weights` hands it tensors without copying them to another process;
        what a trainer that updates the weights between rollouts wants."""
        from vllm import LLM

        saved = os.environ.get(_IN_PROCESS_VAR)
        if in_process:
            os.environ[_IN_PROCESS_VAR] = "0"
        try:
            llm = LLM(model=model, seed=seed, max_model_len=max_model_len, dtype=dtype, **(llm_kwargs or {}))
        finally:
            if in_process:
                if saved is None:
                    os.environ.pop(_IN_PROCESS_VAR, None)
                else:
                    os.environ[_IN_PROCESS_VAR] = saved
        return cls(llm, seed=seed, **kwargs)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Put a trainer's updated weights (``model.named_parameters()``-style pairs, Hugging Face names)
        into the engine's model through vLLM's in-place reload (each layer's kernel-format processing
        redone, as at load time: the CPU backend repacks its linear weights; a tied output layer is
        redone too), then drop the engine's prefix cache, whose keys and values the old weights computed.
        An engine in another process takes the last two steps as pickled calls: it needs
        ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``; one started ``in_process`` does not."""
        payload = [(name, tensor.detach().to("cpu").contiguous()) for name, tensor in weights]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": payload, "is_checkpoint_format": True})
        self.llm.apply_model(_refresh_tied_output_layer)
        self.llm.reset_prefix_cache()

    def engine_params(self, params: SamplingParams, request_id: str) -> Any:
        """The ``vllm.SamplingParams`` of one request."""
        values = self.vllm_params(params, {"skip_special_tokens": False, "logprobs": 0 if self.logprobs else None})
        values["seed"] = derive_seed(self.seed, params.seed, request_id) % (2**31)
        return self.sampling_params_cls(**values)

    async def request(self, prompt_ids: list[int], params: SamplingParams, request_id: str, multi_modal_data: dict[str, Any] | None = None) -> Any:
        if not prompt_ids:
            raise ValueError("VLLMPolicy needs a non-empty prompt")
        if multi_modal_data and self.image_token_id is None:
            raise ValueError("VLLMPolicy got images but knows no image token: pass image_token_id= (the VLChatFormatter's)")
        if self.max_model_len is not None and len(prompt_ids) >= self.max_model_len:
            # vLLM refuses the whole batched call for one over-long prompt: refuse this request alone
            raise ContextLimitExceeded(f"a prompt of {len(prompt_ids)} tokens for max_model_len {self.max_model_len}")
        if multi_modal_data:  # a prompt the engine would refuse fails here, alone, not in the batched call
            prompt_ids = engine_image_prompt(prompt_ids, list(multi_modal_data.get("image") or ()), self.image_token_id, self.image_token_counts)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        pending = _Pending(list(prompt_ids), self.engine_params(params, request_id), loop.create_future(), multi_modal_data or None)
        self._queue.append(pending)
        if self._server is None or self._server.done() or self._server.get_loop() is not loop:
            self._server = loop.create_task(self._serve())
        return await pending.future

    async def _serve(self) -> None:
        while self._queue:
            waiting = -1
            while len(self._queue) != waiting:  # let the episodes that are about to ask join this batch
                waiting = len(self._queue)
                await asyncio.sleep(0)
            batch, self._queue = self._queue[: self.max_batch_size], self._queue[self.max_batch_size :]
            batch = [p for p in batch if not p.future.done()]
            if not batch:
                continue
            await resolve_in_thread([p.future for p in batch], lambda batch=batch: self._generate(batch))

    def _generate(self, batch: Sequence[_Pending]) -> list[Any]:
        """One ``generate`` call for the batch; a prompt the engine refuses as over its window (one the
        length check in :meth:`request` could not see: an engine that does not say its window) is refused
        alone (:func:`~gem_core.rollout.policy.answer_each`), the other requests answered."""
        return answer_each(list(batch), lambda part: self.llm.generate([self._prompt(p) for p in part], [p.params for p in part], use_tqdm=False))

    def _prompt(self, pending: _Pending) -> dict[str, Any]:
        """vLLM's ``TokensPrompt``: the token ids, and the images as ``multi_modal_data`` with one image
        token per image in the prompt (cut in :meth:`request`; vLLM expands each itself)."""
        if not pending.multi_modal_data:
            return {"prompt_token_ids": pending.prompt_ids}
        prompt = {"prompt_token_ids": pending.prompt_ids, "multi_modal_data": dict(pending.multi_modal_data)}
        if self.mm_processor_kwargs:
            prompt["mm_processor_kwargs"] = dict(self.mm_processor_kwargs)
        return prompt


def _image_token_id(llm: Any) -> int | None:
    """The image token of a vision-language model from the engine's HF config (LLaVA's
    ``image_token_index``, Qwen2-VL's ``image_token_id``); None for a text model or an engine that says nothing."""
    config: Any = llm
    for name in ("llm_engine", "model_config", "hf_config"):
        config = getattr(config, name, None)
    for name in ("image_token_index", "image_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


_IN_PROCESS_VAR = "VLLM_ENABLE_V1_MULTIPROCESSING"


def _refresh_tied_output_layer(model: Any) -> bool:
    """Runs on the engine's model. An output layer tied to the embedding (SmolLM2's) gets no weights of
    its own in a reload, so vLLM never redoes its kernel-format processing, and on CPU it keeps computing
    with the old weights' packed copy: point it at the reloaded embedding and redo that processing.
    True when the model has such a layer."""
    config = getattr(model, "config", None)
    head, decoder = getattr(model, "lm_head", None), getattr(model, "model", None)
    embedding = getattr(decoder, "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None or embedding is None:
        return False
    head.weight = embedding.weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
    return True


def engine_max_model_len(llm: Any) -> int | None:
    """The context window of a vLLM ``LLM`` (``llm.llm_engine.model_config.max_model_len``) or of an
    engine that says it otherwise (``.engine.max_model_len``, ``.max_model_len``); None when none says."""
    for path in (("llm_engine", "model_config", "max_model_len"), ("engine", "max_model_len"), ("max_model_len",)):
        value: Any = llm
        for name in path:
            value = getattr(value, name, None)
        if isinstance(value, int):
            return value
    return None
