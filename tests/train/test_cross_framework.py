"""benchmarks/cross_framework.py: the experiment each run trains (the benchmark's settings, --set), the points
where models are saved, the table's reading against the reference trainer's range, bad arguments in one line,
the process-tree memory it reports, and the whole benchmark end to end on the reference trainer with a tiny
model (trained, each saved model evaluated by gem-core eval, the table and the figure written, nothing redone
when run again). TRL's arm runs in the trl session (tests/integrations/trl/test_experiment.py), verl's in
the verl_real session (tests/integrations/verl/real/test_verl_experiment_run.py), OpenRLHF's in the openrlhf_real
session (tests/integrations/openrlhf/real/test_openrlhf_experiment_run.py), RL2's in the rl2_real session
(tests/integrations/rl2/real/test_rl2_experiment_run.py); those three are marked benchmark_arm, out of the default sessions
(`nox -s verl_real openrlhf_real rl2_real -- -m benchmark_arm` runs them)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gem_core.experiment import load_experiment, weights_sha256
from gem_core.precision import kernel_flags
from gem_core.utils import stats
from helpers.scripts import script_module

ROOT = Path(__file__).resolve().parents[2]
PORTABLE = ROOT / "examples" / "experiments" / "portable.toml"


@pytest.fixture(scope="module")
def cross_framework():
    with script_module(ROOT / "benchmarks" / "cross_framework.py") as module:
        yield module


def test_each_run_trains_the_file_with_the_benchmarks_groups_evaluations_and_seed(cross_framework):
    base = cross_framework.settings_experiment(PORTABLE, [])
    run = cross_framework.run_experiment(base, seed=2, eval_every=10)
    assert (run.seed, run.group_size, run.eval_every) == (2, 2, 10)
    assert run.updates == base.updates == 30 and run.lr == base.lr and run.estimator == base.estimator
    assert cross_framework.eval_points(run) == [10, 20, 30]
    assert cross_framework.eval_points(cross_framework.run_experiment(base, 0, 7)) == [7, 14, 21, 28, 30]
    assert cross_framework.eval_points(cross_framework.run_experiment(base, 0, 0)) == [30]  # the end alone


def test_the_reference_runs_over_seeds_the_others_over_trainer_seeds(cross_framework, monkeypatch):
    jobs = cross_framework.benchmark_jobs(["reference", "trl", "verl"], [0, 1, 2], None)
    assert jobs == [("reference", 0), ("reference", 1), ("reference", 2), ("trl", 0), ("verl", 0)]  # others: the first seed
    jobs = cross_framework.benchmark_jobs(["reference", "trl"], [0, 1], [1, 2, 1])
    assert jobs == [("reference", 0), ("reference", 1), ("trl", 1), ("trl", 2)]  # a seed named twice runs once
    parsed = []
    monkeypatch.setattr(cross_framework, "run_benchmark", lambda args: parsed.append(args) or 0)
    assert cross_framework.main(["--seeds", "3", "4", "--trainer-seeds", "5", "6"]) == 0
    assert (parsed[0].seeds, parsed[0].trainer_seeds) == ([3, 4], [5, 6])


def test_set_replaces_a_key_of_the_file_and_is_checked_as_the_file_is(cross_framework):
    changed = cross_framework.settings_experiment(PORTABLE, ["training.updates=4", "rollout.episodes_per_update=8", 'model.id="elsewhere"'])
    assert (changed.updates, changed.episodes_per_update, changed.model) == (4, 8, "elsewhere")
    bad = {
        "training.updatez=4": "unknown key training.updatez",
        "optimizer.lr=-1.0": "optimizer.lr=-1.0 is not allowed",
        "training.updates": "expected SECTION.KEY=VALUE",
        "model.id=elsewhere": "is not a TOML value",
    }
    for setting, message in bad.items():
        with pytest.raises(cross_framework.BenchmarkError, match=message):
            cross_framework.settings_experiment(PORTABLE, [setting])


def test_a_group_size_the_episodes_cannot_hold_is_one_line(cross_framework, capsys):
    status = cross_framework.main(["--set", "rollout.group_size=3", "--trainers", "reference", "--out", "/nonexistent/never-written"])
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cross_framework: error: --set:") and "group_size" in err[0]
    assert cross_framework.main(["--eval-every", "-1"]) == 2 and "--eval-every -1" in capsys.readouterr().err


def test_a_bad_python_is_one_line(cross_framework, capsys, tmp_path):
    for pair, message in (("trl", "expected NAME=PATH"), ("roll=/usr/bin/python3", "NAME one of"), (f"trl={tmp_path}/none", "not an executable")):
        assert cross_framework.main(["--python", pair, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    # a Python without the trainer: named, with how to get one
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'trl'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    assert cross_framework.main(["--trainers", "trl", "--python", f"trl={fake}", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot import gem_integrations.trl (ModuleNotFoundError: No module named 'trl')" in err[0] and "nox -s trl" in err[0]
    assert not (tmp_path / "out").exists()  # refused before anything ran
    # verl, OpenRLHF and RL2 have no default Python (their CPU runs need their real tiers' virtualenvs): asked for, it is named
    for trainer in ("verl", "openrlhf", "rl2"):
        assert cross_framework.main(["--trainers", trainer, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"pass --python {trainer}=PATH" in err[0] and f"nox -s {trainer}_real" in err[0], err
        assert not (tmp_path / "out").exists()


def test_a_recorded_run_is_read_back_a_failed_one_run_again_another_experiments_refused(cross_framework, monkeypatch, tmp_path, capsys):
    experiment = cross_framework.run_experiment(cross_framework.settings_experiment(PORTABLE, []), 0, 10)
    trained = []

    def fake_runner(experiment_file, run, python, experiment):
        trained.append(run.name)
        return {"status": 1 if len(trained) == 1 else 0, "wall_seconds": 1.0, "peak_rss_gb": 0.1}  # fails the first time only

    monkeypatch.setitem(cross_framework.RUNNERS, "reference", fake_runner)
    monkeypatch.setattr(cross_framework, "trainer_version", lambda trainer, python: "0")
    run = tmp_path / "reference-seed0"
    assert cross_framework.train("reference", experiment, run, sys.executable)["status"] == 1
    assert cross_framework.train("reference", experiment, run, sys.executable)["status"] == 0  # the failed run, run again
    assert "reference-seed0: the recorded run failed" in capsys.readouterr().out
    assert cross_framework.train("reference", experiment, run, sys.executable)["status"] == 0  # read back, not run
    assert trained == ["reference-seed0"] * 2
    with pytest.raises(cross_framework.BenchmarkError, match="another experiment"):
        cross_framework.train("reference", cross_framework.run_experiment(experiment, 1, 10), run, sys.executable)


def test_a_run_killed_from_outside_says_by_what(cross_framework, tmp_path):
    """A run the kernel's OOM killer ends leaves a log that stops mid-run (a progress bar): the record names the
    signal first, then the log's last line."""
    log = tmp_path / "train.log"
    log.write_text("update 3\nLoading weights: 100%|##########| 272/272\n")
    assert cross_framework.failure(-9, log) == "killed by SIGKILL (out of memory?); its log ends: Loading weights: 100%|##########| 272/272"
    assert cross_framework.failure(-15, log).startswith("killed by SIGTERM; its log ends: ")
    assert cross_framework.failure(-200, log).startswith("killed by signal 200; ")
    assert cross_framework.failure(1, log) == "Loading weights: 100%|##########| 272/272"
    assert cross_framework.failure(1, tmp_path / "none.log") == "(no output)"


def _result(cross_framework, trainer, seed, finals, status=0):
    curve = {0: {"success_rate": 0.1, "hint_right_after_lower_rate": None}}
    curve |= {10 * (i + 1): {"success_rate": value, "hint_right_after_lower_rate": 0.5} for i, value in enumerate(finals)}
    record = {"status": status, "version": "1.0", "wall_seconds": 600.0, "peak_rss_gb": 3.0, "seconds_per_update": 20.0, "error": "boom"}
    return cross_framework.RunResult(trainer, seed, record, curve)


def test_the_tables_read_each_trainer_over_its_seeds_against_the_reference(cross_framework):
    results = [
        _result(cross_framework, "reference", 0, [0.2, 0.40]),
        _result(cross_framework, "reference", 1, [0.3, 0.60]),
        _result(cross_framework, "trl", 0, [0.3, 0.50]),
        _result(cross_framework, "verl", 0, [0.3, 0.35]),
        _result(cross_framework, "openrlhf", 0, [], status=1),
    ]
    results[3].record["batch_returns"] = [0.2, -0.1, -0.1]  # verl: every episode malformed from update 2
    results[2].record["batch_returns"] = [0.2, -0.1 + 1e-3, 0.3]  # trl: near, not at, the floor
    assert cross_framework.reference_finals(results) == [0.40, 0.60]
    rows = cross_framework.table(results, [10, 20], format_error_reward=-0.1).splitlines()
    assert rows[0] == '| trainer | seed | success @0 | success @10 | success @20 | right after "lower" | collapsed at | s / update | wall (min) | peak GB |'
    assert "| 0.500 | 0.500 | - | 20.0 |" in rows[4] and "| 0.350 | 0.500 | 2 | 20.0 |" in rows[5]
    assert "failed: boom" in rows[6]
    assert "| 0.400 | 0.500 | ? | 20.0 | 10.0 | 3.00 |" in rows[2]  # no returns recorded
    assert cross_framework.collapsed_at(None, -0.1) is None and cross_framework.collapsed_at([-0.1], -0.1) == 1
    assert cross_framework.collapsed_at([0.5, -0.1, 0.4, -0.1, -0.1], -0.1) == 4  # one unlucky batch is not a collapse
    assert cross_framework.collapsed_at([0.5, -0.1, 0.4], -0.1) is None
    results.append(_result(cross_framework, "verl", 1, [0.3, 0.45]))  # a second verl seed that kept its signal
    results[-1].record["batch_returns"] = [0.2, 0.3, 0.1]
    rows = cross_framework.trainer_table(results, format_error_reward=-0.1).splitlines()
    assert rows[0] == (
        "| trainer | runs | collapsed [exact 95%] | final success by seed | mean [95%] | mean, not collapsed | equivalent to the reference within (TOST, 5%) |"
    )
    margin = stats.equivalence_margin([0.35, 0.45], [0.40, 0.60])
    low, high = stats.mean_interval([0.40, 0.60])
    assert rows[2:] == [
        f"| reference | 2 | 0 [0.000, 0.842] | 0.400 (0), 0.600 (1) | 0.500 [{low:.3f}, {high:.3f}] | 0.500 | - |",
        "| trl | 1 | 0 [0.000, 0.975] | 0.500 (0) | 0.500 | 0.500 | - |",  # one run: no interval, no test
        f"| verl | 2 | 1 [0.013, 0.987] | 0.350 (0), 0.450 (1) | 0.400 [{stats.mean_interval([0.35, 0.45])[0]:.3f}, "
        f"{stats.mean_interval([0.35, 0.45])[1]:.3f}] | 0.450 | {margin:.3f} |",
    ]  # the failed OpenRLHF run has no row


def test_a_trainer_whose_weights_never_moved_is_told_apart_from_one_that_learns_alike(cross_framework):
    """The check the old "inside the reference's range" could not make: five runs that end where they started
    (0.315) against a reference that learns get a margin wider than the gap; five runs drawn like the reference's get
    a margin of the spread's size."""
    reference = [0.70, 0.80, 0.75, 0.90, 0.65]
    frozen = [0.315] * 5
    alike = [0.72, 0.78, 0.70, 0.85, 0.68]
    results = [_result(cross_framework, "reference", seed, [value]) for seed, value in enumerate(reference)]
    results += [_result(cross_framework, "trl", seed, [value]) for seed, value in enumerate(frozen)]
    results += [_result(cross_framework, "verl", seed, [value]) for seed, value in enumerate(alike)]
    margins = {line.split(" | ")[0].strip("| "): float(line.rsplit("|", 2)[1]) for line in cross_framework.trainer_table(results).splitlines()[3:]}
    assert margins["trl"] > statistics.fmean(reference) - 0.315 > 0.4
    assert margins["verl"] < 0.15


def test_the_figure_draws_each_trainer_as_its_median_and_range_over_seeds(cross_framework, tmp_path):
    pytest.importorskip("matplotlib")

    class Axis:  # what _band draws, recorded
        def __init__(self):
            self.calls = []

        def fill_between(self, x, low, high, **kw):
            self.calls.append(("range", list(x), list(low), list(high)))

        def plot(self, x, y, **kw):
            self.calls.append(("line", list(x), list(y), kw["label"]))

    axis = Axis()
    cross_framework._band(axis, [{0: 0.3, 10: 0.5, 20: 0.7}, {0: 0.3, 10: 0.1, 20: 0.9}, {0: 0.3, 10: 0.2}], "C1", "verl", "o")
    assert axis.calls == [("range", [0, 10, 20], [0.3, 0.1, 0.7], [0.3, 0.5, 0.9]), ("line", [0, 10, 20], [0.3, 0.2, 0.8], "verl: median, range shaded")]
    axis = Axis()
    cross_framework._band(axis, [{0: 0.3, 10: 0.5}], "C1", "trl", "o")  # one run: its line, no band
    assert axis.calls == [("line", [0, 10], [0.3, 0.5], "trl")]
    results = [_result(cross_framework, "reference", seed, [0.4 + 0.1 * seed, 0.5]) for seed in range(3)]
    results += [_result(cross_framework, "trl", 0, [0.3, 0.35]), _result(cross_framework, "verl", 0, [], status=1)]
    results[1].curve[10]["hint_right_after_lower_rate"] = None  # never saw "lower": no point
    for r in results[:4]:
        r.record["batch_returns"], r.record["batch_success"] = [0.2, 0.3, 0.4], [0.3, 0.4, 0.5]
    cross_framework.figure(results, {"binary search": 1.0}, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 1000


def test_each_trainers_batch_returns_and_success_are_read_from_its_own_logs(cross_framework, tmp_path):
    """The shapes each trainer logs in (from this machine's records): gem-core train's metrics.jsonl (its rl steps,
    not the warm start), TRL's logged gem/episode_return and gem/success_rate, verl's critic/score/mean and
    gem/success_rate, OpenRLHF's reward and gem_success, RL2's scores/train and gem/success_rate in their drivers'
    reports; no logs, or logs without the key, give None (not an empty list)."""
    logs = {
        "reference": (
            "train/metrics.jsonl",
            '{"phase": "warm_start", "mean_return": 9, "success_rate": 9}\n{"phase": "rl", "mean_return": 0.5, "success_rate": 0.25}\n'
            '{"phase": "rl", "mean_return": -0.1, "success_rate": 0.75}\n',
        ),
        "trl": (
            "train.log",
            "{'loss': '0.01', 'gem/episode_return': '0.5', 'gem/success_rate': '0.25', 'x': '1'}\nnoise\n"
            "{'gem/episode_return': '-0.1', 'gem/success_rate': '0.75'}\n",
        ),
        "verl": (
            "train/verl_run.json",
            json.dumps(
                {
                    "updates": [
                        {"update": 1, "metrics": {"critic/score/mean": 0.5, "gem/success_rate": 0.25}},
                        {"update": 2, "metrics": {"critic/score/mean": -0.1, "gem/success_rate": 0.75}},
                    ]
                }
            ),
        ),
        "openrlhf": (
            "train/openrlhf_run.json",
            json.dumps(
                {
                    "updates": [
                        {"global_step": 1, "return": 7.0, "reward": 0.5, "gem_success": 0.25},
                        {"global_step": 2, "return": 7.0, "reward": -0.1, "gem_success": 0.75},
                    ]
                }
            ),
        ),
        "rl2": (
            "train/rl2_run.json",
            json.dumps({"updates": [{"step": 1, "scores/train": 0.5, "gem/success_rate": 0.25}, {"step": 2, "scores/train": -0.1, "gem/success_rate": 0.75}]}),
        ),
    }
    for trainer, (name, text) in logs.items():
        run = tmp_path / trainer
        assert cross_framework.batch_returns(trainer, run) is None  # nothing logged (a record read back from git)
        assert cross_framework.batch_success(trainer, run) is None
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)
        assert cross_framework.batch_returns(trainer, run) == [0.5, -0.1], trainer
        assert cross_framework.batch_success(trainer, run) == [0.25, 0.75], trainer
        key = cross_framework.BATCH_KEYS[trainer][1]  # a plugin that did not log its success rate then: none, not a guess
        (run / name).write_text(text.replace(key, "gem/other"))
        assert cross_framework.batch_success(trainer, run) is None, trainer


def test_a_warm_starts_fingerprint_says_how_far_weights_built_again_are(cross_framework, tmp_path):
    """Where a warm start built again has another sha256, its fingerprint against the recorded one tells float
    rounding from another start: a weight moved by 1e-6 is within 1e-6, one moved by 0.5 is not, a tensor more is named."""
    torch = pytest.importorskip("torch")  # the fingerprint reads weights through torch; the core_py sessions have none
    np = pytest.importorskip("numpy")
    save_file = pytest.importorskip("safetensors.numpy").save_file
    rng = np.random.default_rng(0)
    weights = {"a.weight": rng.standard_normal((64, 33)).astype(np.float32), "b.bias": rng.standard_normal(7).astype(np.float32)}

    def fingerprint(tensors: dict) -> dict:
        model = tmp_path / f"model-{len(list(tmp_path.iterdir()))}"
        model.mkdir()
        save_file(tensors, str(model / "model.safetensors"))
        return cross_framework.weights_fingerprint(model)

    recorded = fingerprint(weights)
    assert recorded["b.bias"][1:] == [float(weights["b.bias"][i]) for i in (0, 2, 4, 6)]  # the ends and between, by size
    assert cross_framework.fingerprint_distance(recorded, fingerprint(weights)) == "norms within 0.0e+00 relative, the kept values within 0.0e+00"
    rounded = {**weights, "a.weight": weights["a.weight"] + np.float32(1e-6)}
    distance = cross_framework.fingerprint_distance(recorded, fingerprint(rounded))
    norms, values = (float(x) for x in re.findall(r"within ([0-9.e+-]+)", distance))
    assert 0 < norms < 1e-5 and 0 < values < 2e-6, distance
    moved = {**weights, "b.bias": weights["b.bias"] + np.float32(0.5)}
    assert float(re.findall(r"within ([0-9.e+-]+)", cross_framework.fingerprint_distance(recorded, fingerprint(moved)))[1]) == pytest.approx(0.5, rel=1e-3)
    assert cross_framework.fingerprint_distance(recorded, fingerprint({**weights, "c": np.ones(3, np.float32)})).startswith("other tensors (1 ")
    # the numbers behind the words, which decide whether a start built on another kind of CPU is the same start
    gaps = cross_framework.fingerprint_gaps(recorded, fingerprint(rounded))
    assert (f"{gaps[0]:.1e}", f"{gaps[1]:.1e}") == (f"{norms:.1e}", f"{values:.1e}")
    assert cross_framework.fingerprint_gaps(recorded, fingerprint(moved))[1] > 1000 * cross_framework.SAME_START_VALUES
    assert cross_framework.fingerprint_gaps(recorded, fingerprint({**weights, "c": np.ones(3, np.float32)})) is None
    assert cross_framework.fingerprint_gaps({}, recorded) is None
    # bfloat16 weights and an empty tensor read too (numpy has no bfloat16)
    from safetensors.torch import save_file as save_torch

    model = tmp_path / "bf16"
    model.mkdir()
    save_torch({"w": torch.arange(10, dtype=torch.bfloat16), "empty": torch.zeros(0)}, str(model / "model.safetensors"))
    assert cross_framework.weights_fingerprint(model) == {"w": [pytest.approx(float(torch.arange(10.0).norm())), 0.0, 3.0, 6.0, 9.0], "empty": [0.0]}
    # a recorded fingerprint that is not one (cut short, hand-edited) is said in words, inside the one-line error
    broken = tmp_path / "fingerprint.json"
    for text in ('{"a.weight": [1.0, 2.0', '["not", "a", "dict"]', '{"a.weight": "x"}'):
        broken.write_text(text)
        assert cross_framework.read_fingerprint(broken) == {}
        assert cross_framework.fingerprint_distance(cross_framework.read_fingerprint(broken), recorded) == "the recorded fingerprint names no tensor"
    cross_framework.write_fingerprint(broken, tmp_path / "model-0")
    assert cross_framework.read_fingerprint(broken) == recorded


def test_the_memory_of_a_process_tree_counts_its_children(cross_framework):
    """A shell (a few MB itself) whose child holds 200 MB: the tree's memory is the child's and more."""
    code = "import time; b = bytearray(200_000_000); time.sleep(30)"
    shell = subprocess.Popen(["sh", "-c", f"{sys.executable} -c '{code}' & wait"], start_new_session=True)
    try:
        for _ in range(200):
            if cross_framework.tree_rss_bytes(shell.pid) > 200_000_000:
                break
            time.sleep(0.1)
        assert cross_framework.tree_rss_bytes(shell.pid) > 200_000_000
        with open(f"/proc/{shell.pid}/status") as handle:
            own = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmRSS:"))
        assert own < 50_000_000
    finally:
        os.killpg(shell.pid, signal.SIGKILL)  # the shell and its child: their own process group
        shell.wait()
    assert cross_framework.tree_rss_bytes(shell.pid) == 0  # ended


@pytest.mark.slow
def test_the_benchmark_runs_evaluates_and_reports_the_reference_trainer(cross_framework, request, tmp_path, capsys):
    torch = pytest.importorskip("torch")  # the core_py sessions have none
    pytest.importorskip("transformers")
    tiny = request.getfixturevalue("tiny")
    out = tmp_path / "out"
    argv = ["--trainers", "reference", "--seeds", "0", "1", "--eval-every", "1", "--warm-start", "1", "--out", str(out)]
    argv += ["--set", f'model.id="{tiny[0]}"', "--set", "training.updates=2", "--set", "rollout.episodes_per_update=4", "--set", "seeds.eval_episodes=10"]
    assert cross_framework.main(argv) == 0
    # the warm start, once: gem-core train --steps 0 from the experiment's model; every run and evaluation starts there
    warm = json.loads((out / "start" / "warm_start.json").read_text())
    model = out / "start" / "train" / "model"
    assert warm["steps"] == 1 and warm["model"] == str(model) and warm["sha256"] == weights_sha256(model)
    # in the runs' float32 whatever the machine (bf16 weights differ between CPU kinds), the machine recorded beside
    assert warm["command"][warm["command"].index("--precision") + 1] == "float32"
    assert json.loads((out / "start" / "train" / "config.json").read_text())["precision"] == "float32"
    assert warm["machine"]["cpu"] == kernel_flags() and warm["machine"]["torch"] == torch.__version__
    fingerprint = json.loads((out / "start" / "fingerprint.json").read_text())  # what tells a rebuilt start's distance
    assert fingerprint == cross_framework.weights_fingerprint(model) and len(fingerprint) > 10
    assert all(len(values) == 1 + cross_framework.FINGERPRINT_POINTS and values[0] > 0 for values in fingerprint.values())
    assert [json.loads(line)["phase"] for line in open(out / "start" / "train" / "metrics.jsonl")] == ["warm_start"]
    assert json.loads((out / "start" / "eval.json").read_text())["model"] == str(model)
    for seed in (0, 1):
        run = out / f"reference-seed{seed}"
        record = json.loads((run / "run.json").read_text())
        assert record["status"] == 0 and record["seed"] == seed and record["peak_rss_gb"] > 0.1 and record["seconds_per_update"] > 0
        assert sorted(record["checkpoints"]) == ["1", "2"]
        steps = [json.loads(line) for line in open(run / "train" / "metrics.jsonl") if '"phase": "rl"' in line]
        assert record["seconds_per_update"] == pytest.approx(sum(s["update_seconds"] for s in steps) / 2)  # rollouts included
        assert record["batch_returns"] == [s["mean_return"] for s in steps]  # each update's batch, from the trainer's log
        assert record["batch_success"] == [s["success_rate"] for s in steps]
        written = load_experiment(run / "experiment.toml")
        assert (written.seed, written.group_size, written.model, written.model_sha256) == (seed, 2, str(model), warm["sha256"])
        assert json.loads((run / "train" / "config.json").read_text())["model"] == str(model)  # trained from the warm start
        for update in (1, 2):
            summary = json.loads((run / "eval" / f"update-{update}.json").read_text())
            assert summary["episodes"] == 10 and summary["model"] == record["checkpoints"][str(update)] and 0 <= summary["success_rate"] <= 1
            episodes = [json.loads(line) for line in open(run / "eval" / f"update-{update}.jsonl")]
            assert sorted(e["seed"] for e in episodes) == sorted(e["seed"] for e in map(json.loads, open(out / "start" / "eval.jsonl")))
    report = (out / "cross_framework.md").read_text()
    assert report.count("| reference ") == 3 and "random valid guesses" in report  # a row a run, and the trainer's over both
    assert "| collapsed at |" in report and "the format error's -0.1" in report and "| reference | 2 |" in report
    assert f"`python benchmarks/cross_framework.py {shlex.join(argv)}`" in report  # the command run, not the test runner's
    assert (out / "cross_framework.png").stat().st_size > 1000
    # run again: every run and evaluation is read back, none redone
    before = {p: p.stat().st_mtime for p in out.rglob("*.json")}
    capsys.readouterr()
    assert cross_framework.main(argv) == 0
    assert ": training (" not in capsys.readouterr().out  # no run started again
    assert {p: p.stat().st_mtime for p in out.rglob("*.json")} == before
    # --report-only: the same report from the records (the command shown without the flag), nothing run
    written = (out / "cross_framework.md").read_text()
    assert cross_framework.main([*argv, "--report-only"]) == 0 and (out / "cross_framework.md").read_text() == written
    assert ": training (" not in capsys.readouterr().out
    # a reference run stopped after a checkpoint (no run.json) is continued by gem-core train --resume, not redone
    run = out / "reference-seed1"
    (run / "run.json").unlink()
    # but never by --report-only: a partial report, the run a row "not recorded yet", named in one line; exit status 1
    assert cross_framework.main([*argv, "--report-only"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["cross_framework: a partial report: 1 of 2 runs not recorded yet (reference-seed1)"], err
    partial = (out / "cross_framework.md").read_text()
    assert "| reference | 1 | not recorded yet |" in partial and "A partial report: 1 of the command's 2 runs" in partial
    assert "| reference | 1 |" in partial.split("Each trainer over its seeds")[1]  # the trainer's row over the one recorded run
    assert not (run / "run.json").exists() and ": resuming" not in capsys.readouterr().out  # nothing run
    assert cross_framework.main(argv) == 0
    assert "reference-seed1: resuming" in capsys.readouterr().out
    record = json.loads((run / "run.json").read_text())
    assert record["resumed"] and "--resume" in record["command"] and "--experiment" not in record["command"]
    assert [json.loads(line)["step"] for line in open(run / "train" / "metrics.jsonl") if '"phase": "rl"' in line] == [1, 2]
    # the records without the weights (git keeps only the records): the warm start is built again, held to its
    # recorded sha256, and the runs read back; built again to other weights, one line
    shutil.rmtree(out / "start" / "train")
    assert cross_framework.main(argv) == 0
    assert "built again" in capsys.readouterr().out and weights_sha256(model) == warm["sha256"]
    shutil.rmtree(out / "start" / "train")
    (out / "start" / "warm_start.json").write_text(json.dumps(warm | {"sha256": "0" * 64}))
    assert cross_framework.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not the one" in err[0] and "warm_start.json records" in err[0], err
    assert "norms within 0.0e+00 relative, the kept values within 0.0e+00" in err[0]  # the same weights, by the fingerprint
    # the weights that differ are set aside, never read back as the recorded ones by the next call
    assert not (out / "start" / "train").exists() and (out / "start" / f"train-{warm['sha256'][:12]}" / "model").is_dir()
    assert cross_framework.main(argv) == 2
    err = capsys.readouterr().err
    assert "is not the one" in err and "this kind of CPU built other weights before" in err
    # built on another kind of CPU (float32 kernels round by kind): within float rounding of the recorded
    # fingerprint, the same start, recorded as this CPU's build, evaluated apart; the runs that pin it read back
    other_cpu = {**warm["machine"], "cpu": ["amx_tile"] if "amx_tile" not in kernel_flags() else ["avx2"]}
    (out / "start" / "warm_start.json").write_text(json.dumps(warm | {"sha256": "0" * 64, "machine": other_cpu}))
    assert cross_framework.main(argv) == 0
    printed = capsys.readouterr().out
    assert "built on another kind of CPU" in printed and ": training (" not in printed
    builds = json.loads((out / "start" / "warm_start.json").read_text())["builds"]
    assert [(b["sha256"], b["machine"]["cpu"]) for b in builds] == [(warm["sha256"], kernel_flags())]
    assert builds[0]["distance"] == "norms within 0.0e+00 relative, the kept values within 0.0e+00"
    assert json.loads((out / "start" / f"eval-{warm['sha256'][:12]}.json").read_text())["model"] == str(model)
    report = (out / "cross_framework.md").read_text()
    assert f"- sha256 {warm['sha256'][:12]}... on a CPU with {', '.join(kernel_flags())}" in report
    assert "runs from it: reference 0, reference 1" in report and "runs from it: none" in report
    assert cross_framework.main([*argv, "--report-only"]) == 0  # read back as the recorded build's runs too
    capsys.readouterr()
    # farther than float rounding on another kind of CPU: another start, one line
    shutil.rmtree(out / "start" / "train")
    moved = {name: [values[0] * 1.01, *values[1:]] for name, values in fingerprint.items()}
    (out / "start" / "fingerprint.json").write_text(json.dumps(moved))
    (out / "start" / "warm_start.json").write_text(json.dumps(warm | {"sha256": "0" * 64, "machine": other_cpu}))
    assert cross_framework.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "farther than float rounding" in err[0], err
    shutil.rmtree(out / "start" / f"train-{warm['sha256'][:12]}")
    (out / "start" / "fingerprint.json").write_text(json.dumps(fingerprint))
    (out / "start" / "warm_start.json").write_text(json.dumps(warm))
    # a warm start of other settings is not read back as this one's: one line
    other = list(argv)
    other[argv.index("--warm-start") + 1] = "2"
    assert cross_framework.main(other) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds another warm start" in err[0], err
    # a record of another experiment is not read back as this one's: one line
    assert cross_framework.main([a if a != "training.updates=2" else "training.updates=3" for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a run of another experiment" in err[0] and "reference-seed0" in err[0], err


def test_an_evaluation_episode_the_infrastructure_failed_is_out_of_every_rate(cross_framework):
    """A request error says nothing about the model: counted apart, out of the success and hint-use rates."""

    def episode(success, observations, error=None):
        return {"success": success, "error": error, "transcript": {"turns": [{"observation": o} for o in observations]}}

    lower = "At turn 1, you guessed 5, and the target number is lower than 5."  # GuessTheNumber's own feedback
    played = [
        episode(True, [lower, "Congratulations! You guessed the correct number 3 in 2 turns."]),
        episode(False, [lower, "At turn 2, you guessed 7, and the target number is lower than 7."]),
        episode(False, [lower, "At turn 2, you guessed 2, and the target number is higher than 2."], error="timeout after 3 retries"),
    ]
    summary = cross_framework.eval_summary("m", played, 1.0)
    assert (summary["episodes"], summary["errors"], summary["success_rate"]) == (2, 1, 0.5)
    assert summary["hint_right_after_lower_rate"] == 0.5  # 3 went down after 5, 7 went up
    with pytest.raises(cross_framework.BenchmarkError, match="every episode failed \\(timeout"):
        cross_framework.eval_summary("m", played[2:], 1.0)
