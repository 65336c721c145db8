"""VLChatFormatter: a vision-language processor's chat template as token deltas (see chat.py for text).

Messages are rendered in the content-part form Hugging Face processors take (``{"type": "image"}``,
``{"type": "text", "text": ...}``), so the template puts its image placeholder where each image is;
then the processor itself expands each placeholder to the number of image tokens the model reads for
that image (LLaVA: a fixed count; Qwen2-VL: one per patch group), so the context's token ids are
exactly what the model's own processor would give for that conversation. Text-only observations take
:class:`~gem_core.rollout.chat.ChatFormatter`'s path unchanged.

``mm_processor_kwargs`` (e.g. Qwen-VL's ``{"max_pixels": 200704}``) go to every processor call, as verl's
``data.mm_processor_kwargs`` and vLLM's go to theirs: the context holds as many image tokens per image as
the engine and the trainer's own processor call give for the same setting.

An engine that expands images itself (vLLM) takes one image token per image
(:func:`gem_core.rollout.engine.collapse_image_tokens`); two images side by side (a template with nothing
between them) make one run of tokens, so the formatter says how many tokens each image has
(:meth:`VLChatFormatter.image_token_counts`) and the engine policies cut by those counts, not by runs.

The image token's text in an env's or a model's *text* (``<image>`` echoed back) is broken by a
zero-width space (:func:`gem_core.multimodal.escape_token`): it must never count as an image.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from gem_core.multimodal import IMAGE_PLACEHOLDER, MultimodalObservation, content_parts, escape_token
from gem_core.rollout.chat import ChatFormatter, ChatTemplateError


class VLChatFormatter(ChatFormatter):
    """A :class:`ChatFormatter` over a Hugging Face processor (``AutoProcessor.from_pretrained(...)``:
    ``apply_chat_template``, ``tokenizer``, ``image_token``, and ``__call__(text=, images=)``).

    ``image_token_id``: the token the processor expands per image (what an engine collapses back to one
    per image before vLLM expands it again; see :class:`gem_core.rollout.VLLMPolicy`).
    ``mm_processor_kwargs``: keyword arguments for every processor call (verl's ``data.mm_processor_kwargs``,
    vLLM's ``mm_processor_kwargs``: e.g. ``{"max_pixels": ...}`` for Qwen-VL). Other arguments as
    :class:`ChatFormatter`'s.
    """

    supports_images = True
    #: How many images' token counts are remembered (least recently used dropped).
    COUNT_CACHE_SIZE = 1024

    def __init__(self, processor: Any, *, mm_processor_kwargs: Mapping[str, Any] | None = None, **kwargs: Any):
        self.processor = processor
        self.mm_processor_kwargs: dict[str, Any] = dict(mm_processor_kwargs or {})
        # id(image) -> (a weak reference to the image, its token count): the entry goes when the image does
        self._counts: OrderedDict[int, tuple[weakref.ref, int]] = OrderedDict()
        self._counts_lock = threading.RLock()  # a reference's callback may run inside a locked section (GC)
        tokenizer = processor.tokenizer
        self.image_token: str = getattr(processor, "image_token", None) or IMAGE_PLACEHOLDER
        image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        if not isinstance(image_token_id, int) or image_token_id == getattr(tokenizer, "unk_token_id", None):
            raise ChatTemplateError(f"the processor's tokenizer has no token {self.image_token!r}")
        self.image_token_id: int = image_token_id
        super().__init__(tokenizer, **kwargs)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The processor's chat template over ``messages`` with every content as parts."""
        kwargs = dict(self.chat_template_kwargs)
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        parts = [{**m, "content": self._parts(m["content"])} for m in messages]
        return self.processor.apply_chat_template(parts, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)

    def _parts(self, content: Any) -> list[dict[str, Any]]:
        if isinstance(content, MultimodalObservation):
            return content_parts(content, escape=self.image_token)
        if isinstance(content, str):
            return [{"type": "text", "text": content}]  # text observations were escaped by the caller
        return list(content)

    # -- what the runner calls -------------------------------------------------------------------------
    def prompt_ids(self, observation: Any) -> list[int]:
        if not isinstance(observation, MultimodalObservation):
            return super().prompt_ids(escape_token(observation, self.image_token))
        text = self.render(self._prefix_messages + [{"role": "user", "content": observation}], True)
        return self.expand(text, observation.images)

    def prompt_text(self, observation: Any) -> str:
        if not isinstance(observation, MultimodalObservation):
            return super().prompt_text(escape_token(observation, self.image_token))
        return self.render(self._prefix_messages + [{"role": "user", "content": observation}], True)

    def observation_ids(self, observation: Any, response_ids: Sequence[int], role: str = "user") -> list[int]:
        if not isinstance(observation, MultimodalObservation):
            return super().observation_ids(escape_token(observation, self.image_token), response_ids, role)
        tail = self._rendered_tail(observation, "user" if role == "user" else self.tool_role)  # type: ignore[arg-type]
        if self.response_closed(response_ids) and self._end_text is not None:
            tail = tail[len(self._end_text) :]
        return self.expand(tail, observation.images)

    def expand(self, text: str, images: Sequence[Any]) -> list[int]:
        """Template text with one image token per image -> token ids with each expanded by the processor."""
        found = text.count(self.image_token)
        if found != len(images):
            raise ChatTemplateError(f"the chat template rendered {found} {self.image_token!r} for {len(images)} images")
        out = self.processor(text=[text], images=list(images), add_special_tokens=False, **self.mm_processor_kwargs)
        ids = [int(t) for t in out["input_ids"][0]]
        runs = _runs(ids, self.image_token_id)
        if len(runs) == len(images):  # each image its own run: the counts come free
            for image, count in zip(images, runs):
                self._remember(image, count)
        return ids

    def image_token_count(self, image: Any) -> int:
        """How many image tokens the processor gives ``image`` (with :attr:`mm_processor_kwargs`)."""
        with self._counts_lock:
            cached = self._counts.get(id(image))
            if cached is not None and cached[0]() is image:
                self._counts.move_to_end(id(image))
                return cached[1]
        count = self.expand(self.image_token, [image]).count(self.image_token_id)
        self._remember(image, count)
        return count

    def image_token_counts(self, images: Sequence[Any]) -> list[int]:
        """Each image's count of image tokens, in order: how an engine policy cuts a context's image tokens
        to one per image (:func:`gem_core.rollout.engine.collapse_image_tokens`) even where two images' runs
        touch. Known from the expansion that put them in the context, else from the processor."""
        return [self.image_token_count(image) for image in images]

    def _remember(self, image: Any, count: int) -> None:
        key = id(image)

        def forget(ref: weakref.ref) -> None:
            with self._counts_lock:
                if self._counts.get(key, (None,))[0] is ref:
                    del self._counts[key]

        with self._counts_lock:
            self._counts[key] = (weakref.ref(image, forget), count)
            self._counts.move_to_end(key)
            while len(self._counts) > self.COUNT_CACHE_SIZE:
                self._counts.popitem(last=False)


def _runs(ids: Sequence[int], token: int) -> list[int]:
    """The lengths of the runs of ``token`` in ``ids``, in order."""
    runs: list[int] = []
    previous = None
    for t in ids:
        if t == token:
            if previous == token:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = t
    return runs
