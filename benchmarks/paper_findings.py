"""The GEM paper's two findings, reproduced with the reference trainer (``gem-core train``) on CPU.

    python benchmarks/paper_findings.py [--scale real|tiny] [--seeds 0 1 2] [--steps N] [--jobs 2] [--out runs/paper_findings]

(1) ReBN against vanilla multi-turn REINFORCE (both gamma 0.9): does ReBN learn faster or reach a higher
    success rate? (2) gamma 0.9 against gamma 0.999 (both ReBN): does the smaller discount give fewer
    turns per solved GuessTheNumber episode, toward binary search (about 2.9 guesses for 1-10)?

Three arms (ReBN 0.9 is in both findings), each trained from ``--seeds`` with a scale's settings otherwise:
``real`` (default), the default run of ``gem-core train`` (the embedded real model, a warm start on hint-blind
moves, 30 updates, the top 10 layers trained); ``tiny``, the toy scale (``TINY_RUN``: a tiny local model, a supervised warm start, 300 updates).
Every run plays the same held-out seeds. Runs live in ``--out`` as ``<scale>-<arm>-seed<seed>``; a run already
complete there is read back, not trained again, so an interrupted benchmark picks up where it stopped, but
only when its ``config.json`` is the arm's (estimator, gamma, seed and the scale's settings, model included):
a directory holding a run of other settings is an error, never counted.
Printed: one table per finding, mean and spread (sample std) over seeds of the held-out success at the
end, its mean over every evaluation (area under the curve: "learns faster"), and held-out turns per
solved episode. Written: ``findings.md`` (the tables) and ``findings.png`` (held-out curves per arm).
It runs long (toy scale: about ten minutes per run on two cores; real: about 25 minutes per run alone, and
``--jobs`` runs share the cores): start it in the background.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Arm:
    name: str
    estimator: str
    gamma: float


ARMS = (Arm("rebn-0.9", "rebn", 0.9), Arm("reinforce-0.9", "reinforce", 0.9), Arm("rebn-0.999", "rebn", 0.999))
FINDINGS = (
    ("(1) ReBN vs vanilla multi-turn REINFORCE, gamma 0.9", ("rebn-0.9", "reinforce-0.9")),
    ("(2) gamma 0.9 vs 0.999, ReBN: turns per solved episode", ("rebn-0.9", "rebn-0.999")),
)


def run_dir(out: str, arm: Arm, seed: int, scale: str) -> str:
    return os.path.join(out, f"{scale}-{arm.name}-seed{seed}")


def arm_config(arm: Arm, seed: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The config fields that make a run one of ``arm``'s at this scale and seed: the estimator, gamma,
    seed, and every setting of the scale (``extra``: TINY_RUN's fields, ``--set`` ones; the model always)."""
    from gem_core.train.trainer import TrainConfig

    return {"model": TrainConfig.model, **extra, "estimator": arm.estimator, "gamma": arm.gamma, "seed": seed}


def mismatches(directory: str, expected: dict[str, Any]) -> list[str]:
    """The fields of ``expected`` that the run saved in ``directory`` (its config.json) does not have,
    as ``name: saved != expected``; ``["no config.json"]`` when it has none."""
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as handle:
            saved = json.load(handle)
    except (OSError, ValueError):
        return ["no config.json"]
    return [f"{key}: {saved.get(key)!r} != {value!r}" for key, value in expected.items() if _normal(saved.get(key)) != _normal(value)]


def _normal(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value  # JSON has lists where a config has tuples


def train_one(out: str, arm: Arm, seed: int, steps: int, extra: dict[str, Any], scale: str) -> str:
    """Train one (arm, seed), unless its run directory already holds the finished run. A directory that
    holds a run of another arm, seed or scale is an error, never counted or continued."""
    import torch

    from gem_core.train.run import read_metrics, train
    from gem_core.train.trainer import TrainConfig

    directory = run_dir(out, arm, seed, scale)
    expected = arm_config(arm, seed, extra)
    if finished(directory, steps, expected):
        return directory
    wrong = mismatches(directory, expected)
    if os.path.exists(os.path.join(directory, "config.json")) and wrong:
        raise SystemExit(f"paper_findings: {directory} holds a run of other settings ({'; '.join(wrong)}): move it away")
    torch.set_num_threads(1)  # one run per core: small ops on shared threads only contend
    resume = os.path.exists(os.path.join(directory, "checkpoint.pt"))
    config = TrainConfig(**{**expected, "steps": steps, "out": directory, "resume": resume})
    train(config, progress=False, log=lambda line: None)
    assert finished(directory, steps, expected), read_metrics(os.path.join(directory, "metrics.jsonl"))[-1:]
    return directory


def finished(directory: str, steps: int, expected: dict[str, Any]) -> bool:
    """Whether ``directory`` holds a finished run (its evaluation after ``steps`` updates) whose config is
    ``expected``'s (:func:`arm_config`): a run of another arm, seed or scale never counts."""
    from gem_core.train.run import read_metrics

    path = os.path.join(directory, "metrics.jsonl")
    if not os.path.exists(path) or mismatches(directory, expected):
        return False
    records = read_metrics(path)
    return any(r.get("step") == steps and "eval_success_rate" in r for r in records)


def curves(directory: str) -> list[dict[str, Any]]:
    """The held-out evaluations of a run (the warm start's at step 0, then every ``eval_every``)."""
    from gem_core.train.run import read_metrics

    return [r for r in read_metrics(os.path.join(directory, "metrics.jsonl")) if "eval_success_rate" in r]


def arm_numbers(out: str, arm: Arm, seeds: list[int], scale: str) -> dict[str, list[float]]:
    numbers: dict[str, list[float]] = {"start": [], "final": [], "auc": [], "turns_solved": []}
    for seed in seeds:
        evals = curves(run_dir(out, arm, seed, scale))
        numbers["start"].append(evals[0]["eval_success_rate"])
        numbers["final"].append(evals[-1]["eval_success_rate"])
        numbers["auc"].append(statistics.fmean(e["eval_success_rate"] for e in evals[1:]))
        solved = evals[-1]["eval_turns_when_solved"]
        if solved is not None:
            numbers["turns_solved"].append(solved)
    return numbers


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def tables(out: str, seeds: list[int], scale: str) -> str:
    by_name = {arm.name: arm for arm in ARMS}
    lines = []
    for title, names in FINDINGS:
        lines += [f"**{title}** ({len(seeds)} seeds: {', '.join(map(str, seeds))}; mean ± sample std)", ""]
        lines.append("| arm | held-out success at the start (after any warm start) | at the end | mean over evaluations | turns per solved episode (end) |")
        lines.append("|---|---|---|---|---|")
        for name in names:
            n = arm_numbers(out, by_name[name], seeds, scale)
            lines.append(f"| {name} | {spread(n['start'])} | {spread(n['final'])} | {spread(n['auc'])} | {spread(n['turns_solved'])} |")
        lines.append("")
    return "\n".join(lines)


def plot(out: str, seeds: list[int], png: str, scale: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for arm in ARMS:
        runs = [curves(run_dir(out, arm, seed, scale)) for seed in seeds]
        steps = [e["step"] for e in runs[0]]
        success = np.array([[e["eval_success_rate"] for e in run] for run in runs])
        turns = np.array([[np.nan if e["eval_turns_when_solved"] is None else e["eval_turns_when_solved"] for e in run] for run in runs])
        for axis, values in ((axes[0], success), (axes[1], turns)):
            with warnings.catch_warnings():  # an evaluation that no seed solved has no turns: a gap
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, low, high = np.nanmean(values, axis=0), np.nanmin(values, axis=0), np.nanmax(values, axis=0)
            axis.plot(steps, mean, "o-", label=arm.name)
            axis.fill_between(steps, low, high, alpha=0.15)
    axes[0].set(title="held-out success rate (band: min-max over seeds)", xlabel="RL update", ylim=(0, 1))
    axes[1].set(title="held-out turns per solved episode", xlabel="RL update")
    for axis in axes:
        axis.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--scale", choices=("real", "tiny"), default="real", help="the default run's settings (real model) or the toy scale's (default real)")
    parser.add_argument("--steps", type=int, default=None, help="RL updates per run (default: the scale's, 30 real or 300 tiny)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 1)), help="runs at once, one torch thread each")
    parser.add_argument("--out", default="runs/paper_findings", help="where the runs, findings.md and findings.png go")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="another TrainConfig field for every run, e.g. --set eval_every=25")
    args = parser.parse_args(argv)
    if (args.steps is not None and args.steps < 1) or args.jobs < 1 or min(args.seeds) < 0:
        parser.error("--steps and --jobs must be >= 1 and seeds >= 0")
    from gem_core.train.trainer import TINY_RUN, TrainConfig

    extra: dict[str, Any] = dict(TINY_RUN) if args.scale == "tiny" else {}
    steps = args.steps or extra.pop("steps", TrainConfig.steps)
    extra.pop("steps", None)
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            parser.error(f"--set {item!r}: the value must be JSON (e.g. --set eval_every=25)")
    os.makedirs(args.out, exist_ok=True)
    jobs = [(arm, seed) for seed in args.seeds for arm in ARMS]
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(train_one, args.out, arm, seed, steps, extra, args.scale) for arm, seed in jobs]
        for future, (arm, seed) in zip(futures, jobs):
            future.result()
            print(f"done: {arm.name} seed {seed}", file=sys.stderr, flush=True)
    text = tables(args.out, args.seeds, args.scale)
    print(text)
    with open(os.path.join(args.out, "findings.md"), "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    plot(args.out, args.seeds, os.path.join(args.out, "findings.png"), args.scale)
    print(f"wrote {os.path.join(args.out, 'findings.md')} and findings.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
