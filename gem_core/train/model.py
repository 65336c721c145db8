"""What the reference trainer needs of a causal LM beyond its forward: its stack of decoder layers (``trained_layers``
freezes the lower ones) and its optimizer (AdamW over the trained weights). The token ids that
close a ``\\boxed{}`` move (``stop_after_box``) are the rollout's: :func:`gem_core.rollout.policy.closing_brace_ids`."""

from __future__ import annotations

from typing import Any


def decoder_layers(model: Any) -> Any:
    """The model's stack of decoder layers: its one ``ModuleList`` named ``layers``, ``h`` or ``blocks``
    (Llama, Qwen, Mistral, GPT-2 and the like); ValueError when there is not exactly one."""
    import torch

    stacks = [m for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h", "blocks")]
    if len(stacks) != 1:
        raise ValueError(
            f"trained_layers: cannot find {type(model).__name__}'s decoder layers (found {len(stacks)} layer stacks); --trained-layers 0 trains every weight"
        )
    return stacks[0]


def freeze_lower_layers(model: Any, trained: int) -> bool:
    """Train the top ``trained`` decoder layers and what follows them (the final norm; an output layer not tied
    to the input embeddings): the input embeddings (and an output layer tied to them) and every layer below are
    frozen. Autograd then builds no graph below the lowest trained layer, so the backward pass stops there (on
    the 30-layer real model the top 10 cost about half of a full update: docs/training.md). A model with
    ``trained`` layers or fewer keeps every weight trained. Returns whether anything was frozen."""
    layers = decoder_layers(model)
    if trained >= len(layers):
        return False
    frozen = [model.get_input_embeddings(), *layers[: len(layers) - trained]]
    for module in frozen:
        for parameter in module.parameters():
            parameter.requires_grad_(False)
    return True


def adamw(parameters: Any, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0) -> Any:
    """AdamW (the experiment's ``optimizer.betas``, ``eps``, ``weight_decay``; torch's defaults but no weight decay
    by default) over the parameters that are trained (``requires_grad``), fused (one kernel over every tensor:
    about 6x faster a step on CPU than torch's per-tensor loop, the same update) where the device has the fused
    kernel."""
    import torch

    parameters = [p for p in parameters if p.requires_grad]
    devices = {p.device.type for p in parameters}
    fused = devices <= {"cpu", "cuda"} and all(p.dtype in (torch.float32, torch.float16, torch.bfloat16) for p in parameters)
    return torch.optim.AdamW(parameters, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, fused=fused or None)
