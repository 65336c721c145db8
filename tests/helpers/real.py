"""What the real tier's tests share (the `real` and `*_real` nox sessions): whether a package is really
installed (an import stub is not), the embedded model's converted checkpoint, and the bounds of a CPU vLLM engine
on a small machine, and the rule for "the engine and the trainer hold the same weights"."""

from __future__ import annotations

import importlib.machinery
import os

from gem_core.models import DEFAULT_MODEL, resolve_model


# Same weights, two float32 stacks (vLLM's CPU kernels and the trainer's transformers forward) on the same
# tokens: the log-probs differ by summation order only. Measured over this tier's runs: a mean of 1e-5 to
# 1.3e-5 per token (250 to 720 tokens), a largest token mostly 2e-5 to 5e-5, but once 2.06e-4 (one token of 251,
# CI stop 87, OpenRLHF's update 2, whose mean was 1.14e-5). Different weights differ far more: one update moves
# the mean by about 4e-2 and some token by 0.19 and more. So a rare token decides nothing; the mean separates
# the two cases (SAME_WEIGHTS_MEAN_ABS: 800 times below an update's), and every token must still be within
# SAME_WEIGHTS_MAX_ABS (5 times the worst token measured, 190 times below the smallest move; the stale tied LM head
# that vLLM 0.29's CPU reload leaves, seen here, put a token 9e-3 off).
SAME_WEIGHTS_MEAN_ABS = 5e-5
SAME_WEIGHTS_MAX_ABS = 1e-3
MOVED = 1e-2  # an update moves some token's log-prob by more than this (measured: 0.19 and more)


def assert_same_weights(gap, what: str) -> None:
    """``gap``: per-token |log-prob difference| of the same tokens (a tensor or an array) under two stacks said
    to hold the same weights; within SAME_WEIGHTS_MEAN_ABS on average and SAME_WEIGHTS_MAX_ABS on every token."""
    mean, largest = float(gap.mean()), float(gap.max())
    assert mean <= SAME_WEIGHTS_MEAN_ABS and largest <= SAME_WEIGHTS_MAX_ABS, f"{what}: |gap| mean {mean:.3e}, max {largest:.3e}"


def really_installed(*names: str) -> bool:
    """Whether every one of ``names`` is on the path as a real package (the import stubs some plugin sessions
    install live in ``sys.meta_path``, which this does not ask)."""
    for name in names:
        try:
            if importlib.machinery.PathFinder.find_spec(name) is None:
                return False
        except (ImportError, ValueError):
            return False
    return True


def embedded_model_dir() -> str:
    """The embedded real model's converted checkpoint (``GEM_CORE_CACHE``; converted on first use), never the hub."""
    return resolve_model(DEFAULT_MODEL, prefer_hub=False)


def bound_cpu_engine() -> None:
    """A CPU vLLM engine's KV cache at 1 GiB (its default, 4, is more than a test needs), tokenizers single-threaded;
    what the caller's environment already sets is kept."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def checkpoint_logprobs(model_dir: str, sequences: list[list[int]], attn_implementation: str = "sdpa") -> list:
    """Each sequence's token log-probs on the action axis (token ``i + 1`` given tokens ``0..i``) under the
    checkpoint in ``model_dir``: transformers, float32, temperature 1, ``attn_implementation`` as the trainer's
    actor computes them. The real tier's two-update tests read a trainer's saved weights with it."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn_implementation).eval()
    out = []
    with torch.no_grad():
        for tokens in sequences:
            ids = torch.tensor([tokens])
            logits = model(input_ids=ids).logits[0, :-1].float()
            out.append(logits.log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0].double())
    del model
    return out
