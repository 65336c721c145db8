"""The micro-batch budget of the default run's update: how many padded tokens go through one forward and backward
(``--micro-batch-tokens``, ``TrainConfig.micro_batch_tokens``), against time and memory.

    python benchmarks/micro_batch.py [--model smollm2-135m-instruct] [--episodes 32] [--repeats 3] [--budgets 1024 2048 4096 8192]

The batch is what ``gem-core train`` sees on ``game:GuessTheNumber-v0-easy`` (``--episodes`` episodes of random
well-formed guesses, benchmarks/shared_prefix.py's), the trainer the default run's (``TrainConfig()``: the top 10 of
30 layers trained, a KL to the reference at 0.1, two mini-batches, bf16 autocast where the CPU has it) but for the
budget; the reference a copy of the model whose trained layers are then moved a little (so the two differ as after
the first update). Timed: ``Trainer.optimize`` on the same rows from the same weights, ``--repeats`` times per
budget, the budgets interleaved (their order turning each repeat), median and range; the memory an arm adds while it
runs: the process's resident memory sampled every 10 ms during the update, its peak less the resident memory just
before. Checked: every budget's weight change equals the first budget's within 1e-2 of its norm (the same gradient,
summed in another order: tests/train/test_memory.py shows it equal in float32; bf16 rounds differently per
micro-batch), else it stops. Printed: a Markdown table.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from shared_prefix import batch_of_episodes  # noqa: E402

TOLERANCE = 1e-2  # the weight change's relative difference between two budgets


def resident_gb() -> float:
    """This process's resident memory now (Linux /proc)."""
    with open("/proc/self/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


class PeakSampler:
    """The highest resident memory seen while the block runs, sampled every 10 ms in a thread."""

    def __enter__(self) -> PeakSampler:
        self.before = self.peak = resident_gb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, resident_gb())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, resident_gb())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 2048, 4096, 8192], help="micro-batch budgets in tokens (the first is the baseline)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.episodes < 2 or min(args.budgets) < 1:
        parser.error("--repeats >= 1, --episodes >= 2 and every budget >= 1")

    import torch

    from gem_core.train.run import load_model
    from gem_core.train.trainer import Trainer, TrainConfig

    model, tokenizer = load_model(args.model)
    _trajectories, rows = batch_of_episodes(tokenizer, args.episodes, args.max_tokens)
    episode_ids = [f"e{i}" for i in range(rows.input_ids.shape[0])]
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def one_update(budget: int) -> tuple[float, float, dict]:
        trainer = Trainer(TrainConfig(episodes_per_update=args.episodes, micro_batch_tokens=budget), copy.deepcopy(model), tokenizer)
        try:
            trainer._reference()
            with torch.no_grad():
                for p in trainer.model.parameters():
                    if p.requires_grad:
                        p.add_(1e-3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
            moved = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
            with PeakSampler() as memory:
                started = time.perf_counter()
                trainer.optimize(rows, episode_ids)
                seconds = time.perf_counter() - started
            change = {k: v.detach() - moved[k] for k, v in trainer.model.state_dict().items() if v.is_floating_point()}
            return seconds, memory.peak - memory.before, change
        finally:
            trainer.close()

    times: dict[int, list[float]] = {b: [] for b in args.budgets}
    added: dict[int, list[float]] = {b: [] for b in args.budgets}
    changes: dict[int, dict] = {}
    for repeat in range(args.repeats):
        turn = repeat % len(args.budgets)
        for budget in args.budgets[turn:] + args.budgets[:turn]:
            seconds, gb, changes[budget] = one_update(budget)
            times[budget].append(seconds)
            added[budget].append(gb)
            print(f"repeat {repeat}: {budget} tokens {seconds:.2f} s, +{gb:.2f} GB", flush=True)
    base = args.budgets[0]
    norm = sum(float(c.double().pow(2).sum()) for c in changes[base].values()) ** 0.5
    differences = {
        b: sum(float((changes[b][k] - changes[base][k]).double().pow(2).sum()) for k in changes[base]) ** 0.5 / max(norm, 1e-30) for b in args.budgets
    }
    if norm == 0 or max(differences.values()) > TOLERANCE:
        print(f"the budgets' updates differ (relative differences {differences}, change norm {norm}): not the same gradient", file=sys.stderr)
        return 1
    model.load_state_dict(start)
    tokens = int(rows.attention.sum())
    print(
        f"\n{rows.input_ids.shape[0]} rows, {tokens} tokens ({rows.input_ids.numel()} padded), two mini-batches; {args.repeats} updates per budget, interleaved\n"
    )
    print("| micro-batch budget (tokens) | update seconds, median | range | memory added, GB (median) | weight change vs the first, relative | speed-up |")
    print("|---|---|---|---|---|---|")
    first = statistics.median(times[base])
    for budget in args.budgets:
        median = statistics.median(times[budget])
        print(
            f"| {budget} | {median:.2f} | {min(times[budget]):.2f}-{max(times[budget]):.2f} | {statistics.median(added[budget]):.2f} | "
            f"{differences[budget]:.1e} | {first / median:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
