"""ReBN statistics across ranks: per-group counts and sums all-reduced through `torch.distributed`.

Each rank holds a shard of the batch; ReBN normalises over every turn on every rank. The statistics
are two small all-reduces per call -- (count, sum) per group, then the sum of squared deviations from
the global mean -- so every rank ends with the same mean and std as one process holding the union
(two passes rather than one sum-of-squares pass: no cancellation when returns share a large offset).
Every rank must make the same call (same group_by kind, same ddof) or the collectives will not match.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _dist() -> Any:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "distributed=True needs torch.distributed initialised (torch.distributed.init_process_group) "
            "in every rank; for a single process leave distributed=False"
        )
    return dist


def is_distributed_ready() -> bool:
    """True when torch is importable and a default process group is initialised."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized()


def all_reduce_sum(x: np.ndarray, process_group: Any = None) -> np.ndarray:
    """Element-wise float64 sum of `x` over all ranks (through the device NCCL needs, when it is NCCL)."""
    dist = _dist()
    import torch

    tensor = torch.from_numpy(np.array(x, dtype=np.float64))
    if dist.get_backend(process_group) == "nccl":
        tensor = tensor.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=process_group)
    return tensor.cpu().numpy()


def union_keys(local_keys: np.ndarray, process_group: Any = None) -> np.ndarray:
    """Sorted union of every rank's group keys, so group g means the same group on every rank."""
    dist = _dist()
    gathered: list[Any] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(gathered, np.asarray(local_keys).tolist(), group=process_group)
    merged = [key for keys in gathered for key in keys]
    return np.unique(np.asarray(merged)) if merged else np.asarray(local_keys)[:0]
