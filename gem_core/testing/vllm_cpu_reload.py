"""Test machinery for the real-engine tier (not used by any plugin): a vLLM 0.29 CPU gap in its in-place weight
reload (still there in 0.32), run inside the engine's worker through ``collective_rpc`` with a callable. The
two-update tests of OpenRLHF, verl, RL2 and oat (tests/integrations/*/real) use it; it imports nothing, so the
engine's processes can load it. Also which of the reloaded checkpoints a long run keeps (:func:`kept_updates`).
"""

from __future__ import annotations

import os

#: comma-separated updates whose weight-sync checkpoint folder is kept once the engine reloaded it (the
#: cross-framework benchmark's evaluation points; about 0.5 GB each on the real model); unset: every one
KEEP_ENV = "GEM_TEST_KEEP_UPDATES"


def kept_updates() -> set[int] | range:
    """The updates whose weight-sync checkpoint folder stays after the engine reloaded it (:data:`KEEP_ENV`)."""
    listed = os.environ.get(KEEP_ENV)
    return range(1, 1 << 30) if listed is None else {int(update) for update in listed.split(",") if update}


def repack_tied_lm_head(worker) -> bool:
    """WORKAROUND (vLLM 0.29 and 0.32, CPU): after ``Worker.reload_weights``, redo the tied LM head's weight processing.

    On CPU, vLLM's ``process_weights_after_loading`` hands each linear layer's weight to a oneDNN (or sgl)
    packed GEMM; for a model with tied embeddings (SmolLM2) the checkpoint has no ``lm_head.weight``, so the
    layerwise reload loads nothing into ``ParallelLMHead`` ("ParallelLMHead: Failed to load weights"), puts its
    old tensors back and never re-packs it: the logits kept the initial embedding while the input embedding was
    reloaded (measured: |engine - reloaded checkpoint| up to 1.2e-1 after a 1e-3 change of the embedding, 3.5e-5
    after this; vLLM 0.32 the same: 2.1e-1 without, 3.3e-5 with it). The head shares the embedding's (reloaded)
    weight; its own processing is run again here.
    Returns whether the model has a tied LM head (False: nothing done)."""
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    if head is None or not getattr(worker.model_config.hf_config, "tie_word_embeddings", False):
        return False
    head.quant_method.process_weights_after_loading(head)
    return True
