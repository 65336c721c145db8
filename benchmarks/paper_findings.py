"""The GEM paper's findings, reproduced with the reference trainer (``gem-core train``) on CPU.

    python benchmarks/paper_findings.py [--finding 1|2] [--scale real|tiny] [--seeds 0 1 2 3 4 5]
        [--arms NAME ...] [--steps N] [--jobs 2] [--out runs/paper_findings] [--read-runs DIR] [--set KEY=JSON ...]
        [--report-only]

(1) ReBN against vanilla multi-turn REINFORCE and against GRPO with groups (all gamma 0.9), on the default run's
    game (``game:GuessTheNumber-v0-easy``): does ReBN reach a higher held-out success rate?
(2) gamma 0.9 against 0.99 and 0.999 (all ReBN) on ``game:GuessTheNumber-v0`` (numbers 1-20, 20 turns: room to
    dawdle, as in the paper's section 4.2; the easy game's 4 turns leave none): does the smaller discount solve in
    fewer turns, toward binary search (3.7 guesses on the balanced 1-20 set) rather than a linear scan (10.5)?

Fixed before any run of this version (issue 65), so that the data cannot choose them: the seeds, 0-5 (the default
``--seeds``: six, the fewest at which a two-sided sign test can reach 5%); each finding's measure (1: held-out success
at the end, sampled; 2: held-out turns per solved episode at the end, sampled); the test, a two-sided exact sign
test on the per-seed paired differences (a tie is dropped), at 5%. Reported beside it, not tested: the mean paired
difference with its 95% Student-t interval, and every other measure.

Each arm is the default run of ``gem-core train`` (``real``, the default scale: the embedded real model, a warm start
on hint-blind moves, then RL) but for the estimator, gamma, group size and, for finding (2), the env; ``tiny`` is the
toy scale (``TINY_RUN``). GRPO plays its 32 episodes as 8 start states x 4 (groups of 4); the other arms play 32
start states once. Every run of a finding plays the same held-out seeds, and the same seed shares its warm start, so
the comparison is paired by seed. Runs live in ``--out`` as ``<scale>-<arm>-seed<seed>``; a run already complete there
(or in a ``--read-runs`` folder: any run directory there whose settings are the arm's, e.g. the default run's own
sweep, ``benchmarks/results/default_run_seeds``, for the ReBN arm) is read back, not trained again, so an interrupted
benchmark picks up where it stopped, but only when its ``config.json`` is the arm's in every setting that shapes a
run (all of ``TrainConfig`` but where it is written and how often it checkpoints): a directory holding a run of
other settings, an older default's included, is an error, never counted.

Printed: one table per finding. Per arm, mean over seeds with a 95% confidence interval (Student's t over
seeds) of: held-out success after the warm start and at the end (sampled and greedy), the training batches'
success over the RL updates, and held-out turns per solved episode at the end; then each seed's run (held-out
success at the end, sampled, and for finding (2) its turns per solved episode); finding (2) adds the scripted
players on the same held-out episodes (binary search, a linear scan from the bottom, random valid guesses). Per
comparison, the paired difference per seed, its mean and interval, the sign test's count and p-value, and the
verdict. Written per finding: ``finding1.md``, ``finding2.md`` (its tables) and ``finding1.png``, ``finding2.png`` (the
curves per arm); a run of one finding leaves the other's files as they were.
``--report-only`` trains nothing: the tables and figures from the finished runs there are (a run still training,
or of other settings, is named as not there), and a comparison short of any seed gets no verdict, since the test
was fixed for every seed and a verdict read at a stopping point of one's choosing would not be that test.
It runs long (real: about 25 minutes per run of finding 1 alone, more for finding 2's longer episodes; ``--jobs``
runs share the cores): start it in the background.
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
from typing import Any, Callable

from gem_core.utils.cores import usable_cores
from gem_core.utils.stats import mean_interval, sign_test


@dataclass(frozen=True)
class Arm:
    name: str
    estimator: str
    gamma: float
    group_size: int = 1
    env_id: str | None = None  # None: the scale's env (the default run's)


#: Finding (2)'s game: numbers 1-20 in up to 20 turns. Its longest episode fits the default run's context (1024
#: tokens): a 106-token prompt, 20 answers of at most 16 tokens and 19 hints of about 27 (939).
LONG_GAME = "game:GuessTheNumber-v0"

ARMS = (
    Arm("rebn-0.9", "rebn", 0.9),
    Arm("reinforce-0.9", "reinforce", 0.9),
    Arm("grpo-g4", "grpo", 0.9, group_size=4),
    Arm("rebn-0.999", "rebn", 0.999),  # the easy game's gamma arm (the earlier finding (2); in no finding now)
    Arm("rebn-0.9-n20", "rebn", 0.9, env_id=LONG_GAME),
    Arm("rebn-0.99-n20", "rebn", 0.99, env_id=LONG_GAME),
    Arm("rebn-0.999-n20", "rebn", 0.999, env_id=LONG_GAME),
)


@dataclass(frozen=True)
class Finding:
    number: int
    title: str
    reference: str  # the arm the others are compared with
    compared: tuple[str, ...]
    measure: str  # the measure the paper's finding is about (MEASURES), the one the sign test is run on
    direction: int  # the direction the paper found: +1 the reference higher, -1 the reference lower


FINDINGS = (
    Finding(1, "(1) ReBN vs vanilla multi-turn REINFORCE and vs GRPO with groups of 4, gamma 0.9", "rebn-0.9", ("reinforce-0.9", "grpo-g4"), "final", +1),
    Finding(
        2,
        f"(2) gamma 0.9 vs 0.99 and 0.999, ReBN, on {LONG_GAME}: turns per solved episode",
        "rebn-0.9-n20",
        ("rebn-0.99-n20", "rebn-0.999-n20"),
        "turns_solved",
        -1,
    ),
)
#: The seeds fixed before the runs (see the module docstring): six, the fewest at which a two-sided sign test can reach 5%.
SEEDS = (0, 1, 2, 3, 4, 5)
ALPHA = 0.05
#: Whether an arm's run at a seed counts (:func:`counted_runs`).
Counted = Callable[[Arm, int], bool]
# What a run's config.json may differ in and still be the arm's run: where it is written, whether it was
# resumed, how often it checkpoints or logs, and its length (a run counts only with an evaluation after
# exactly ``--steps`` updates, checked apart).
NOT_THE_RUN = ("out", "resume", "checkpoint_every", "tensorboard", "updates")


def run_dir(out: str, arm: Arm, seed: int, scale: str) -> str:
    return os.path.join(out, f"{scale}-{arm.name}-seed{seed}")


def arm_settings(arm: Arm, seed: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The ``TrainConfig`` fields an arm sets at this scale and seed: the scale's (``extra``: TINY_RUN's
    fields, ``--set`` ones; the model always), then the estimator, gamma, group size, the arm's env and the seed."""
    from gem_core.train.trainer import TrainConfig

    env = {"env_ids": (arm.env_id,)} if arm.env_id else {}
    return {"model": TrainConfig.model, **extra, **env, "estimator": arm.estimator, "gamma": arm.gamma, "group_size": arm.group_size, "seed": seed}


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


def train_one(out: str, arm: Arm, seed: int, steps: int, extra: dict[str, Any], scale: str, threads: int = 1) -> str:
    """Train one (arm, seed) on ``threads`` torch threads, unless its run directory already holds the finished run.
    A directory that holds a run of another arm, seed or scale is an error, never counted or continued."""
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
    torch.set_num_threads(threads)  # the cores shared out between the runs at once: shared threads only contend
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

PER_SEED_LABELS = {"final": "success", "turns_solved": "turns per solved episode"}


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


def arm_numbers(out: str, arm: Arm, seeds: list[int], scale: str, counted: Counted | None = None) -> dict[str, list[float | None]]:
    """Each measure of :data:`MEASURES` per seed, in ``seeds``' order; every measure None for a seed whose run
    ``counted`` refuses (not there, not finished, or of other settings; ``counted`` None: every seed's run is read)."""
    absent = dict.fromkeys((key for key, _ in MEASURES), None)
    runs = [run_numbers(run_dir(out, arm, seed, scale)) if counted is None or counted(arm, seed) else absent for seed in seeds]
    return {key: [run[key] for run in runs] for key, _ in MEASURES}


def counted_runs(out: str, scale: str, steps: int, extra: dict[str, Any]) -> Counted:
    """Whether ``out`` holds the finished run of an arm at a seed (:func:`finished`: its evaluation after ``steps``
    updates, its config the arm's): what ``--report-only`` counts, so a run still training, or one of other
    settings, is reported as not there."""
    return lambda arm, seed: finished(run_dir(out, arm, seed, scale), steps, arm_config(arm, seed, extra))


def interval(values: list[float]) -> tuple[float, float] | None:
    """The mean's 95% confidence interval over ``values`` (Student's t, n - 1 degrees of freedom); None
    below two values."""
    return mean_interval(values, 0.95)


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


def paired_difference(reference: list[float | None], other: list[float | None], direction: int, runs_missing: int = 0) -> str:
    """``reference - other`` per seed (seeds where both have the measure): the differences, their mean and 95%
    interval, the sign test (:func:`sign_test`: how many seeds went the paper's ``direction``, its p-value) and the
    verdict, the test's alone: "reproduces" when p < :data:`ALPHA` and most seeds went the paper's way, "the
    opposite" when p < ALPHA the other way, "not shown" otherwise. With ``runs_missing`` seeds of the comparison
    not yet run, no verdict: the test was fixed for every seed, and one read before they are all in would let
    the stopping point choose it."""
    differences = [a - b for a, b in zip(reference, other) if a is not None and b is not None]
    if not differences:
        return "- | - | - | -"
    above, n, p = sign_test([d * direction for d in differences])
    per_seed = ", ".join(f"{d:+.3f}" for d in differences)
    test = f"{above} of {n} the paper's way, p = {p:.3f}"
    verdict = "not shown" if p >= ALPHA else "reproduces" if above > n - above else "the opposite"
    if runs_missing:
        verdict = f"none yet: {runs_missing} seed{'s' if runs_missing > 1 else ''} still to run"
    return f"{per_seed} | {summary(differences)} | {test} | {verdict}"


def linear_scan(env_id: str, seeds: list[int]) -> tuple[float, float | None]:
    """A linear scan from the bottom of the range (the smallest number, then the next, whatever the hints say),
    played on ``env_id`` at each of ``seeds``: (success rate, turns per solved episode)."""
    import gem_core

    env = gem_core.make(env_id)
    won = turns = 0
    try:
        for seed in seeds:
            env.reset(seed=seed)
            game = env.unwrapped
            for turn, guess in enumerate(range(game.min_number, game.max_number + 1), start=1):
                _, _, terminated, truncated, info = env.step("\\boxed{%d}" % guess)
                if terminated or truncated:
                    won += bool(info["success"])
                    turns += turn if info["success"] else 0
                    break
    finally:
        env.close()
    return won / len(seeds), (turns / won if won else None)


def scripted_players(directory: str) -> list[tuple[str, float, float | None]]:
    """The scripted players on a run's held-out episodes: the ones its ``metrics.jsonl`` recorded (the env's report
    hook: binary search, random valid guesses, the hint-blind ceiling) and a linear scan (:func:`linear_scan`), as
    (name, success rate, turns per solved episode)."""
    from gem_core.train.run import read_metrics

    with open(os.path.join(directory, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    recorded = next((r["baselines"] for r in read_metrics(os.path.join(directory, "metrics.jsonl")) if "baselines" in r), {})
    players = [(name, b["success_rate"], b.get("turns_when_solved")) for name, b in recorded.items()]
    seeds = (config.get("evaluation") or {}).get("seeds")
    if seeds is None:  # a run saved before config.json recorded its evaluation seeds: the same set, worked out again
        from gem_core.train.config import evaluation_seeds

        seeds = evaluation_seeds(config["env_ids"][0], config.get("env_kwargs") or {}, config["eval_episodes"], config.get("eval_set", "heldout"))
    return players + [("linear scan from the bottom", *linear_scan(config["env_ids"][0], seeds))]


def tables(out: str, seeds: list[int], scale: str, arms: tuple[Arm, ...] = ARMS, counted: Counted | None = None) -> str:
    """One table per finding whose reference arm and at least one compared arm are in ``arms`` (the
    comparisons of those arms alone): each arm's measures, finding (2)'s scripted players on the same episodes,
    then each comparison's paired difference on the finding's measure with the sign test. With ``counted``
    (:func:`counted_runs`), the runs it refuses are left out and named, and a comparison missing any seed has
    no verdict yet; without it, every seed's run is read."""
    by_name = {arm.name: arm for arm in arms}
    labels = dict(MEASURES)
    lines = []
    for finding in FINDINGS:
        others = tuple(name for name in finding.compared if name in by_name)
        if finding.reference not in by_name or not others:
            continue
        names = (finding.reference, *others)
        present = {name: [seed for seed in seeds if counted is None or counted(by_name[name], seed)] for name in names}
        numbers = {name: arm_numbers(out, by_name[name], seeds, scale, counted) for name in names}
        lines += [f"**{finding.title}** ({len(seeds)} seeds: {', '.join(map(str, seeds))}; mean [95% confidence interval over seeds])", ""]
        missing = [
            f"{name} seed{'s' if len(seeds) - len(present[name]) > 1 else ''} {', '.join(str(s) for s in seeds if s not in present[name])}"
            for name in names
            if len(present[name]) < len(seeds)
        ]
        if missing:
            lines += [f"Not run yet (or not finished): {'; '.join(missing)}.", ""]
        lines.append("| arm | " + " | ".join(label for _, label in MEASURES) + " |")
        lines.append("|---|" + "---|" * len(MEASURES))
        for name, values in numbers.items():
            lines.append(f"| {name} | " + " | ".join(summary(values[key]) for key, _ in MEASURES) + " |")
        # every seed's run, not the means alone (finding (2) also its turns per solved episode)
        per_seed = ("final", "turns_solved") if finding.measure == "turns_solved" else ("final",)
        lines += ["", "| each seed's run, at the end (sampled) | " + " | ".join(f"seed {seed}" for seed in seeds) + " |", "|---|" + "---|" * len(seeds)]
        for name in names:
            for key in per_seed:
                cells = ("-" if value is None else f"{value:.3f}" for value in numbers[name][key])
                lines.append(f"| {name}: {PER_SEED_LABELS[key]} | " + " | ".join(cells) + " |")
        if finding.measure == "turns_solved" and present[finding.reference]:
            lines += ["", "| scripted player, the same held-out episodes | success | turns per solved episode |", "|---|---|---|"]
            for name, success, turns in scripted_players(run_dir(out, by_name[finding.reference], present[finding.reference][0], scale)):
                lines.append(f"| {name} | {success:.3f} | {'-' if turns is None else f'{turns:.2f}'} |")
        lines += [
            "",
            f"| comparison ({labels[finding.measure]}) | paired difference per seed | mean [95% interval] | two-sided sign test | the paper's finding |",
            "|---|---|---|---|---|",
        ]
        for name in others:
            unpaired = sum(1 for seed in seeds if seed not in present[finding.reference] or seed not in present[name])
            difference = paired_difference(numbers[finding.reference][finding.measure], numbers[name][finding.measure], finding.direction, unpaired)
            lines.append(f"| {finding.reference} - {name} | {difference} |")
        lines.append("")
    return "\n".join(lines)


def plot(out: str, seeds: list[int], png: str, scale: str, arms: tuple[Arm, ...] = ARMS, counted: Counted | None = None) -> None:
    """Three panels per arm, mean over seeds with the min-max band: each update's training-batch success
    (a moving mean over 5 updates), held-out success and held-out turns per solved episode at each evaluation.
    With ``counted``, the runs it counts alone (an arm with none is left out, its seeds in the legend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for arm in arms:
        shown = [seed for seed in seeds if counted is None or counted(arm, seed)]
        if not shown:
            continue
        directories = [run_dir(out, arm, seed, scale) for seed in shown]
        label = arm.name if len(shown) == len(seeds) else f"{arm.name} ({len(shown)} of {len(seeds)} seeds)"
        train = np.array([np.convolve(training_success(d), np.ones(5) / 5, mode="valid") for d in directories])
        runs = [curves(d) for d in directories]
        steps = [e["step"] for e in runs[0]]
        success = np.array([[e["eval_success_rate"] for e in run] for run in runs])
        turns = np.array([[np.nan if e["eval_turns_when_solved"] is None else e["eval_turns_when_solved"] for e in run] for run in runs])
        for axis, x, values in ((axes[0], np.arange(5, 5 + train.shape[1]), train), (axes[1], steps, success), (axes[2], steps, turns)):
            with warnings.catch_warnings():  # an evaluation that no seed solved has no turns: a gap
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, low, high = np.nanmean(values, axis=0), np.nanmin(values, axis=0), np.nanmax(values, axis=0)
            axis.plot(x, mean, "-" if axis is axes[0] else "o-", label=label)
            axis.fill_between(x, low, high, alpha=0.15)
    axes[0].set(title="training-batch success (mean of the last 5 updates)", xlabel="RL update", ylim=(0, 1))
    axes[1].set(title="held-out success, sampled (band: min-max over seeds)", xlabel="RL update", ylim=(0, 1))
    axes[2].set(title="held-out turns per solved episode", xlabel="RL update")
    for axis in axes:
        axis.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def copy_finished(read_runs: list[str], out: str, arm: Arm, seed: int, steps: int, extra: dict[str, Any], scale: str) -> str | None:
    """A finished run of ``arm`` at ``seed`` in a ``--read-runs`` folder (any run directory there whose config.json
    is the arm's: :func:`finished`), its records (config.json, metrics.jsonl) copied into the arm's run directory
    under ``out``, with ``read_from.txt`` naming where they came from; None when there is none, or the arm's run
    directory already holds something."""
    import shutil

    target = run_dir(out, arm, seed, scale)
    if os.path.exists(target):
        return None
    expected = arm_config(arm, seed, extra)
    for folder in read_runs:
        for name in sorted(os.listdir(folder)):
            source = os.path.join(folder, name)
            if os.path.isdir(source) and finished(source, steps, expected):
                os.makedirs(target)
                for record in ("config.json", "metrics.jsonl"):
                    shutil.copy(os.path.join(source, record), os.path.join(target, record))
                with open(os.path.join(target, "read_from.txt"), "w", encoding="utf-8") as handle:
                    handle.write(source + "\n")
                return source
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--finding", type=int, choices=[f.number for f in FINDINGS], help="the arms of one finding (default: --arms, or every arm of both)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help=f"run seeds (default {' '.join(map(str, SEEDS))}: fixed before the runs)")
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=[arm.name for arm in ARMS],
        default=None,
        help="the arms to train and report (default: every arm of the findings); a finding is reported when its reference and a compared arm are",
    )
    parser.add_argument("--scale", choices=("real", "tiny"), default="real", help="the default run's settings (real model) or the toy scale's (default real)")
    parser.add_argument("--steps", type=int, default=None, help="RL updates per run (default: the scale's, the default run's or 300 tiny)")
    parser.add_argument(
        "--jobs", type=int, default=usable_cores(), help="runs at once, the cores shared out between them as torch threads (default: one a core)"
    )
    parser.add_argument("--out", default="runs/paper_findings", help="where the runs and each finding's tables (findingN.md) and figure (findingN.png) go")
    parser.add_argument(
        "--read-runs",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of finished runs (e.g. benchmarks/results/default_run_seeds): one whose settings are an arm's counts for it, not trained again",
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="another TrainConfig field for every run, e.g. --set eval_every=25")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: the tables and figures from the finished runs --out (and --read-runs) holds, the others named, no verdict while a seed is missing",
    )
    args = parser.parse_args(argv)
    if (args.steps is not None and args.steps < 1) or args.jobs < 1 or min(args.seeds) < 0:
        parser.error("--steps and --jobs must be >= 1 and seeds >= 0")
    for folder in args.read_runs:
        if not os.path.isdir(folder):
            parser.error(f"--read-runs {folder}: no such folder")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out {args.out}: a file, not a folder")
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
    if args.finding is not None:
        finding = next(f for f in FINDINGS if f.number == args.finding)
        names = {finding.reference, *finding.compared} | set(args.arms or ())
    else:
        names = set(args.arms) if args.arms else {name for f in FINDINGS for name in (f.reference, *f.compared)}
    arms = tuple(arm for arm in ARMS if arm.name in names)
    try:
        for arm in arms:
            arm_config(arm, args.seeds[0], extra)  # a bad --set is one line here, not a traceback in a worker
    except (TypeError, ValueError) as error:
        parser.error(f"--set: {error}")
    os.makedirs(args.out, exist_ok=True)
    for arm in arms:
        for seed in args.seeds:
            source = copy_finished(args.read_runs, args.out, arm, seed, steps, extra, args.scale)
            if source:
                print(f"read: {arm.name} seed {seed} from {source}", file=sys.stderr, flush=True)
    jobs = [] if args.report_only else [(arm, seed) for arm in arms for seed in args.seeds]  # arm by arm: a stopped benchmark has whole arms
    threads = max(1, usable_cores() // args.jobs)
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(train_one, args.out, arm, seed, steps, extra, args.scale, threads) for arm, seed in jobs]
        for future, (arm, seed) in zip(futures, jobs):
            future.result()
            print(f"done: {arm.name} seed {seed}", file=sys.stderr, flush=True)
    counted = counted_runs(args.out, args.scale, steps, extra)
    written = []
    # a file per finding, its tables, and its figure where two of its arms ran (finding (2)'s are another game): a
    # run of one finding leaves the other's files as they were
    for finding in FINDINGS:
        own = tuple(arm for arm in arms if arm.name in (finding.reference, *finding.compared))
        text = tables(args.out, args.seeds, args.scale, own, counted)
        if not text:  # its reference arm or every compared arm left out (--arms)
            continue
        print(text)
        written.append(f"finding{finding.number}.md")
        with open(os.path.join(args.out, written[-1]), "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
        shown = tuple(arm for arm in own if any(counted(arm, seed) for seed in args.seeds))
        if len(shown) > 1:
            written.append(f"finding{finding.number}.png")
            plot(args.out, args.seeds, os.path.join(args.out, written[-1]), args.scale, shown, counted)
    if not written:
        print("no finding has its reference arm and a compared arm among these arms: no table written")
    else:
        print(f"wrote {', '.join(os.path.join(args.out, name) for name in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
