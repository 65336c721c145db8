"""Advantage estimators on CPU: gem_core's ReBN against verl's GRPO and REINFORCE++ on the same tensors.

    python benchmarks/advantages.py [--batch 4096] [--length 256] [--repeat 15] [--threads 1] [--update-seconds 13] [--strict]
    nox -s bench_advantages -- [same options]      # in its own venv, with verl installed

The batch is what a multi-turn trainer's advantage hook sees: (batch, length) float32 token-level
rewards with each turn's reward on its last token, an int64 response mask whose runs of 1s are the
turns (about 8 per sequence, separated by environment tokens), and a prompt-group index (groups of
8 rows, uuid strings in an object array, as verl passes them). ReBN does more work than GRPO (find
the turns, discounted returns over them, per-turn statistics, paint back per turn).

gem_core's ReBN is the readable numpy reference (gem_core/algo), with no compiled fast path. Earlier
targets (within 3x of verl's `grpo_vectorized`, 20x faster than `reinforce_plus_plus`) kept a numba
path alive. They no longer apply. The question now is whether the estimator changes what an update
costs, so the measure is ReBN's share of one update: `--update-seconds` (default 13, one update of
the reference trainer on the real 135M model on a 2-core CPU). `--strict` exits 1 when ReBN takes
more than 1% of an update. verl's ratios are still printed, for scale.

Every candidate runs round-robin, in a new random order each round (so machine load, and cache
eviction by the candidate before, hit them alike), and is reported as median wall time, median
process CPU time and median page faults per call. A floor row, `rewards.sum(-1)[:, None] * mask`, is the least
any token-level estimator pays: read every reward and mask entry once, write every token once.
Timings default to one torch thread: on a small shared machine, OpenMP threads of small ops
contend and every number (verl's most of all) swings by several times. verl is optional: without
it, ReBN is timed alone.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np


def make_batch(batch: int, length: int, group_size: int, seed: int = 0) -> dict[str, Any]:
    """Random multi-turn batch: 6-10 turns per row (as many as fit), dense rewards on turn ends."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((batch, length), dtype=np.int64)
    rewards = np.zeros((batch, length), dtype=np.float32)
    turns = 0
    for row in range(batch):
        position = 0
        for _ in range(int(rng.integers(6, 11))):
            response, environment = int(rng.integers(12, 25)), int(rng.integers(4, 9))
            if position + response > length:
                break
            mask[row, position : position + response] = 1
            rewards[row, position + response - 1] = rng.normal()
            position += response + environment
            turns += 1
    group_ids = [str(uuid.UUID(int=int(g), version=4)) for g in rng.integers(0, 2**62, batch // group_size + 1)]
    index = np.array([group_ids[row // group_size] for row in range(batch)], dtype=object)
    return {"rewards": rewards, "mask": mask, "index": index, "turns": turns}


def time_interleaved(candidates: dict[str, Callable[[], Any]], repeat: int, warmup: int = 2) -> dict[str, tuple[float, float, float]]:
    """(median wall ms, median process-CPU ms, median page faults) of each candidate, run round-robin."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    wall: dict[str, list[float]] = {name: [] for name in candidates}
    cpu: dict[str, list[float]] = {name: [] for name in candidates}
    faults: dict[str, list[float]] = {name: [] for name in candidates}
    order = list(candidates.items())
    shuffle = random.Random(0).shuffle
    for _ in range(repeat):
        shuffle(order)  # whoever runs right after a cache-flushing candidate changes every round
        for name, fn in order:
            start_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            fn()
            cpu[name].append((time.process_time() - start_cpu) * 1e3)
            wall[name].append((time.perf_counter() - start_wall) * 1e3)
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start_faults)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name]), statistics.median(faults[name])) for name in candidates}


def load_verl() -> Any:
    try:
        from verl.trainer.ppo import core_algos
    except Exception as error:  # noqa: BLE001 -- ImportError, or a broken optional dependency inside verl
        print(f"verl not found ({type(error).__name__}: {error}); timing gem_core's ReBN alone.\n")
        return None
    return core_algos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: stable on a shared box; 0: torch's default)",
    )
    parser.add_argument("--update-seconds", type=float, default=13.0, help="one update's cost, to set ReBN's time against")
    parser.add_argument("--strict", action="store_true", help="exit 1 when ReBN takes more than 1%% of an update")
    args = parser.parse_args(argv)

    import torch

    from gem_core.algo import rebn_token_level, turn_ids_from_mask

    if args.threads:
        torch.set_num_threads(args.threads)
    data = make_batch(args.batch, args.length, args.group_size)
    rewards_np, mask_np, index = data["rewards"], data["mask"], data["index"]
    rewards, mask = torch.from_numpy(rewards_np), torch.from_numpy(mask_np)
    print(
        f"batch {args.batch} x {args.length} = {args.batch * args.length:,} tokens "
        f"({int(mask_np.sum()):,} response tokens), {data['turns']:,} turns "
        f"({data['turns'] / args.batch:.1f} per sequence), groups of {args.group_size}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )

    # The numbers first: both backends agree, and every response token got its turn's advantage.
    adv_torch = rebn_token_level(rewards, mask, index, gamma=args.gamma)
    adv_numpy = rebn_token_level(rewards_np, mask_np, index, gamma=args.gamma)
    gap = float(np.abs(adv_torch.numpy() - adv_numpy).max())
    assert gap < 1e-5, f"torch and numpy ReBN disagree by {gap}"
    assert not torch.isnan(adv_torch).any() and bool((adv_torch[mask == 0] == 0).all())

    floor = "floor: rewards.sum(-1)[:, None] * mask"
    turn_ids = turn_ids_from_mask(mask)  # what the plugins pass: the rollout's explicit turns
    candidates: dict[str, Callable[[], Any]] = {
        "gem_core rebn_token_level (torch)": lambda: rebn_token_level(rewards, mask, index, gamma=args.gamma),
        "  + returns (torch)": lambda: rebn_token_level(rewards, mask, index, gamma=args.gamma, return_returns=True),
        "  explicit turn_ids (torch)": lambda: rebn_token_level(rewards, mask, index, gamma=args.gamma, turn_ids=turn_ids),
        "gem_core rebn_token_level (numpy)": lambda: rebn_token_level(rewards_np, mask_np, index, gamma=args.gamma),
        floor: lambda: rewards.sum(-1)[:, None] * mask,
    }
    verl = load_verl()
    if verl is not None:
        from verl.trainer.config import AlgoConfig

        config = AlgoConfig(gamma=args.gamma)
        grpo = verl.get_adv_estimator_fn("grpo")
        grpo_vectorized = verl.get_adv_estimator_fn("grpo_vectorized")
        reinforce_pp = verl.get_adv_estimator_fn("reinforce_plus_plus")
        candidates["verl grpo"] = lambda: grpo(rewards, mask, index)
        candidates["verl grpo_vectorized"] = lambda: grpo_vectorized(rewards, mask, index)
        candidates["verl reinforce_plus_plus"] = lambda: reinforce_pp(rewards, mask, config=config)
    timings = time_interleaved(candidates, args.repeat)

    rebn_wall, rebn_cpu, _ = timings["gem_core rebn_token_level (torch)"]
    print(f"\n| {'estimator':<44} | {'wall ms':>8} | {'CPU ms':>8} | {'page faults':>11} | {'wall / ReBN':>11} |")
    print(f"|{'-' * 46}|{'-' * 9}:|{'-' * 9}:|{'-' * 12}:|{'-' * 12}:|")
    for name, (wall_ms, cpu_ms, faults) in timings.items():
        print(f"| {name:<44} | {wall_ms:>8.2f} | {cpu_ms:>8.2f} | {faults:>11.0f} | {wall_ms / rebn_wall:>10.2f}x |")

    share = rebn_wall / (args.update_seconds * 1e3)
    print(f"\nReBN: {rebn_wall:.1f} ms wall, {rebn_cpu:.1f} ms CPU per call = {share:.2%} of a {args.update_seconds:g} s update (budget: 1%)")
    if verl is not None:
        grpo_wall, grpo_cpu, _ = timings["verl grpo_vectorized"]
        rpp_wall, rpp_cpu, _ = timings["verl reinforce_plus_plus"]
        print(f"for scale: ReBN / grpo_vectorized = {rebn_wall / grpo_wall:.2f}x wall, {rebn_cpu / grpo_cpu:.2f}x CPU")
        print(f"for scale: reinforce_plus_plus / ReBN = {rpp_wall / rebn_wall:.1f}x wall, {rpp_cpu / rebn_cpu:.1f}x CPU")
        print(f"for scale: reinforce_plus_plus / floor = {rpp_wall / timings[floor][0]:.1f}x wall")
    return 1 if args.strict and share > 0.01 else 0


if __name__ == "__main__":
    sys.exit(main())
