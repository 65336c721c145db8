"""One rank of the gloo test: computes ReBN on its shard with distributed=True and saves the results.

    python _distributed_worker.py RANK WORLD_SIZE PORT OUT_DIR

The full batch is rebuilt from a fixed seed on every rank (see `shared_batch`), so the parent test
can compute the single-process answer on the union and compare.
"""

from __future__ import annotations

import sys

import numpy as np


def shared_batch() -> dict:
    """Ragged episodes with group keys, plus a token-level batch; identical on every rank."""
    rng = np.random.default_rng(1234)
    episodes = [list(rng.normal(size=int(n))) for n in rng.integers(1, 6, size=12)]
    # rank 0 holds episodes 0..6 (groups a, b), rank 1 holds 7..11 (groups b, c): different key sets
    keys = ["a"] * 4 + ["b"] * 5 + ["c"] * 3
    rows, length = 10, 16
    mask = np.zeros((rows, length), dtype=np.int64)
    for row in range(rows):
        mask[row, 1:5] = 1
        mask[row, 7 : 9 + row % 4] = 1
    rewards = np.where(mask == 1, rng.normal(size=(rows, length)), 0.0)
    row_keys = [f"prompt-{row % 3}" for row in range(rows)]
    return {"episodes": episodes, "keys": keys, "rewards": rewards, "mask": mask, "row_keys": row_keys}


def shard(rank: int) -> tuple[slice, slice]:
    """(episode slice, token-row slice) of this rank."""
    return (slice(0, 7), slice(0, 6)) if rank == 0 else (slice(7, 12), slice(6, 10))


def main() -> None:
    rank, world, port, out_dir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    import torch
    import torch.distributed as dist

    from gem_core.algo import (
        discounted_returns,
        normalization_stats,
        rebn,
        rebn_token_level,
    )

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    data = shared_batch()
    episodes_part, rows_part = shard(rank)
    episodes, keys = data["episodes"][episodes_part], data["keys"][episodes_part]
    results = {
        "ddof0": rebn(episodes, gamma=0.9, ddof=0, distributed=True),
        "ddof1_grouped": rebn(episodes, gamma=0.9, ddof=1, group_by=keys, distributed=True),
        "torch_grouped": rebn([torch.tensor(e) for e in episodes], gamma=0.5, group_by=keys, distributed=True).numpy(),
        "token_level": rebn_token_level(
            torch.tensor(data["rewards"][rows_part], dtype=torch.float32),
            torch.tensor(data["mask"][rows_part]),
            data["row_keys"][rows_part],
            gamma=0.9,
            ddof=1,
            distributed=True,
        ).numpy(),
    }
    stats = normalization_stats(discounted_returns(episodes, gamma=0.9), distributed=True)
    results["stats"] = np.array([stats.count[0], stats.mean[0], stats.std[0]])
    # rank 1 brings nothing: the statistics still cover rank 0's turns, and rank 1 gets an empty result
    mine = data["episodes"][:7] if rank == 0 else []
    results["uneven"] = rebn(mine, gamma=0.9, distributed=True)
    dist.barrier()
    dist.destroy_process_group()
    np.savez(f"{out_dir}/rank{rank}.npz", **results)


if __name__ == "__main__":
    main()
