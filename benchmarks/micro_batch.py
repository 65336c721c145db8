"""The micro-batch budget of the default run's update: how many padded tokens go through one forward and backward
(``--micro-batch-tokens``, ``TrainConfig.micro_batch_tokens``), against time and memory.

    python benchmarks/micro_batch.py [--model smollm2-135m-instruct] [--episodes 32] [--repeats 3] [--budgets 1024 2048 4096 8192]
        [--precision auto|bf16|float32]

The batch is what ``gem-core train`` sees on ``game:GuessTheNumber-v0-easy`` (``--episodes`` episodes of random
well-formed guesses, benchmarks/shared_prefix.py's), the trainer the default run's (``TrainConfig()``: the top 10 of
30 layers trained, a KL to the reference at 0.1, two mini-batches, bf16 autocast where the CPU has it) but for the
budget; the reference a copy of the model whose trained layers are then moved a little (so the two differ as after
the first update). Timed: ``Trainer.optimize`` on the same rows from the same weights, after the heap bound a run
sets between its phases (``gem_core.train.memory.bound_heap``: a block over 4 MB mapped afresh, so a larger
micro-batch pays its page faults as in a run), ``--repeats`` times per budget, the budgets interleaved (their order turning each repeat), median and range; the memory an arm adds while it
runs: the process's resident memory sampled every 10 ms during the update, its peak less the resident memory just
before. Checked, in float32: every budget's gradient of the loss at the starting weights (``Trainer.accumulate_gradient``)
equals the first budget's within 1e-5 of its norm (the same gradient summed in another order, as
tests/train/test_memory.py shows), else it stops. Under bf16 autocast the difference is reported, not checked: bf16
rounds each micro-batch's sums apart (8-15% of the gradient's norm between 1024 and 2048 or 4096 tokens, measured). The weights after the update's two Adam
steps are not compared: Adam's first steps are about lr times each gradient element's sign, so elements near 0
flip with the rounding (19% of the weight change's norm between 1024 and 2048 tokens, measured). Printed: a Markdown table.
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

TOLERANCE = 1e-5  # the gradient's relative difference between two budgets, in float32 (bf16's is reported, not checked)


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
    parser.add_argument("--precision", default="auto", choices=("auto", "bf16", "float32"), help="the update's precision (default auto, the default run's)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 2048, 4096, 8192], help="micro-batch budgets in tokens (the first is the baseline)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.episodes < 2 or min(args.budgets) < 1:
        parser.error("--repeats >= 1, --episodes >= 2 and every budget >= 1")

    import torch

    from gem_core.train.memory import bound_heap
    from gem_core.train.run import load_model
    from gem_core.train.trainer import Trainer, TrainConfig

    model, tokenizer = load_model(args.model)
    _trajectories, rows = batch_of_episodes(tokenizer, args.episodes, args.max_tokens)
    episode_ids = [f"e{i}" for i in range(rows.input_ids.shape[0])]
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}

    bf16_seen: list[bool] = []

    def one_update(budget: int) -> tuple[float, float, dict]:
        trainer = Trainer(TrainConfig(episodes_per_update=args.episodes, micro_batch_tokens=budget, precision=args.precision), copy.deepcopy(model), tokenizer)
        try:
            trainer._reference()
            bf16_seen.append(trainer.bf16)
            with torch.no_grad():
                for p in trainer.model.parameters():
                    if p.requires_grad:
                        p.add_(1e-3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
            trainer.optimizer.zero_grad()
            trainer.accumulate_gradient(rows)  # the loss's gradient at these weights, this budget's micro-batches
            gradient = {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
            trainer.optimizer.zero_grad()
            bound_heap()  # as a run does between its phases: blocks over 4 MB are mapped afresh (page faults and all)
            with PeakSampler() as memory:
                started = time.perf_counter()
                trainer.optimize(rows, episode_ids)
                seconds = time.perf_counter() - started
            return seconds, memory.peak - memory.before, gradient
        finally:
            trainer.close()

    times: dict[int, list[float]] = {b: [] for b in args.budgets}
    added: dict[int, list[float]] = {b: [] for b in args.budgets}
    gradients: dict[int, dict] = {}
    for repeat in range(args.repeats):
        turn = repeat % len(args.budgets)
        for budget in args.budgets[turn:] + args.budgets[:turn]:
            seconds, gb, gradients[budget] = one_update(budget)
            times[budget].append(seconds)
            added[budget].append(gb)
            print(f"repeat {repeat}: {budget} tokens {seconds:.2f} s, +{gb:.2f} GB", flush=True)
    base = args.budgets[0]
    in_bf16 = any(bf16_seen)
    norm = sum(float(c.double().pow(2).sum()) for c in gradients[base].values()) ** 0.5
    differences = {
        b: sum(float((gradients[b][k] - gradients[base][k]).double().pow(2).sum()) for k in gradients[base]) ** 0.5 / max(norm, 1e-30) for b in args.budgets
    }
    if norm == 0 or (not in_bf16 and max(differences.values()) > TOLERANCE):
        print(f"the budgets' gradients differ (relative differences {differences}, gradient norm {norm}): not the same loss", file=sys.stderr)
        return 1
    model.load_state_dict(start)
    tokens = int(rows.attention.sum())
    print(
        f"\n{rows.input_ids.shape[0]} rows, {tokens} tokens ({rows.input_ids.numel()} padded), two mini-batches; {args.repeats} updates per budget, interleaved\n"
    )
    print("| micro-batch budget (tokens) | update seconds, median | range | memory added, GB (median) | gradient vs the first, relative | speed-up |")
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
