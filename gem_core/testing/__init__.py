"""What a user needs to test their own env, policy or plugin without a GPU or a download (docs/testing.md), and
what the trainer plugins' tests in other virtualenvs import: a local tokenizer with a chat template and a tiny
random model (gem_core.tiny's, re-exported), a fake OpenAI-compatible chat server; the env checker, the golden
scenario and the vLLM-faithful engine are its modules. No product module imports it; the repository's own test
machinery is under tests/helpers. Imports only gem_core, tokenizers and transformers (lazily), never pytest.
"""

from gem_core.testing.fake_server import FakeChatServer
from gem_core.tiny import build_tiny_model
from gem_core.tiny import CHAT_TEMPLATES, build_raw_tokenizer, build_test_tokenizer, save_test_tokenizer

__all__ = ["CHAT_TEMPLATES", "FakeChatServer", "build_raw_tokenizer", "build_test_tokenizer", "build_tiny_model", "save_test_tokenizer"]
