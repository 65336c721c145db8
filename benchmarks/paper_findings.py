"""The GEM paper's findings, reproduced with the reference trainer (``gem-core train``) on CPU.

    python benchmarks/paper_findings.py [--scale real|tiny] [--seeds 0 1 2] [--arms NAME ...] [--steps N]
        [--jobs 2] [--out runs/paper_findings] [--set KEY=JSON ...]

(1) ReBN against vanilla multi-turn REINFORCE and against GRPO with groups (all gamma 0.9): does ReBN learn
    faster or reach a higher success rate? (2) gamma 0.9 against gamma 0.999 (both ReBN): does the smaller
    discount give fewer turns per solved GuessTheNumber episode, toward binary search (about 2.9 guesses for 1-10)?

Four arms (ReBN 0.9 is in both findings), each trained from ``--seeds`` with a scale's settings otherwise:
``real`` (default), the default run of ``gem-core train`` (the embedded real model, a warm start on hint-blind
moves, 30 updates, the top 10 layers trained); ``tiny``, the toy scale (``TINY_RUN``: a tiny local model, a
supervised warm start, 300 updates). GRPO plays its 32 episodes as 8 seeds x 4 (groups of 4); the other arms
play 32 seeds once. Every run plays the same held-out seeds. Runs live in ``--out`` as
``<scale>-<arm>-seed<seed>``; a run already complete there is read back, not trained again, so an interrupted
benchmark picks up where it stopped, but only when its ``config.json`` is the arm's in every setting that
shapes a run (all of ``TrainConfig`` but where it is written and how often it checkpoints): a directory
holding a run of other settings, an older default's included, is an error, never counted.

Printed: one table per finding. Per arm, mean over seeds with a 95% confidence interval (Student's t over
seeds) of: held-out success after the warm start and at the end (sampled and greedy), the training batches'
success over the RL updates (the area under the learning curve: "learns faster"), and held-out turns per
solved episode at the end. Per comparison, the paired difference (the same seed shares the warm start and the
held-out episodes) with its interval, and whether it reproduces the paper: the interval excludes 0 the
paper's way. Written: ``findings.md`` (the tables) and ``findings.png`` (the curves per arm).
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
    group_size: int = 1


ARMS = (
    Arm("rebn-0.9", "rebn", 0.9),
    Arm("reinforce-0.9", "reinforce", 0.9),
    Arm("grpo-g4", "grpo", 0.9, group_size=4),
    Arm("rebn-0.999", "rebn", 0.999),
)
# (title, the reference arm, the arms compared with it, the measure the paper's finding is about, the
# direction the paper found: +1 the reference higher, -1 the reference lower)
FINDINGS = (
    ("(1) ReBN vs vanilla multi-turn REINFORCE and vs GRPO with groups of 4, gamma 0.9", "rebn-0.9", ("reinforce-0.9", "grpo-g4"), "final", +1),
    ("(2) gamma 0.9 vs 0.999, ReBN: turns per solved episode", "rebn-0.9", ("rebn-0.999",), "turns_solved", -1),
)
# What a run's config.json may differ in and still be the arm's run: where it is written, whether it was
# resumed, how often it checkpoints or logs, and its length (a run counts only with an evaluation after
# exactly ``--steps`` updates, checked apart).
NOT_THE_RUN = ("out", "resume", "checkpoint_every", "tensorboard", "updates")
# Student's t, 0.975 quantile, by degrees of freedom (a 95% two-sided interval); past 30, the normal's.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def run_dir(out: str, arm: Arm, seed: int, scale: str) -> str:
    return os.path.join(out, f"{scale}-{arm.name}-seed{seed}")


def arm_settings(arm: Arm, seed: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The ``TrainConfig`` fields an arm sets at this scale and seed: the scale's (``extra``: TINY_RUN's
    fields, ``--set`` ones; the model always), then the estimator, gamma, group size and seed."""
    from gem_core.train.trainer import TrainConfig

    return {"model": TrainConfig.model, **extra, "estimator": arm.estimator, "gamma": arm.gamma, "group_size": arm.group_size, "seed": seed}


def arm_config(arm: Arm, seed: int, extra: dict[str, Any]) -> dict[str, Any]:
    """What the ``config.json`` of the arm's run holds: every ``TrainConfig`` field (the defaults of today's
    code where the arm sets nothing) but :data:`NOT_THE_RUN`."""
    from gem_core.train.trainer import TrainConfig, config_dict

    full = config_dict(TrainConfig(**arm_settings(arm, seed, extra)))
    return {key: value for key, value in full.items() if key not in NOT_THE_RUN}


def mismatches(directory: str, expected: dict[str, Any]) -> list[str]:
    """The fields of ``expected`` that the run saved in ``directory`` (its config.json) does not have,
    as ``name: saved != expected``; ``["no config.json"]`` when it has none."""
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as handle:
            saved = json.load(handle)
    except (OSError, ValueError):
        return ["no config.json"]
    saved = _current_names(saved)
    return [f"{key}: {saved.get(key)!r} != {value!r}" for key, value in expected.items() if _normal(saved.get(key)) != _normal(value)]


def _current_names(saved: dict[str, Any]) -> dict[str, Any]:
    """A config.json under today's field names (a run saved before the rename reads as the same run)."""
    from gem_core.train.trainer import TrainConfig, config_dict

    fields = {key: value for key, value in saved.items() if key not in ("weights", "evaluation")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        try:
            return config_dict(TrainConfig.from_dict(fields))
        except (TypeError, ValueError):
            return saved


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
    config = TrainConfig(**{**arm_settings(arm, seed, extra), "updates": steps, "out": directory, "resume": resume})
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
    """The held-out evaluations of a run (after the warm start at step 0, then every ``eval_every`` and at the end)."""
    from gem_core.train.run import read_metrics

    return [r for r in read_metrics(os.path.join(directory, "metrics.jsonl")) if "eval_success_rate" in r]


def training_success(directory: str) -> list[float]:
    """The success rate of each RL update's training batch, in order."""
    from gem_core.train.run import read_metrics

    return [r["success_rate"] for r in read_metrics(os.path.join(directory, "metrics.jsonl")) if r.get("phase") == "rl" and "success_rate" in r]


MEASURES = (
    ("start", "held-out success after the warm start (sampled)"),
    ("final", "at the end, sampled"),
    ("final_greedy", "at the end, greedy"),
    ("train_auc", "training batches' success, mean over updates"),
    ("turns_solved", "held-out turns per solved episode (end, sampled)"),
)


def run_numbers(directory: str) -> dict[str, float | None]:
    """One run's measures (:data:`MEASURES`); a measure the run lacks (greedy evaluation in an older run,
    turns when no episode was solved) is None."""
    evals = curves(directory)
    train = training_success(directory)
    return {
        "start": evals[0]["eval_success_rate"],
        "final": evals[-1]["eval_success_rate"],
        "final_greedy": evals[-1].get("eval_greedy_success_rate"),
        "train_auc": statistics.fmean(train) if train else None,
        "turns_solved": evals[-1].get("eval_turns_when_solved"),
    }


def arm_numbers(out: str, arm: Arm, seeds: list[int], scale: str) -> dict[str, list[float | None]]:
    """Each measure of :data:`MEASURES` per seed, in ``seeds``' order."""
    runs = [run_numbers(run_dir(out, arm, seed, scale)) for seed in seeds]
    return {key: [run[key] for run in runs] for key, _ in MEASURES}


def interval(values: list[float]) -> tuple[float, float] | None:
    """The mean's 95% confidence interval over ``values`` (Student's t, n - 1 degrees of freedom); None
    below two values."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    t = T_975[len(values) - 2] if len(values) - 1 <= len(T_975) else statistics.NormalDist().inv_cdf(0.975)
    half = t * statistics.stdev(values) / len(values) ** 0.5
    return mean - half, mean + half


def summary(values: list[float | None]) -> str:
    """``mean [low, high]`` over the values present (``(n=2)`` when some are missing); ``-`` with none."""
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    count = "" if len(present) == len(values) else f" (n={len(present)})"
    bounds = interval(present)
    if bounds is None:
        return f"{present[0]:.3f}{count}"
    return f"{statistics.fmean(present):.3f} [{bounds[0]:.3f}, {bounds[1]:.3f}]{count}"


def paired_difference(reference: list[float | None], other: list[float | None], direction: int) -> str:
    """``reference - other`` per seed (seeds where both have the measure), its mean and 95% interval, and
    the verdict: "reproduces" when the interval excludes 0 in the paper's ``direction``, "the opposite"
    when it excludes 0 the other way, "not shown" otherwise."""
    differences = [a - b for a, b in zip(reference, other) if a is not None and b is not None]
    if not differences:
        return "- | -"
    bounds = interval(differences)
    text = summary(differences)
    if bounds is None:
        return f"{text} | not shown (one seed)"
    low, high = bounds[0] * direction, bounds[1] * direction
    verdict = "reproduces" if min(low, high) > 0 else "the opposite" if max(low, high) < 0 else "not shown"
    return f"{text} | {verdict}"


def tables(out: str, seeds: list[int], scale: str, arms: tuple[Arm, ...] = ARMS) -> str:
    """One table per finding whose reference arm and at least one compared arm are in ``arms`` (the
    comparisons of those arms alone): each arm's measures, then each comparison's paired difference on the
    finding's measure."""
    by_name = {arm.name: arm for arm in arms}
    labels = dict(MEASURES)
    lines = []
    for title, reference, compared, measure, direction in FINDINGS:
        others = tuple(name for name in compared if name in by_name)
        if reference not in by_name or not others:
            continue
        numbers = {name: arm_numbers(out, by_name[name], seeds, scale) for name in (reference, *others)}
        lines += [f"**{title}** ({len(seeds)} seeds: {', '.join(map(str, seeds))}; mean [95% confidence interval over seeds])", ""]
        lines.append("| arm | " + " | ".join(label for _, label in MEASURES) + " |")
        lines.append("|---|" + "---|" * len(MEASURES))
        for name, values in numbers.items():
            lines.append(f"| {name} | " + " | ".join(summary(values[key]) for key, _ in MEASURES) + " |")
        lines += ["", f"| comparison ({labels[measure]}) | paired difference, per seed | the paper's finding |", "|---|---|---|"]
        for name in others:
            difference = paired_difference(numbers[reference][measure], numbers[name][measure], direction)
            lines.append(f"| {reference} - {name} | {difference} |")
        lines.append("")
    return "\n".join(lines)


def plot(out: str, seeds: list[int], png: str, scale: str, arms: tuple[Arm, ...] = ARMS) -> None:
    """Three panels per arm, mean over seeds with the min-max band: each update's training-batch success
    (a moving mean over 5 updates), held-out success and held-out turns per solved episode at each evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for arm in arms:
        directories = [run_dir(out, arm, seed, scale) for seed in seeds]
        train = np.array([np.convolve(training_success(d), np.ones(5) / 5, mode="valid") for d in directories])
        runs = [curves(d) for d in directories]
        steps = [e["step"] for e in runs[0]]
        success = np.array([[e["eval_success_rate"] for e in run] for run in runs])
        turns = np.array([[np.nan if e["eval_turns_when_solved"] is None else e["eval_turns_when_solved"] for e in run] for run in runs])
        for axis, x, values in ((axes[0], np.arange(5, 5 + train.shape[1]), train), (axes[1], steps, success), (axes[2], steps, turns)):
            with warnings.catch_warnings():  # an evaluation that no seed solved has no turns: a gap
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, low, high = np.nanmean(values, axis=0), np.nanmin(values, axis=0), np.nanmax(values, axis=0)
            axis.plot(x, mean, "-" if axis is axes[0] else "o-", label=arm.name)
            axis.fill_between(x, low, high, alpha=0.15)
    axes[0].set(title="training-batch success (mean of the last 5 updates)", xlabel="RL update", ylim=(0, 1))
    axes[1].set(title="held-out success, sampled (band: min-max over seeds)", xlabel="RL update", ylim=(0, 1))
    axes[2].set(title="held-out turns per solved episode", xlabel="RL update")
    for axis in axes:
        axis.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=[arm.name for arm in ARMS],
        default=[arm.name for arm in ARMS],
        help="the arms to train and report (default: all); a finding is reported when all its arms are",
    )
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
    steps = args.steps or extra.pop("updates", TrainConfig.updates)
    extra.pop("updates", None)
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            parser.error(f"--set {item!r}: the value must be JSON (e.g. --set eval_every=25)")
    arms = tuple(arm for arm in ARMS if arm.name in args.arms)
    try:
        for arm in arms:
            arm_config(arm, args.seeds[0], extra)  # a bad --set is one line here, not a traceback in a worker
    except (TypeError, ValueError) as error:
        parser.error(f"--set: {error}")
    os.makedirs(args.out, exist_ok=True)
    jobs = [(arm, seed) for arm in arms for seed in args.seeds]  # arm by arm: a stopped benchmark has whole arms
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(train_one, args.out, arm, seed, steps, extra, args.scale) for arm, seed in jobs]
        for future, (arm, seed) in zip(futures, jobs):
            future.result()
            print(f"done: {arm.name} seed {seed}", file=sys.stderr, flush=True)
    text = tables(args.out, args.seeds, args.scale, arms)
    print(text)
    with open(os.path.join(args.out, "findings.md"), "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    plot(args.out, args.seeds, os.path.join(args.out, "findings.png"), args.scale, arms)
    print(f"wrote {os.path.join(args.out, 'findings.md')} and findings.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
