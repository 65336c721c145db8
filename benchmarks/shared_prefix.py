"""The shared prompt prefix on the real model: one update's forward and backward, and one rollout's
generation, with the batch's common prefix run once (the default) and run for every row.

    python benchmarks/shared_prefix.py [--model smollm2-135m-instruct] [--episodes 32] [--max-tokens 12] [--repeats 3]

The batch is what ``gem-core train`` sees on ``game:GuessTheNumber-v0-easy``: ``--episodes`` episodes
played to their end by well-formed random guesses (several turns each, so the rows differ after the
instruction), as the trainer's rows (one per episode). Timed, each ``--repeats`` times with the two arms
interleaved (on, off, on, off, ...: the machine's load drifts alike for both) and the fastest kept:

* update: :func:`gem_core.train.trainer.token_logprobs` and ``backward`` over the rows (the part of an
  update that the prefix changes; micro-batches of the trainer's default budget);
* generation: ``HFPolicy.generate_batch`` of ``--max-tokens`` tokens (greedy) for the first-turn prompts
  of the episodes (every prompt the same instruction) and for their last-turn prompts (the instruction
  and a few turns of their own).

Printed: a Markdown table of seconds per arm and the speed-up, the tokens in the batch and the shared
prefix's length. Both arms give the same numbers (tests/train/test_memory.py,
tests/rollout/test_rollout_policies.py); this measures only time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import zlib
from typing import Any

ENV_ID = "game:GuessTheNumber-v0-easy"


def batch_of_episodes(tokenizer: Any, episodes: int, max_tokens: int) -> tuple[list[Any], Any]:
    """``episodes`` trajectories of random well-formed guesses, and their training rows."""
    from gem_core.registry import make
    from gem_core.rollout import ChatFormatter, RunConfig, SamplingParams, ScriptedPolicy, run_episodes
    from gem_core.train.trainer import training_rows

    mover = make(ENV_ID)

    class RandomGuesses(ScriptedPolicy):
        async def generate(self, prompt_ids: Any, params: Any, *, request_id: str = "") -> Any:
            mover.reset(seed=zlib.crc32(request_id.encode()))
            return await super().generate(prompt_ids, params, request_id=request_id)

    policy = RandomGuesses(tokenizer, lambda context: str(mover.sample_random_action()))
    envs = [make(ENV_ID) for _ in range(episodes)]
    try:
        config = RunConfig(params=SamplingParams(max_tokens=max_tokens))
        trajectories = asyncio.run(run_episodes(envs, policy, ChatFormatter(tokenizer), config, seeds=list(range(episodes))))
    finally:
        for env in envs:
            env.close()
        mover.close()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = training_rows(trajectories, [[1.0] * t.num_turns for t in trajectories], "sequence", pad)
    return trajectories, rows


def time_update(model: Any, rows: Any, share: bool) -> float:
    from gem_core.train.trainer import TrainConfig, micro_batches, output_layer, token_logprobs

    assert output_layer(model) is not None  # the decoder path, where the prefix is shared
    model.zero_grad()
    model.train()
    started = time.perf_counter()
    for part in micro_batches(rows, TrainConfig.micro_batch_tokens):
        logprobs = token_logprobs(model, part, share_prefix=share)
        (-(logprobs * (part.targets >= 0)).sum()).backward()
    seconds = time.perf_counter() - started
    model.zero_grad()
    return seconds


def time_generation(model: Any, prompts: list[list[int]], max_tokens: int, share: bool) -> float:
    from gem_core.rollout import HFPolicy, SamplingParams

    policy = HFPolicy(model, max_batch_size=len(prompts), share_prefix=share)
    started = time.perf_counter()
    policy.generate_batch(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0), [str(i) for i in range(len(prompts))])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a path, hub id or smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=32, help="episodes in the batch (>= 2)")
    parser.add_argument("--max-tokens", type=int, default=12, help="tokens per response")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per arm (the fastest is kept)")
    args = parser.parse_args()
    if args.episodes < 2 or args.max_tokens < 1 or args.repeats < 1:
        parser.error("--episodes must be >= 2, --max-tokens and --repeats >= 1")

    from gem_core.rollout.policies import shared_prefix_length
    from gem_core.train.run import load_model

    model, tokenizer = load_model(args.model)
    trajectories, rows = batch_of_episodes(tokenizer, args.episodes, args.max_tokens)
    first = [list(t.prompt_ids) for t in trajectories]
    last = [list(t.as_sequence().input_ids[: t.turns[-1].context_len]) for t in trajectories]
    lengths = rows.attention.sum(1).tolist()
    prefix = shared_prefix_length([rows.input_ids[i, :n].tolist() for i, n in enumerate(lengths)])

    cases = {
        "update: log-probs + backward": lambda share: time_update(model, rows, share),
        "generation, first turn": lambda share: time_generation(model, first, args.max_tokens, share),
        "generation, last turn": lambda share: time_generation(model, last, args.max_tokens, share),
    }
    best: dict[tuple[str, bool], float] = {}
    for name, run in cases.items():
        run(True)  # warm-up
        for _ in range(args.repeats):
            for share in (True, False):
                seconds = run(share)
                best[name, share] = min(best.get((name, share), float("inf")), seconds)

    print(
        f"\n{args.episodes} episodes of {ENV_ID} (random well-formed guesses, {sum(t.num_turns for t in trajectories)} turns), "
        f"model {args.model}; {int(sum(lengths))} tokens in the rows, {prefix} of each row shared; fastest of {args.repeats}; "
        f"load at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n"
    )
    print("| step | prefix run once s | prefix run per row s | speed-up |")
    print("|---|---|---|---|")
    for name in cases:
        on, off = best[name, True], best[name, False]
        print(f"| {name} | {on:.2f} | {off:.2f} | {off / on:.2f}x |")


if __name__ == "__main__":
    main()
