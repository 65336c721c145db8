"""Fixtures of the rollout tests: the local test tokenizer (built once per session) and formatters."""

from __future__ import annotations

import pytest

from gem_core.rollout import ChatFormatter
from gem_core.testing import build_test_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return build_test_tokenizer("qwen3")


@pytest.fixture(scope="session")
def chatml_tokenizer():
    return build_test_tokenizer("chatml")


@pytest.fixture(scope="session")
def formatter(tokenizer):
    return ChatFormatter(tokenizer)
