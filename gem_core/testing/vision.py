"""A tiny LLaVA-architecture vision-language model with random weights, and its processor, built from
local pieces (nothing is downloaded): the test tokenizer (gem_core.tiny.tokenizer) plus an ``<image>``
token, a CLIP image processor at 32x32 pixels, a one-layer CLIP vision tower (8x8 patches: 16 image tokens
per image) and a two-layer Qwen2 language model. Saved with ``save_pretrained`` it is ~1 MB and loads with
``AutoProcessor``/``LlavaForConditionalGeneration.from_pretrained``; a forward pass takes milliseconds on CPU.
"""

from __future__ import annotations

import os
from typing import Any

IMAGE_TOKEN = "<image>"
IMAGE_SIZE = 32
PATCH_SIZE = 8
#: Image tokens per image: (32 / 8)^2 patches (the CLS token is dropped: "default" feature selection).
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2

#: ChatML with content parts (a string content is rendered as is): each image part is one ``<image>``.
VL_CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' -}}"
    "{%- if m['content'] is string -%}{{- m['content'] -}}"
    "{%- else -%}{%- for part in m['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<image>' -}}{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def build_tiny_vl_processor(image_size: int = IMAGE_SIZE) -> Any:
    """The processor: the test tokenizer with ``<image>``, a CLIP image processor at ``image_size`` pixels
    (the model's 32 by default), the template above. Another ``image_size`` is a processor whose defaults
    do not fit the model until a processor kwarg says so (``{"size": {"height": 32, "width": 32}}``), as a
    Qwen-VL processor's defaults give more image tokens than a deployment's ``max_pixels`` allows."""
    from transformers import LlavaProcessor

    from gem_core.tiny.tokenizer import build_test_tokenizer

    try:  # transformers 5 names the Pillow backend; 4.x has only this class
        from transformers import CLIPImageProcessorPil as ImageProcessor
    except ImportError:  # pragma: no cover - transformers 4.x
        from transformers import CLIPImageProcessor as ImageProcessor

    tokenizer = build_test_tokenizer("chatml")
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    size = {"height": image_size, "width": image_size}
    image_processor = ImageProcessor(size=size, crop_size=size, do_center_crop=False)
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        chat_template=VL_CHAT_TEMPLATE,
        num_additional_image_tokens=1,
        image_token=IMAGE_TOKEN,
    )


def build_tiny_vl_model(vocab_size: int, image_token_id: int, *, seed: int = 0, hidden_size: int = 32) -> Any:
    """A ``LlavaForConditionalGeneration`` with random weights drawn from ``seed`` (the global torch RNG
    is left untouched)."""
    import torch
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config

    vision = CLIPVisionConfig(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=hidden_size,
    )
    text = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=image_token_id,
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
    return model.eval()


def build_tiny_vl(seed: int = 0, processor_image_size: int = IMAGE_SIZE) -> tuple[Any, Any]:
    """(model, processor), built in memory (``processor_image_size``: see :func:`build_tiny_vl_processor`)."""
    processor = build_tiny_vl_processor(processor_image_size)
    tokenizer = processor.tokenizer
    model = build_tiny_vl_model(len(tokenizer), tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), seed=seed)
    return model, processor


def save_tiny_vl(directory: str | os.PathLike[str], seed: int = 0, processor_image_size: int = IMAGE_SIZE) -> str:
    """Build the model and processor and save both to ``directory`` (``from_pretrained`` loads them);
    returns the directory (``processor_image_size``: see :func:`build_tiny_vl_processor`)."""
    directory = os.fspath(directory)
    model, processor = build_tiny_vl(seed, processor_image_size)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory
