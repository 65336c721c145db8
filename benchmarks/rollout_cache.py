"""What a rollout of the default run costs, before and after the changes to ``HFPolicy`` and the trainer that made a
seed a seed and the rollout faster: batching in rounds (determinism), keeping each episode's KV cache between its
turns (speed), and under bf16 generating with a bfloat16 copy of the weights (speed).

    python benchmarks/rollout_cache.py [--model smollm2-135m-instruct] [--repeats 5] [--warmup-steps 8] [--out FILE.json]

The rollout is the default run's (``gem-core train``'s own :meth:`~gem_core.train.trainer.Trainer.rollout`: 32
episodes of ``game:GuessTheNumber-v0-easy`` at temperature 1, each response ending at its move), after the
default warm start (so episodes last several turns, as in training). Four arms, on the same seeds, interleaved
(one rollout of each arm per repeat, the arms' order turning each repeat, so the machine's drift falls alike on
all):

* ``as requests arrive, whole context``: the policy before this change (a batch of whichever episodes asked at
  one moment; every turn runs its whole context, less the instruction's shared prefix);
* ``rounds, whole context``: batches in rounds (:class:`~gem_core.rollout.policies.Cohort`): what determinism
  alone costs or saves;
* ``rounds, episode cache``: and each episode's keys and values kept between its turns (the default in float32);
* ``rounds, episode cache, bfloat16 copy`` (the default under bf16): the same, generating with the trainer's
  bfloat16 copy of the weights (:meth:`~gem_core.train.trainer.Trainer.rollout_model`) instead of the float32 model.
  Its episodes are another distribution's samples (the bfloat16 weights'), so its tokens run differ a little.

All four write the KV cache in place into a buffer laid out ahead (no arm pays for concatenation). Printed: a
Markdown table of the rollout seconds per arm (median and range over the repeats), the tokens the model ran
(prefill and decode), whether the arm's repeats on one seed set gave identical episodes, and the speed-up of the
default over the first arm, measured in this run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

ARMS = (
    ("as requests arrive, whole context", dict(rounds=False, reuse_cache=False)),
    ("rounds, whole context", dict(rounds=True, reuse_cache=False)),
    ("rounds, episode cache", dict(rounds=True, reuse_cache=True)),
    ("rounds, episode cache, bfloat16 copy (default)", dict(rounds=True, reuse_cache=True, bfloat16=True)),
)


def arm_policy(trainer: Any, rounds: bool, reuse_cache: bool, counts: dict[str, int], bfloat16: bool = False) -> tuple[Any, Any]:
    """``trainer.policy`` for one arm (the trainer's own HFPolicy with the arm's options, on the float32 model or
    the trainer's bfloat16 copy), and the hook that counts the tokens each forward runs (remove it after the rollout)."""
    from gem_core.rollout import HFPolicy

    model = trainer.rollout_model() if bfloat16 else trainer.model

    def make(batch_size: int) -> Any:
        policy = HFPolicy(model, seed=trainer.config.seed, max_batch_size=batch_size, pad_token_id=trainer.pad_id, reuse_cache=reuse_cache)
        if not rounds:
            policy.open_cohort = None  # the runner then cannot tell the policy when episodes end: batches as requests arrive
        return policy

    def count(module: Any, args: Any, kwargs: Any) -> None:
        shape = kwargs["input_ids"].shape
        counts["prefill" if shape[1] > 1 else "decode"] += int(shape[0] * shape[1])

    return make, model.register_forward_pre_hook(count, with_kwargs=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="the model (default: the default run's, smollm2-135m-instruct)")
    parser.add_argument("--repeats", type=int, default=5, help="rollouts per arm, interleaved (default 5)")
    parser.add_argument("--warmup-steps", type=int, default=8, help="the warm start before timing (default 8, the default run's)")
    parser.add_argument("--out", default=None, help="also write the numbers as JSON here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup_steps < 0:
        parser.error("--repeats must be >= 1 and --warmup-steps >= 0")

    import torch

    from gem_core.train.run import load_model, warm_start
    from gem_core.train.trainer import Trainer, TrainConfig

    # bf16 wherever it runs: the last arm is the trainer's bfloat16 copy (the others generate in float32 regardless)
    config = TrainConfig(out="runs/bench-rollout-cache", warm_start_steps=args.warmup_steps, precision="bf16", **({"model": args.model} if args.model else {}))
    torch.manual_seed(config.seed)
    model, tokenizer = load_model(config.model, config.seed)
    trainer = Trainer(config, model, tokenizer, log=lambda _: None)
    try:
        if args.warmup_steps:
            warm_start(trainer, args.warmup_steps, config.warm_start_batch)
        seconds: dict[str, list[float]] = {name: [] for name, _ in ARMS}
        tokens: dict[str, dict[str, int]] = {}
        episodes: dict[str, list[Any]] = {name: [] for name, _ in ARMS}
        turns: dict[str, int] = {}
        for repeat in range(args.repeats):
            order = ARMS[repeat % len(ARMS) :] + ARMS[: repeat % len(ARMS)]
            for name, options in order:
                counts = {"prefill": 0, "decode": 0}
                trainer.policy, hook = arm_policy(trainer, counts=counts, **options)
                try:
                    started = time.perf_counter()
                    trajectories = trainer.rollout(trainer.train_seeds(0), prefix="s0-")
                    seconds[name].append(time.perf_counter() - started)
                finally:
                    hook.remove()
                tokens[name] = counts
                turns[name] = sum(t.num_turns for t in trajectories)
                episodes[name].append([[(turn.response_ids, turn.logprobs) for turn in t.turns] for t in trajectories])
    finally:
        trainer.close()
    base = statistics.median(seconds[ARMS[0][0]])
    rows = []
    lines = [
        f"One rollout of the default run (32 episodes, after a warm start of {args.warmup_steps} steps), {args.repeats} per arm, interleaved:",
        "",
        "| policy | rollout seconds (median) | range | turns | tokens run: prefill / decode | repeats identical | speed-up over the first |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, _ in ARMS:
        values = seconds[name]
        median = statistics.median(values)
        identical = all(run == episodes[name][0] for run in episodes[name])
        rows.append(
            {"arm": name, "seconds": values, "median": median, "turns": turns[name], "tokens": tokens[name], "identical": identical, "speedup": base / median}
        )
        lines.append(
            f"| {name} | {median:.2f} | {min(values):.2f}-{max(values):.2f} | {turns[name]} | {tokens[name]['prefill']} / {tokens[name]['decode']} | "
            f"{'yes' if identical else 'no'} | {base / median:.2f}x |"
        )
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump({"repeats": args.repeats, "arms": rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
