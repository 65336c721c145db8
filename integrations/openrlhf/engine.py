"""OpenRLHF's vLLM engine as a gem_core :class:`~gem_core.rollout.Policy` (the runner's side of the agent).

OpenRLHF hands its agent executor ``llm_engine`` (the ``RolloutRayActor``) and the rollout's
``vllm.SamplingParams``; the actor's ``generate(prompt_token_ids, sampling_params,
multi_modal_data=None)`` answers with a vLLM ``RequestOutput``. :class:`OpenRLHFEnginePolicy` makes
that a gem_core policy through :class:`gem_core.plugins.EnginePolicy`: each turn gets its **own copy**
of OpenRLHF's sampling params with gem_core's ``max_tokens`` and the chat template's stop tokens, and
the answer is read from its ``token_ids`` (which keep the stop token), never from its ``text`` (which
vLLM returns without it unless ``include_stop_str_in_output``, and without special tokens by default).

Vision-language models: a context with images goes as OpenRLHF's own executor sends it,
``multi_modal_data={"image": [PIL images]}`` (the context's images in order), with each image's
processor-expanded image tokens cut to one, by each image's count
(:func:`gem_core.rollout.engine_image_prompt`): what OpenRLHF's ``generate`` makes of the prompt itself with
``--data.max_images_per_prompt`` (its ``dedup_media_tokens``), done here too so that vLLM never expands an
image twice without that flag. OpenRLHF's cut merges every run of image tokens, so two images whose tokens
touch (a context that puts nothing between them) would reach vLLM as one: such a request is refused in one
line before it is sent. (``MultimodalObservation`` puts a line break between the placeholders it adds.)
OpenRLHF 0.11 has no processor-kwargs setting: its agent, its actor and vLLM all read the processor's
settings (e.g. Qwen-VL's ``max_pixels``) from the model directory, so the formatter over the processor
OpenRLHF hands the agent expands images as they do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gem_core.plugins import EnginePolicy, copy_params, sampling_from_vllm
from gem_core.rollout import SamplingParams, engine_image_prompt


gem_params = sampling_from_vllm  # gem_core sampling params from OpenRLHF's vllm.SamplingParams (gem_core.plugins)
own_params = copy_params  # the trainer's vllm.SamplingParams copied per turn (gem_core.plugins)


class OpenRLHFEnginePolicy(EnginePolicy):
    """A gem_core policy over OpenRLHF's ``llm_engine``; ``base_params``: the rollout's sampling params
    (kept as they are: logprobs, min_tokens, skip_special_tokens, ...; only the copy per turn changes).
    ``image_token_id``: the token the model's processor expands per image and ``image_token_counts`` the
    count of each image's tokens (a :class:`~gem_core.rollout.VLChatFormatter`'s attribute and method);
    needed only for contexts with images."""

    def __init__(
        self,
        engine: Any,
        base_params: Any,
        image_token_id: int | None = None,
        image_token_counts: Callable[[Sequence[Any]], list[int]] | None = None,
    ):
        self.engine = engine
        self.base_params = base_params
        self.image_token_id = image_token_id
        self.image_token_counts = image_token_counts

    async def request(self, prompt_ids: list[int], params: SamplingParams, request_id: str, multi_modal_data: dict[str, Any] | None = None) -> Any:
        turn_params = own_params(self.base_params, self.vllm_params(params))
        if multi_modal_data:
            if self.image_token_id is None:
                raise ValueError("OpenRLHFEnginePolicy got images but knows no image token: pass image_token_id= (the VLChatFormatter's)")
            prompt_ids = engine_image_prompt(prompt_ids, list(multi_modal_data.get("image") or ()), self.image_token_id, self.image_token_counts)
            token = self.image_token_id
            if any(a == token and b == token for a, b in zip(prompt_ids, prompt_ids[1:])):
                raise ValueError(
                    "two images side by side in the context (nothing between their image tokens): OpenRLHF's engine "
                    "(dedup_media_tokens) would merge them into one image; put text between the images' placeholders"
                )
        return await self.engine.generate(prompt_ids, turn_params, multi_modal_data=multi_modal_data or None)
