"""Test helpers that other virtualenvs (trainer plugins' tests) import: a local tokenizer with a chat
template, a tiny random model, a fake OpenAI-compatible chat server. Imports only gem_core, tokenizers
and transformers (lazily), never pytest.
"""

from gem_core.testing.fake_server import FakeChatServer
from gem_core.tiny import build_tiny_model
from gem_core.tiny import CHAT_TEMPLATES, build_raw_tokenizer, build_test_tokenizer, save_test_tokenizer

__all__ = ["CHAT_TEMPLATES", "FakeChatServer", "build_raw_tokenizer", "build_test_tokenizer", "build_tiny_model", "save_test_tokenizer"]
