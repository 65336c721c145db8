"""VLChatFormatter: a vision-language processor's chat template as token deltas (see chat.py for text).

Messages are rendered in the content-part form Hugging Face processors take (``{"type": "image"}``,
``{"type": "text", "text": ...}``), so the template puts its image placeholder where each image is;
then the processor itself expands each placeholder to the number of image tokens the model reads for
that image (LLaVA: a fixed count; Qwen2-VL: one per patch group), so the context's token ids are
exactly what the model's own processor would give for that conversation. Text-only observations take
:class:`~gem_core.rollout.chat.ChatFormatter`'s path unchanged.

The image token's text in an env's or a model's *text* (``<image>`` echoed back) is broken by a
zero-width space (:func:`gem_core.multimodal.escape_token`): it must never count as an image.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gem_core.multimodal import IMAGE_PLACEHOLDER, MultimodalObservation, content_parts, escape_token
from gem_core.rollout.chat import ChatFormatter, ChatTemplateError


class VLChatFormatter(ChatFormatter):
    """A :class:`ChatFormatter` over a Hugging Face processor (``AutoProcessor.from_pretrained(...)``:
    ``apply_chat_template``, ``tokenizer``, ``image_token``, and ``__call__(text=, images=)``).

    ``image_token_id``: the token the processor expands per image (what an engine collapses back to one
    per image before vLLM expands it again; see :class:`gem_core.rollout.VLLMPolicy`). Other arguments as
    :class:`ChatFormatter`'s.
    """

    supports_images = True

    def __init__(self, processor: Any, **kwargs: Any):
        self.processor = processor
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
        out = self.processor(text=[text], images=list(images), add_special_tokens=False)
        return [int(t) for t in out["input_ids"][0]]

    def image_token_count(self, image: Any) -> int:
        """How many image tokens the processor gives ``image``."""
        return self.expand(self.image_token, [image]).count(self.image_token_id)
