"""The frozen lower layers once an update: the default run's update on the real model with its KL term, the
frozen layers run once per micro-batch for the reference and every mini-batch (the default,
gem_core.train.decoder) against run in every forward (as before).

    python benchmarks/frozen_layers.py [--model smollm2-135m-instruct] [--episodes 32] [--repeats 3]

The batch is what ``gem-core train`` sees on ``game:GuessTheNumber-v0-easy`` (``--episodes`` episodes of random
well-formed guesses, benchmarks/shared_prefix.py's), the trainer the default run's (``TrainConfig()``: the top 10
of 30 layers trained, a KL to the reference at 0.1, two mini-batches, bf16 autocast where the CPU has it), the
reference a copy of the model whose trained layers are then moved a little (so the two differ as they do after
the first update). Timed: ``Trainer.optimize`` on the same rows from the same weights, ``--repeats`` times each,
the arms interleaved (split, whole, whole, split, ...), median and range. Checked: the two arms' weights after the
update are equal bit for bit (else it stops). Printed: a Markdown table.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from shared_prefix import batch_of_episodes  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    from gem_core.train import trainer as trainer_module
    from gem_core.train.run import load_model
    from gem_core.train.trainer import Trainer, TrainConfig

    model, tokenizer = load_model(args.model)
    _trajectories, rows = batch_of_episodes(tokenizer, args.episodes, args.max_tokens)
    episode_ids = [f"e{i}" for i in range(rows.input_ids.shape[0])]
    whole_forward = trainer_module.frozen_layer_count

    def one_update(split: bool) -> tuple[float, dict]:
        trainer_module.frozen_layer_count = whole_forward if split else (lambda decoder: 0)
        try:
            trainer = Trainer(TrainConfig(episodes_per_update=args.episodes), copy.deepcopy(model), tokenizer)
            reference = trainer._reference()
            with torch.no_grad():
                for p in trainer.model.parameters():
                    if p.requires_grad:
                        p.add_(1e-3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
            started = time.perf_counter()
            trainer.optimize(rows, episode_ids)
            seconds = time.perf_counter() - started
            weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
            del reference
            trainer.close()
            return seconds, weights
        finally:
            trainer_module.frozen_layer_count = whole_forward

    times: dict[bool, list[float]] = {True: [], False: []}
    weights: dict[bool, dict] = {}
    order = [True, False]
    for repeat in range(args.repeats):
        for split in order if repeat % 2 == 0 else order[::-1]:
            seconds, weights[split] = one_update(split)
            times[split].append(seconds)
            print(f"repeat {repeat}: {'split' if split else 'whole'} {seconds:.2f} s", flush=True)
    if not all(torch.equal(weights[True][k], weights[False][k]) for k in weights[True]):
        print("the two arms' updates differ: the split is not the whole forward", file=sys.stderr)
        return 1
    tokens = int(rows.attention.sum())
    print(f"\n{rows.input_ids.shape[0]} rows, {tokens} tokens; the weights after the update equal bit for bit\n")
    print("| update of the default run (KL to the reference, 2 mini-batches) | seconds, median | range | speed-up |")
    print("|---|---|---|---|")
    whole = statistics.median(times[False])
    for split, name in ((False, "every forward runs every layer (before)"), (True, "the frozen 20 layers once (default)")):
        median = statistics.median(times[split])
        print(f"| {name} | {median:.2f} | {min(times[split]):.2f}-{max(times[split]):.2f} | {whole / median:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
