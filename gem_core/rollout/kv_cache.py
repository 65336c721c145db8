"""transformers' KV cache as gem-core's local models use it: the cache's tensors, a layout that can be written
in place, the forward's names for the cache and for "logits at the last position only", and the common prefix
of a batch's prompts.

Separate from :class:`~gem_core.rollout.hf_policy.HFPolicy` because the trainer uses the same helpers for its own
forward passes (``gem_core.train``: the shared prompt prefix, the cache keyword, ``logits_to_keep``); neither the
policy nor the trainer owns them. transformers is imported only inside the functions that build a cache: it is an
optional dependency of the core.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any


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
