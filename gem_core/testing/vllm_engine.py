"""A stand-in for a vLLM engine that behaves like vLLM where trainer plugins depend on it.

Plugin tests drive a trainer's own rollout code with this engine instead of a GPU. A stand-in that is
kinder than vLLM hides real defects, so the rules below are vLLM's (``vllm/v1/engine/detokenizer.py``,
``vllm/v1/core/sched/utils.py:check_stop``, ``vllm/sampling_params.py``), not a convenient guess:

* **The model does not know what you asked for.** :class:`ScriptedModel` emits its reply, then its
  end-of-turn token, and then keeps going (a new turn it made up) until something stops it. Only the
  request's ``stop_token_ids``, the tokenizer's EOS (unless ``ignore_eos``), ``max_tokens`` and the
  engine's ``max_model_len`` stop it.
* **The stop token is in ``token_ids`` but not in ``text``** unless ``include_stop_str_in_output``.
  EOS and ``stop_token_ids`` are never held back from ``token_ids``. Stop tokens are ignored before
  ``min_tokens``.
* **``text`` is decoded with the request's ``skip_special_tokens``, which defaults to True** as in
  ``vllm.SamplingParams``.
* **``max_tokens``** is the request's; ``None`` means "the rest of ``max_model_len``". A prompt of
  ``max_model_len`` tokens or more is refused with vLLM 0.32's error, in its words (:func:`context_refusal`),
  and a batch holding one such prompt is refused whole, as vLLM does; a prompt plus ``max_tokens`` longer
  than ``max_model_len`` is cut at ``max_model_len`` with ``finish_reason="length"``.
* **Finish reasons** are vLLM's: ``"stop"`` (EOS, a stop token or a stop string), ``"length"``
  (``max_tokens`` or ``max_model_len``), ``"abort"``. ``stop_reason`` is the stop token id (None for EOS
  or length).
* **Logprobs**: with ``logprobs=k`` (0 included), one dict per generated token mapping token id ->
  :class:`Logprob`, the sampled token always present; ``None`` when the request did not ask.

``generate`` takes ``(prompt_token_ids, sampling_params, ...)`` as OpenRLHF's rollout actor calls it;
:meth:`VLLMFaithfulEngine.generate_tokens` answers verl's server-manager call shape
(``request_id, prompt_ids=..., sampling_params={dict}``) with the same rules; :class:`VLLMFaithfulLLM`
is vLLM's offline ``LLM`` (a batch of prompts in one synchronous ``generate``, as oat's actor calls it).

**Images** (vision-language models) come as vLLM takes them: a ``TokensPrompt`` dict
``{"prompt_token_ids": [...], "multi_modal_data": {"image": PIL image or [PIL images]}}``, one image
token in the prompt per image, which the engine expands to the count the model's processor gives (vLLM's
prompt updates). As vLLM: modalities other than vLLM's are refused, fewer image tokens than images is an
error. Stricter than vLLM (a test's typo is caught, never ignored): unknown prompt keys, images that are
not PIL images, images for a text-only model. :class:`HFVisionModel` is the model for them: a Hugging Face
VL model run greedily on the expanded prompt with the processor's ``pixel_values``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gem_core.rollout.policies import cache_keyword, scripted_logprob

#: The keys of vLLM's ``TokensPrompt`` (``vllm.inputs.TokensPrompt`` and its ``_PromptOptions``); the
#: real-tier test checks this set against the installed vLLM.
TOKENS_PROMPT_KEYS = frozenset(
    {
        "prompt_token_ids",
        "prompt",
        "token_type_ids",
        "prompt_token_offsets",
        "multi_modal_data",
        "media_io_kwargs",
        "mm_processor_kwargs",
        "multi_modal_uuids",
        "cache_salt",
    }
)
#: The modalities vLLM's ``MultiModalDataParser`` knows (anything else: "Unsupported modality").
VLLM_MODALITIES = ("audio", "image", "video", "vision_chunk")

#: What a model that was not stopped writes after its end-of-turn token: a turn it made up.
RUNAWAY_TEXT = "\n<|im_start|>user\nAnd then? Tell me more.<|im_end|>\n<|im_start|>assistant\nMore text."


@dataclass
class Logprob:
    """vLLM's per-token logprob record."""

    logprob: float
    rank: int | None = 1
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """vLLM's ``CompletionOutput`` (the fields trainers read)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """vLLM's ``RequestOutput`` (one completion per request: ``n=1``)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass
class VLLMSamplingParams:
    """The fields of ``vllm.SamplingParams`` that the engine honours, with vLLM's defaults."""

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    seed: int | None = None
    n: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


class EngineError(ValueError):
    """What vLLM raises for a request it refuses (e.g. a prompt longer than the model's context)."""


def context_refusal(prompt_len: int, max_model_len: int) -> str | None:
    """vLLM 0.32's refusal of a prompt of ``prompt_len`` tokens that leaves no room in ``max_model_len``, in
    its words (``vllm/renderers/params.py`` for a longer prompt, ``vllm/v1/engine/input_processor.py`` for
    one exactly as long; the same in 0.29), or None when it fits. vLLM refuses every prompt of a batched
    ``generate`` call for one such prompt, before it runs any."""
    if prompt_len > max_model_len:
        return (
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains {prompt_len} input tokens, "
            "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt."
        )
    if prompt_len == max_model_len:
        return (
            f"The decoder prompt (length {prompt_len}) plus the number of requested output tokens (at least 1) is longer than the "
            f"maximum model length of {max_model_len}. Make sure that `max_model_len` is no smaller than the number of text tokens "
            "(prompt + requested output tokens)."
        )
    return None


class ScriptedModel:
    """A deterministic "model": ``respond(decoded_prompt) -> reply text``; it writes the reply, then its
    end-of-turn token, then :data:`RUNAWAY_TEXT` over and over, whatever the request asks for."""

    def __init__(self, tokenizer: Any, respond: Callable[[str], str], *, end_of_turn_id: int | None = None, runaway_text: str = RUNAWAY_TEXT):
        self.tokenizer = tokenizer
        self.respond = respond
        end = end_of_turn_id if end_of_turn_id is not None else getattr(tokenizer, "eos_token_id", None)
        if end is None:
            raise ValueError("ScriptedModel needs an end-of-turn token: pass end_of_turn_id or use a tokenizer with an EOS")
        self.end_of_turn_id = int(end)
        self.runaway_ids = list(tokenizer.encode(runaway_text, add_special_tokens=False)) or [self.end_of_turn_id]

    def stream(self, prompt_token_ids: Sequence[int]) -> Any:
        """The tokens the model would write after ``prompt_token_ids``, forever."""
        context = self.tokenizer.decode(list(prompt_token_ids), skip_special_tokens=False)
        reply = list(self.tokenizer.encode(self.respond(context), add_special_tokens=False))
        return itertools.chain(reply, [self.end_of_turn_id], itertools.cycle(self.runaway_ids))


class VLLMFaithfulEngine:
    """An engine with vLLM's request semantics (see the module docstring) over a :class:`ScriptedModel`.

    ``max_model_len``: the context window (prompt + response). ``requests`` records every request as
    ``(prompt_token_ids, sampling params as given)``; ``aborted`` request ids get ``finish_reason="abort"``
    with what was generated so far (nothing, here), as vLLM does when a request is aborted.
    """

    def __init__(self, model: ScriptedModel, *, max_model_len: int = 4096):
        self.model = model
        self.tokenizer = model.tokenizer
        self.max_model_len = int(max_model_len)
        self.eos_token_id = getattr(self.tokenizer, "eos_token_id", None)
        self.requests: list[tuple[list[int], Any]] = []
        self.aborted: set[str] = set()
        self._count = 0

    # -- OpenRLHF / vLLM AsyncLLM call shape ---------------------------------------------------------
    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: Any,
        multi_modal_data: Any = None,
        request_id: str | None = None,
        mm_processor_kwargs: Mapping[str, Any] | None = None,
    ) -> RequestOutput:
        """``generate(prompt_token_ids, sampling_params)`` answered as vLLM would; ``mm_processor_kwargs``
        go to the model's processor with the request's images (vLLM's ``TokensPrompt`` key)."""
        images = read_multi_modal_data(multi_modal_data)
        self._count += 1
        request_id = request_id or f"req-{self._count}"
        self.requests.append((list(prompt_token_ids), dataclasses.replace(sampling_params) if dataclasses.is_dataclass(sampling_params) else sampling_params))
        return self._complete(list(prompt_token_ids), _read_params(sampling_params), request_id, images, mm_processor_kwargs)

    # -- verl server-manager call shape ----------------------------------------------------------------
    async def generate_tokens(self, request_id: str, *, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any], **_: Any) -> RequestOutput:
        """verl's ``server_manager.generate(request_id, prompt_ids=..., sampling_params={...})``: the dict
        is read as vLLM's server reads it (vLLM names and defaults)."""
        self._count += 1
        params = _read_params(dict(sampling_params))
        self.requests.append((list(prompt_ids), dict(sampling_params)))
        return self._complete(list(prompt_ids), params, request_id)

    # -- the rules -------------------------------------------------------------------------------------
    def _complete(
        self, prompt: list[int], params: VLLMSamplingParams, request_id: str, images: list[Any] | None = None, mm_kwargs: Mapping[str, Any] | None = None
    ) -> RequestOutput:
        if params.n != 1:
            raise EngineError("this engine answers n=1 only")
        mm_kwargs = dict(mm_kwargs or {})
        if images:
            prompt = self._expand_images(prompt, images, mm_kwargs)
        refusal = context_refusal(len(prompt), self.max_model_len)
        if refusal is not None:
            raise EngineError(refusal)
        room = self.max_model_len - len(prompt)
        max_tokens = room if params.max_tokens is None else int(params.max_tokens)
        if max_tokens < 1:
            raise EngineError(f"max_tokens must be at least 1, got {max_tokens}.")
        if request_id in self.aborted:
            return RequestOutput(request_id, prompt, [CompletionOutput(0, "", [], None, [] if params.logprobs is not None else None, "abort")])
        stops = set(params.stop_token_ids or ())
        ids: list[int] = []
        finish, stop_reason, stopped_on_token = "length", None, False
        stream = self.model.stream(prompt, images=images, mm_processor_kwargs=mm_kwargs) if images else self.model.stream(prompt)
        for token in stream:
            ids.append(int(token))
            if len(ids) > params.min_tokens:  # vLLM masks stop tokens out of the first min_tokens
                if not params.ignore_eos and self.eos_token_id is not None and token == self.eos_token_id:
                    finish, stopped_on_token = "stop", True
                    break
                if token in stops:
                    finish, stop_reason, stopped_on_token = "stop", int(token), True
                    break
            if len(ids) >= max_tokens or len(prompt) + len(ids) >= self.max_model_len:
                break
        shown = ids[:-1] if stopped_on_token and not params.include_stop_str_in_output else ids
        text = self.tokenizer.decode(shown, skip_special_tokens=params.skip_special_tokens)
        logprobs = None
        cumulative = None
        if params.logprobs is not None:
            values = [scripted_logprob(t, i) for i, t in enumerate(ids)]
            logprobs = [{t: Logprob(v, 1, self.tokenizer.decode([t]))} for t, v in zip(ids, values)]
            cumulative = float(sum(values))
        return RequestOutput(request_id, prompt, [CompletionOutput(0, text, ids, cumulative, logprobs, finish, stop_reason)])

    def _expand_images(self, prompt: list[int], images: list[Any], mm_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        """vLLM's prompt update: the first image token per image replaced by that image's tokens (as the
        model's processor gives them with the request's ``mm_processor_kwargs``)."""
        placeholder = getattr(self.model, "image_token_id", None)
        if placeholder is None:
            raise EngineError(f"{type(self.model).__name__} is not a multimodal model: it takes no images")
        found = prompt.count(placeholder)
        if found < len(images):
            raise EngineError(
                f"Expected there to be {len(images)} prompt updates corresponding to {len(images)} image items, but instead found {found} "
                "prompt updates! This is likely because you forgot to include input placeholder tokens (e.g., `<image>`) in the prompt."
            )
        out: list[int] = []
        remaining = iter(images)
        image = next(remaining, None)
        for token in prompt:
            if token == placeholder and image is not None:
                out.extend(self.model.image_tokens(image, **dict(mm_kwargs or {})))
                image = next(remaining, None)
            else:
                out.append(token)
        return out


def read_multi_modal_data(data: Any) -> list[Any] | None:
    """The images of a request's ``multi_modal_data`` as vLLM parses it (one item or a list per modality),
    refused with one :class:`EngineError` line where vLLM would refuse it or this engine cannot serve it."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise EngineError(f"multi_modal_data must be a dict of modality -> items, got {type(data).__name__}")
    for key in data:
        if key not in VLLM_MODALITIES:
            raise EngineError(f"Unsupported modality: {key}")
        if key != "image":
            raise EngineError(f"this engine serves images only, not {key}")
    items = data.get("image")
    if items is None:
        return None
    from PIL import Image

    items = [items] if isinstance(items, Image.Image) else items
    if not isinstance(items, (list, tuple)):
        raise EngineError(f"multi_modal_data['image'] must be a PIL image or a list of them, got {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, Image.Image):
            raise EngineError(f"multi_modal_data['image'][{i}] must be a PIL image, got {type(item).__name__}")
    return [item if item.mode == "RGB" else item.convert("RGB") for item in items]  # vLLM converts to RGB too


def read_tokens_prompt(prompt: Any) -> tuple[list[int], list[Any] | None]:
    """A ``TokensPrompt`` dict as vLLM reads it: (token ids, images or None)."""
    if not isinstance(prompt, Mapping) or "prompt_token_ids" not in prompt:
        raise EngineError("this engine takes token prompts only")
    unknown = sorted(set(prompt) - TOKENS_PROMPT_KEYS)
    if unknown:
        raise EngineError(f"unknown TokensPrompt keys {unknown}; vLLM's are {sorted(TOKENS_PROMPT_KEYS)}")
    ids = prompt["prompt_token_ids"]
    if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise EngineError("Token prompt should be a list of integers")
    return [int(t) for t in ids], read_multi_modal_data(prompt.get("multi_modal_data"))


class HFVisionModel:
    """A Hugging Face vision-language model (e.g. :func:`gem_core.testing.vision.build_tiny_vl_model`'s)
    as the engine's model: greedy tokens, the first forward pass with the processor's ``pixel_values``
    for the request's images. ``calls`` records per request the prompt's image-token count and the
    ``pixel_values`` shape (None when no image came), so tests see that the images reached the model."""

    def __init__(self, model: Any, processor: Any):
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.image_token_id = int(self.tokenizer.convert_tokens_to_ids(processor.image_token))
        self.calls: list[tuple[int, tuple[int, ...] | None]] = []

    def image_tokens(self, image: Any, **mm_processor_kwargs: Any) -> list[int]:
        """What the processor expands one image token to, for ``image`` (with the request's processor kwargs)."""
        out = self.processor(text=[self.processor.image_token], images=[image], add_special_tokens=False, **mm_processor_kwargs)
        return [int(t) for t in out["input_ids"][0]]

    def stream(self, prompt_token_ids: Sequence[int], images: Sequence[Any] | None = None, mm_processor_kwargs: Mapping[str, Any] | None = None) -> Any:
        import torch

        ids = torch.tensor([list(prompt_token_ids)], dtype=torch.long)
        inputs: dict[str, Any] = {"input_ids": ids}
        if images:
            kwargs = dict(mm_processor_kwargs or {})
            inputs["pixel_values"] = self.processor.image_processor(list(images), return_tensors="pt", **kwargs)["pixel_values"]
        self.calls.append((int((ids == self.image_token_id).sum()), tuple(inputs["pixel_values"].shape) if images else None))
        past, name = None, cache_keyword(self.model)
        with torch.inference_mode():
            while True:
                out = self.model(**inputs, **{name: past}, use_cache=True)
                past = getattr(out, name)
                token = int(out.logits[0, -1].argmax())
                yield token
                inputs = {"input_ids": torch.tensor([[token]], dtype=torch.long)}


class VLLMFaithfulLLM:
    """vLLM's offline ``LLM`` over a :class:`VLLMFaithfulEngine`: ``generate(prompts, sampling_params,
    prompt_token_ids=..., use_tqdm=..., lora_request=...)`` answers a batch at once, in order, with the
    engine's rules (vLLM 0.8's signature: token prompts as ``prompt_token_ids=`` or as
    ``{"prompt_token_ids": ...}`` dicts; ``sampling_params`` one for all or one per prompt; text prompts
    are refused here, the engine is token in, token out). ``calls`` records each batch's size."""

    def __init__(self, engine: VLLMFaithfulEngine):
        self.engine = engine
        self.calls: list[int] = []

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self, prompts: Any = None, sampling_params: Any = None, prompt_token_ids: Any = None, use_tqdm: bool = True, lora_request: Any = None, **_: Any
    ) -> list[RequestOutput]:
        if prompt_token_ids is not None:
            batch = [list(p) for p in prompt_token_ids]
            images: list[Any] = [None] * len(batch)
            mm_kwargs: list[Any] = [None] * len(batch)
        else:
            items = prompts if isinstance(prompts, (list, tuple)) else [prompts]
            read = [read_tokens_prompt(p) for p in items]
            batch = [ids for ids, _ in read]
            images = [mm for _, mm in read]
            mm_kwargs = [p.get("mm_processor_kwargs") for p in items]
        params = (
            sampling_params
            if isinstance(sampling_params, (list, tuple))
            else [sampling_params if sampling_params is not None else VLLMSamplingParams()] * len(batch)
        )
        if len(params) != len(batch):
            raise EngineError(f"{len(params)} sampling params for {len(batch)} prompts")
        for ids, mm in zip(batch, images):  # vLLM checks every prompt before it runs any: one refusal refuses the call
            refusal = None if mm else context_refusal(len(ids), self.engine.max_model_len)
            if refusal is not None:
                raise EngineError(refusal)
        self.calls.append(len(batch))
        out = []
        for ids, p, mm, kwargs in zip(batch, params, images, mm_kwargs):
            self.engine._count += 1
            request_id = str(self.engine._count)
            self.engine.requests.append((ids, dataclasses.replace(p) if dataclasses.is_dataclass(p) else p))
            out.append(self.engine._complete(ids, _read_params(p), request_id, mm, kwargs))
        return out


def _read_params(params: Any) -> VLLMSamplingParams:
    """vLLM sampling params from a vllm.SamplingParams-like object or a dict; unset fields get vLLM's defaults."""
    defaults = VLLMSamplingParams()
    if isinstance(params, Mapping):
        get = params.get
    else:

        def get(name: str, default: Any = None) -> Any:
            return getattr(params, name, default)

    values = {}
    for f in dataclasses.fields(VLLMSamplingParams):
        if f.name == "extra":
            continue
        value = get(f.name, None)
        values[f.name] = getattr(defaults, f.name) if value is None and f.name not in ("max_tokens", "logprobs", "seed", "stop_token_ids") else value
    if isinstance(params, Mapping) and "max_tokens" not in params:
        values["max_tokens"] = defaults.max_tokens
    return VLLMSamplingParams(**values)
