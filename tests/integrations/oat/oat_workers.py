"""Worker processes of the two-device test (torch.multiprocessing spawn: importable by module name)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import oat_stubs  # noqa: E402,F401  (IMPORT STUB, as in the conftest)


def two_device_worker(rank: int, out: str, port: int, rewards: list) -> None:
    import torch
    import torch.distributed as dist

    from gem_core.testing import build_test_tokenizer
    from gem_integrations.oat.advantage import rebn_args
    from oat_harness import gem_args, learner_advantages, make_learner
    from test_oat import _synthetic

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        tokenizer = build_test_tokenizer("qwen3")
        episodes = _synthetic(rewards, tokenizer)
        mine = episodes[:1] if rank == 0 else episodes[1:]  # device 0: episode 0; device 1: episodes 1 and 2
        learner = make_learner(rebn_args(gem_args(rollout_batch_size_per_device=16, tis_c=None), gamma=0.9), world_size=2)
        applied = learner_advantages(learner, mine, tokenizer)
        torch.save(dict(applied), os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
