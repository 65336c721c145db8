"""The decoder's hidden states for the loss, computed once where they are the same: the rows' shared prefix once
per micro-batch, and the frozen lower layers once per update.

* :func:`decoder_hidden_states`: the decoder over right-padded rows, their common prefix (the instruction every
  episode of a batch starts from) through the decoder once, its key/value cache repeated for the rest of every row.
* :func:`frozen_bottom` and :func:`top_hidden_states`: with ``--trained-layers N`` the layers below the top N (and
  the embeddings) never change, and the KL's reference model is a copy of the policy taken when RL starts, so
  its lower layers are the policy's. An update with a KL term used to run those layers twice on the same rows
  (the reference's forward, then the policy's), the larger part of both forwards (20 of the 30 layers of the
  default run). :func:`frozen_bottom` runs them once per micro-batch, without gradients;
  :func:`top_hidden_states` runs the layers above from there, for the reference and then for the policy (each
  pass of each mini-batch). It calls the decoder's own layer modules with the arguments its forward gives them
  (the same causal mask, rotary embeddings, positions and cache), in the same order, so the hidden states are
  those of :func:`decoder_hidden_states` bit for bit (``tests/train/test_decoder_split.py``: values and
  gradients), and a run is the run it was (``tests/train/test_determinism.py``'s recorded run).

The split needs a decoder whose forward is that loop (:data:`SPLIT_MODEL_TYPES`: Llama, Qwen2 without
sliding-window layers) and transformers' ``create_causal_mask`` sized against a chosen cache layer; elsewhere
(and with gradient checkpointing, whose recomputation keeps no cache) :func:`frozen_layer_count` is 0 and the
trainer runs the whole decoder, as before.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from gem_core.rollout.policies import MIN_SHARED_PREFIX, cache_keyword, shared_prefix_length

#: decoders whose forward is embeddings, one causal mask, rotary embeddings, the layers in order, a final norm
SPLIT_MODEL_TYPES = ("llama", "qwen2")


def is_checkpointing(model: Any) -> bool:
    # transformers 5 renamed is_gradient_checkpointing (reading the old name warns); 4.x has only the old one
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name) or name in vars(model):
            return bool(getattr(model, name))
    return False


def shared_prefix(decoder: Any, rows: Any, share_prefix: bool = True) -> int:
    """The rows' common prefix length worth one pass of its own (0: none): at least ``MIN_SHARED_PREFIX`` tokens,
    two rows or more, no gradient checkpointing."""
    size = rows.input_ids.shape[0]
    if not share_prefix or size < 2 or is_checkpointing(decoder):
        return 0
    lengths = rows.attention.sum(dim=1).tolist()
    prefix = shared_prefix_length([rows.input_ids[i, :n].tolist() for i, n in enumerate(lengths)])
    return prefix if prefix >= MIN_SHARED_PREFIX else 0


def decoder_hidden_states(decoder: Any, rows: Any, *, share_prefix: bool = True) -> Any:
    """The decoder's last hidden states over right-padded ``rows`` ``[B, W, H]``.

    The rows' common prefix (:func:`~gem_core.rollout.policies.shared_prefix_length`: the instruction
    every episode of a batch starts from) goes through the decoder once, as one row, and its key/value
    cache is repeated for the rest of every row. The gradient is the same: each row's use of the prefix
    sends its gradient back through the one computation, where they add up as they would over B copies
    (tested). Not with gradient checkpointing, whose recomputation keeps no cache."""
    import torch

    size, width = rows.input_ids.shape
    prefix = shared_prefix(decoder, rows, share_prefix)
    if not prefix:
        return decoder(input_ids=rows.input_ids, attention_mask=rows.attention).last_hidden_state
    name = cache_keyword(decoder)
    shared = decoder(input_ids=rows.input_ids[:1, :prefix], use_cache=True)
    cache = getattr(shared, name)
    cache.batch_repeat_interleave(size)
    positions = torch.arange(prefix, width, device=rows.input_ids.device).expand(size, -1)
    rest = decoder(
        input_ids=rows.input_ids[:, prefix:], attention_mask=rows.attention, position_ids=positions, use_cache=True, **{name: cache}
    ).last_hidden_state
    return torch.cat([shared.last_hidden_state.expand(size, -1, -1), rest], dim=1)


# ------------------------------------------------------------------------------------------------
# The frozen lower layers, once an update.
# ------------------------------------------------------------------------------------------------


def _mask_function() -> tuple[Any, str] | None:
    """transformers' ``create_causal_mask`` and its cache keyword, where it can size the mask against a chosen
    cache layer (``layer_idx``); None otherwise."""
    try:
        from transformers.masking_utils import create_causal_mask
    except ImportError:
        return None
    parameters = inspect.signature(create_causal_mask).parameters
    if "layer_idx" not in parameters:
        return None
    return create_causal_mask, ("cache" if "cache" in parameters else "past_key_values")


def frozen_layer_count(decoder: Any) -> int:
    """How many of the decoder's lower layers are frozen (with the embeddings below them) where the split is
    supported (see the module docstring); 0 where it is not, where nothing is frozen, or where everything is."""
    config = getattr(decoder, "config", None)
    if config is None or getattr(config, "model_type", None) not in SPLIT_MODEL_TYPES or _mask_function() is None:
        return 0
    if getattr(decoder, "has_sliding_layers", False) or any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return 0
    if is_checkpointing(decoder) or not all(hasattr(decoder, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return 0
    if getattr(config, "attention_dropout", 0.0) or any(type(m).__name__ == "Dropout" and m.p > 0 for m in decoder.modules()):
        return 0  # the reference's pass (eval) and the policy's (train) would part at a dropout
    if any(p.requires_grad for p in decoder.embed_tokens.parameters()):
        return 0
    layers = decoder.layers[: config.num_hidden_layers]
    count = 0
    for layer in layers:
        if any(p.requires_grad for p in layer.parameters()):
            break
        count += 1
    return count if count < len(layers) else 0


@dataclass
class FrozenBottom:
    """A micro-batch's hidden states after the frozen layers ``[0, first)``: the shared prefix's ``[1, prefix, H]``
    (None without one) and the rest of every row's ``[B, W - prefix, H]`` (the whole row's without a prefix)."""

    first: int
    prefix: int
    prefix_hidden: Any
    hidden: Any


def _layers(decoder: Any, hidden: Any, first: int, last: int, *, attention_mask: Any, position_ids: Any, cache: Any, use_cache: Any) -> Any:
    """Layers ``[first, last)`` of the decoder over ``hidden``, with what its forward gives every layer: the causal
    mask (sized against cache layer ``first``, the first this call fills), the rotary embeddings of the positions,
    the positions and the cache."""
    create_causal_mask, mask_cache = _mask_function()
    mask = create_causal_mask(
        config=decoder.config, inputs_embeds=hidden, attention_mask=attention_mask, position_ids=position_ids, layer_idx=first, **{mask_cache: cache}
    )
    position_embeddings = decoder.rotary_emb(hidden, position_ids)
    name = cache_keyword(decoder)
    for layer in decoder.layers[first:last]:
        hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings, position_ids=position_ids, use_cache=use_cache, **{name: cache})
    return hidden


def frozen_bottom(decoder: Any, rows: Any, first: int, *, share_prefix: bool = True) -> FrozenBottom:
    """The frozen layers ``[0, first)`` over ``rows``, as :func:`decoder_hidden_states` runs them (the shared
    prefix once). Run it without gradients: nothing below ``first`` trains."""
    import torch
    from transformers import DynamicCache

    size, width = rows.input_ids.shape
    prefix = shared_prefix(decoder, rows, share_prefix)
    device = rows.input_ids.device
    if not prefix:
        positions = torch.arange(width, device=device)[None]
        hidden = _layers(
            decoder, decoder.embed_tokens(rows.input_ids), 0, first, attention_mask=rows.attention, position_ids=positions, cache=None, use_cache=None
        )
        return FrozenBottom(first, 0, None, hidden)
    cache = DynamicCache(config=decoder.config)
    start = torch.arange(prefix, device=device)[None]
    prefix_hidden = _layers(
        decoder, decoder.embed_tokens(rows.input_ids[:1, :prefix]), 0, first, attention_mask=None, position_ids=start, cache=cache, use_cache=True
    )
    cache.batch_repeat_interleave(size)
    positions = torch.arange(prefix, width, device=device).expand(size, -1)
    hidden = _layers(
        decoder, decoder.embed_tokens(rows.input_ids[:, prefix:]), 0, first, attention_mask=rows.attention, position_ids=positions, cache=cache, use_cache=True
    )
    return FrozenBottom(first, prefix, prefix_hidden, hidden)


def top_hidden_states(decoder: Any, rows: Any, bottom: FrozenBottom) -> Any:
    """The decoder's last hidden states ``[B, W, H]`` from ``bottom`` (:func:`frozen_bottom` of the same rows, by
    this decoder or one with the same frozen layers): its layers from ``bottom.first`` on and its final norm,
    with the gradient where its weights take one."""
    import torch
    from transformers import DynamicCache

    size, width = rows.input_ids.shape
    last = decoder.config.num_hidden_layers
    device = rows.input_ids.device
    if not bottom.prefix:
        positions = torch.arange(width, device=device)[None]
        hidden = _layers(decoder, bottom.hidden, bottom.first, last, attention_mask=rows.attention, position_ids=positions, cache=None, use_cache=None)
        return decoder.norm(hidden)
    prefix = bottom.prefix
    cache = DynamicCache(config=decoder.config)
    start = torch.arange(prefix, device=device)[None]
    shared = decoder.norm(_layers(decoder, bottom.prefix_hidden, bottom.first, last, attention_mask=None, position_ids=start, cache=cache, use_cache=True))
    cache.batch_repeat_interleave(size)
    positions = torch.arange(prefix, width, device=device).expand(size, -1)
    rest = decoder.norm(_layers(decoder, bottom.hidden, bottom.first, last, attention_mask=rows.attention, position_ids=positions, cache=cache, use_cache=True))
    return torch.cat([shared.expand(size, -1, -1), rest], dim=1)
