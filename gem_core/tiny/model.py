"""A tiny randomly initialised causal LM for CPU tests (a few hundred KB; nothing is downloaded)."""

from __future__ import annotations

from typing import Any


def build_tiny_model(vocab_size: int, *, seed: int = 0, hidden_size: int = 32, num_layers: int = 2, max_positions: int = 4096) -> Any:
    """A Qwen2-architecture ``transformers`` model with random weights drawn from ``seed`` (the global
    torch RNG is left untouched). ``vocab_size``: ``len(tokenizer)``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.eval()
