"""ROLL plugin tests (run by `nox -s roll`): the bridge against gem-llm 0.0.4's real registry (ROLL's pin),
ROLL's rules as read from its source, and the golden scenario. `nox -s roll_src` (ROLL_SRC=<checkout>)
adds test_roll_src.py: ROLL's own env manager and advantage code run on CPU."""

from __future__ import annotations

import importlib.metadata
import os
import tempfile

import pytest

# ROLL's logger writes ./output/logs under the working directory unless ROLL_LOG_DIR names another: not into the checkout
os.environ.setdefault("ROLL_LOG_DIR", tempfile.mkdtemp(prefix="roll-logs-"))

gem = pytest.importorskip("gem", reason="the ROLL tests run in their own virtualenv: nox -s roll")
try:
    GEM_VERSION = importlib.metadata.version("gem-llm")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover
    GEM_VERSION = None
if GEM_VERSION != "0.0.4":
    pytest.skip(f"the ROLL tests need gem-llm 0.0.4 (ROLL's pin), found {GEM_VERSION}: nox -s roll", allow_module_level=True)


@pytest.fixture(scope="session")
def tokenizer():
    from gem_core.testing import build_test_tokenizer

    return build_test_tokenizer("qwen3")


@pytest.fixture(scope="session")
def golden_roll(tokenizer):
    """The golden scenario with ROLL's ReBN settings (ddof 1, eps 1e-6)."""
    from gem_core.testing.golden import golden_scenario

    return golden_scenario(tokenizer=tokenizer, ddof=1, eps=1e-6)


@pytest.fixture(scope="session", autouse=True)
def registered():
    """What ROLL's env worker does first: import the env_manager_cls module, which registers gem-core."""
    import gem_integrations.roll.env_manager  # noqa: F401
