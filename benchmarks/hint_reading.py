"""How fast the default model of ``gem-core train`` learns to read GuessTheNumber's hints, given labels.

    python benchmarks/hint_reading.py [--steps 300] [--every 100] [--episodes 200] [--seed 0] [--after-warm-start]

The RL phase of the default run has to discover, from rewards alone, that the next guess should depend
on the last hint ("higher" / "lower"). This measures how quickly the same tiny model (built by
``gem_core.train.run.default_model``) learns that dependence when it is *shown* the moves: supervised
imitation, at the warm start's settings (32 episodes per step, lr 3e-3, the moves alone as targets), of
three scripted players of ``game:GuessTheNumber-v0-easy`` (1-10, 4 guesses):

* ``random``: a uniform guess in 1-10 (the control: nothing to read; wins 1 - 0.9^4 = 0.344);
* ``consistent``: a uniform guess among the numbers every hint so far allows (wins 0.762);
* ``bisect``: the middle of the numbers every hint so far allows (binary search: wins every episode).

Printed: held-out success (the trainer's held-out seeds, sampling at temperature 1) every ``--every``
steps per player. If even imitation needs hundreds of steps to read the hints, RL, whose signal for a
hint-consistent guess is one winning move in several episodes next to random earlier moves, cannot be
expected to find it within the default run's budget.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import sys
import time
import zlib
from typing import Any

PLAYERS = ("random", "consistent", "bisect")
RANGE = re.compile(r"between (\d+) and (\d+)")
HINT = re.compile(r"you guessed (\d+), and the target number is (higher|lower)")


def allowed(context: str) -> tuple[int, int]:
    """The numbers every hint in ``context`` (the episode's text so far) still allows, as (low, high)."""
    low, high = map(int, RANGE.search(context).groups())
    for guess, hint in HINT.findall(context):
        if hint == "higher":
            low = max(low, int(guess) + 1)
        else:
            high = min(high, int(guess) - 1)
    return low, max(low, high)


def move(player: str, context: str, rng: random.Random) -> str:
    low, high = allowed(context)
    if player == "random":
        first, last = map(int, RANGE.search(context).groups())
        guess = rng.randint(first, last)
    elif player == "consistent":
        guess = rng.randint(low, high)
    else:
        guess = (low + high) // 2
    return f"\\boxed{{{guess}}}"


def imitate(player: str, steps: int, every: int, episodes: int, seed: int, warm: bool) -> list[tuple[int, float, float]]:
    """(step, held-out success, seconds) every ``every`` supervised steps of imitating ``player``; with
    ``warm``, after the default run's warm start (100 steps on transcripts of random moves)."""
    import torch

    from gem_core.rollout import ScriptedPolicy, run_episodes
    from gem_core.train.run import default_model, supervised_loss, warm_start
    from gem_core.train.trainer import Trainer, TrainConfig, training_rows

    config = TrainConfig(eval_episodes=episodes, seed=seed, out="unused")
    torch.manual_seed(seed)
    model, tokenizer = default_model(seed)
    trainer = Trainer(config, model, tokenizer, log=lambda line: None)

    class Scripted(ScriptedPolicy):
        async def generate(self, prompt_ids: Any, params: Any, *, request_id: str = "") -> Any:
            self.rng = random.Random(zlib.crc32(f"{seed}:{request_id}".encode()))
            return await super().generate(prompt_ids, params, request_id=request_id)

    if warm:
        warm_start(trainer, config.warmup_steps, config.warmup_batch)
    teacher = Scripted(tokenizer, lambda context: move(player, context, teacher.rng))
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=config.warmup_lr, weight_decay=0.0)
    batch = config.warmup_batch
    started = time.perf_counter()
    points = []
    try:
        for step in range(steps + 1):
            if step % every == 0 or step == steps:
                points.append((step, trainer.evaluate().success_rate, time.perf_counter() - started))
            if step == steps:
                break
            seeds = [2 * 10**6 + step * batch + i for i in range(batch)]
            trajectories = asyncio.run(run_episodes(trainer.envs[:batch], teacher, trainer.formatter, trainer.run_config, seeds=seeds, episode_id_prefix=f"w{step}-"))
            rows = training_rows(trajectories, [[1.0] * t.num_turns for t in trajectories], "sequence", trainer.pad_id)
            loss = supervised_loss(trainer, rows)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        trainer.close()
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--episodes", type=int, default=200, help="held-out episodes per evaluation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--after-warm-start", action="store_true", help="start from the default run's warm-started model, not from scratch")
    parser.add_argument("--players", nargs="+", choices=PLAYERS, default=list(PLAYERS))
    args = parser.parse_args(argv)
    if args.steps < 1 or args.every < 1 or args.episodes < 1:
        parser.error("--steps, --every and --episodes must be at least 1")
    if args.seed < 0:
        parser.error("--seed must be 0 or more")
    results = {player: imitate(player, args.steps, args.every, args.episodes, args.seed, args.after_warm_start) for player in args.players}
    steps = [step for step, _, _ in results[args.players[0]]]
    header = ["imitated player"] + [f"step {s}" for s in steps] + ["seconds"]
    rows = [[player] + [f"{success:.3f}" for _, success, _ in points] + [f"{points[-1][2]:.0f}"] for player, points in results.items()]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    start = "after the default warm start" if args.after_warm_start else "from scratch"
    print(f"held-out success of the default model ({start}) while imitating each player ({args.episodes} episodes, seed {args.seed})")
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
