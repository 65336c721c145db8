"""The default run over several seeds, as a distribution: every seed's row, the median and range, and how often a
run ends at the hint-blind ceiling (with its exact 95% interval).

    python benchmarks/default_run_seeds.py [--seeds 0 1 2 3 4] [--eval-set heldout] [--name default]
        [--out runs/default_seeds] [--report-only] [--rerun] [--experiment FILE] [-- EXTRA gem-core train OPTIONS]

Each seed is ``gem-core train --seed S --eval-set SET --out OUT/NAME-seedS EXTRA...``, the command a user runs,
one run at a time (two runs on two cores take twice as long and spoil each other's timings). A run that is
complete (evaluated after its last update) is read back, from its ``metrics.jsonl`` and ``config.json`` alone (what a
sweep keeps in the repository); one that stopped part way (a checkpoint) is continued with ``--resume``,
which reproduces the uninterrupted run bit for bit (tests/train/test_determinism.py): the sweep can be stopped
and started again, across sessions. Settings are chosen on ``--eval-set validation`` with other seeds (e.g.
100-104); the held-out set and seeds 0-4 are run once, at the end.

Printed and written to ``OUT/NAME.md`` (and, with ``--figure PNG``, the seeds as a band: :func:`figure`): per seed, held-out (or validation) success after the warm start and
after RL, sampled and greedy; the right way after "lower" and after "higher" (sampled / greedy); wall minutes
and peak memory; whether the run ended at or below the hint-blind ceiling. Then the median and range of each,
the runs that failed (no final evaluation), the Clopper-Pearson 95% interval of the rate of runs at the
ceiling, and the mean success and mean return before and after RL. Another env (``-- --env ID``) is reported with
its own evaluation size (``--eval-episodes``) and, where it has no hint-blind ceiling or hints, says so instead of
counting its runs "not at the ceiling". The table holds the sweep's other finished seeds in ``OUT`` too (``NAME-seedS``
with the same settings but the seed), so a run of some seeds does not drop the rest; a finished one of other
settings is named below it, not counted.

``--experiment FILE`` runs an experiment file over the seeds instead of the default run's flags: ``seed`` is one of
the file's keys (``gem-core train --experiment`` refuses ``--seed`` beside it), so each seed gets the file with its
seed set, written to ``OUT/NAME-seedS.toml`` (kept beside the run, what it ran) and trained with ``gem-core train
--experiment OUT/NAME-seedS.toml --eval-set SET --out OUT/NAME-seedS``. An existing copy that says otherwise than the
file (the file was edited mid-sweep) is refused in one line before anything runs or is read back, its run finished
or not, rather than mixed into the table.

``--rerun`` trains each finished seed again, the same command into ``OUT/NAME-seedS-rerun``, and says whether the
rerun is the same run: every field of every ``metrics.jsonl`` line but the machine's (timings and memory,
``gem_core.train.trainer.MACHINE_FIELDS``), the settings (``config.json`` but ``out``), and the saved weights' sha256
where both runs still hold ``model/``. Written to ``OUT/NAME-rerun.md``; the exit code is 1 if any differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Any

from gem_core.envs.report import at_or_below
from gem_core.experiment import Experiment, load_experiment, to_toml
from gem_core.train.trainer import MACHINE_FIELDS
from gem_core.utils.stats import binomial_interval

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_record(out: str) -> dict[str, Any] | None:
    """What a run directory holds: its start and final evaluations, peak memory and wall time (None: no final evaluation)."""
    path = os.path.join(out, "metrics.jsonl")
    try:
        saved = json.load(open(os.path.join(out, "config.json"), encoding="utf-8"))
        steps = saved["updates"] if "updates" in saved else saved["steps"]  # "steps": a run saved before the rename
        lines = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    except (OSError, ValueError, KeyError):
        return None
    evaluations = [line for line in lines if "eval_success_rate" in line]
    if len(evaluations) < 2 or evaluations[-1]["step"] != steps:  # finished: evaluated after its last update
        return None
    first, last = evaluations[0], evaluations[-1]
    ceiling = (first.get("baselines") or {}).get("hint-blind ceiling (random, no repeats)", {}).get("success_rate")
    wall = None
    if os.path.exists(os.path.join(out, "sweep.json")):
        wall = json.load(open(os.path.join(out, "sweep.json"), encoding="utf-8")).get("seconds")
    record = {
        "steps": last["step"],
        "start_sampled": first["eval_success_rate"],
        "start_greedy": first["eval_greedy_success_rate"],
        "sampled": last["eval_success_rate"],
        "greedy": last["eval_greedy_success_rate"],
        "lower_sampled": last.get("eval_hint_right_after_lower_rate"),
        "lower_greedy": last.get("eval_greedy_hint_right_after_lower_rate"),
        "higher_sampled": last.get("eval_hint_right_after_higher_rate"),
        "higher_greedy": last.get("eval_greedy_hint_right_after_higher_rate"),
        "start_return_sampled": first.get("eval_mean_return"),
        "start_return_greedy": first.get("eval_greedy_mean_return"),
        "return_sampled": last.get("eval_mean_return"),
        "return_greedy": last.get("eval_greedy_mean_return"),
        "peak_gb": max((line.get("peak_rss_gb") or 0.0) for line in lines),
        "minutes": None if wall is None else wall / 60,
        "episodes": saved.get("eval_episodes", 200),  # 200: the default, where a settings file leaves it out
        "ceiling": ceiling,
    }
    record["at_ceiling"] = ceiling is not None and at_or_below(min(record["sampled"], record["greedy"]), ceiling)
    return record


#: What a seed's config.json may differ in from another seed's of the same sweep.
NOT_THE_SWEEP = ("seed", "out", "resume")


def _settings(out: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(out, "config.json"), encoding="utf-8") as handle:
            return {k: v for k, v in json.load(handle).items() if k not in NOT_THE_SWEEP}
    except (OSError, ValueError):
        return None


def other_seeds(folder: str, name: str, records: dict[int, dict[str, Any] | None]) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """The finished runs ``folder`` holds of the sweep ``name`` (``NAME-seedS``) at seeds not in ``records``, where
    their settings are those of the sweep's finished runs in ``records`` (config.json but :data:`NOT_THE_SWEEP`),
    so that a run of some seeds does not drop the others from NAME.md; and a line for each finished run left out
    for other settings. Nothing when ``records`` has no finished run to compare with."""
    reference = next((_settings(os.path.join(folder, f"{name}-seed{seed}")) for seed, r in sorted(records.items()) if r is not None), None)
    found: dict[int, dict[str, Any]] = {}
    refused: list[str] = []
    if reference is None or not os.path.isdir(folder):
        return found, refused
    for entry in sorted(os.listdir(folder)):
        match = re.fullmatch(rf"{re.escape(name)}-seed(\d+)", entry)
        if not match or int(match.group(1)) in records:
            continue
        record = run_record(os.path.join(folder, entry))
        if record is None:
            continue
        settings = _settings(os.path.join(folder, entry)) or {}
        differing = sorted(key for key in set(settings) | set(reference) if settings.get(key) != reference.get(key))
        if differing:
            refused.append(f"{entry} (other settings: {', '.join(differing)})")
        else:
            found[int(match.group(1))] = record
    return found, refused


def check_seed_copy(experiment: Experiment, seed: int, out: str) -> str:
    """The text of the experiment with ``seed`` set; a copy already beside the run ``out`` (``OUT.toml``) that differs
    (the file was edited since that run) is refused in one line, finished run or not: the table would mix two
    experiments."""
    text = to_toml(dataclasses.replace(experiment, seed=seed))
    path = f"{out}.toml"
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            if handle.read() != text:
                raise SystemExit(
                    f"default_run_seeds: {path} holds another experiment than the file's with seed {seed} (edited since?): move it, or the run, away"
                )
    return text


def seed_experiment(experiment: Experiment, seed: int, out: str) -> list[str]:
    """The experiment with ``seed`` set, written to ``OUT.toml`` beside the run ``out`` (:func:`check_seed_copy`
    first); the train flags that run it."""
    text = check_seed_copy(experiment, seed, out)
    path = f"{out}.toml"
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    return ["--experiment", path]


def run_seed(seed: int, out: str, eval_set: str, extra: list[str], experiment: Experiment | None = None) -> None:
    """Train (or continue) one seed with the CLI (the experiment file's copy with this seed, where one is given); the
    wall time of the runs that made it is kept in sweep.json."""
    # the CLI of this interpreter's gem-core (`python -m gem_core.cli` is `gem-core`): no PATH needed
    what = ["--seed", str(seed)] if experiment is None else seed_experiment(experiment, seed, out)
    command = [sys.executable, "-m", "gem_core.cli", "train", *what, "--eval-set", eval_set, "--out", out, *extra]
    if os.path.exists(os.path.join(out, "checkpoint.pt")):
        command.append("--resume")
    before = 0.0
    if os.path.exists(os.path.join(out, "sweep.json")):
        before = json.load(open(os.path.join(out, "sweep.json"), encoding="utf-8")).get("seconds", 0.0)
    print("+", " ".join(command), flush=True)
    started = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "sweep.json"), "w", encoding="utf-8") as handle:
        json.dump({"seconds": before + time.perf_counter() - started, "command": command, "returncode": result.returncode}, handle)


def _weights_digest(out: str) -> dict[str, str]:
    """The sha256 of every weight file the run saved (``model/*.safetensors``); empty when it kept none."""
    folder = os.path.join(out, "model")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors")) if os.path.isdir(folder) else []
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest() for name in names}


def run_differences(first: str, second: str) -> tuple[list[str], bool]:
    """Where two runs part: each ``metrics.jsonl`` field that differs (line number and key; the machine's fields left
    out), each setting of ``config.json`` but ``out``, and the weights. Also whether the weights were compared (both
    runs hold ``model/``)."""

    def lines(out: str) -> list[dict[str, Any]]:
        with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
            return [{k: v for k, v in json.loads(line).items() if k not in MACHINE_FIELDS} for line in handle if line.strip()]

    def settings(out: str) -> dict[str, Any]:
        with open(os.path.join(out, "config.json"), encoding="utf-8") as handle:
            return {k: v for k, v in json.load(handle).items() if k != "out"}

    differences = []
    a, b = lines(first), lines(second)
    if len(a) != len(b):
        differences.append(f"metrics.jsonl: {len(a)} lines against {len(b)}")
    for number, (x, y) in enumerate(zip(a, b), start=1):
        differences += [f"metrics.jsonl line {number}: {key}" for key in sorted(set(x) | set(y)) if x.get(key) != y.get(key)]
    sa, sb = settings(first), settings(second)
    differences += [f"config.json: {key}" for key in sorted(set(sa) | set(sb)) if sa.get(key) != sb.get(key)]
    wa, wb = _weights_digest(first), _weights_digest(second)
    compared = bool(wa) and bool(wb)
    if compared and wa != wb:
        differences.append("the saved weights (sha256)")
    return differences, compared


def rerun_report(name: str, seeds: list[int], outs: dict[int, str]) -> tuple[str, bool]:
    """Each seed's run beside its rerun: the same run, or where they part. Returns the text and whether all agree."""
    lines, same = [f"### {name}: each seed run again with the same command", ""], True
    for seed in seeds:
        first, second = outs[seed], f"{outs[seed]}-rerun"
        if run_record(first) is None or run_record(second) is None:
            lines.append(f"- seed {seed}: not compared (the run or its rerun did not finish)")
            same = False
            continue
        differences, compared = run_differences(first, second)
        count = sum(1 for _ in open(os.path.join(first, "metrics.jsonl"), encoding="utf-8"))
        weights = "the saved weights' sha256 equal" if compared else "weights not compared (a run kept no model/)"
        if differences:
            same = False
            shown = "; ".join(differences[:10]) + (f"; and {len(differences) - 10} more" if len(differences) > 10 else "")
            lines.append(f"- seed {seed}: **the rerun differs** ({len(differences)} differences: {shown})")
        else:
            lines.append(
                f"- seed {seed}: the same run: {count} metrics.jsonl lines equal in every field but the machine's "
                f"({', '.join(sorted(MACHINE_FIELDS))}), the same settings, {weights}"
            )
    return "\n".join(lines), same


def update_curves(out: str) -> dict[str, list[float | None]]:
    """A run's training-batch curves per update (success rate, right way after "higher" and after "lower") and its
    evaluations (step, sampled, greedy), from its ``metrics.jsonl``."""
    lines = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") if line.strip()]
    rl = [line for line in lines if line.get("phase") == "rl" and "success_rate" in line]
    evaluations = [line for line in lines if "eval_success_rate" in line]
    return {
        "step": [line["step"] for line in rl],
        "success_rate": [line["success_rate"] for line in rl],
        "higher": [line.get("hint_right_after_higher_rate") for line in rl],
        "lower": [line.get("hint_right_after_lower_rate") for line in rl],
        "eval_step": [line["step"] for line in evaluations],
        "eval_sampled": [line["eval_success_rate"] for line in evaluations],
        "eval_greedy": [line["eval_greedy_success_rate"] for line in evaluations],
        "baselines": [(name, b["success_rate"]) for name, b in ((evaluations[0].get("baselines") or {}) if evaluations else {}).items()],
    }


def band(rows: list[list[float | None]]) -> tuple[list[float], list[float], list[float]]:
    """Per position across the seeds' rows (equal lengths): the median, the lowest and the highest, missing values
    (a batch without that hint) left out; NaN where no seed has a value."""
    medians, lows, highs = [], [], []
    for column in zip(*rows):
        values = [v for v in column if v is not None]
        medians.append(statistics.median(values) if values else math.nan)
        lows.append(min(values) if values else math.nan)
        highs.append(max(values) if values else math.nan)
    return medians, lows, highs


def figure(name: str, seeds: list[int], outs: dict[int, str], path: str, eval_set: str) -> str:
    """Every finished seed as a band: the training batch's success (median line, range shaded, each seed thin), the
    right way after "higher" and after "lower" in the training batch (a run drifting to "always go down" shows as
    "higher" falling to 0), and each seed's evaluations, sampled and greedy, with the scripted baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {seed: update_curves(out) for seed, out in outs.items()}
    where = "held-out" if eval_set == "heldout" else "validation"
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for axis, key, title in (
        (axes[0], "success_rate", "success (training batch)"),
        (axes[1], "higher", 'right way after "higher" / "lower" (training batch)'),
    ):
        keys = [key] if key != "higher" else ["higher", "lower"]
        for key_, color in zip(keys, ("tab:blue", "tab:orange")):
            length = min(len(c[key_]) for c in curves.values())
            steps = next(iter(curves.values()))["step"][:length]
            rows = [c[key_][:length] for c in curves.values()]
            for row in rows:
                axis.plot(steps, [math.nan if v is None else v for v in row], color=color, alpha=0.25, linewidth=0.8)
            median, low, high = band(rows)
            label = {"success_rate": "success", "higher": 'after "higher"', "lower": 'after "lower"'}[key_]
            axis.fill_between(steps, low, high, color=color, alpha=0.15)
            axis.plot(steps, median, color=color, linewidth=2, label=f"{label}: median, range shaded, seeds thin")
        axis.set(title=title, xlabel="update", ylim=(0, 1.05))
        axis.legend(fontsize=7)
    for seed, c in curves.items():
        axes[2].plot(c["eval_step"], c["eval_sampled"], "o-", color="tab:blue", alpha=0.5)
        axes[2].plot(c["eval_step"], c["eval_greedy"], "s--", color="tab:green", alpha=0.5)
    axes[2].plot([], [], "o-", color="tab:blue", label="sampled (a line a seed)")
    axes[2].plot([], [], "s--", color="tab:green", label="greedy (a line a seed)")
    baselines = next(iter(curves.values()))["baselines"]
    for (baseline, value), style in zip(baselines, (":", "--", "-.")):
        for axis in (axes[0], axes[2]):
            axis.axhline(value, color="grey", linestyle=style, linewidth=1, label=f"{baseline} {value:.3f}" if axis is axes[2] else None)
    episodes = {record["episodes"] for record in map(run_record, outs.values()) if record is not None}
    axes[2].set(title=f"success ({where}, {_episodes(episodes)} episodes)", xlabel="update", ylim=(0, 1.05))
    axes[2].legend(fontsize=7)
    fig.suptitle(f"{name}: seeds {', '.join(map(str, seeds))} ({len(curves)} of {len(seeds)} finished)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _cell(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _episodes(counts: set[int]) -> str:
    """The evaluation's size: one number where every run used the same (200 is the default; the env's balanced
    seeds where it has them, GuessTheNumber's targets), else each."""
    return "/".join(str(count) for count in sorted(counts)) or "?"


def report(name: str, seeds: list[int], records: dict[int, dict[str, Any] | None], eval_set: str, extra: list[str], experiment_file: str | None = None) -> str:
    where = "held-out" if eval_set == "heldout" else "validation"
    what = ["--seed S"] if experiment_file is None else [f"--experiment {name}-seedS.toml"]
    command = "`" + " ".join(["gem-core train", *what, *extra, f"--eval-set {eval_set}"]) + "`"
    if experiment_file is not None:
        command += f" (`{experiment_file}` with seed S)"
    episodes = _episodes({r["episodes"] for r in records.values() if r is not None})
    lines = [
        f"### {name}: {command}, seeds {', '.join(map(str, seeds))} ({where} set, {episodes} episodes an evaluation)",
        "",
        '| seed | after the warm start, sampled / greedy | after RL, sampled | after RL, greedy | right way after "lower" (s / g) | after "higher" (s / g) | minutes | peak GB (updates) | at the ceiling |',
        "|---|---|---|---|---|---|---|---|---|",
    ]
    done = {seed: r for seed, r in records.items() if r is not None}
    for seed in seeds:
        r = records.get(seed)
        if r is None:
            lines.append(f"| {seed} | failed or not run | | | | | | | |")
            continue
        lines.append(
            f"| {seed} | {_cell(r['start_sampled'])} / {_cell(r['start_greedy'])} | {_cell(r['sampled'])} | {_cell(r['greedy'])} | "
            f"{_cell(r['lower_sampled'])} / {_cell(r['lower_greedy'])} | {_cell(r['higher_sampled'])} / {_cell(r['higher_greedy'])} | "
            f"{_cell(r['minutes'], 1)} | {_cell(r['peak_gb'], 2)} | {'yes' if r['at_ceiling'] else 'no'} |"
        )
    if done:

        def summary(key: str) -> str:
            values = [r[key] for r in done.values() if r[key] is not None]
            return "-" if not values else f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"

        lines.append(
            f"| median [range] | {summary('start_sampled')} / {summary('start_greedy')} | {summary('sampled')} | {summary('greedy')} | "
            f"{summary('lower_sampled')} / {summary('lower_greedy')} | {summary('higher_sampled')} / {summary('higher_greedy')} | "
            f"{summary('minutes')} | {summary('peak_gb')} | |"
        )
        at = sum(1 for r in done.values() if r["at_ceiling"])
        low, high = binomial_interval(at, len(done))
        ceiling = next(iter(done.values()))["ceiling"]
        if ceiling is None:  # another env: GuessTheNumber's hint-blind policy has no counterpart there
            at_ceiling = "the env has no hint-blind ceiling"
        else:
            at_ceiling = (
                f"{at} of {len(done)} ended at or below the hint-blind ceiling ({_cell(ceiling)}, sampled or greedy): "
                f"exact 95% interval of that rate [{low:.3f}, {high:.3f}]"
            )

        def mean(key: str) -> str:
            values = [r[key] for r in done.values() if r[key] is not None]
            return "-" if not values else f"{statistics.mean(values):.3f}"

        lines += [
            "",
            f"{len(done)} of {len(seeds)} runs finished ({len(seeds) - len(done)} failed or not run); {at_ceiling}. "
            f"Mean after RL: {mean('sampled')} sampled, {mean('greedy')} greedy. Mean return after the warm start "
            f"{mean('start_return_sampled')} sampled / {mean('start_return_greedy')} greedy, after RL "
            f"{mean('return_sampled')} / {mean('return_greedy')}.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--eval-set", choices=("heldout", "validation"), default="heldout")
    parser.add_argument("--name", default="default", help="the sweep's name: runs are OUT/NAME-seedS (default: default)")
    parser.add_argument("--out", default="runs/default_seeds")
    parser.add_argument("--report-only", action="store_true", help="read the runs back, train none")
    parser.add_argument("--figure", metavar="PNG", default=None, help="also draw the finished seeds as a band (needs matplotlib)")
    parser.add_argument("--rerun", action="store_true", help="train each finished seed again (OUT/NAME-seedS-rerun) and say whether it is the same run")
    parser.add_argument("--experiment", metavar="FILE", default=None, help="run this experiment file over the seeds (a copy a seed: OUT/NAME-seedS.toml)")
    args = parser.parse_args(argv)
    experiment = None
    if args.experiment is not None:
        try:
            experiment = load_experiment(args.experiment)
        except (OSError, ValueError) as error:
            parser.error(f"--experiment: {error}")
    if args.rerun and args.report_only:
        parser.error("--rerun trains; with --report-only it would compare nothing")
    if experiment is not None:  # every seed's copy, before any run: a finished run of an older file is not read back either
        for seed in args.seeds:
            check_seed_copy(experiment, seed, os.path.join(args.out, f"{args.name}-seed{seed}"))
    records: dict[int, dict[str, Any] | None] = {}
    for seed in args.seeds:
        out = os.path.join(args.out, f"{args.name}-seed{seed}")
        record = run_record(out)
        if record is None and not args.report_only:
            run_seed(seed, out, args.eval_set, extra, experiment)
            record = run_record(out)
        records[seed] = record
    found, refused = other_seeds(args.out, args.name, records)
    reported = sorted({**records, **found})
    text = report(args.name, reported, {**records, **found}, args.eval_set, extra, args.experiment)
    if refused:
        text += "\n\nLeft out of this table, finished with other settings than the seeds above: " + "; ".join(refused) + "."
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.name}.md"), "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    finished = {seed: os.path.join(args.out, f"{args.name}-seed{seed}") for seed, record in records.items() if record is not None}
    if args.figure and (finished or found):
        shown = {**finished, **{seed: os.path.join(args.out, f"{args.name}-seed{seed}") for seed in found}}
        print("figure:", figure(args.name, reported, dict(sorted(shown.items())), args.figure, args.eval_set))
    if not args.rerun:
        return 0
    for seed, out in finished.items():
        if run_record(f"{out}-rerun") is None:
            run_seed(seed, f"{out}-rerun", args.eval_set, extra, experiment)
    text, same = rerun_report(args.name, args.seeds, {seed: os.path.join(args.out, f"{args.name}-seed{seed}") for seed in args.seeds})
    print(text)
    with open(os.path.join(args.out, f"{args.name}-rerun.md"), "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
