"""Tier 1 (issue 64): the same recorded batch and starting weights give the same update in every trainer.

    python benchmarks/same_update.py [--experiment examples/experiments/portable.toml] [--trainers trl]
        [--python trl=.nox/trl/bin/python] [--episodes 8] [--fault lr] [--out benchmarks/results/same_update]

Records a batch from the experiment (:mod:`tier1.batch`: the experiment's env played by scripted strategies,
one episode flagged as failed by the infrastructure, the tiny test model as actor and a moved copy as
reference), runs one update of it through each trainer's own advantage, loss, backward and optimizer code,
each in its own Python (``--python NAME=PATH``; default: ``.nox/<name>/bin/python`` where it exists, e.g. from
``nox -s trl --install-only``, else this one), computes the same update with the trainer's declared semantics
(:mod:`tier1.reference`) and prints one row per trainer: estimator, loss aggregation, the largest advantage
difference and the weight change's difference relative to its norm. A row passes when the advantages are equal
(float64: exactly; float32: within one float32 ulp of the largest) and the weight changes agree within 1e-3.

The check is made sensitive on top of the experiment (printed): a KL term (``kl_coef`` 0.05 when the file has
none), two optimizer steps at least (``epochs`` 2 when an update makes one), and :data:`SENSITIVE_LR` as the
rate (at the experiment's 1e-4 the tiny model's ratios stay inside any clip, so a clip could not be checked).
``--fault NAME`` injects one mistake on the trainers' side (lr, kl, clip, aggregation, infra): every row must
then fail. Exit status 0 when every row passes (with ``--fault``: when every row fails), 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from gem_core.errors import InvalidArgumentError  # noqa: E402
from gem_core.experiment import Experiment, load_experiment, parse_experiment, to_toml  # noqa: E402
from tier1.reference import FAULTS, TRAINERS, Comparison, Update, WEIGHT_TOLERANCE, compare, reference_update  # noqa: E402

DEFAULT_EXPERIMENT = ROOT / "examples" / "experiments" / "portable.toml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "same_update"
SENSITIVE_KL = 0.05
SENSITIVE_LR = 1e-3


def sensitive(experiment: Experiment, episodes: int | None = None) -> tuple[Experiment, list[str]]:
    """The experiment the check runs: ``experiment`` with a KL term, two optimizer steps at least, the check's
    rate and (``episodes``) a smaller batch; and what was changed, in words."""
    changes: dict[str, object] = {"lr": SENSITIVE_LR}
    if not experiment.kl_coef:
        changes["kl_coef"] = SENSITIVE_KL
    if experiment.optimizer_steps_per_update < 2:
        changes["ppo_epochs"] = 2
    if episodes:
        changes["episodes_per_update"] = episodes
    changed = dataclasses.replace(experiment, **changes)
    return changed, [f"{name}={value}" for name, value in changes.items()]


def trainer_module(name: str):
    return importlib.import_module(f"tier1.{TRAINERS[name]}")


def check(trainer: str, work: Path, experiment: Experiment, python: str, fault: str | None = None) -> tuple[Comparison, Update, Update]:
    """Run ``trainer`` on the batch in ``work`` (in ``python``) and the reference with its semantics; compare."""
    from tier1.batch import load

    result = work / f"{trainer}{'-' + fault if fault else ''}.pt"
    argv = [python, str(Path(__file__).resolve()), "--run", trainer, "--out", str(work)] + (["--fault", fault] if fault else [])
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{trainer} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    theirs = Update.load(result)
    ours = reference_update(load(work), trainer_module(trainer).semantics(experiment), steps=theirs.steps)
    return compare(theirs, ours), theirs, ours


def python_pair(text: str) -> tuple[str, str]:
    """``--python TRAINER=PATH``, checked: a known trainer and a path."""
    trainer, sep, path = text.partition("=")
    if not sep or not path or trainer not in TRAINERS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected TRAINER=PATH with TRAINER one of {', '.join(TRAINERS)}")
    return trainer, path


def prepare(experiment_file: str | Path, out: Path, episodes: int | None = None) -> tuple[Experiment, list[str], Any]:
    """The experiment made sensitive (:func:`sensitive`), written to ``out/experiment.toml``, and its batch recorded in
    ``out``: (experiment, what was changed, the recorded batch)."""
    from tier1.batch import record

    experiment, changes = sensitive(load_experiment(experiment_file), episodes)
    out.mkdir(parents=True, exist_ok=True)
    (out / "experiment.toml").write_text(to_toml(experiment))
    return experiment, changes, record(experiment, out)


def saved_experiment(out: Path, **changes: Any) -> Experiment:
    """The experiment :func:`prepare` wrote to ``out``, with ``changes``."""
    experiment = parse_experiment((out / "experiment.toml").read_text(), str(out / "experiment.toml"))
    return dataclasses.replace(experiment, **changes)


def check_here(trainer: str, work: Path, experiment: Experiment, **kwargs: Any) -> tuple[Comparison, Update, Update]:
    """:func:`check` in this process (its Python must hold the trainer): the trainer's update and the reference's."""
    from tier1.batch import load

    theirs = trainer_module(trainer).run(work, experiment, **kwargs)
    ours = reference_update(load(work), trainer_module(trainer).semantics(experiment), steps=theirs.steps)
    return compare(theirs, ours), theirs, ours


def table(rows: list[tuple[str, Experiment, Comparison | None, str]]) -> str:
    lines = [
        "| trainer | estimator | loss aggregation | largest advantage difference | relative weight-change difference | result |",
        "|---|---|---|---|---|---|",
    ]
    for trainer, e, c, note in rows:
        if c is None:
            lines.append(f"| {trainer} | {e.estimator} | {e.loss_aggregation} | - | - | {note} |")
        else:
            verdict = "pass" if c.ok else "FAIL"
            lines.append(
                f"| {trainer} | {e.estimator} | {e.loss_aggregation} | {c.advantage_difference:.2e} (tol {c.advantage_tolerance:.1e}) | {c.weight_difference:.2e} (tol {WEIGHT_TOLERANCE:.0e}) | {verdict}{note} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default=str(DEFAULT_EXPERIMENT))
    parser.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=list(TRAINERS))
    parser.add_argument("--python", action="append", default=[], metavar="TRAINER=PATH", type=python_pair)
    parser.add_argument("--episodes", type=int, default=None, help="episodes in the recorded batch (default: the experiment's episodes_per_update)")
    parser.add_argument("--fault", choices=FAULTS, default=None)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--run", choices=list(TRAINERS), help=argparse.SUPPRESS)  # inside a trainer's Python
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.run:
        update = trainer_module(args.run).run(out, saved_experiment(out), args.fault)
        update.save(out / f"{args.run}{'-' + args.fault if args.fault else ''}.pt")
        return 0

    from tier1.batch import summary

    pythons = dict(args.python)
    try:
        experiment, changes, recorded = prepare(args.experiment, out, args.episodes)
    except InvalidArgumentError as exc:  # a missing, unreadable or invalid experiment file: one line, no traceback
        parser.exit(2, f"same_update.py: error: {exc}\n")
    print(f"experiment {args.experiment}, made sensitive: {', '.join(changes)}")
    print(f"recorded batch: {summary(recorded)}")
    rows = []
    for trainer in args.trainers:
        default = ROOT / ".nox" / trainer / "bin" / "python"
        python = pythons.get(trainer) or (str(default) if default.exists() else sys.executable)
        try:
            comparison, _, ours = check(trainer, out, experiment, python, args.fault)
            clip = max(s["clip_fraction"] for s in ours.stats)
            rows.append((trainer, experiment, comparison, f" ({len(ours.steps)} steps, clipped {clip:.0%} at most)"))
        except Exception as exc:  # one trainer's failure is its row, not the table's end
            rows.append((trainer, experiment, None, f"error: {str(exc).strip().splitlines()[-1][:120]}"))
    print(table(rows))
    passed = [c is not None and c.ok for _, _, c, _ in rows]
    if args.fault:
        return 0 if all(c is not None and not c.ok for _, _, c, _ in rows) else 1
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
