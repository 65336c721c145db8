"""What every trainer plugin's experiment writer shares (``gem-core experiment FILE --trainer NAME``): the dataset
commands an experiment's rows are made with, the held-out evaluation command, the launch script around a trainer's
command (header, ``$MODEL``, ``$DATA``, the precision chosen where it runs) and hydra overrides. The experiment
itself, its keys and checks: :mod:`gem_core.experiment`."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from gem_core.experiment import Experiment, require, require_one_env, train_rows
from gem_core.models import EMBEDDED_MODELS


def dataset_command(trainer: str, experiment: Experiment, out: str, *, held_out: bool = False, extra: tuple[str, ...] = ()) -> list[str]:
    """``gem-core make-dataset TRAINER`` for the training rows (the start states of run seed ``seeds.seed``, one a
    group, update after update: :func:`run_start_seeds`, what ``gem-core train --seed`` plays) or the
    held-out rows (``seeds.eval_start ..``, ``--balanced``: gem-core train's held-out seeds), each row carrying the experiment's env kwargs, tools and token
    and turn limits (the runner applies a row's own limits over the trainer's: gem_core.rollout.play_row)."""
    env_id = require_one_env(trainer, experiment)
    argv = ["gem-core", "make-dataset", trainer, "--env", env_id]
    if held_out:
        argv += ["--n", str(experiment.eval_episodes), "--seed-start", str(experiment.eval_seed_start), "--balanced"]
    else:
        argv += ["--n", str(train_rows(experiment)), "--run-seed", str(experiment.seed), "--per-update", str(experiment.groups_per_update)]
        argv += ["--seeds-below", str(experiment.eval_seed_start)]
    if experiment.env_kwargs:
        argv += ["--env-kwargs", _json(experiment.env_kwargs)]
    if experiment.tools:
        argv += ["--tools", ",".join(experiment.tools)]
    if experiment.max_turns:
        argv += ["--max-turns", str(experiment.max_turns)]
    argv += ["--max-turn-tokens", str(experiment.max_turn_tokens)]
    if experiment.max_context_tokens:
        argv += ["--max-context-tokens", str(experiment.max_context_tokens)]
    if experiment.stop_after_box:
        argv.append("--stop-after-box")
    return argv + list(extra) + ["--out", out]


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def shell_word(arg: str) -> str:
    """``arg`` quoted for bash; one that names ``$MODEL`` or ``$DATA`` in double quotes, so that they expand."""
    if "$" in arg:
        return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return shlex.quote(arg)


def shell_command(argv: list[str]) -> str:
    """``argv`` as one bash command, each ``--option values`` or ``key=value`` on its own continued line."""
    lines: list[str] = []
    for index, arg in enumerate(argv):
        # a flag held in a variable (the precision's, e.g. $BF16_FLAG) starts a line too, read as the option it is
        flag = arg.startswith("-") or (arg.startswith("$") and arg.endswith("_FLAG"))
        starts_line = index > 0 and (flag or ("=" in arg and not argv[index - 1].startswith("-")))
        if not lines or starts_line:
            lines.append(shell_word(arg))
        else:
            lines[-1] += " " + shell_word(arg)
    return " \\\n  ".join(lines)


def header(trainer: str, experiment: Experiment, source: str) -> list[str]:
    """The comment lines every written configuration starts with: what it runs and from which file."""
    return [
        f"# {trainer}'s configuration of the experiment {source} (gem-core experiment {source} --trainer {trainer}).",
        f"# {experiment.updates} updates of {experiment.episodes_per_update} episodes ({experiment.groups_per_update} start states x group "
        f"{experiment.group_size}) on {', '.join(experiment.env_ids)}; {experiment.estimator}, gamma {experiment.gamma:g}; lr {experiment.lr:g}.",
        f"# Training start states: run seed {experiment.seed}'s (one dataset row a group, update after update: what gem-core "
        f"train --seed {experiment.seed} plays); held-out: "
        f"{experiment.eval_episodes} seeds from {experiment.eval_seed_start} (on GuessTheNumber each target equally often: --balanced).",
        *([f"# Weights: sha256 {experiment.model_sha256} (gem_core.experiment.weights_sha256 of the model directory)."] if experiment.model_sha256 else []),
    ]


def model_assignment(experiment: Experiment) -> str:
    """The shell line that sets ``$MODEL`` to what the trainer loads: ``model.id`` itself, or for the
    embedded model's alias the checkpoint gem_core resolves it to (hub id, or the converted GGUF)."""
    name = experiment.model
    if name.strip().lower() in EMBEDDED_MODELS:
        resolve = f"from gem_core.models import resolve_model; print(resolve_model({json.dumps(name)}))"
        return f"MODEL=${{MODEL:-$(python -c {shlex.quote(resolve)})}}"
    return f"MODEL=${{MODEL:-{shlex.quote(name)}}}"


#: What each precision means, in the comment above a written script's precision settings.
PRECISION_MEANING = {
    "bf16": "the update in bfloat16, master weights and optimizer state in float32",
    "float32": "the update in float32 throughout",
    "auto": "bf16 where this machine computes in bfloat16 (a CUDA GPU with it, a CPU with AVX512-BF16 or AMX), float32 elsewhere",
}


def require_precision(trainer: str, experiment: Experiment, variables: Mapping[str, Mapping[str, str] | str]) -> None:
    """Refuse ``training.precision`` where the trainer cannot train in it: ``variables[precision]`` is then the
    reason (a string) instead of the trainer's settings (see :func:`precision_lines`). ``auto`` is decided where
    the script runs."""
    reason = variables.get(experiment.precision)
    require(trainer, experiment, "training.precision", not isinstance(reason, str), reason if isinstance(reason, str) else "")


def precision_lines(trainer: str, experiment: Experiment, variables: Mapping[str, Mapping[str, str] | str]) -> list[str]:
    """The shell lines that set the trainer's precision settings as shell variables, which its command names
    (``$NAME``): ``variables`` maps ``bf16`` and ``float32`` each to ``{NAME: value}``, or to the reason the trainer
    cannot train in it. An explicit precision is written as its values; ``auto`` as both, chosen where the script
    runs by ``python -m gem_core.precision`` (``$GEM_PRECISION`` where it is set), one that the trainer cannot
    train in stopping the script in one line."""
    require_precision(trainer, experiment, variables)
    precision = experiment.precision

    def assignments(values: Mapping[str, str]) -> str:
        return " ".join(f"{name}={shlex.quote(value)}" for name, value in values.items())

    comment = f"# training.precision = {precision!r}: {PRECISION_MEANING[precision]}".replace("'", '"')
    if precision != "auto":
        return [comment, assignments(variables[precision])]  # type: ignore[arg-type]
    lines = [comment + " ($GEM_PRECISION, where set, decides)", "PRECISION=$(python -m gem_core.precision)", 'case "$PRECISION" in']
    for name in ("bf16", "float32"):
        values = variables[name]
        if isinstance(values, str):
            other = "float32" if name == "bf16" else "bf16"
            stop = f"training.precision auto is {name} on this machine, which {trainer} cannot train in ({values}); set training.precision = {other}"
            lines.append(f"  {name}) echo {shlex.quote(stop)} >&2; exit 2 ;;")
        else:
            lines.append(f"  {name}) {assignments(values)} ;;")
    lines.append("  *) echo \"python -m gem_core.precision gave '$PRECISION', not bf16 or float32\" >&2; exit 2 ;;")
    return lines + ["esac"]


def warmup_optimizer_steps(experiment: Experiment) -> int:
    """The warm-up in optimizer steps (trainers count steps, the experiment updates)."""
    return experiment.warmup_updates * experiment.optimizer_steps_per_update


def script(trainer: str, experiment: Experiment, source: str, body: list[str], *, data: str = "./data/experiment") -> str:
    """A bash script: the header, ``$MODEL`` and ``$DATA``, then ``body`` (the dataset commands and the
    trainer's command, each already a shell line); extra arguments go to the last command."""
    lines = ["#!/usr/bin/env bash", *header(trainer, experiment, source), "set -euo pipefail", model_assignment(experiment)]
    lines += [f"DATA=${{DATA:-{data}}}", 'mkdir -p "$DATA"', *body]
    return "\n".join(lines) + "\n"


def launch_script(
    trainer: str,
    experiment: Experiment,
    source: str,
    datasets: list[list[str]],
    variables: Mapping[str, Mapping[str, str] | str],
    command: list[str],
    note: str | None = None,
) -> str:
    """The launch script of a trainer started by one command (verl, OpenRLHF, RL2, oat): its ``datasets``
    commands (:func:`dataset_command`), the precision lines (:func:`precision_lines` of ``variables``), ``note``
    (a comment line, where given), then ``command``, the script's own arguments (``"$@"``) after it."""
    body = [*(shell_command(argv) for argv in datasets), *precision_lines(trainer, experiment, variables)]
    body += [note] if note else []
    return script(trainer, experiment, source, body + [shell_command(command) + ' \\\n  "$@"'])


def hydra_value(value: Any, *, python_bools: bool = False) -> str:
    """``value`` as a hydra override writes it: ``null`` for None, ``[a,b]`` for a list, ``true``/``false`` for a
    bool (``True``/``False`` with ``python_bools``: verl's configs' spelling; hydra reads both), else ``str``."""
    if value is None:
        return "null"
    if isinstance(value, bool) and not python_bools:
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v, python_bools=python_bools) for v in value) + "]"
    return str(value)


def hydra_overrides(settings: Mapping[str, Any], *, python_bools: bool = False) -> list[str]:
    """A hydra-configured trainer's settings (``{key: value}``, verl's or RL2's) as its overrides, ``key=value``
    (:func:`hydra_value`), in the settings' order."""
    return [f"{key}={hydra_value(value, python_bools=python_bools)}" for key, value in settings.items()]


def eval_command(experiment: Experiment, checkpoint: str = "CHECKPOINT") -> list[str]:
    """``gem-core eval`` of a saved checkpoint on the experiment's held-out seeds, as every trainer's is evaluated:
    ``--balanced`` (GuessTheNumber: every target equally often), the seeds ``gem-core train`` evaluates on."""
    e = experiment
    argv = ["gem-core", "eval", *e.env_ids, "--policy", "hf", "--model", checkpoint, "--episodes", str(e.eval_episodes)]
    argv += [
        "--seed-start",
        str(e.eval_seed_start),
        "--balanced",
        "--seed",
        str(e.seed),
        "--temperature",
        repr(e.temperature),
        "--max-tokens",
        str(e.max_turn_tokens),
    ]
    if e.max_context_tokens:
        argv += ["--max-context-tokens", str(e.max_context_tokens)]
    if e.max_turns:
        argv += ["--max-turns", str(e.max_turns)]
    if e.env_kwargs:
        argv += ["--env-kwargs", _json(e.env_kwargs)]
    if e.tools:
        argv += ["--tools", ",".join(e.tools)]
    if e.stop_after_box:
        argv.append("--stop-after-box")
    return argv
