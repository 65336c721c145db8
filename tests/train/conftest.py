"""Fixtures of the training tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny model and the project's tokenizer, saved where ``--model`` can load them (a test that takes it
    skips where torch is not installed: the core_py sessions)."""
    pytest.importorskip("torch")
    from gem_core.testing import build_test_tokenizer, build_tiny_model

    tokenizer = build_test_tokenizer("chatml")
    model = build_tiny_model(len(tokenizer), hidden_size=32, num_layers=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    path = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), model, tokenizer
