"""RL2 plugin tests: rl-square 0.0.2's own code on CPU (run by `nox -s rl2`).

IMPORT STUB: sglang, sglang_router and ring_flash_attn (GPU-only packages RL2 imports at module level;
none of the code under test calls them) are placeholder modules, made by the OpenRLHF tests' stub
machinery (tests/integrations/openrlhf/openrlhf_import_stubs.py, loaded here as its own module object
with these names). Everything else is real: RL2 (rollout loop, env loading, datasets, PPOTrainer.train's
advantage step, compute_advantages), torch, transformers, datasets, torchdata, hydra, wandb (disabled
mode). The process group is gloo with world size 1, as RL2 calls it on rank 0.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

pytest.importorskip("RL2", reason="the RL2 tests run in their own virtualenv: nox -s rl2")

_path = os.path.join(os.path.dirname(__file__), "..", "openrlhf", "openrlhf_import_stubs.py")
_spec = importlib.util.spec_from_file_location("rl2_import_stubs", _path)
import_stubs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_stubs)
import_stubs.STUBBED = ("sglang", "sglang_router", "ring_flash_attn")  # IMPORT STUB: GPU-only packages
import_stubs.install()
sys.modules["rl2_import_stubs"] = import_stubs

os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(scope="session", autouse=True)
def process_group():
    import torch.distributed as dist
    import wandb

    wandb.init(mode="disabled")
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29571")
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def tokenizer():
    from gem_core.testing import build_test_tokenizer

    return build_test_tokenizer("qwen3")
