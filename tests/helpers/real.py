"""What the real tier's tests share (the `real` and `*_real` nox sessions): whether a package is really
installed (an import stub is not), the embedded model's converted checkpoint, and the bounds of a CPU vLLM engine
on a small machine."""

from __future__ import annotations

import importlib.machinery
import os

from gem_core.models import DEFAULT_MODEL, resolve_model


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
