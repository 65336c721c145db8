"""The boundary every estimator shares: torch tensors in, float64 numpy inside, the caller's kind out.

The maths is written once, in numpy. A torch tensor is copied to the host at the start (it holds one
value per turn, or one per token: a few MB) and the result goes back to the first torch input's
device, in the input's floating dtype. float64 inside on every backend, so numpy and torch give the
same numbers. torch is imported only when a tensor arrives.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

Array = Any  # numpy.ndarray or torch.Tensor; kept loose so `import gem_core.algo` never needs torch


def is_torch(x: Any) -> bool:
    """True when `x` is a torch tensor; never imports torch itself."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def to_numpy(x: Any, dtype: Any = None) -> np.ndarray:
    """A host numpy array of `x` (a tensor is detached and copied; bfloat16 goes through float32)."""
    if is_torch(x):
        import torch

        x = x.detach().cpu()
        x = (x.float() if x.dtype == torch.bfloat16 else x).numpy()  # numpy has no bfloat16
    return np.asarray(x, dtype=dtype)


def result_like(like: Any, *others: Any, dtype: Any = None) -> Callable[[np.ndarray], Array]:
    """How results go back: numpy stays numpy; if any input is a tensor, a tensor on the first one's device.

    Its dtype is `dtype` when given, else `like`'s floating dtype (a numpy `like` keeps float32/float64),
    else torch's default float dtype.
    """
    tensors = [x for x in (like, *others) if is_torch(x)]
    if not tensors:
        return lambda result: result
    import torch

    if dtype is None and is_torch(like):
        dtype = like.dtype if like.is_floating_point() else torch.get_default_dtype()
    elif dtype is None:
        dtype = torch.float32 if np.asarray(like).dtype == np.float32 else torch.float64
    device = tensors[0].device
    if device.type == "mps" and dtype == torch.float64:  # MPS has no float64
        dtype = torch.float32
    return lambda result: torch.as_tensor(result).to(device=device, dtype=dtype)


def on_device_of(result: np.ndarray, *inputs: Any) -> Array:
    """`result` as it is, or as a tensor (same dtype) on the first torch input's device."""
    for x in inputs:
        if is_torch(x):
            import torch

            return torch.as_tensor(result, device=x.device)
    return result


# ---------------------------------------------------------------------------------------------
# Validation shared by every estimator: clear ValueErrors instead of NaNs leaking into a loss.


def check_discount(name: str, value: float) -> float:
    """A discount-like argument (gamma, lambda) must be a finite number in [0, 1]."""
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


def check_eps(eps: float) -> float:
    eps = float(eps)
    if not (eps >= 0.0 and np.isfinite(eps)):
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    return eps


def check_ddof(ddof: int) -> int:
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 (population std) or 1 (sample std), got {ddof!r}")
    return int(ddof)


def check_min_std(min_std: Any) -> float:
    if isinstance(min_std, bool) or not isinstance(min_std, (int, float)) or not np.isfinite(min_std) or min_std < 0:
        raise ValueError(f"min_std must be a finite number >= 0, got {min_std!r}")
    return float(min_std)


def check_finite(x: np.ndarray, what: str) -> None:
    """Rewards/values must be finite: one NaN would silently poison every advantage in its group."""
    bad = np.flatnonzero(~np.isfinite(x.reshape(-1)))
    if bad.size:
        raise ValueError(f"{what} must be finite; got {float(x.reshape(-1)[bad[0]])} at flat index {int(bad[0])}")


def check_nonempty(n: int, what: str) -> None:
    if n == 0:
        raise ValueError(f"empty batch: {what} has no turns, so there is nothing to estimate advantages for")


# ---------------------------------------------------------------------------------------------
# Group keys (strings or ints per episode) -> dense integer codes.


def encode_keys(keys: Any, n: int, what: str = "group_by") -> tuple[np.ndarray, np.ndarray]:
    """Map `n` group keys (strings, ints, a numpy array or a torch tensor) to codes 0..G-1.

    Returns (codes, uniques): `uniques` sorted, `uniques[codes] == keys`.
    """
    keys = to_numpy(keys) if is_torch(keys) else np.asarray(keys if isinstance(keys, np.ndarray) else list(keys))
    if keys.dtype == object:  # e.g. verl's uuid strings in an object array: let numpy find their type
        keys = np.asarray(keys.tolist())
        keys = keys.astype(str) if keys.dtype == object else keys
    if keys.ndim != 1 or keys.shape[0] != n:
        unit = "turn" if "turn" in what else "episode"
        raise ValueError(f"{what} must hold one key per {unit}: expected {n} keys, got {keys.shape[0] if keys.ndim == 1 else keys.shape}")
    uniques, codes = np.unique(keys, return_inverse=True)
    return codes.reshape(-1).astype(np.int64), uniques
