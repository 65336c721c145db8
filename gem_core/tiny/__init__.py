"""A tiny model and a local tokenizer, built here and never downloaded: what ``gem-core train --model tiny`` runs,
and the stand-ins the tests (and a user testing an env of their own) build models and tokenizers from.
Imports nothing from gem_core; torch, tokenizers and transformers only when a builder is called."""

from gem_core.tiny.model import build_tiny_model
from gem_core.tiny.tokenizer import CHAT_TEMPLATES, build_raw_tokenizer, build_test_tokenizer, save_test_tokenizer

__all__ = ["CHAT_TEMPLATES", "build_raw_tokenizer", "build_test_tokenizer", "build_tiny_model", "save_test_tokenizer"]
