"""A script of the repository (a benchmark under benchmarks/, not a package) loaded as a module in a test, what
the tests of benchmarks/cross_framework.py's arms check of its records, and the arguments a written launch script
hands its trainer (for the arms' CPU drivers)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any


@contextmanager
def script_module(path: str | Path) -> Iterator[ModuleType]:
    """The script at ``path`` as a module named after its file, registered in ``sys.modules`` while the
    block runs (its dataclasses and pickled functions look their module up by name), removed after it."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


#: a test of one of benchmarks/cross_framework.py's arms: 2 updates of 4 episodes, 6 held-out episodes
ARM_TEST_SETTINGS = ("training.updates=2", "rollout.episodes_per_update=4", "seeds.eval_episodes=6")


def run_arm(root: Path, trainer: str, out: Path, eval_every: int = 1, settings: tuple[str, ...] = ()) -> tuple[Any, dict]:
    """For a test of one of benchmarks/cross_framework.py's arms: the benchmark (``root``'s) run for ``trainer`` alone,
    in this Python, into ``out``, over :data:`ARM_TEST_SETTINGS` and ``settings``, from the experiment's model as it is (no warm
    start), a model kept and evaluated every ``eval_every`` updates and after the last; it must end well (else the
    run's train.log tail is the failure). Returns the run's experiment (as written into its experiment.toml) and
    its record (run.json)."""
    argv = ["--trainers", trainer, "--python", f"{trainer}={sys.executable}", "--eval-every", str(eval_every), "--warm-start", "0", "--out", str(out)]
    argv += [arg for setting in (*ARM_TEST_SETTINGS, *settings) for arg in ("--set", setting)]
    run = out / f"{trainer}-seed0"
    with script_module(Path(root) / "benchmarks" / "cross_framework.py") as cross_framework:
        status = cross_framework.main(argv)
        log = run / "train.log"
        assert status == 0, log.read_text(errors="replace")[-3000:] if log.exists() else f"exit status {status}"
        experiment = cross_framework.load_experiment(run / "experiment.toml")
    record = json.loads((run / "run.json").read_text())
    print(f"{trainer} run:", {k: record.get(k) for k in ("wall_seconds", "seconds_per_update", "peak_rss_gb")})
    return experiment, record


def keep_checkpoints(model_dir: str, folders: list[str], keep: set[int]) -> dict[str, str]:
    """For an arm's CPU driver: of the weight-sync checkpoint folders of updates 1, 2, ... (``folders``), those of the
    ``keep`` updates, each given the model's tokenizer (a Hugging Face model folder gem-core eval loads); {update: folder}."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    kept = {}
    for update, folder in enumerate(folders, start=1):
        if update in keep:
            tokenizer.save_pretrained(folder)
            kept[str(update)] = folder
    return kept


def check_arm_evaluations(out: Path, trainer: str, seed: int = 0, episodes: int | None = None) -> dict:
    """For a test of one of benchmarks/cross_framework.py's arms, after the benchmark ran into ``out``: the run
    ``<trainer>-seed<seed>`` is recorded as ended well, each model it kept is a Hugging Face model folder with its
    tokenizer, each was evaluated by gem-core eval on the starting weights' seeds (``episodes`` of them, none
    errored), each update's batch return and success rate were read from the trainer's own logs, and the table has its
    row; returns the run's record."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = out / f"{trainer}-seed{seed}"
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == 0 and record["seconds_per_update"] > 0 and record["peak_rss_gb"] > 0.5, record
    updates = max(int(update) for update in record["checkpoints"])  # the last update keeps a model
    assert record["batch_returns"] is not None and len(record["batch_returns"]) == updates, record  # read from its own logs
    success = record["batch_success"]  # each update's batch success rate, logged by the plugin in the trainer's logs
    assert success is not None and len(success) == updates and all(0.0 <= rate <= 1.0 for rate in success), record
    start = sorted(json.loads(line)["seed"] for line in open(out / "start" / "eval.jsonl"))
    assert episodes is None or len(start) == episodes
    for update, checkpoint in record["checkpoints"].items():
        AutoModelForCausalLM.from_pretrained(checkpoint)
        AutoTokenizer.from_pretrained(checkpoint)
        summary = json.loads((run / "eval" / f"update-{update}.json").read_text())
        assert summary["model"] == checkpoint and summary["episodes"] == len(start) and summary["errors"] == 0, summary
        assert sorted(json.loads(line)["seed"] for line in open(run / "eval" / f"update-{update}.jsonl")) == start
    assert f"| {trainer} {record['version']} | {seed} |" in (out / "cross_framework.md").read_text()
    return record


def script_arguments(script: str | Path, command: list[str], env: dict[str, str], extra: list[str], record: Path, cwd: Path) -> list[str]:
    """Run the launch script ``script`` (as ``gem-core experiment --trainer NAME`` writes it) in ``cwd`` with ``env``
    added and ``extra`` as its ``"$@"``: its other commands (``gem-core make-dataset ...``) run for real; the exact
    arguments it passes to ``gem-core COMMAND...`` (e.g. ``["openrlhf", "train"]``) are recorded in ``record``
    instead of run, and returned. A test platform then runs the trainer on them its own way (CPU stand-ins)."""
    words = " && ".join(f'[ "${i + 1}" = {shlex.quote(word)} ]' for i, word in enumerate(command))
    wrapper = (
        f'gem-core() {{ if {words}; then shift {len(command)}; printf "%s\\0" "$@" > "$GEM_TEST_ARGV"; '
        'else command gem-core "$@"; fi; }; export -f gem-core; exec bash "$0" "$@"'
    )
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # this Python's gem-core
    full_env = {**os.environ, **env, "GEM_TEST_ARGV": str(record), "PATH": path}
    record.unlink(missing_ok=True)
    done = subprocess.run(["bash", "-c", wrapper, str(script), *extra], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{script} failed: {done.stderr[-3000:]}")
    if not record.exists():
        raise RuntimeError(f"{script} never ran `gem-core {' '.join(command)}`")
    return [a for a in record.read_bytes().decode().split("\0") if a]


def script_precision(script: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The precision settings a written launch script gives its trainer where it runs here: its
    ``# training.precision`` lines (:func:`gem_core.experiment_scripts.precision_lines`) run by bash with ``env`` added
    (``PRECISION`` decides an ``auto`` script's), ``{NAME: value}`` of the variables they set; ``{}`` for a script
    without them. For a platform that reads the trainer's arguments from the script's text (verl's)."""
    lines = script.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("# training.precision")), None)
    if start is None:
        return {}
    end = lines.index("esac", start) if lines[start + 1].startswith("PRECISION=") else start + 1
    block = "\n".join(lines[start : end + 1])
    names = sorted(set(re.findall(r"\b([A-Z][A-Z0-9_]*)=", block)) - {"PRECISION"})
    printed = " ".join(f'"${name}"' for name in names)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # this Python's gem_core
    done = subprocess.run(
        ["bash", "-c", f"set -eu\n{block}\nprintf '%s\\0' {printed}"],
        env={**os.environ, "PATH": path, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the script's precision lines failed: {done.stderr.strip()}")
    return dict(zip(names, done.stdout.split("\0")))
